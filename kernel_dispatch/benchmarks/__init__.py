"""The benchmark harness behind ``python -m kernel_dispatch.bench``.

timing: events, warm-up, L2 flush, median and spread, peak memory, copy bandwidth.
common: one candidate (a backend or baseline at one shape), how it is run, its errors.
attention / mhc: the sweeps, inputs, FLOP and byte counts of each operator.
baselines: what a user would pick instead (SDPA, FlexAttention, torch.compile of golden).
report / plots / docs: the markdown table and JSON, the PNG plots, docs/benchmarks.md.
"""
