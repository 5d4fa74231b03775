"""Host -> device copies the engine's step makes (below attention.py and kv_window.py, which both use them)."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def host_to_device(values: np.ndarray | list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A host array or list as a tensor on device, through pinned memory on CUDA: a copy from pageable
    memory may wait for the stream, which would stall a step launched ahead (async scheduling)."""
    t = torch.from_numpy(values) if isinstance(values, np.ndarray) else torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)
