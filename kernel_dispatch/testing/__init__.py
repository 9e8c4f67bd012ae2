"""Helpers shared by the tests and the GPU checks: the matrix's runner and comparison, compile specs."""
