"""Helpers shared by the tests and the tools in scripts/: the matrix's runner and comparison, compile specs and
builds for sm_90 (Triton PTX, TileLang CUDA source), the TileLang kernel tarball for GPU machines."""
