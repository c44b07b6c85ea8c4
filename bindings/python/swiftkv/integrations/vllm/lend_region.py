"""The worker's half of a lending vLLM engine: vLLM's KV cache allocated in the library's elastic
region, whose tail units the worker gives up and takes back as the scheduler's lending policy
(lending.TailLender) orders.

vLLM allocates its KV cache as one backing tensor (``allocate_kv_cache`` in
vllm/v1/worker/utils.py), inside the connector's ``get_mem_pool_context``. There a torch function
mode serves that one ``torch.zeros(size, dtype=torch.int8)`` from the region's memory, so vLLM's
per-layer views are views of the region. With a block-outermost layout (``BLHNC``, which the
connector asks for) block b of every layer is bytes [b * bpb, (b + 1) * bpb) of it: the last
blocks are one contiguous tail, the region's. The region is made a whole number of lending units
long (its end past vLLM's last block is never vLLM's); unit k counts from the end, as the
scheduler's TailLender counts it.

A unit is given up (``release``) only after the scheduler took every one of its blocks out of
vLLM's hands; the region then decommits it and lends it to borrowers. Taking it back
(``restore``) asks the borrowers' leases back; it is done once they are released or expired, and
only then does the scheduler hand the blocks back to vLLM. The worker reports what it finished
each step (LendReport), and the scheduler counts a unit done once every tensor-parallel rank has.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from typing import Optional

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

import swiftkv

from .._torch import DTYPES
from .common import log

# Options of the "lend" block in kv_connector_extra_config, and their defaults.
LEND_OPTIONS = {
    "endpoint": None,            # the coordinator endpoint to offer on ("{rank}" in it under TP)
    "name": "vllm",              # the name borrowers ask for (".tp<rank>" added under TP)
    "borrower": None,            # the borrower's geometry per worker: num_layers, num_kv_heads,
                                 # head_dim, dtype, chunk_tokens
    "high_free_blocks": 0.5,     # lend while this many blocks stay free after it (< 1: a share)
    "low_free_blocks": 0.25,     # reclaim below this many free blocks (< 1: a share)
    "keep_blocks": 1,            # blocks at the head never lent (block 0 is vLLM's null block)
    "reclaim_deadline_s": 2.0,   # how long vLLM waits for a reclaim before it preempts
    "lease_ms": 1000,            # a lease's life between heartbeats: what a dead borrower costs
    "granule_bytes": None,       # host memory: bytes a memfd (default: the largest power of two
                                 # to 2 MiB that divides the unit)
}

_BORROWER_KEYS = {"num_layers", "num_kv_heads", "head_dim", "dtype", "chunk_tokens"}
_DTYPE_NAMES = {"float16": swiftkv.DType.F16, "bfloat16": swiftkv.DType.BF16,
                "float32": swiftkv.DType.F32, "f16": swiftkv.DType.F16,
                "bf16": swiftkv.DType.BF16, "f32": swiftkv.DType.F32}


def lend_options(raw, who: str = "SwiftKVConnector") -> Optional[dict]:
    """The "lend" option block, checked, over its defaults; None when the engine does not lend."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{who}: lend is {raw!r}; an object of {sorted(LEND_OPTIONS)}")
    unknown = sorted(set(raw) - set(LEND_OPTIONS))
    if unknown:
        raise ValueError(f"{who}: unknown lend keys {unknown}; known: {sorted(LEND_OPTIONS)}")
    opts = {**LEND_OPTIONS, **raw}
    if not opts["endpoint"]:
        raise ValueError(f"{who}: lend needs an endpoint to offer its memory on "
                         "(ipc://PATH or tcp://HOST:PORT)")
    b = opts["borrower"]
    if not isinstance(b, dict) or set(b) != _BORROWER_KEYS:
        raise ValueError(f"{who}: lend.borrower is {b!r}; the borrower's geometry as each of its "
                         f"workers holds it: {sorted(_BORROWER_KEYS)}")
    if str(b["dtype"]) not in _DTYPE_NAMES:
        raise ValueError(f"{who}: lend.borrower.dtype {b['dtype']!r} is not one of "
                         f"{sorted(_DTYPE_NAMES)}")
    for key in ("high_free_blocks", "low_free_blocks"):
        if not float(opts[key]) >= 0:
            raise ValueError(f"{who}: lend.{key} must be >= 0, not {opts[key]!r}")
    if not float(opts["reclaim_deadline_s"]) > 0 or not int(opts["lease_ms"]) > 0:
        raise ValueError(f"{who}: lend.reclaim_deadline_s and lend.lease_ms must be > 0")
    return opts


