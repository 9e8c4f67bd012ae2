"""Input checks shared by the kernel backends' launchers (the registry's reasons catch these before a launch; a
launcher called directly still gets a named error, never a kernel on the wrong input)."""
import torch

from ..declaration import dtype_name


def check_query(q: torch.Tensor, backend: str, dtypes, head_dims) -> None:
    """``q`` [..., D]: a CUDA tensor of one of ``dtypes`` with D in ``head_dims``; else a ValueError or TypeError
    naming ``q``, the backend and what it supports."""
    if q.dtype not in dtypes:
        names = " and ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"q: the {backend} backend supports {names}, got {q.dtype}")
    if q.shape[-1] not in head_dims:
        raise ValueError(f"q: the {backend} backend supports head dims {tuple(head_dims)}, got D = {q.shape[-1]}")
    if q.device.type != "cuda":
        raise ValueError(f"q: the {backend} backend needs a CUDA tensor, got device {q.device}")
