"""Which device the engine runs on, and the host -> device copies its step makes (below attention.py and
kv_window.py, which both use them)."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def host_to_device(values: np.ndarray | list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A host array or list as a tensor on device, through pinned memory on CUDA: a copy from pageable
    memory may wait for the stream, which would stall a step launched ahead (async scheduling)."""
    t = torch.from_numpy(values) if isinstance(values, np.ndarray) else torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def pick_device(name: str | None) -> torch.device:
    """The device `name` names (CUDA when None and available), checked to exist in this torch build."""
    try:
        device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise ValueError(f"invalid device {name!r}: {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but this torch build ({torch.__version__}) has no "
                             f"usable CUDA GPU; use device='cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r} is not supported; use 'cuda', 'cuda:N' or 'cpu'")
    return device
