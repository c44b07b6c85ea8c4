"""Shared pieces of the Python binding's tests (run by ctest with PYTHONPATH set to the build's
bindings/python directory)."""

import os

import numpy as np
import pytest

import swiftkv


@pytest.fixture
def small_model():
    """2 layers, 2 KV heads of 16 dims, 16-token blocks, 32-token chunks, f16: 8 KiB a chunk."""
    return swiftkv.ModelDesc("pytest-model", num_layers=2, num_kv_heads=2, head_dim=16,
                             block_tokens=16, chunk_tokens=32)


@pytest.fixture
def ctx():
    with swiftkv.Context(host_budget_bytes=8 << 20) as c:
        yield c


def chunks_of(seed: int, n: int, chunk_bytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n * chunk_bytes, dtype=np.uint8)


def tokens_of(seed: int, n_tokens: int) -> np.ndarray:
    return (np.arange(n_tokens, dtype=np.uint32) + np.uint32(seed * 100003))


def endpoint(tmp_path, name: str) -> str:
    return f"ipc://{os.path.join(str(tmp_path), name)}"
