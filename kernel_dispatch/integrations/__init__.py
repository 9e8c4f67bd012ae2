"""Adapters to other libraries, each an optional extra imported on demand.

- ``kernel_dispatch.integrations.transformers`` (``pip install 'kernel-dispatch[hf]'``): lazy attention as a
  transformers attention implementation, kernel mHC for transformers' DeepSeek-V4.
"""
