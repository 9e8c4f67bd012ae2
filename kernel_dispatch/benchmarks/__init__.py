"""The generic harness behind ``python -m kernel_dispatch.bench``; names no operator.

common: the bench module protocol and their discovery from the declarations; one candidate (a backend or
baseline at one shape), how it is run, its errors; the sweep.
timing: events, warm-up, L2 flush, median and spread, peak memory, copy bandwidth.
baselines: helpers for baselines (a compiled golden function, dynamic sizes).
report / plots / docs: the JSON and markdown tables, the PNG plots, docs/benchmarks.md and the README's speed
summary, each drawing on the bench modules (``kernel_dispatch/ops/*_bench.py``) for an operator's own parts.
"""