def borrower_desc(opts: dict) -> swiftkv.ModelDesc:
    b = opts["borrower"]
    return swiftkv.ModelDesc(name="borrower", num_layers=int(b["num_layers"]),
                             num_kv_heads=int(b["num_kv_heads"]), head_dim=int(b["head_dim"]),
                             chunk_tokens=int(b["chunk_tokens"]),
                             block_tokens=int(b["chunk_tokens"]),
                             dtype=_DTYPE_NAMES[str(b["dtype"])])


def blocks_of_share(value, num_blocks: int) -> int:
    """A watermark: a share of the blocks (below 1) or a count."""
    v = float(value)
    return int(v * num_blocks) if v < 1 else int(v)


@dataclasses.dataclass(frozen=True)
class LendGeometry:
    """How vLLM's KV cache divides into lending units, the same on the scheduler's side and on
    every worker's."""

    num_blocks: int        # vLLM's blocks
    block_bytes: int       # bytes of one block, every layer of the backing allocation
    raw_bytes: int         # the backing allocation vLLM makes
    unit_blocks: int       # a lending unit, in vLLM blocks
    capacity_blocks: int   # the region: whole units, at least num_blocks
    lender: swiftkv.ModelDesc
    borrower: swiftkv.ModelDesc

    @property
    def units(self) -> int:
        return self.capacity_blocks // self.unit_blocks

    @staticmethod
    def of(kv_cache_config, opts: dict, who: str = "SwiftKVConnector") -> "LendGeometry":
        """From vLLM's KV cache config: one backing allocation of num_blocks blocks, every
        layer's spec alike (heads, head size, dtype, block size)."""
        tensors = list(kv_cache_config.kv_cache_tensors)
        sizes = {t.size for t in tensors}
        if len(sizes) != 1:
            raise ValueError(f"{who}: lending needs vLLM's KV cache in one backing allocation; "
                             f"its tensors have sizes {sorted(sizes)}")
        raw = sizes.pop()
        n = int(kv_cache_config.num_blocks)
        specs = {(g.kv_cache_spec.block_size, g.kv_cache_spec.num_kv_heads,
                  g.kv_cache_spec.head_size, g.kv_cache_spec.dtype)
                 for g in kv_cache_config.kv_cache_groups}
        if len(specs) != 1:
            raise ValueError(f"{who}: lending needs every KV cache group alike; groups have "
                             f"(block, heads, head size, dtype) {sorted(map(str, specs))}")
        block, heads, dim, dtype = specs.pop()
        if dtype not in DTYPES:
            raise ValueError(f"{who}: lending: KV cache dtype {dtype} is not supported")
        layer_block = 2 * block * heads * dim * torch.tensor([], dtype=dtype).element_size()
        if raw % n or (raw // n) % layer_block:
            raise ValueError(f"{who}: lending: a backing allocation of {raw} bytes is not "
                             f"{n} blocks of whole layers of {layer_block} bytes")
        bpb = raw // n
        lender = swiftkv.ModelDesc(name="vllm-kv", num_layers=bpb // layer_block,
                                   num_kv_heads=heads, head_dim=dim, block_tokens=block,
                                   chunk_tokens=block, dtype=DTYPES[dtype])
        borrower = borrower_desc(opts)
        _, unit = swiftkv.lend_unit(borrower, lender)
        return LendGeometry(num_blocks=n, block_bytes=bpb, raw_bytes=raw, unit_blocks=unit,
                            capacity_blocks=-(-n // unit) * unit, lender=lender,
                            borrower=borrower)


@dataclasses.dataclass
class LendReport(KVConnectorWorkerMetadata):
    """What workers finished of the lending orders since their last report: units given to the
    library (released) or mapped back (restored), each with the ranks that did. vLLM aggregates
    the reports of an engine's workers; the scheduler counts a unit done once every rank has."""

    released: dict = dataclasses.field(default_factory=dict)  # unit -> set of ranks
    restored: dict = dataclasses.field(default_factory=dict)

    def aggregate(self, other: "LendReport") -> "LendReport":
        out = LendReport({k: set(v) for k, v in self.released.items()},
                         {k: set(v) for k, v in self.restored.items()})
        for mine, theirs in ((out.released, other.released), (out.restored, other.restored)):
            for unit, ranks in theirs.items():
                mine.setdefault(unit, set()).update(ranks)
        return out

    def __bool__(self) -> bool:
        return bool(self.released or self.restored)


class _AllocateInRegion(torch.overrides.TorchFunctionMode):
    """Serves the one torch.zeros of `size` int8 elements that vLLM's allocate_kv_cache makes
    from `make()`; every other call runs as it would."""

    def __init__(self, size: int, make):
        super().__init__()
        self.size, self.make, self.served = size, make, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.zeros and self.served is None and len(args) == 1
                and int(args[0]) == self.size and kwargs.get("dtype") is torch.int8):
            self.served = self.make(kwargs.get("device"))
            return self.served
        return func(*args, **kwargs)


class _CudaBytes:
    """A device range as __cuda_array_interface__ shows it to torch."""

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|i1",
                                         "data": (address, False), "version": 3}


