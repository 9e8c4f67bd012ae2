"""Kernel backends. Each subpackage declares CAPABILITIES, PRIORITY and unavailable() without
importing its compiler; its per-operator modules hold the kernels and are imported on use."""
