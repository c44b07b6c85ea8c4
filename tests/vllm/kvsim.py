"""A stand-in for vLLM's model runner over CPU tensors, shared by the connector's tests and the
worker processes of its tensor-parallel tests (tp_worker.py).

Its "model" writes, for every token it computes, K and V that depend only on the token's prefix,
so a load is checked byte for byte: before each layer's compute, every token before the step's
first computed token must hold exactly its prefix's bytes in that layer, unless the connector
reported its block as failed (then vLLM recomputes it). A tensor-parallel worker holds a slice
of the KV heads and checks that slice.
"""

from __future__ import annotations

import numpy as np
import torch

LAYERS, HEADS, DIM, BLOCK, CHUNK = 4, 2, 32, 16, 64
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
# An EAGLE drafter's attention layer: vLLM names it after the model's own and puts it in their KV
# cache group (its spec is the same); it runs once per draft token, after the model's layers.
DRAFTER = f"model.layers.{LAYERS}.self_attn.attn"


def names_of(tokens) -> np.ndarray:
    """The library's names of the full chunks of tokens, as the connector gives them: vLLM's
    hash (sha256, as vLLM's engine makes them by default) of each chunk's last block, over a
    request of those tokens with no LoRA, salt or other extras."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from swiftkv.integrations import vllm as sv
    from swiftkv.integrations.vllm import common as svc  # noqa: E402
    if not hasattr(kv_cache_utils, "NONE_HASH"):  # a process of its own: as vLLM's engine core
        init_none_hash(sha256)
    r = Request(request_id="names", prompt_token_ids=[int(t) for t in tokens],
                sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                mm_features=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
    chunks = len(tokens) // CHUNK
    if chunks == 0:
        return np.zeros((0, 32), np.uint8)
    return svc.chunk_names(r.block_hashes, CHUNK // BLOCK, chunks)


def prefix_hashes(tokens) -> np.ndarray:
    """h[p]: a 64-bit hash of tokens[:p+1] (what a token's K/V depend on)."""
    h = np.empty(len(tokens), dtype=np.uint64)
    x = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for i, t in enumerate(tokens):
            x = (x ^ np.uint64(t + 1)) * np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(31)
            h[i] = x
    return h


_LANES = np.arange(2 * HEADS * DIM, dtype=np.uint64)


def kv_bits(hashes: np.ndarray, layer: int, heads: slice = slice(None)) -> torch.Tensor:
    """[tokens, 2, heads, DIM] int16: the K/V bits of tokens with these prefix hashes, for the
    model's KV heads `heads` (a worker's shard)."""
    with np.errstate(over="ignore"):
        x = (hashes[:, None] + np.uint64((layer * 0x632BE59BD9B4E019) % (1 << 64))) * np.uint64(
            0x94D049BB133111EB) + _LANES[None, :] * np.uint64(0xD6E8FEB86659FD93)
        x ^= x >> np.uint64(29)
    bits = (x >> np.uint64(48)).astype(np.uint16).view(np.int16).reshape(-1, 2, HEADS, DIM)
    return torch.from_numpy(bits[:, :, heads].copy())


class KVTensors:
    """One worker's per-layer KV tensors as vLLM allocates them.

    vLLM 0.33's layouts (KVCacheLayout: "LBNHC", "LBHNC", "BLNHC", "BLHNC", ...) are allocated
    by vLLM's own allocate_kv_cache: one backing buffer, a [pages, H, N, K+V] view per layer,
    N = `kernel_block` tokens (vLLM splits a block into kernel blocks when its attention kernel
    takes smaller ones). The older 5-dimensional layouts are plain tensors: [2, blocks, B, H, D]
    ("vllm"), [blocks, 2, B, H, D] ("nhd"), HND memory viewed as [blocks, 2, B, H, D] ("hnd")."""

    LEGACY = ("vllm", "nhd", "hnd")

    def __init__(self, layout: str, num_blocks: int, heads: int = HEADS,
                 kernel_block: int = BLOCK):
        self.layout = layout
        self.num_blocks = num_blocks
        self.heads = heads
        self.kernel_block = kernel_block
        if layout in self.LEGACY:
            self.tensors = {n: self._legacy() for n in NAMES}
            self._kv5 = {n: t.view(torch.int16) for n, t in self.tensors.items()}
            return
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor)
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.worker.utils import allocate_kv_cache
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=heads, head_size=DIM,
                                 dtype=torch.float16)
        page = spec.page_size_bytes
        kind = KVCacheLayout[layout]
        if kind.is_block_outermost:  # a block holds every layer's page
            layer_stride, block_stride = page, page * LAYERS
        else:
            layer_stride, block_stride = page * num_blocks, page
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[KVCacheTensor(size=page * num_blocks * LAYERS, layers=list(NAMES),
                                            layer_stride=layer_stride,
                                            block_stride=block_stride)],
            kv_cache_groups=[KVCacheGroupSpec(list(NAMES), spec)])
        self.tensors = allocate_kv_cache(config, torch.device("cpu"), kind, [kernel_block])
        # [pages, H, N, 2, D] per layer, in int16 (the stand-in's K/V bits).
        self._kv5 = {n: t.view(torch.int16).unflatten(3, (2, DIM))
                     for n, t in self.tensors.items()}

    def _legacy(self):
        n, h = self.num_blocks, self.heads
        if self.layout == "vllm":
            return torch.zeros(2, n, BLOCK, h, DIM, dtype=torch.float16)
        if self.layout == "nhd":
            return torch.zeros(n, 2, BLOCK, h, DIM, dtype=torch.float16)
        return torch.zeros(n, 2, h, BLOCK, DIM, dtype=torch.float16).permute(0, 1, 3, 2, 4)

    def _where(self, blocks, offsets):
        """The kernel block and its row of each (vLLM block, offset)."""
        k = BLOCK // self.kernel_block
        return blocks * k + offsets // self.kernel_block, offsets % self.kernel_block

    def kv(self, layer: int, blocks, offsets) -> torch.Tensor:
        """[tokens, 2, H, D] of the given block ids and offsets."""
        t = self._kv5[NAMES[layer]]
        if self.layout == "vllm":
            return t[:, blocks, offsets].permute(1, 0, 2, 3)
        if self.layout in self.LEGACY:
            return t[blocks, :, offsets]
        pages, rows = self._where(blocks, offsets)
        return t[pages, :, rows].permute(0, 2, 1, 3)  # [tokens, H, 2, D] -> [tokens, 2, H, D]

    def put(self, layer: int, blocks, offsets, values) -> None:
        t = self._kv5[NAMES[layer]]
        if self.layout == "vllm":
            t[:, blocks, offsets] = values.permute(1, 0, 2, 3)
        elif self.layout in self.LEGACY:
            t[blocks, :, offsets] = values
        else:
            pages, rows = self._where(blocks, offsets)
            t[pages, :, rows] = values.permute(0, 2, 1, 3)