class RegionLender:
    """One worker's elastic region under vLLM's KV cache (see the module's documentation).
    Called from the worker's model-runner thread only."""

    def __init__(self, cfg, kv_cache_config, opts: dict):
        self.cfg = cfg
        self.opts = opts
        self.geo = LendGeometry.of(kv_cache_config, opts)
        w = cfg.world
        self.endpoint = str(opts["endpoint"])
        if w > 1:
            if "{rank}" not in self.endpoint:
                raise ValueError("SwiftKVConnector: under tensor parallelism each worker offers "
                                 "its shard on an endpoint of its own: lend.endpoint must hold "
                                 f"{{rank}} (it is {self.endpoint!r})")
            self.endpoint = self.endpoint.replace("{rank}", str(cfg.rank))
            self.name = f"{opts['name']}.tp{cfg.rank}"
        else:
            self.name = str(opts["name"])
        self.ctx: Optional[swiftkv.Context] = None
        self.region = None
        self.tensor: Optional[torch.Tensor] = None  # vLLM's backing allocation, in the region
        self.owned_units = 0                        # of the region's units, from its head
        self.restoring: set = set()                 # units asked back, not yet mapped
        self.report = LendReport()                  # what is done since the last report
        self.stats = {"units_released": 0, "units_restored": 0}

    # --- the allocation --------------------------------------------------------------------

    def _make(self, device) -> torch.Tensor:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        g = self.geo
        region_bytes = g.capacity_blocks * g.block_bytes
        cuda = dev.type == "cuda"
        index = (dev.index if dev.index is not None else torch.cuda.current_device()) \
            if cuda else None
        granule = None
        if not cuda:
            granule = self.opts["granule_bytes"]
            if granule is None:
                unit_bytes = g.unit_blocks * g.block_bytes
                granule = 2 << 20
                while granule > 4096 and unit_bytes % granule:
                    granule //= 2
            if (g.unit_blocks * g.block_bytes) % int(granule) or int(granule) % 4096:
                raise ValueError(
                    f"SwiftKVConnector: a lending unit of {g.unit_blocks * g.block_bytes} bytes "
                    f"is not whole granules of {granule} bytes (a multiple of the page): a "
                    "borrower would map the lender's own blocks")
        self.ctx = swiftkv.Context(
            host_budget_bytes=(0 if cuda else region_bytes) + (16 << 20),
            coord_endpoint=self.endpoint, device_mask=(1 << index) if cuda else 0)
        lender = dataclasses.replace(self.geo.lender, device=index if cuda else swiftkv.DEVICE_HOST)
        self.region = self.ctx.elastic(
            lender, self.geo.borrower, capacity_blocks=g.capacity_blocks,
            owned_blocks=g.capacity_blocks, lease_ms=int(self.opts["lease_ms"]),
            reclaim_deadline_ms=int(float(self.opts["reclaim_deadline_s"]) * 1000),
            host_granule_bytes=0 if cuda else int(granule))
        self.owned_units = g.units
        base = int(self.region.layer_view(0)["base"])
        if cuda:
            t = torch.as_tensor(_CudaBytes(base, g.raw_bytes), device=dev)
            t.zero_()  # device memory comes uninitialized; vLLM asked for zeros
        else:  # (a memfd's new pages are zeros)
            buf = (ctypes.c_int8 * g.raw_bytes).from_address(base)
            t = torch.frombuffer(buf, dtype=torch.int8)
        self.tensor = t
        return t

    @contextlib.contextmanager
    def allocation(self):
        """vLLM's KV cache allocation, served from the region."""
        mode = _AllocateInRegion(self.geo.raw_bytes, self._make)
        with mode:
            yield
        if mode.served is None:
            raise RuntimeError(
                "SwiftKVConnector: vLLM did not allocate its KV cache as one torch.zeros of "
                f"{self.geo.raw_bytes} bytes inside the connector's memory pool context: this "
                "vLLM allocates otherwise, and cannot lend through this connector")

    def check_views(self, layers: list) -> None:
        """vLLM's per-layer views lie in the region, block-outermost: block b of every layer in
        bytes [b * bpb, (b + 1) * bpb) of it. Raises naming what is not so."""
        if self.tensor is None:
            raise RuntimeError("SwiftKVConnector: lending, but vLLM's KV cache was not "
                               "allocated in the connector's memory pool context")
        lo = self.tensor.data_ptr()
        hi = lo + self.geo.raw_bytes
        bpb = self.geo.block_bytes
        for i, t in enumerate(layers):
            start = t.data_ptr()
            if not lo <= start < hi:
                raise RuntimeError(f"SwiftKVConnector: layer {i}'s KV cache is not in the "
                                   "lending region")
            # The block axis is the first: its stride, in bytes, is a whole block of all layers
            # (for kernel blocks smaller than vLLM's, a whole block over their count).
            stride = t.stride(0) * t.element_size()
            per = self.geo.num_blocks and t.shape[0] // self.geo.num_blocks
            if per < 1 or stride * per != bpb:
                raise RuntimeError(
                    f"SwiftKVConnector: lending needs a block-outermost KV cache layout (BLHNC or "
                    f"BLNHC); layer {i} steps {stride} bytes a page over {t.shape[0]} pages, not "
                    f"{bpb} a block: vLLM chose another layout (its attention backend may not "
                    "take BLHNC; docs/vllm.md, Lending)")

    def offer(self) -> None:
        self.region.offer(self.name)
        log.info("SwiftKVConnector: lending on %s as %s: %d units of %d blocks (%d bytes)",
                 self.endpoint, self.name, self.geo.units, self.geo.unit_blocks,
                 self.geo.unit_blocks * self.geo.block_bytes)

    # --- the orders --------------------------------------------------------------------------

    def apply(self, release: list, restore: list) -> None:
        """The scheduler's orders of a step (lending.Orders): units to give to the library and
        units to take back, by number from the tail (unit 0 is the last)."""
        units = self.geo.units
        for k in release:
            want = units - k - 1  # owned units once unit k is given up
            if want != self.owned_units - 1:
                raise RuntimeError(f"SwiftKVConnector: the scheduler released unit {k}, but this "
                                   f"worker owns {self.owned_units} of {units} units")
            self.region.resize(want * self.geo.unit_blocks)
            self.owned_units = want
            self.report.released.setdefault(k, set()).add(self.cfg.rank)
            self.stats["units_released"] += 1
        for k in restore:
            want = units - k
            if want != self.owned_units + 1:
                raise RuntimeError(f"SwiftKVConnector: the scheduler restored unit {k}, but this "
                                   f"worker owns {self.owned_units} of {units} units")
            self.region.resize(want * self.geo.unit_blocks)
            self.owned_units = want
            self.restoring.add(k)

    def take_report(self) -> Optional[LendReport]:
        """What is done since the last report: a unit being restored is done once no lease on
        the region is asked back any more (released by its borrower, or expired)."""
        if self.restoring and self.region.stats()["reclaiming_blocks"] == 0:
            for k in self.restoring:
                self.report.restored.setdefault(k, set()).add(self.cfg.rank)
                self.stats["units_restored"] += 1
            self.restoring.clear()
        report, self.report = self.report, LendReport()
        return report if report else None

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.close()  # ends the region; borrowers lose their leases
            self.ctx = None
            self.region = None
