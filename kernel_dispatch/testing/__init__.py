"""Helpers shared by the tests, the GPU checks and the tools: the matrix's runner and comparison, compile specs
and builds for sm_90 (Triton PTX, TileLang CUDA source), kernel caches."""