def worker_step(w, kv: KVTensors, meta, plan, has_sync_kv_loads: bool, runs_layers: bool,
                finished_req_ids: set, heads: slice = slice(None), drafter_passes: int = 0):
    """One step of a worker: the connector's hooks in vLLM's order around the stand-in's
    compute, then those of a drafter's layer (DRAFTER) `drafter_passes` times. plan: (request
    id, first computed token, end, block ids, prefix hashes) per scheduled request. Returns
    (finished_sending, failed block ids); raises AssertionError if a block the step read held
    wrong K/V and was not reported."""
    w.handle_preemptions(meta)
    w.bind_connector_metadata(meta)
    if has_sync_kv_loads:
        w.start_load_kv(None)
    wrong = {}
    # vLLM runs the attention layers (and so their hooks) only when it has tokens to run.
    for layer, name in enumerate(NAMES if runs_layers else []):
        w.wait_for_layer_load(name)
        for rid, start, end, blocks, h in plan:
            pos = torch.arange(0, start)
            got = kv.kv(layer, blocks[pos // BLOCK], pos % BLOCK)
            bad = (got != kv_bits(h[:start], layer, heads)).flatten(1).any(1).nonzero().flatten()
            if len(bad):
                wrong.setdefault(rid, set()).update(int(blocks[p // BLOCK]) for p in bad.tolist())
            pos = torch.arange(start, end)
            kv.put(layer, blocks[pos // BLOCK], pos % BLOCK, kv_bits(h[start:end], layer, heads))
        w.save_kv_layer(name, kv.tensors[name], None)
    for _ in range(drafter_passes if runs_layers else 0):
        w.wait_for_layer_load(DRAFTER)
        w.save_kv_layer(DRAFTER, kv.tensors[DRAFTER], None)
    if not has_sync_kv_loads:
        w.start_load_kv(None)
    w.wait_for_save()
    transfers = w.get_transfer_results(finished_req_ids)
    errors = w.get_block_ids_with_load_errors()
    w.clear_connector_metadata()
    for rid, blocks in wrong.items():
        assert blocks <= errors, (f"{rid}: blocks {sorted(blocks - errors)} hold wrong K/V and "
                                  "were not reported")
    return transfers.finished_sending, errors
