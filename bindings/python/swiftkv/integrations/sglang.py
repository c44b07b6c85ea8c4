"""libswiftkv as a HiCache storage backend of SGLang (its L3, behind SGLang's GPU memory and its
host memory pool): pages cached in the library's host memory, on disk and in memory lent by
other models, written from and read into SGLang's host pool without a copy in between.

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "swiftkv", "module_path": "swiftkv.integrations.sglang",
          "class_name": "SwiftKVStorage", "interface_v1": 1,
          "host_budget_bytes": 17179869184}'

docs/sglang.md has the options, what is supported and what is not.

Which page is which: SGLang names each page by a chained SHA-256 over its tokens and the key of
the page before it (seeded by its extra key and cache salt where a request has them); the
library names the page's chunk by those 32 bytes (a key that is not 64 hex digits by a digest
of it) and adds the model's fingerprint: SGLang's model name, the pool's geometry and dtype, the
weights' identity and, where each rank holds its own part of a page (tensor parallel heads,
pipeline stages, context parallel slices), the rank. One chunk is one page.

How SGLang's calls map onto the library: the host pool is registered as a library pool over
its own memory (register_mem_pool_host), so ``batch_set_v1`` is one save-only request over the
pages' slots (every layer copied straight out of the pool into a tier) and ``batch_get_v1`` one
load-only request (the leading cached run copied straight into the slots; it stops at the
first page not cached or not intact: a corrupt disk record, lent memory taken back).
``batch_exists`` is a lookup of the names in the library's index and reads no page.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Any, List, Optional

import numpy as np
import sglang
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

import swiftkv

from . import _engine, _torch

_log = logging.getLogger(__name__)
_WHO = "SwiftKVStorage"

__all__ = ["SwiftKVStorage", "SUPPORTED_SGLANG", "OPTIONS"]

# The SGLang releases this backend is tested with, [first, end) as (major, minor, patch): its
# HiCacheStorage interface and host pools change between patch releases.
SUPPORTED_SGLANG = ((0, 5, 23), (0, 5, 24))


def _check_sglang_version(version: str) -> None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    lo, hi = SUPPORTED_SGLANG
    if m is None or not lo <= tuple(int(g) for g in m.groups()) < hi:
        raise ImportError(f"swiftkv.integrations.sglang supports SGLang "
                          f"{'.'.join(map(str, lo))} (its HiCacheStorage interface and host "
                          f"pools), not SGLang {version}")


_check_sglang_version(sglang.__version__)

# The extra config's keys and their defaults. The first four are SGLang's own (its dynamic
# backend loader reads them); interface_v1 must be 1 so that SGLang makes the zero-copy calls.
OPTIONS = {
    "backend_name": None,
    "module_path": None,
    "class_name": None,
    "interface_v1": 0,
    "host_budget_bytes": 4 << 30,  # host memory for cached pages, the whole engine's
    "disk_path": None,             # a directory for the disk tier (None: no disk tier)
    "disk_budget_bytes": 0,        # the disk tier's size, the whole engine's (needed with a path)
    "model_identity": None,        # what tells these weights apart (default: their files)
    "host_codec": "raw",           # how pages are kept in host memory: raw, zstd, fp8, kivi-8/4/2
    "disk_codec": "raw",           # and on disk
    "accept_lossy": False,         # whether loads may return fp8 or kivi pages
    "lenders": [],                 # [{"endpoint", "name", "units"}]: lenders to borrow from
}

# The host pool's element types. SGLang keeps an fp8 KV cache as uint8 in its pools, which does
# not say which fp8 it is: such pages are kept as 1-byte elements (I8), whose bytes the library
# never interprets under the raw and zstd codecs.
_DTYPES = {**_torch.DTYPES, torch.float8_e4m3fn: swiftkv.DType.FP8_E4M3,
           torch.float8_e5m2: swiftkv.DType.FP8_E5M2, torch.uint8: swiftkv.DType.I8}
_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
_NAME_BYTES = 32  # SGLang's keys are SHA-256 digests in hex


def _options(extra: Optional[dict]) -> dict:
    opts = _engine.options(dict(extra or {}), OPTIONS, _WHO,
                           "--hicache-storage-backend-extra-config")
    if not bool(opts["interface_v1"]):
        raise ValueError(f"{_WHO} serves SGLang's zero-copy calls (batch_get_v1, batch_set_v1) "
                         "only: add \"interface_v1\": 1 to --hicache-storage-backend-extra-config "
                         "(without it SGLang copies each page through get and set, which this "
                         "backend does not implement)")
    if int(opts["host_budget_bytes"]) <= 0:
        raise ValueError(f"{_WHO}: host_budget_bytes must be > 0, not "
                         f"{opts['host_budget_bytes']!r}")
    for k in ("host_codec", "disk_codec"):
        _engine.codec(opts[k], _WHO)  # refused here, before anything is made
    return opts


def _key_name(key: str) -> bytes:
    """One page key as the library's chunk name: the 32 bytes of a SHA-256 hex digest, else a
    digest of the key (so that any key has a name of the one length, and the same one always)."""
    if len(key) == 2 * _NAME_BYTES:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(b"swiftkv-sglang-key\0" + key.encode()).digest()


def page_names(keys: List[str]) -> np.ndarray:
    """SGLang's page keys as the library's chunk names: a [len(keys), 32] uint8 array."""
    if all(len(k) == 2 * _NAME_BYTES for k in keys):
        try:  # every key 64 hex digits (SGLang's own): one decode
            return np.frombuffer(bytes.fromhex("".join(keys)), np.uint8).reshape(len(keys),
                                                                                 _NAME_BYTES)
        except ValueError:
            pass
    return np.frombuffer(b"".join(_key_name(k) for k in keys),
                         np.uint8).reshape(len(keys), _NAME_BYTES)


def _shards(cfg: HiCacheStorageConfig) -> list:
    """What of a page this rank holds, as identity parts: every rank its own part of a page's
    heads (tensor parallel), layers (pipeline stages) and tokens (context parallel), except the
    MLA latent, which every tensor-parallel rank holds whole."""
    parts = []
    if not cfg.is_mla_model and cfg.tp_size > 1:
        parts.append(f"tp{cfg.tp_rank}of{cfg.tp_size}")
    if cfg.pp_size > 1:
        parts.append(f"pp{cfg.pp_rank}of{cfg.pp_size}")
    if cfg.attn_cp_size > 1:
        parts.append(f"cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}")
    return parts


class SwiftKVStorage(HiCacheStorage):
    """SGLang's L3 through the library: one library context per SGLang rank (each TP, PP and DP
    rank is a process of its own), with its share of the budgets and a disk directory of its own.
    SGLang constructs it as cls(storage_config, kwargs) and then hands it its host pool
    (register_mem_pool_host), through whose memory every page goes."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        cfg = storage_config
        self.config = cfg
        self.opts = opts = _options(cfg.extra_config)
        if cfg.is_mla_model and (cfg.tp_size > 1 or cfg.dcp_size > 1):
            # SGLang writes an MLA page from one rank only (is_storage_writer) and reads it on
            # every rank; each rank's context is its own process's.
            raise ValueError(f"{_WHO}: an MLA model with tensor parallel size {cfg.tp_size} "
                             f"(decode context parallel size {cfg.dcp_size}) is not supported: "
                             "SGLang stores its pages from one rank and loads them on every "
                             "rank, and the library's contexts do not share pages between "
                             "processes. Serve it with tensor parallel size 1 per rank (data "
                             "parallel attention) or without the storage backend")
        self.shards = _shards(cfg)
        ranks = max(1, cfg.tp_size if not cfg.is_mla_model else 1) * max(1, cfg.pp_size) * \
            max(1, cfg.attn_cp_size)
        config: dict = {"host_budget_bytes": max(1, int(opts["host_budget_bytes"]) // ranks)}
        if opts["disk_path"] is not None:
            # A disk directory has one owner (docs/disk-format.md): each rank its own.
            parts = [str(opts["disk_path"])]
            if cfg.dp_rank:
                parts.append(f"dp{cfg.dp_rank}")
            if self.shards:
                parts.append("-".join(self.shards))
            path = os.path.join(*parts)
            os.makedirs(path, mode=0o700, exist_ok=True)
            config.update(disk_path=path,
                          disk_budget_bytes=max(1, int(opts["disk_budget_bytes"]) // ranks),
                          # An L3 outlives the engine: host pages are written to disk at close.
                          write_back_on_close=True)
        self.ctx = swiftkv.Context(**config)
        self.model = None
        self.pool = None
        self.borrower: Optional[_engine.Borrower] = None  # leases of lent memory, kept up
        self.mem_pool_host = None
        self.page_size = 0
        self.num_layers = 0

    # --- The host pool -------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """SGLang's host pool: the model's geometry is read from it, and its memory becomes the
        library pool every page is copied out of and into."""
        if self.pool is not None:
            raise ValueError(f"{_WHO}: a host pool is registered already")
        views, desc = self._pool_geometry(mem_pool_host)
        self.model = self.ctx.register_model(desc)
        _engine.set_codecs(self.model, self.opts["host_codec"], self.opts["disk_codec"],
                           self.opts["accept_lossy"], _WHO)
        self.pool = self.model.pool_from_tensors(views, layout="vllm")
        self.borrower = _engine.Borrower(self.ctx, self.model, self.opts["lenders"], _log, _WHO)
        self.mem_pool_host = mem_pool_host
        self.page_size = desc.block_tokens
        self.num_layers = desc.num_layers

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """Pools other than the KV pool (Mamba states, sliding-window and indexer pools,
        compressed caches, drafters) are refused by name: the backend stores the plain KV pool
        only, and a model whose pages need another pool is served without this backend."""
        if str(host_pool_name) != PoolName.KV.value:
            raise ValueError(f"{_WHO}: SGLang's {str(host_pool_name)!r} host pool is not "
                             "supported (only the KV pool is stored); serve this model without "
                             "--hicache-storage-backend, or with one that stores that pool")
        if self.pool is None:
            self.register_mem_pool_host(host_pool)
        elif host_pool is not self.mem_pool_host:
            raise ValueError(f"{_WHO}: a second KV host pool is not supported")
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def _pool_geometry(self, pool):
        """Per-layer views of the pool's memory as [2, pages, page_size, heads, dim] (the
        library's 'vllm' pool layout) and the model they hold."""
        cfg = self.config
        layout = getattr(pool, "layout", None)
        if layout not in _LAYOUTS:
            raise ValueError(f"{_WHO}: SGLang's host pool layout {layout!r} is not supported "
                             f"({', '.join(_LAYOUTS)}); pass --hicache-mem-layout with one")
        kv = getattr(pool, "kv_buffer", None)
        if not isinstance(kv, torch.Tensor) or kv.device.type != "cpu":
            raise ValueError(f"{_WHO}: the host pool has no host tensor kv_buffer "
                             f"({type(kv).__name__})")
        if kv.dtype not in _DTYPES:
            raise ValueError(f"{_WHO}: KV dtype {kv.dtype} is not supported "
                             f"({', '.join(str(d) for d in _DTYPES)})")
        page, layers = int(pool.page_size), int(pool.layer_num)
        if pool.size % page:
            raise ValueError(f"{_WHO}: the host pool's {pool.size} tokens are not whole pages "
                             f"of {page}")
        pages = pool.size // page
        if cfg.is_mla_model:
            # One latent row per token (kv_lora_rank + qk_rope_head_dim): stored as one head
            # whose first half is K and second half V, so that every byte is kept as it is.
            width = int(kv.shape[-1])
            if width % 2:
                raise ValueError(f"{_WHO}: an MLA row of {width} elements (odd) is not "
                                 "supported")
            if layout == "layer_first":  # [layers, size, 1, width]
                per_layer = [kv[l].unflatten(0, (pages, page)) for l in range(layers)]
            elif layout == "page_first":  # [size, layers, 1, width]: see below
                per_layer = [kv.flatten(1, 2).unflatten(0, (pages, page))]
            else:  # page_first_direct: [pages, layers, page, 1, width]
                per_layer = [kv[:, l] for l in range(layers)]
            views = [v.unflatten(3, (2, width // 2)).permute(3, 0, 1, 2, 4) for v in per_layer]
            heads, dim = (layers if layout == "page_first" else 1), width // 2
        else:
            heads, dim = int(pool.head_num), int(pool.head_dim)
            if int(getattr(pool, "v_head_dim", dim)) != dim:
                raise ValueError(f"{_WHO}: K heads of {dim} and V heads of {pool.v_head_dim} "
                                 "elements are not supported (the library keeps K and V of one "
                                 "size)")
            if layout == "layer_first":  # [2, layers, size, heads, dim]
                views = [kv[:, l].unflatten(1, (pages, page)) for l in range(layers)]
            elif layout == "page_first":  # [2, size, layers, heads, dim]: see below
                views = [kv.flatten(2, 3).unflatten(1, (pages, page))]
                heads *= layers
            else:  # page_first_direct: [2, pages, layers, page, heads, dim]
                views = [kv[:, :, l] for l in range(layers)]
        identity = self.opts["model_identity"]
        name = cfg.model_name or "sglang-model"
        if identity is None:
            identity = _engine.weights_identity(
                name, _engine.model_dir(name), [f"model={name}"], _log, _WHO)
        # page_first keeps a token's rows of every layer side by side: a page's K (and V) is
        # one run of bytes. The library then sees one layer whose heads are every layer's, so
        # that a page is copied as two runs rather than a row per token and layer; the bytes
        # and their order are the pool's either way.
        lib_layers = 1 if layout == "page_first" else layers
        identity = "/".join([identity, f"sglang-{'mla' if cfg.is_mla_model else 'mha'}",
                             *self.shards])
        desc = swiftkv.ModelDesc(name=name, num_layers=lib_layers, num_kv_heads=heads,
                                 head_dim=dim, block_tokens=page, chunk_tokens=page,
                                 dtype=_DTYPES[kv.dtype], identity=identity)
        return views, desc

    # --- Pages ---------------------------------------------------------------------------------

    def _pages(self, keys: List[str], host_indices: torch.Tensor) -> np.ndarray:
        """The pool pages of a call's slots: one page per key, its slots whole and in order."""
        if self.pool is None:
            raise RuntimeError(f"{_WHO}: no host pool was registered (register_mem_pool_host)")
        idx = host_indices.detach().to("cpu").numpy() if isinstance(host_indices, torch.Tensor) \
            else np.asarray(host_indices)
        n, page = len(keys), self.page_size
        if idx.ndim != 1 or len(idx) != n * page:
            raise ValueError(f"{_WHO}: {len(keys)} keys take {n * page} host slots "
                             f"({page} a page), not {idx.shape}")
        rows = idx.reshape(n, page)
        if page > 1 and ((rows[:, 0] % page).any() or (np.diff(rows, axis=1) != 1).any()):
            raise ValueError(f"{_WHO}: host slots must be whole pages of {page} in order")
        return (rows[:, 0] // page).astype(np.int32)

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading keys are held, from the index alone (no page is read)."""
        if not keys:
            return 0
        if self.model is None:
            return 0
        return int(self.model.lookup_named(page_names(keys)).prefix_tokens) // self.page_size

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Copies the leading cached run of the keys' pages into their host slots: True for
        each page loaded intact, False from the first that is not (not cached, or its bytes
        could not be trusted) to the end."""
        if not keys:
            return []
        pages = self._pages(keys, host_indices)
        with self.model.request(self.pool, len(keys) * self.page_size, pages,
                                shape=swiftkv.RequestShape.LOAD_ONLY,
                                names=page_names(keys)) as req:
            req.start_load()
            valid = len(keys) * self.page_size
            for layer in range(self.num_layers):
                valid = min(valid, req.wait_layer_load(layer))
        loaded = min(valid, int(req.final.load_end_tokens)) // self.page_size
        return [i < loaded for i in range(len(keys))]

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Copies the keys' pages out of their host slots into the library (pages held already
        are not copied again): True for each page held after the call."""
        if not keys:
            return []
        names = page_names(keys)
        pages = self._pages(keys, host_indices)
        with self.model.request(self.pool, len(keys) * self.page_size, pages,
                                shape=swiftkv.RequestShape.SAVE_ONLY, names=names) as req:
            for layer in range(self.num_layers):
                req.save_layer(layer)
            req.wait_save()
        held = self.model.lookup_named(names).residency
        return [bool(r != swiftkv.Tier.DROPPED) for r in held]

    # --- The v2 calls: the KV pool only ---------------------------------------------------------

    @staticmethod
    def _kv_only(transfers) -> None:
        for t in transfers or []:
            if str(t.name) != PoolName.KV.value:
                raise ValueError(f"{_WHO}: SGLang's {str(t.name)!r} pool is not supported (only "
                                 "the KV pool is stored)")

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        """batch_exists for the KV pool; a transfer of any other pool is refused by name."""
        self._kv_only(pool_transfers)
        hit = self.batch_exists(keys, extra_info)
        return PoolTransferResult(hit, {PoolName.KV: hit} if hit else {},
                                  list(range(1, hit + 1)))

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        self._kv_only(transfers)
        return {t.name: self.batch_get_v1(t.keys or [], t.host_indices, extra_info)
                for t in transfers}

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        self._kv_only(transfers)
        return {t.name: self.batch_set_v1(t.keys or [], t.host_indices, extra_info)
                for t in transfers}

    # --- The copying calls SGLang makes without interface_v1: refused at construction ----------

    def _copying(self, call: str):
        raise NotImplementedError(f"{_WHO}.{call}: only the zero-copy calls are served (set "
                                  "\"interface_v1\": 1)")

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None):
        self._copying("get")

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None):
        self._copying("batch_get")

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        self._copying("set")

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        self._copying("batch_set")

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # --- Lifetime ------------------------------------------------------------------------------

    def clear(self) -> bool:
        """Drops every page of the model in every tier (SGLang's cache flush)."""
        if self.model is not None:
            self.model.clear()
        return True

    def get_stats(self):
        return None

    def close(self) -> None:
        """Ends the context; with a disk tier, host pages are written to disk first."""
        if self.ctx is not None:
            if self.borrower is not None:
                self.borrower.close()
            self.pool = None
            self.model = None
            self.ctx.close()
            self.ctx = None
