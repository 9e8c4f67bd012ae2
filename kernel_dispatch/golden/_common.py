"""Helpers shared by the golden modules."""
import torch


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when the leading floating input is float64, else float32 (SPEC: 'at least fp32')."""
    for t in tensors:
        if t is not None and t.is_floating_point():
            return torch.float64 if t.dtype == torch.float64 else torch.float32
    return torch.float32
