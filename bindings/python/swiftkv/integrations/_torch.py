"""What the torch-based integrations (transformers, vLLM) share: torch's K/V dtypes and devices
as the library names them."""

from __future__ import annotations

from typing import Optional

import torch

from .. import DType

# The K/V element types the library takes from torch.
DTYPES = {torch.float16: DType.F16, torch.bfloat16: DType.BF16, torch.float32: DType.F32}


def device_index(device) -> Optional[int]:
    """A torch device as a swiftkv device: None for the CPU, the CUDA ordinal otherwise."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"swiftkv pages live on the CPU or a CUDA device, not {device}")
    return device.index if device.index is not None else torch.cuda.current_device()
