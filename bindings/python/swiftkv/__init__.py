"""Python binding of libswiftkv: KV-cache memory sharing between co-located LLMs.

The raw module ``swiftkv.capi`` is SWIG over the C header: every ``swiftkv_*`` function, the
versioned structs (with ``<struct>_init()`` giving the header's defaults) and the constants. A
failed call raises :class:`Error`; a call returns its status (``OK`` or ``IN_PROGRESS``) followed
by its outputs; the GIL is released while the library works.

This layer removes the boilerplate: handles are objects that end their C object on ``close()``
or when the ``with`` block ends (a context's regions, pools and requests before the context;
``Context.close`` waits for the calls other threads are making into it, and later calls raise
:class:`StateError`), structs come back as dicts, token and KV arrays are numpy arrays (any buffer works), and engine
tensors pass as numpy arrays or raw addresses (``tensor.data_ptr()``).

    import numpy as np, swiftkv
    m = swiftkv.ModelDesc("llama", num_layers=4, num_kv_heads=2, head_dim=64, chunk_tokens=32)
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        model = ctx.register_model(m)
        tokens = np.arange(64, dtype=np.uint32)
        kv = np.zeros(2 * m.chunk_bytes, dtype=np.uint8)
        model.store(tokens, kv)
        print(model.lookup(tokens)["prefix_tokens"])    # 64
"""

from __future__ import annotations

import ctypes
import enum
import functools
import os
import threading
import weakref
from dataclasses import asdict, dataclass, fields, make_dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

from . import capi as _c
from .tensors import HOST as _HOST, TensorInfo, host_array as _host_array, stream_handle, tensor_info

__all__ = [
    "Error", "InvalidArgument", "OutOfMemory", "NotFound", "Busy", "IOFailure", "CudaError",
    "NoDevice", "PeerError", "TimedOut", "VersionMismatch", "Unsupported", "UserError",
    "StateError", "InternalError", "Status", "DType", "Tier", "Role", "RequestShape", "EvictionPolicy", "MemoryKind",
    "CudaAlloc", "RemotePath", "TierOrder", "wait_layer_load_batch", "save_layer_batch",
    "ChunkEventReason", "DEVICE_MASK_ALL", "ModelDesc", "Context", "Model", "Elastic", "Pool", "Request",
    "version", "version_string", "status_string", "last_error_message", "dtype_size",
    "device_count",
    "bytes_per_token", "meu", "lend_unit", "plan_borrower", "plan_scale_up", "plan_scale_down",
    "AttentionDesc", "attention_workspace_size", "attention_workspace", "AttentionPlan", "DEVICE_HOST", "LEASE_ALL",
    "MODEL_ALL", "TIERS_ALL", "MAX_CHUNK_NAME_BYTES", "tier_mask", "TensorInfo", "tensor_info", "stream_handle",
    "POOL_LAYOUTS", "Record", "Lookup", "CodecKind", "Codec", "Method", "Adaptive", "ChunkInfo",
]

# --- Errors and enums ----------------------------------------------------------------------------

class Error(Exception):
    """A libswiftkv call failed: .status (a Status) and .message (the library's words). Each
    status raises its own subclass (InvalidArgument for EINVAL, NotFound for ENOTFOUND, ...;
    Error.of(status) names it), so ``except swiftkv.Busy`` works as well as checking .status."""

    cached_tokens = None  # set by Model.store when it failed after caching a leading part
    cached_chunks = None  # set by Model.store_named likewise

    def __init__(self, status: int, message: str):
        super().__init__(int(status), message)

    @property
    def status(self) -> "Status":
        return Status(self.args[0])

    @property
    def message(self) -> str:
        return self.args[1]

    def __str__(self) -> str:
        return f"{Status(self.args[0]).name}: {self.args[1]}"

    @staticmethod
    def of(status: int) -> type:
        """The class that a failure of `status` raises."""
        return _ERRORS.get(int(status), Error)


class InvalidArgument(Error, ValueError):
    """EINVAL: an argument is wrong (the message names it); nothing changed."""


class OutOfMemory(Error):
    """ENOMEM: no memory, budget or room for it."""


class NotFound(Error, LookupError):
    """ENOTFOUND: the named object (chunk, model, request, lease) does not exist."""


class Busy(Error):
    """EBUSY: in use, registered already, or a bound reached."""


class IOFailure(Error):
    """EIO: a disk read or write failed."""


class CudaError(Error):
    """ECUDA: a CUDA call failed."""


class NoDevice(Error):
    """ENODEV: no usable CUDA device for it."""


class PeerError(Error):
    """EPEER: the other process broke the protocol or went away."""


class TimedOut(Error):
    """ETIMEDOUT: a wait ran out of time."""


class VersionMismatch(Error):
    """EVERSION: an unknown struct size or version, or another protocol version."""


class Unsupported(Error):
    """EUNSUPPORTED: not in this build or on this device."""


class UserError(Error):
    """EUSER: a callback failed."""


class StateError(Error):
    """ESTATE: a call out of order, or on something closed."""


class InternalError(Error):
    """EINTERNAL: a bug in libswiftkv."""


class Status(enum.IntEnum):
    OK = _c.SWIFTKV_OK
    IN_PROGRESS = _c.SWIFTKV_IN_PROGRESS
    EINVAL = _c.SWIFTKV_EINVAL
    ENOMEM = _c.SWIFTKV_ENOMEM
    ENOTFOUND = _c.SWIFTKV_ENOTFOUND
    EBUSY = _c.SWIFTKV_EBUSY
    EIO = _c.SWIFTKV_EIO
    ECUDA = _c.SWIFTKV_ECUDA
    ENODEV = _c.SWIFTKV_ENODEV
    EPEER = _c.SWIFTKV_EPEER
    ETIMEDOUT = _c.SWIFTKV_ETIMEDOUT
    EVERSION = _c.SWIFTKV_EVERSION
    EUNSUPPORTED = _c.SWIFTKV_EUNSUPPORTED
    EUSER = _c.SWIFTKV_EUSER
    ESTATE = _c.SWIFTKV_ESTATE
    EINTERNAL = _c.SWIFTKV_EINTERNAL


class DType(enum.IntEnum):
    F16 = _c.SWIFTKV_DTYPE_F16
    BF16 = _c.SWIFTKV_DTYPE_BF16
    F32 = _c.SWIFTKV_DTYPE_F32
    FP8_E4M3 = _c.SWIFTKV_DTYPE_FP8_E4M3
    FP8_E5M2 = _c.SWIFTKV_DTYPE_FP8_E5M2
    I8 = _c.SWIFTKV_DTYPE_I8


class Tier(enum.IntEnum):
    """A tier's number (swiftkv_tier): what residency and events report. Masks of tiers (clear's
    tier_mask) are bits: ``Tier.HOST.bit`` or ``tier_mask(Tier.HOST, Tier.DISK)``."""

    PEER = _c.SWIFTKV_TIER_PEER
    HOST = _c.SWIFTKV_TIER_HOST
    DISK = _c.SWIFTKV_TIER_DISK
    DROPPED = _c.SWIFTKV_TIER_DROPPED
    REMOTE = _c.SWIFTKV_TIER_REMOTE  # memory lent by another host (numbered after DROPPED)

    @property
    def bit(self) -> int:
        """This tier's bit in a tier mask (SWIFTKV_TIER_BIT)."""
        if self is Tier.DROPPED:
            raise ValueError("DROPPED is not a tier a mask can name")
        return 1 << int(self)


def tier_mask(*tiers) -> int:
    """The mask of the given tiers (each a Tier, or an iterable of them)."""
    mask = 0
    for t in tiers:
        if isinstance(t, Tier):
            mask |= t.bit
        elif isinstance(t, int):
            raise TypeError("tier_mask takes Tier values; a plain int is ambiguous (a tier "
                            "number or already a mask)")
        else:
            mask |= tier_mask(*t)
    return mask


def _mask(tiers) -> int:
    """clear's tier_mask argument: a Tier or an iterable of them means their bits; a plain int
    is a mask already (TIERS_ALL, Tier.HOST.bit)."""
    if isinstance(tiers, Tier):
        return tiers.bit
    if isinstance(tiers, int):
        return tiers
    return tier_mask(*tiers)


class RequestShape(enum.IntEnum):
    """What a connector request does: LOAD_AND_SAVE (per layer wait_layer_load then save_layer,
    then wait_save), LOAD_ONLY (start_load, then wait_layer_load per layer; nothing saved) or
    SAVE_ONLY (save_layer per layer, then wait_save; nothing loaded)."""

    LOAD_AND_SAVE = _c.SWIFTKV_REQUEST_LOAD_AND_SAVE
    LOAD_ONLY = _c.SWIFTKV_REQUEST_LOAD_ONLY
    SAVE_ONLY = _c.SWIFTKV_REQUEST_SAVE_ONLY


class Role(enum.IntEnum):
    LENDER = _c.SWIFTKV_ROLE_LENDER
    BORROWER = _c.SWIFTKV_ROLE_BORROWER


class EvictionPolicy(enum.IntEnum):
    LRU = _c.SWIFTKV_EVICT_LRU
    RETENTION = _c.SWIFTKV_EVICT_RETENTION


class RemotePath(enum.IntEnum):
    """How a borrower reaches a lender's memory in another process (swiftkv_remote_path)."""

    AUTO = _c.SWIFTKV_REMOTE_PATH_AUTO
    UCX = _c.SWIFTKV_REMOTE_PATH_UCX
    LOCAL = _c.SWIFTKV_REMOTE_PATH_LOCAL


class TierOrder(enum.IntEnum):
    """Where the remote tier stands in the chunk cache's chain (swiftkv_tier_order)."""

    REMOTE_FIRST = _c.SWIFTKV_TIER_ORDER_REMOTE_FIRST  # peer, remote, host, disk
    HOST_FIRST = _c.SWIFTKV_TIER_ORDER_HOST_FIRST  # peer, host, remote, disk


class MemoryKind(enum.IntEnum):
    HOST_MEMFD = _c.SWIFTKV_MEMORY_HOST_MEMFD
    CUDA_VMM = _c.SWIFTKV_MEMORY_CUDA_VMM
    CUDA_IPC = _c.SWIFTKV_MEMORY_CUDA_IPC
    HOST_GRANULES = _c.SWIFTKV_MEMORY_HOST_GRANULES


class CudaAlloc(enum.IntEnum):
    AUTO = _c.SWIFTKV_CUDA_ALLOC_AUTO
    VMM = _c.SWIFTKV_CUDA_ALLOC_VMM
    MALLOC = _c.SWIFTKV_CUDA_ALLOC_MALLOC


class ChunkEventReason(enum.IntEnum):
    EVICTED = _c.SWIFTKV_CHUNK_EVICTED
    REVOKED = _c.SWIFTKV_CHUNK_REVOKED
    CORRUPT = _c.SWIFTKV_CHUNK_CORRUPT


_ERRORS = {int(s): cls for s, cls in (
    (Status.EINVAL, InvalidArgument), (Status.ENOMEM, OutOfMemory), (Status.ENOTFOUND, NotFound),
    (Status.EBUSY, Busy), (Status.EIO, IOFailure), (Status.ECUDA, CudaError),
    (Status.ENODEV, NoDevice), (Status.EPEER, PeerError), (Status.ETIMEDOUT, TimedOut),
    (Status.EVERSION, VersionMismatch), (Status.EUNSUPPORTED, Unsupported),
    (Status.EUSER, UserError), (Status.ESTATE, StateError), (Status.EINTERNAL, InternalError))}
_c.swiftkv_py_set_error_classes(Error, _ERRORS)
_c.Error = Error

DEVICE_HOST = _c.SWIFTKV_DEVICE_HOST
LEASE_ALL = _c.swiftkv_py_lease_all()
MODEL_ALL = _c.swiftkv_py_model_all()
DEVICE_MASK_ALL = _c.swiftkv_py_device_mask_all()
TIERS_ALL = _c.SWIFTKV_TIERS_ALL
# The longest chunk name the *_named calls take, in bytes.
MAX_CHUNK_NAME_BYTES = _c.SWIFTKV_MAX_CHUNK_NAME_BYTES


def version() -> int:
    return _c.swiftkv_version()


def version_string() -> str:
    return _c.swiftkv_version_string()


def status_string(status: int) -> str:
    return _c.swiftkv_status_string(int(status))


def last_error_message() -> str:
    return _c.swiftkv_last_error_message()


def dtype_size(dtype: int) -> int:
    """Bytes of one element (0 for a value that is not a DType)."""
    return _c.swiftkv_dtype_size(int(dtype))


def _fields(s, names) -> dict:
    return {n: getattr(s, n) for n in names}


def _struct_fields(s) -> dict:
    """Every field of a SWIG struct proxy but size and version, as a dict."""
    names = [n for n, v in type(s).__dict__.items() if isinstance(v, property)]
    return {n: getattr(s, n) for n in names if n not in ("size", "version", "this", "thisown")}


class Record:
    """What the library fills in (stats, leases, a lookup, a request's info, ...): a frozen
    dataclass with the C struct's fields as attributes. ``r["field"]``, ``"field" in r``,
    ``dict(r)`` and ``r.as_dict()`` also work, for code written when these were dicts."""

    __slots__ = ()

    def __getitem__(self, name: str):
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def __contains__(self, name: str) -> bool:
        return name in self.keys()

    def keys(self) -> list:
        return [f.name for f in fields(self)]

    def get(self, name: str, default=None):
        return getattr(self, name, default)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(eq=False, slots=True)
class Lookup(Record):
    """What a prompt can reuse (swiftkv_lookup_result), with the tier of each full chunk.

    A prefix-caching engine loads [0, prefix_tokens). With a chunk missing before or between
    cached ones, [dropped_head_tokens, dropped_head_tokens + loadable_tokens) is the longest
    cached run (the earliest of equal ones): recompute the tokens before it, load it, compute
    the rest. When that run is the prefix, dropped_head_tokens is 0."""

    chunks: int
    prefix_tokens: int
    dropped_head_tokens: int
    loadable_tokens: int
    chunks_per_tier: list  # peer, host, disk (index by Tier)
    remote_chunks: int  # in the remote tier
    residency: np.ndarray


_RECORD_TYPES: dict = {}


def _record(name: str, values: dict, eq: bool = True) -> Record:
    """A Record subclass named `name` with these fields (made once per field list)."""
    key = (name, tuple(values))
    cls = _RECORD_TYPES.get(key)
    if cls is None:
        cls = make_dataclass(name, list(values), bases=(Record,), frozen=True, eq=eq)
        _RECORD_TYPES[key] = cls
    return cls(**values)


# The library's defaults (swiftkv_<struct>_init), read once: the numbers live in the library only.
_MODEL_DEFAULTS = _c.swiftkv_model_desc_init()
_ELASTIC_DEFAULTS = _c.swiftkv_elastic_config_init()
_ATTENTION_DEFAULTS = _c.swiftkv_attention_desc_init()


# --- Geometry and planning ---------------------------------------------------------------------


@dataclass
class ModelDesc:
    """A model's KV geometry (swiftkv_model_desc). ``identity`` goes into every chunk key with
    the name: a weights revision, an adapter, a tenant or a salt; models differing only in it
    never share chunks (None or "": none)."""

    name: Optional[str] = None
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    block_tokens: int = _MODEL_DEFAULTS.block_tokens
    chunk_tokens: int = _MODEL_DEFAULTS.chunk_tokens
    dtype: DType = DType.F16
    device: int = DEVICE_HOST
    identity: Optional[str] = None

    def struct(self):
        """The C struct; it points to self.name, so keep this object alive while it is used."""
        d = _c.swiftkv_model_desc_init()
        d.name = self.name
        d.num_layers = self.num_layers
        d.num_kv_heads = self.num_kv_heads
        d.head_dim = self.head_dim
        d.block_tokens = self.block_tokens
        d.chunk_tokens = self.chunk_tokens
        d.dtype = int(self.dtype)
        d.device = self.device
        d.identity = self.identity
        return d

    @property
    def bytes_per_token(self) -> int:
        return bytes_per_token(self)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one cached chunk (all layers, K and V)."""
        return self.bytes_per_token * self.chunk_tokens


def bytes_per_token(m: ModelDesc) -> int:
    _, n = _c.swiftkv_geometry_bytes_per_token(m.struct())
    return n


def meu(borrower: ModelDesc, lender: ModelDesc) -> tuple[int, int]:
    """(borrower_blocks, lender_blocks): the minimum elastic unit (Eq. 6-9)."""
    _, b, l = _c.swiftkv_geometry_meu(borrower.struct(), lender.struct())
    return b, l


def lend_unit(borrower: ModelDesc, lender: ModelDesc) -> tuple[int, int]:
    """(borrower_chunks, lender_blocks): the unit elastic regions lend in."""
    _, c, b = _c.swiftkv_geometry_lend_unit(borrower.struct(), lender.struct())
    return c, b


def plan_borrower(borrower: ModelDesc, borrower_kv_bytes: int,
                  lender_kv_bytes: Sequence[int] = ()) -> Record:
    """The borrower's layer stream cache and regular cache (Eq. 1-5)."""
    out = _c.swiftkv_capacity_plan_init()
    lenders = np.asarray(lender_kv_bytes, dtype=np.uint64) if len(lender_kv_bytes) else None
    _c.swiftkv_plan_borrower(borrower.struct(), borrower_kv_bytes, lenders, out)
    return _record("CapacityPlan", _struct_fields(out))


def plan_scale_up(owned_blocks, block_tokens, meu_lender, meu_borrower, request_tokens):
    """Algorithm 1 ScaleUp: (lender_delta, borrower_delta)."""
    _, l, b = _c.swiftkv_plan_scale_up(owned_blocks, block_tokens, meu_lender, meu_borrower,
                                       request_tokens)
    return l, b


def plan_scale_down(owned_blocks, block_tokens, meu_lender, meu_borrower, max_tokens_in_window):
    """Algorithm 1 ScaleDown: (lender_delta, borrower_delta)."""
    _, l, b = _c.swiftkv_plan_scale_down(owned_blocks, block_tokens, meu_lender, meu_borrower,
                                         max_tokens_in_window)
    return l, b


def device_count() -> int:
    _, n = _c.swiftkv_device_count()
    return n


# --- The context ---------------------------------------------------------------------------------

_callback = threading.local()  # .depth: > 0 on a thread running a callback of the library's
_contexts: "weakref.WeakSet[Context]" = weakref.WeakSet()  # every open one, for fork


def _after_fork_in_child() -> None:
    """In the child of os.fork: every open context is the parent's (its threads, host slabs,
    lent memory and disk are), so each is marked as inherited: its calls raise StateError and
    its close releases nothing. Its locks are made anew: a parent's thread may have held them
    at the fork."""
    for ctx in list(_contexts):
        ctx._inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _in_call(method):
    """A call into the library through the method's context (self._context): counted while it
    runs, so that Context.close waits for it; StateError once the context is closing."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        ctx = self._context
        ctx._enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            ctx._leave()
    return call



class Context:
    """One per engine process (swiftkv_ctx). Keyword arguments are swiftkv_ctx_config fields;
    ``clock`` is a callable returning monotonic nanoseconds. Thread-safe, like the C context.

    ``device_mask`` defaults to every CUDA device this process sees (none on a machine without
    one), where the C config's default is 0, host memory only: a Python engine with a model on
    a GPU needs no option for its pools and loads there. Pass ``device_mask=0`` for host only
    (its host memory is then not page-locked)."""

    _CONFIG = ("device_mask", "host_budget_bytes", "host_numa_node", "disk_path",
               "disk_budget_bytes", "eviction_policy", "demote_free_percent",
               "recompute_token_cost", "recompute_attention_cost", "attention_cost_table",
               "attention_cost_entries", "maintenance_interval_ms", "coord_endpoint",
               "coord_heartbeat_ms", "coord_timeout_ms", "disk_segment_bytes", "disk_sync_ms",
               "transfer_threads", "max_open_requests", "write_back_on_close",
               "coord_ucx_transports", "coord_remote_path", "coord_rma_timeout_ms",
               "tier_order")

    def __init__(self, *, clock: Optional[Callable[[], int]] = None, **config):
        c = _c.swiftkv_ctx_config_init()
        if "device_mask" not in config:
            config["device_mask"] = (1 << device_count()) - 1
        keep = []
        table = config.pop("attention_cost_table", None)
        if table is not None:
            arr = np.ascontiguousarray(table, dtype=np.float64)
            keep.append(arr)
            c.attention_cost_table = arr
            c.attention_cost_entries = len(arr)
        for k, v in config.items():
            if k not in self._CONFIG:
                raise TypeError(f"unknown context option {k!r}")
            if isinstance(v, str):
                keep.append(v)
            setattr(c, k, int(v) if isinstance(v, (enum.IntEnum, bool)) else v)
        if clock is not None:
            _c.swiftkv_py_ctx_config_set_clock(c, clock)
        self._clock = clock  # the library calls it for the context's life
        _, self._h = _c.swiftkv_ctx_create(c)
        self._children: dict = {}  # id -> open child, in creation order
        self._event_fn = None
        self._lock = threading.Lock()  # one close at a time
        # Calls in flight (the C context must outlive them): their count, per thread, and
        # whether close() has begun (no call starts after).
        self._calls_cv = threading.Condition(threading.Lock())
        self._calls = 0
        self._callers: dict = {}  # thread id -> its calls in flight
        self._closing = False
        self._pid = os.getpid()  # the process that made it
        self._forked = False  # set in the child of a fork: the context is the parent's
        _contexts.add(self)

    _context = property(lambda self: self)

    def _inherited(self) -> None:
        """This process is a fork of the one that made the context (os.register_at_fork)."""
        self._forked = True
        self._lock = threading.Lock()
        self._calls_cv = threading.Condition(threading.Lock())
        self._calls = 0
        self._callers = {}

    def _refuse_forked(self) -> None:
        if self._forked:
            raise StateError(Status.ESTATE, f"the context was made by process {self._pid} and "
                             f"this is process {os.getpid()}, a fork of it: a context belongs "
                             "to the process that made it (make a new Context in the child)")

    @property
    def handle(self):
        self._refuse_forked()
        if self._h is None:
            raise StateError(Status.ESTATE, "the context is closed")
        return self._h

    def _enter(self) -> None:
        me = threading.get_ident()
        self._refuse_forked()
        with self._calls_cv:
            if self._closing or self._h is None:
                raise StateError(Status.ESTATE, "the context is closed")
            self._calls += 1
            self._callers[me] = self._callers.get(me, 0) + 1

    def _leave(self) -> None:
        me = threading.get_ident()
        with self._calls_cv:
            self._calls -= 1
            n = self._callers[me] - 1
            if n:
                self._callers[me] = n
            else:
                del self._callers[me]
            if self._closing and self._calls == 0:
                self._calls_cv.notify_all()

    def close(self) -> None:
        """Ends the context and everything made from it (requests, pools, regions first).
        Waits for the calls other threads are making into the context, its models, pools,
        requests and regions; every call after (or waiting to start) raises StateError. From
        inside a call of this context's, or from a callback of the library's, it raises
        StateError: it would wait for itself.

        In the child of a fork the context is the parent's: close releases nothing (the
        child's copies go with its exit) and only marks it closed here."""
        if self._forked:
            for child in self._children.values():
                child._abandon()
            self._children.clear()
            self._h = None
            self._event_fn = None
            return
        with self._lock:
            with self._calls_cv:
                if self._h is None:
                    return
                if self._callers.get(threading.get_ident()) or getattr(_callback, "depth", 0):
                    raise StateError(Status.ESTATE, "Context.close from inside a call into the "
                                     "context or a callback of the library's: it would wait "
                                     "for itself")
                self._closing = True
                while self._calls:
                    self._calls_cv.wait()
            try:
                for child in reversed(list(self._children.values())):
                    child._close()
                self._children.clear()
                if self._event_fn is not None:
                    _c.swiftkv_py_set_chunk_event_callback(self._h, None)
                _c.swiftkv_ctx_destroy(self._h)
            finally:
                self._h = None
                self._event_fn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _adopt(self, child):
        self._children[id(child)] = child
        return child

    def _forget(self, child) -> None:
        """child was closed by its owner: the context stops holding it."""
        self._children.pop(id(child), None)

    @_in_call
    def config(self) -> Record:
        out = _c.swiftkv_ctx_config_init()
        _c.swiftkv_ctx_get_config(out, self.handle)
        d = _struct_fields(out)
        d.pop("clock", None)
        d.pop("clock_user_data", None)
        return _record("ContextConfig", d)

    @_in_call
    def device_count(self) -> int:
        _, n = _c.swiftkv_ctx_device_count(self.handle)
        return n

    @_in_call
    def register_model(self, desc: ModelDesc, role: Role = Role.BORROWER) -> "Model":
        cfg = _c.swiftkv_model_config_init()
        d = desc.struct()
        cfg.desc = d
        cfg.role = int(role)
        _, mid = _c.swiftkv_model_register(self.handle, cfg)
        return Model(self, mid, desc, role)

    @_in_call
    def elastic(self, lender: ModelDesc, borrower: Optional[ModelDesc] = None, *,
                capacity_blocks: int, owned_blocks: int = 0,
                window_ms: int = _ELASTIC_DEFAULTS.window_ms,
                lease_ms: int = _ELASTIC_DEFAULTS.lease_ms, cuda_alloc: CudaAlloc = CudaAlloc.AUTO,
                keep_committed: bool = False,
                clock: Optional[Callable[[], int]] = None,
                reclaim_deadline_ms: int = _ELASTIC_DEFAULTS.reclaim_deadline_ms,
                host_granule_bytes: int = _ELASTIC_DEFAULTS.host_granule_bytes) -> "Elastic":
        """A lender's elastic region (swiftkv_elastic_create). A lease asked back is renewed
        to at most reclaim_deadline_ms after the asking, then expires, released or not. A host
        region with host_granule_bytes (a multiple of the page size) is one memfd per granule,
        passed to a borrower in another process with each lease rather than whole."""
        return self._adopt(Elastic(self, lender, borrower, capacity_blocks, owned_blocks,
                                   window_ms, lease_ms, cuda_alloc, keep_committed, clock,
                                   reclaim_deadline_ms, host_granule_bytes))

    @_in_call
    def stats(self) -> Record:
        out = _c.swiftkv_stats_init()
        _c.swiftkv_stats_get(out, self.handle)
        return _record("Stats", _struct_fields(out))

    @_in_call
    def codec_stats(self) -> Record:
        """Cached chunks, decoded and stored bytes by codec (rows: CodecKind) and tier
        (columns: Tier), with the encode, decode and lossy-refused counters."""
        out = _c.swiftkv_codec_stats_init()
        _c.swiftkv_codec_stats_get(out, self.handle)
        return _record("CodecStats", _struct_fields(out))

    @_in_call
    def metrics_text(self) -> str:
        """The context's counters in Prometheus' text exposition format (swiftkv_metrics_text;
        the names are listed in docs/api.md). swiftkv.metrics.Collector(ctx) serves them to a
        prometheus_client registry."""
        size = 16 << 10
        while True:
            buf = bytearray(size)
            _, n = _c.swiftkv_metrics_text(buf, self.handle)
            if n < size:
                return bytes(buf[:n]).decode()
            size = n + 1

    @_in_call
    def coord_stats(self) -> Record:
        out = _c.swiftkv_coord_stats_init()
        _c.swiftkv_coord_stats_get(out, self.handle)
        return _record("CoordStats", _struct_fields(out))

    @_in_call
    def on_chunk_event(self, fn: Optional[Callable[[dict], None]]) -> None:
        """fn(event) after the cache moved or dropped a chunk on its own, on a library thread;
        event has model, from_tier, to_tier, reason, key. None removes it."""
        if fn is None:
            _c.swiftkv_py_set_chunk_event_callback(self.handle, None)
            self._event_fn = None
            return

        def trampoline(model, frm, to, reason, key_lo, key_hi):
            _callback.depth = getattr(_callback, "depth", 0) + 1
            try:
                fn({"model": model, "from_tier": Tier(frm), "to_tier": Tier(to),
                    "reason": ChunkEventReason(reason), "key": (key_hi << 64) | key_lo})
            finally:
                _callback.depth -= 1

        _c.swiftkv_py_set_chunk_event_callback(self.handle, trampoline)
        self._event_fn = trampoline  # held until replaced: the library points to it

    @_in_call
    def clear(self, tier_mask=TIERS_ALL) -> int:
        """Drops the unpinned chunks of every model in the given tiers: a Tier, several, or a
        mask (TIERS_ALL, tier_mask(...))."""
        _, n = _c.swiftkv_clear(self.handle, MODEL_ALL, _mask(tier_mask), None)
        return n


class CodecKind(enum.IntEnum):
    """A chunk encoding (swiftkv_codec; docs/codecs.md gives the formats and error bounds)."""

    RAW = _c.SWIFTKV_CODEC_RAW
    ZSTD = _c.SWIFTKV_CODEC_ZSTD
    KIVI = _c.SWIFTKV_CODEC_KIVI
    FP8 = _c.SWIFTKV_CODEC_FP8


@dataclass(frozen=True)
class Codec:
    """An encoding: bits and group are KIVI's, byte_planes and zstd_level zstd's (the fields
    another codec uses stay 0; zstd_level is not part of the format and reads back as 0)."""

    kind: CodecKind = CodecKind.RAW
    bits: int = 0
    group: int = 0
    byte_planes: bool = False
    zstd_level: int = 0

    def _params(self):
        p = _c.swiftkv_codec_params_init()
        p.codec = int(self.kind)
        p.bits = self.bits
        p.group = self.group
        p.byte_planes = 1 if self.byte_planes else 0
        if self.zstd_level:
            p.zstd_level = self.zstd_level
        return p


@dataclass(frozen=True)
class Method:
    """A method the adaptive policy may choose (swiftkv_compression_method), with the engine's
    own quality in [0, 1] and decoder speed in GB/s; None: the library measures it."""

    codec: Codec
    quality: Optional[float] = None
    decode_gbps: Optional[float] = None


@dataclass(frozen=True)
class Adaptive:
    """The adaptive policy's parameters (docs/codecs.md, "The adaptive policy"); None takes the
    library's default, and no methods the default set."""

    alpha: Optional[float] = None
    reuse_horizon_s: Optional[float] = None
    host_gbps: Optional[float] = None
    disk_gbps: Optional[float] = None
    recompute_gbps: Optional[float] = None
    methods: tuple = ()


class _ChunkInfoC(ctypes.Structure):
    _fields_ = [("tier", ctypes.c_uint8), ("codec", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lossy", ctypes.c_uint8), ("group", ctypes.c_uint16),
                ("byte_planes", ctypes.c_uint8), ("reserved0", ctypes.c_uint8),
                ("stored_bytes", ctypes.c_uint64)]


@dataclass(frozen=True)
class ChunkInfo:
    """How one chunk is cached (swiftkv_chunk_info); codec is None when it is not cached."""

    tier: Tier
    codec: Optional[Codec]
    lossy: bool
    stored_bytes: int


# --- Models and the chunk cache ----------------------------------------------------------------


def _host_values(values):
    """A torch tensor (any device) as a host numpy array; anything else as it is."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):
        return values.detach().cpu().numpy()
    return values


def _tokens(tokens):
    """Tokens as a C-contiguous uint32 numpy array: a uint32 array passes as it is (no copy);
    other integer arrays (torch int64 input_ids, lists) are converted, values checked."""
    if (type(tokens) is np.ndarray and tokens.dtype == np.uint32 and tokens.ndim == 1
            and tokens.flags.c_contiguous):
        return tokens
    a = np.asarray(_host_values(tokens))
    if a.ndim == 2 and a.shape[0] == 1:  # a batch of one, as transformers' input_ids
        a = a[0]
    if a.ndim != 1:
        raise ValueError(f"tokens must be one sequence: 1-D or [1, T], not shape {a.shape}")
    if a.dtype == np.uint32:
        return np.ascontiguousarray(a)
    if a.size == 0:
        return np.zeros(0, np.uint32)
    if a.dtype.kind not in "iu":
        raise TypeError(f"tokens must be integers, not {a.dtype}")
    # One pass: a negative value or one of 2**32 and more has bits above the low 32.
    if (a < 0).any() if a.itemsize <= 4 else (a >> 32).any():
        raise ValueError("tokens must be in [0, 2**32)")
    return np.ascontiguousarray(a, dtype=np.uint32)


def _names(names):
    """Chunk names as (a C-contiguous uint8 array [n, name_bytes], name_bytes): a 2-D uint8 array
    (a name per row), or a sequence of bytes-like names of one length (an engine's block hashes,
    SGLang's page keys as str are encoded as UTF-8)."""
    if isinstance(names, np.ndarray):
        a = names
    else:
        names = [n.encode() if isinstance(n, str) else bytes(n) for n in names]
        if not names:
            return np.zeros((0, 1), np.uint8), 1
        size = len(names[0])
        if any(len(n) != size for n in names):
            raise ValueError("chunk names must all have one length; got "
                             f"{sorted({len(n) for n in names})} bytes")
        a = np.frombuffer(b"".join(names), dtype=np.uint8).reshape(len(names), size)
    if a.ndim != 2 or a.dtype != np.uint8:
        raise ValueError(f"chunk names must be a [n, name_bytes] uint8 array, not {a.dtype} of "
                         f"shape {a.shape}")
    return np.ascontiguousarray(a), int(a.shape[1])


def _chunk_infos(arr) -> list:
    out = []
    for v in arr:
        tier = Tier(v.tier)
        codec = None if tier is Tier.DROPPED else Codec(
            CodecKind(v.codec), v.bits, v.group, bool(v.byte_planes))
        out.append(ChunkInfo(tier, codec, bool(v.lossy), v.stored_bytes))
    return out


class Model:
    """A registered model (its id in the context)."""

    def __init__(self, ctx: Context, mid: int, desc: ModelDesc, role: Role):
        self.ctx, self.id, self.desc, self.role = ctx, mid, desc, role

    _context = property(lambda self: self.ctx)

    @_in_call
    def unregister(self) -> None:
        _c.swiftkv_model_unregister(self.ctx.handle, self.id)

    @_in_call
    def lookup(self, tokens) -> "Lookup":
        """Where each full chunk of tokens is: the lookup result, with ``residency`` (a Tier
        per chunk, as a numpy uint8 array)."""
        if (type(tokens) is not np.ndarray or tokens.dtype.char != "I" or tokens.ndim != 1
                or not tokens.flags.c_contiguous):
            tokens = _tokens(tokens)  # a list, int64 arrays and tensors: converted, checked
        r = _c.swiftkv_py_lookup(self.ctx.handle, self.id, tokens, self.desc.chunk_tokens)
        return Lookup(r[0], r[1], r[2], r[3], list(r[4]), r[5],
                      np.frombuffer(r[6], dtype=np.uint8))

    @_in_call
    def store(self, tokens, kv) -> int:
        """Stores the chunks of tokens from kv (chunk-major bytes); the leading tokens cached.

        A chunk that cannot be written raises Error(EIO) with ``.cached_tokens``: the leading
        tokens cached before it, which stay cached."""
        st, n = _c.swiftkv_store(self.ctx.handle, self.id, _tokens(tokens),
                                 _host_array(kv, writable=False, what="store"))
        if st < 0:
            e = Error.of(st)(st, _c.swiftkv_last_error_message())
            e.cached_tokens = n
            raise e
        return n

    @_in_call
    def retrieve(self, tokens, start_token: int, out) -> int:
        """Copies cached chunks from start_token into out; the tokens copied."""
        _, n = _c.swiftkv_retrieve(self.ctx.handle, self.id, _tokens(tokens), start_token,
                                   _host_array(out, writable=True, what="retrieve"))
        return n

    # Chunks named by the caller (swiftkv_*_named): `names` is a [n, name_bytes] uint8 array or
    # a sequence of names of one length (1 to 64 bytes), one per chunk in sequence order, each
    # already chained over everything before its chunk (an engine's block or page keys).

    @_in_call
    def lookup_named(self, names) -> "Lookup":
        """Where each named chunk is (token counts are chunks times chunk_tokens)."""
        a, size = _names(names)
        res = np.zeros(len(a), dtype=np.uint8)
        out = _c.swiftkv_lookup_result_init()
        _c.swiftkv_lookup_named(out, res, self.ctx.handle, self.id, a, size)
        return Lookup(out.chunks, out.prefix_tokens, out.dropped_head_tokens,
                      out.loadable_tokens, list(out.chunks_per_tier), out.remote_chunks, res)

    @_in_call
    def store_named(self, names, kv, first_chunk: int = 0) -> int:
        """Stores the named chunks from kv (one chunk's bytes per name); the leading chunks
        cached. first_chunk: the number of the first name's chunk in its sequence. A chunk that
        cannot be written raises Error(EIO) with ``.cached_chunks``."""
        a, size = _names(names)
        st, n = _c.swiftkv_store_named(self.ctx.handle, self.id, a, size, first_chunk,
                                       _host_array(kv, writable=False, what="store_named"))
        if st < 0:
            e = Error.of(st)(st, _c.swiftkv_last_error_message())
            e.cached_chunks = n
            raise e
        return n

    @_in_call
    def retrieve_named(self, names, out) -> int:
        """Copies the named chunks from the first on into out; the chunks copied."""
        a, size = _names(names)
        _, n = _c.swiftkv_retrieve_named(self.ctx.handle, self.id, a, size,
                                         _host_array(out, writable=True, what="retrieve_named"))
        return n

    @_in_call
    def pin_named(self, names) -> None:
        a, size = _names(names)
        _c.swiftkv_pin_named(self.ctx.handle, self.id, a, size)

    @_in_call
    def unpin_named(self, names) -> None:
        a, size = _names(names)
        _c.swiftkv_unpin_named(self.ctx.handle, self.id, a, size)

    @_in_call
    def clear_named(self, names, tier_mask=TIERS_ALL) -> int:
        a, size = _names(names)
        _, n = _c.swiftkv_clear_named(self.ctx.handle, self.id, _mask(tier_mask), a, size)
        return n

    @_in_call
    def move_named(self, names, to: Tier) -> int:
        a, size = _names(names)
        _, n = _c.swiftkv_move_named(self.ctx.handle, self.id, a, size, int(to))
        return n

    @_in_call
    def chunk_keys_named(self, names) -> list:
        """The library's keys of the named chunks, as the chunk event callback reports them
        (event["key"], an int: key_hi << 64 | key_lo). Computes only."""
        a, size = _names(names)
        keys = np.zeros((len(a), 2), dtype=np.uint64)
        _c.swiftkv_chunk_keys_named(keys, self.ctx.handle, self.id, a, size)
        return [(int(hi) << 64) | int(lo) for lo, hi in keys]

    @_in_call
    def borrow(self, lender: "Elastic", max_units: int) -> int:
        """A lease of an elastic region of this process into the peer tier; the lease id."""
        _, lease = _c.swiftkv_borrow(self.ctx.handle, self.id, lender.handle, max_units)
        return lease

    @_in_call
    def borrow_remote(self, endpoint: str, lender_name: str, max_units: int) -> int:
        """A lease of the region offered as lender_name at endpoint (another process)."""
        _, lease = _c.swiftkv_borrow_remote(self.ctx.handle, self.id, endpoint, lender_name,
                                            max_units)
        return lease

    @_in_call
    def pin(self, tokens) -> None:
        _c.swiftkv_pin(self.ctx.handle, self.id, _tokens(tokens))

    @_in_call
    def unpin(self, tokens) -> None:
        _c.swiftkv_unpin(self.ctx.handle, self.id, _tokens(tokens))

    @_in_call
    def clear(self, tokens=None, tier_mask=TIERS_ALL) -> int:
        """Drops this model's unpinned chunks (of tokens, or all) in the given tiers: a Tier,
        several, or a mask."""
        t = None if tokens is None else _tokens(tokens)
        _, n = _c.swiftkv_clear(self.ctx.handle, self.id, _mask(tier_mask), t)
        return n

    @_in_call
    def move(self, tokens, to: Tier) -> int:
        _, n = _c.swiftkv_move(self.ctx.handle, self.id, _tokens(tokens), int(to))
        return n

    @_in_call
    def set_compression(self, *, accept_lossy: bool = False, host: Codec = Codec(),
                        disk: Codec = Codec(), adaptive: Optional[Adaptive] = None) -> None:
        """What this model asks of compression from now on (swiftkv_compression_set): whether
        loads may return lossy chunks, and either the codec of exact chunks entering host memory
        and the disk (raw: as they come) or, with adaptive, the utility policy that chooses each
        chunk's encoding."""
        cfg = _c.swiftkv_compression_config_init()
        cfg.accept_lossy = 1 if accept_lossy else 0
        cfg.host = host._params()
        cfg.disk = disk._params()
        if adaptive is not None:
            methods = tuple(adaptive.methods)
            if len(methods) > _c.SWIFTKV_MAX_COMPRESSION_METHODS:
                raise InvalidArgument(Status.EINVAL, f"at most {_c.SWIFTKV_MAX_COMPRESSION_METHODS}"
                                      f" methods, not {len(methods)}")
            cfg.adaptive = 1
            for name in ("alpha", "reuse_horizon_s", "host_gbps", "disk_gbps", "recompute_gbps"):
                value = getattr(adaptive, name)
                if value is not None:
                    setattr(cfg, name, float(value))
            cfg.n_methods = len(methods)
            for i, m in enumerate(methods):
                _c.swiftkv_py_compression_config_set_method(
                    cfg, i, m.codec._params(), -1.0 if m.quality is None else float(m.quality),
                    0.0 if m.decode_gbps is None else float(m.decode_gbps))
        _c.swiftkv_compression_set(self.ctx.handle, self.id, cfg)

    @_in_call
    def compress(self, tokens, codec: Optional[Codec] = None) -> int:
        """Re-encodes the chunks of tokens where they are (swiftkv_compress): under codec, or
        with None under what the model's adaptive policy chooses for each (EINVAL in fixed mode).
        Returns how many are stored so afterwards."""
        params = None if codec is None else codec._params()
        _, n = _c.swiftkv_compress(self.ctx.handle, self.id, _tokens(tokens), params)
        return n

    @_in_call
    def chunk_info(self, tokens) -> list:
        """How each full chunk of tokens is cached, recording no activity."""
        t = _tokens(tokens)
        n = len(t) // self.desc.chunk_tokens
        arr = (_ChunkInfoC * n)()
        _c.swiftkv_chunk_info_get(memoryview(arr), self.ctx.handle, self.id, t)
        return _chunk_infos(arr)

    @_in_call
    def chunk_info_named(self, names) -> list:
        """How each named chunk is cached, recording no activity."""
        a, size = _names(names)
        arr = (_ChunkInfoC * len(a))()
        _c.swiftkv_chunk_info_get_named(memoryview(arr), self.ctx.handle, self.id, a, size)
        return _chunk_infos(arr)

    @_in_call
    def pool_create(self, regular_pages: int, stream_pages: int = 0) -> "Pool":
        _, pid = _c.swiftkv_pool_create(self.ctx.handle, self.id, regular_pages, stream_pages)
        return self.ctx._adopt(Pool(self, pid, None))

    def pool_register(self, layers: Sequence, *, page_stride: int, kv_stride: int,
                      token_stride: int, head_stride: int, num_pages: int,
                      stream_first: int = 0, stream_pages: int = 0,
                      layer_span_bytes: Optional[int] = None) -> "Pool":
        """Registers the engine's own per-layer tensors, described by hand: strides in
        elements, num_pages pages per layer. Each layer is any array object (see
        swiftkv.tensors) or an int address; layer_span_bytes defaults to the first layer's
        reach. pool_from_tensors reads all of this from the tensors. The tensors must outlive
        the pool."""
        infos = [tensor_info(t) for t in layers]
        for i, t in enumerate(infos):
            self._check_device(t, f"layer {i}")
        if layer_span_bytes is None:
            if not infos or not infos[0].shape:
                raise TypeError("pool_register: pass layer_span_bytes with int addresses")
            layer_span_bytes = infos[0].span_bytes
        return self._register(layers, [t.address for t in infos], num_pages, stream_first,
                              stream_pages, layer_span_bytes,
                              (page_stride, kv_stride, token_stride, head_stride))

    def pool_from_tensors(self, layers, layout: str = "auto", *, stream_first: int = 0,
                          stream_pages: int = 0) -> "Pool":
        """Registers an engine's KV tensors as a pool, reading pages, strides, element type and
        device from the tensors themselves (torch, numpy, cupy: anything swiftkv.tensors
        reads). ``layers`` is one tensor per layer, or one cross-layer tensor. Layouts (see
        POOL_LAYOUTS): 'vllm' [2, pages, B, H, D], 'nhd' [pages, 2, B, H, D], 'hnd'
        [pages, 2, H, B, D], 'cross_layer' [pages, L, 2, B, H, D]; 'auto' picks the one the
        shapes fit. A shape that contradicts the model raises ValueError naming the dimension.
        The tensors must outlive the pool."""
        m = self.desc
        single = not isinstance(layers, (list, tuple))
        tensors = [layers] if single else list(layers)
        if not tensors:
            raise ValueError("pool_from_tensors: no tensors")
        infos = [tensor_info(t) for t in tensors]
        expect = {"kv": 2, "pages": None, "block_tokens": m.block_tokens,
                  "kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "layers": m.num_layers}
        model_field = {"block_tokens": "block_tokens",
                       "kv_heads": "num_kv_heads", "head_dim": "head_dim",
                       "layers": "num_layers"}

        def mismatches(shape, name):
            dims = POOL_LAYOUTS[name]
            if len(shape) != len(dims):
                return [f"{len(shape)} dimensions, layout {name!r} has {len(dims)} "
                        f"{list(dims)}"]
            return [f"dimension {i} ({d}) is {shape[i]}, not 2 (K and V)" if d == "kv" else
                    f"dimension {i} ({d}) is {shape[i]} but model {m.name!r} has "
                    f"{model_field[d]}={expect[d]}"
                    for i, d in enumerate(dims) if expect[d] is not None and shape[i] != expect[d]]

        shape0 = infos[0].shape
        if layout == "auto":
            names = ["cross_layer"] if single else ["vllm", "nhd", "hnd"]
            fits = [n for n in names if not mismatches(shape0, n)]
            if len(fits) > 1:
                raise ValueError(f"pool_from_tensors: shape {shape0} fits layouts {fits}; pass "
                                 "layout=")
            if not fits:
                guess = names[0] if single or shape0[:1] == (2,) else "nhd"
                raise ValueError(f"pool_from_tensors: layer 0 has shape {shape0}: as layout "
                                 f"{guess!r}, " + "; ".join(mismatches(shape0, guess)))
            layout = fits[0]
        if layout not in POOL_LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}: one of {sorted(POOL_LAYOUTS)} or 'auto'")
        if (layout == "cross_layer") != single:
            raise ValueError("layout 'cross_layer' takes one tensor; the others a list of "
                             "one tensor per layer")
        if not single and len(infos) != m.num_layers:
            raise ValueError(f"pool_from_tensors: {len(infos)} tensors but model {m.name!r} has "
                             f"num_layers={m.num_layers}")
        item = dtype_size(m.dtype)
        for i, t in enumerate(infos):
            what = f"layer {i}" if not single else "the tensor"
            bad = mismatches(t.shape, layout)
            if bad:
                raise ValueError(f"pool_from_tensors: {what} has shape {t.shape}: " +
                                 "; ".join(bad))
            if (t.shape, t.strides, t.itemsize, t.device) != (
                    shape0, infos[0].strides, infos[0].itemsize, infos[0].device):
                raise ValueError(f"pool_from_tensors: {what} differs from layer 0 in shape, "
                                 "strides, element type or device")
            if not _dtype_fits(m.dtype, t):
                raise ValueError(f"pool_from_tensors: {what} has {t.itemsize}-byte "
                                 f"{_KIND_NAMES.get(t.kind, t.kind)} elements but model "
                                 f"{m.name!r} is {DType(m.dtype).name} ({item} bytes)")
            self._check_device(t, what)
        dims = POOL_LAYOUTS[layout]
        stride = dict(zip(dims, infos[0].strides))
        if stride["head_dim"] != 1:
            raise ValueError(f"pool_from_tensors: head_dim must be the innermost, contiguous "
                             f"dimension (its stride is {stride['head_dim']} elements)")
        num_pages = shape0[dims.index("pages")]
        if single:
            t = infos[0]
            sub = [i for i, d in enumerate(dims) if d != "layers"]
            view = TensorInfo(t.address, tuple(t.shape[i] for i in sub),
                              tuple(t.strides[i] for i in sub), t.itemsize, t.kind, t.device)
            bases = [t.address + l * stride["layers"] * t.itemsize for l in range(m.num_layers)]
            span = view.span_bytes
        else:
            bases = [t.address for t in infos]
            span = infos[0].span_bytes
        return self._register(tensors, bases, num_pages, stream_first, stream_pages, span,
                              (stride["pages"], stride["kv"], stride["block_tokens"],
                               stride["kv_heads"]))

    def _check_device(self, t: TensorInfo, what: str) -> None:
        if not t.shape:
            return  # an int address: nothing known
        dev = self.desc.device
        if dev == DEVICE_HOST and t.device != _HOST:
            raise ValueError(f"{what} is CUDA memory (device {t.device}) but model "
                             f"{self.desc.name!r} is on the host")
        if dev != DEVICE_HOST and t.device != dev:
            where = "host memory" if t.device == _HOST else f"on CUDA device {t.device}"
            raise ValueError(f"{what} is {where} but model {self.desc.name!r} is on CUDA "
                             f"device {dev}")

    @_in_call
    def _register(self, keep, addresses, num_pages, stream_first, stream_pages, span,
                  strides) -> "Pool":
        bases = _c.swiftkv_py_pointer_array(addresses)
        d = _c.swiftkv_pool_desc_init()
        d.num_pages = num_pages
        d.stream_first = stream_first
        d.stream_pages = stream_pages
        d.layer_base = bases
        d.layer_span_bytes = span
        d.page_stride, d.kv_stride, d.token_stride, d.head_stride = strides
        _, pid = _c.swiftkv_pool_register(self.ctx.handle, self.id, d)
        kept = list(keep) if isinstance(keep, (list, tuple)) else [keep]
        pool = self.ctx._adopt(Pool(self, pid, (kept, bases)))
        # What each tensor was when registered, to refuse one resized or moved since (its
        # memory may be gone: the library would write there).
        pool._was = [(t, _layout_of(t)) for t in kept if not isinstance(t, int)]
        return pool

    @_in_call
    def request(self, pool: "Pool", tokens, pages, load_from_tokens: int = 0,
                shape: RequestShape = RequestShape.LOAD_AND_SAVE, names=None) -> "Request":
        """Begins an engine request (swiftkv_request_begin); use it as a context manager.
        shape: LOAD_AND_SAVE (the per-layer loop), LOAD_ONLY or SAVE_ONLY. names: the
        request's full chunks named by the caller (see lookup_named), one per full chunk of
        tokens; tokens may then be an int, the sequence's length."""
        return self.ctx._adopt(Request(self, pool, tokens, pages, load_from_tokens, shape,
                                       names))


# Dimension names of the pool layouts pool_from_tensors reads.
POOL_LAYOUTS = {
    "vllm": ("kv", "pages", "block_tokens", "kv_heads", "head_dim"),
    "nhd": ("pages", "kv", "block_tokens", "kv_heads", "head_dim"),
    "hnd": ("pages", "kv", "kv_heads", "block_tokens", "head_dim"),
    "cross_layer": ("pages", "layers", "kv", "block_tokens", "kv_heads", "head_dim"),
}
_KIND_NAMES = {"f": "float", "bf": "bfloat", "i": "int", "u": "uint"}


def _dtype_fits(dtype, t: TensorInfo) -> bool:
    """Whether elements of t can hold the model's dtype (same size; floats where it is one)."""
    if t.itemsize != dtype_size(dtype):
        return False
    d = DType(dtype)
    if d in (DType.F16, DType.F32):
        return t.kind == "f"
    if d == DType.BF16:
        return t.kind in ("bf", "u", "i")  # bfloat16, or its bits as 16-bit integers
    return True  # FP8 and I8: any 1-byte element


# --- The lender's elastic region ------------------------------------------------------------------


class Elastic:
    """A lender's elastic region (swiftkv_elastic)."""

    def __init__(self, ctx, lender, borrower, capacity_blocks, owned_blocks, window_ms, lease_ms,
                 cuda_alloc, keep_committed, clock,
                 reclaim_deadline_ms=_ELASTIC_DEFAULTS.reclaim_deadline_ms,
                 host_granule_bytes=_ELASTIC_DEFAULTS.host_granule_bytes):
        self.ctx = ctx
        cfg = _c.swiftkv_elastic_config_init()
        self._keep = (lender.struct(), borrower.struct() if borrower else None, clock)
        cfg.lender = self._keep[0]
        cfg.borrower = self._keep[1]
        cfg.capacity_blocks = capacity_blocks
        cfg.owned_blocks = owned_blocks
        cfg.window_ms = window_ms
        cfg.lease_ms = lease_ms
        cfg.reclaim_deadline_ms = reclaim_deadline_ms
        cfg.host_granule_bytes = host_granule_bytes
        cfg.cuda_alloc = int(cuda_alloc)
        cfg.flags = _c.SWIFTKV_ELASTIC_KEEP_COMMITTED if keep_committed else 0
        if clock is not None:
            _c.swiftkv_py_elastic_config_set_clock(cfg, clock)
        _, self._h = _c.swiftkv_elastic_create(ctx.handle, cfg)

    @property
    def handle(self):
        if self._h is None:
            raise StateError(Status.ESTATE, "the region is closed")
        return self._h

    _context = property(lambda self: self.ctx)

    def close(self) -> None:
        """Ends the region (in the child of a fork: releases nothing, see Context.close)."""
        if self.ctx._forked:
            self._abandon()
        if self._h is not None:  # (else its context closed it)
            self.ctx._enter()
            try:
                self._close()
            finally:
                self.ctx._leave()

    def _close(self) -> None:
        if self._h is not None:
            _c.swiftkv_elastic_destroy(self._h)
            self._h = None
            self.ctx._forget(self)

    def _abandon(self) -> None:
        self._h = None
        self.ctx._forget(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @_in_call
    def layer_view(self, layer: int) -> Record:
        out = _c.swiftkv_layer_view_init()
        _c.swiftkv_elastic_layer_view(out, self.handle, layer)
        return _record("LayerView", _struct_fields(out))

    @_in_call
    def scale_for_request(self, request_tokens: int) -> tuple[Status, int, int]:
        """(OK or IN_PROGRESS, lender blocks grown, borrower chunks lost)."""
        st, b, c = _c.swiftkv_elastic_scale_for_request(self.handle, request_tokens)
        return Status(st), b, c

    @_in_call
    def tick(self, in_use_blocks: int) -> tuple[Status, int, int]:
        st, b, c = _c.swiftkv_elastic_tick(self.handle, in_use_blocks)
        return Status(st), b, c

    @_in_call
    def resize(self, owned_blocks: int) -> tuple[Status, int, int]:
        """Sets the owned part to owned_blocks (whole lending units): (OK, or IN_PROGRESS while
        leases on units it took back are being given back; lender blocks grown or shrunk;
        borrower chunks)."""
        st, b, c = _c.swiftkv_elastic_resize(self.handle, owned_blocks)
        return Status(st), b, c

    @_in_call
    def lend(self, max_units: int) -> Record:
        out = _c.swiftkv_lease_init()
        _c.swiftkv_elastic_lend(out, self.handle, max_units)
        return _record("Lease", _struct_fields(out))

    @_in_call
    def lease(self, lease_id: int) -> Record:
        out = _c.swiftkv_lease_init()
        _c.swiftkv_elastic_lease_get(out, self.handle, lease_id)
        return _record("Lease", _struct_fields(out))

    @_in_call
    def renew(self, lease_id: int) -> None:
        _c.swiftkv_elastic_renew(self.handle, lease_id)

    @_in_call
    def release(self, lease_id: int) -> None:
        _c.swiftkv_elastic_release(self.handle, lease_id)

    @_in_call
    def reclaim(self, lease_id: int = LEASE_ALL) -> None:
        _c.swiftkv_elastic_reclaim(self.handle, lease_id)

    @_in_call
    def wait_reclaims(self, timeout_ms: int) -> None:
        """Blocks (without the GIL) until no lease is asked back; Error(ETIMEDOUT) after timeout_ms."""
        _c.swiftkv_elastic_wait_reclaims(self.handle, timeout_ms)

    @_in_call
    def pending_reclaims(self) -> list[int]:
        _, n = _c.swiftkv_elastic_pending_reclaims(None, self.handle)
        ids = np.zeros(max(n, 1), dtype=np.uint64)
        _, n = _c.swiftkv_elastic_pending_reclaims(ids, self.handle)
        return [int(x) for x in ids[:n]]

    @_in_call
    def stats(self) -> Record:
        out = _c.swiftkv_elastic_stats_init()
        _c.swiftkv_elastic_stats_get(out, self.handle)
        return _record("ElasticStats", _struct_fields(out))

    @_in_call
    def offer(self, name: str) -> None:
        """Offers the region to borrowers in other processes (the context's coord_endpoint)."""
        _c.swiftkv_elastic_offer(self.handle, name)


# --- Pools and requests -------------------------------------------------------------------------


def _layout_of(t):
    """A tensor's address, shape and strides as the library was told them. A torch tensor's are
    read from it directly (what tensor_info finds through its DLPack export, at a twentieth of
    the cost: every request checks each of its pool's tensors)."""
    if type(t).__module__.startswith("torch"):
        data_ptr, stride = getattr(t, "data_ptr", None), getattr(t, "stride", None)
        if callable(data_ptr) and callable(stride):
            return data_ptr(), tuple(t.shape), tuple(stride())
    i = tensor_info(t)
    return i.address, i.shape, i.strides


class Pool:
    """A borrower's paged KV pool (swiftkv_pool_create or swiftkv_pool_register)."""

    def __init__(self, model: Model, pid: int, keep):
        self.model, self.id, self._keep = model, pid, keep
        self._was = []  # (tensor, (address, shape, strides)) of registered tensors
        self._open = True

    def check_tensors(self) -> None:
        """Raises StateError when a tensor registered in this pool was resized or its memory
        moved (torch's resize_, set_) since: the library would read and write memory that is no
        longer the tensor's. Every request on the pool checks it first. The pool keeps its
        tensors alive, so deleting the engine's own reference is harmless."""
        for n, (t, was) in enumerate(self._was):
            now = _layout_of(t)
            if now != was:
                raise StateError(Status.ESTATE,
                                 f"pool {self.id}: tensor {n} changed since it was registered "
                                 f"(address {was[0]:#x}, shape {tuple(was[1])} -> address "
                                 f"{now[0]:#x}, shape {tuple(now[1])}): register the tensors "
                                 "again as a new pool")

    _context = property(lambda self: self.model.ctx)

    def close(self) -> None:
        """Ends the pool (EBUSY, and it stays open, while a request uses it). In the child of a
        fork it releases nothing (see Context.close)."""
        if self._open and self.model.ctx._h is not None and not self.model.ctx._forked:
            self.model.ctx._enter()
            try:
                self._close()
            finally:
                self.model.ctx._leave()
        self._open = False
        self.model.ctx._forget(self)

    def _close(self) -> None:
        if self._open:
            _c.swiftkv_pool_destroy(self.model.ctx.handle, self.id)
        self._open = False

    def _abandon(self) -> None:
        self._open = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @_in_call
    def describe(self) -> Record:
        d = _c.swiftkv_pool_desc_init()
        _, mid = _c.swiftkv_pool_get(d, self.model.ctx.handle, self.id)
        out = _struct_fields(d)
        ptrs = (ctypes.c_void_p * self.model.desc.num_layers).from_address(d.layer_base)
        out["layer_base"] = [p or 0 for p in ptrs]
        out["model"] = mid
        return _record("PoolDesc", out)

    def layer(self, layer: int):
        """Layer `layer` as a numpy array [pages, 2, block_tokens, kv_heads, head_dim] viewing
        the pool's memory (stride-exact; the pool must outlive it)."""
        d = self.describe()
        m = self.model.desc
        if m.device != DEVICE_HOST:
            raise InvalidArgument(Status.EINVAL, "a device pool's memory is not host memory; use "
                        "describe()['layer_base'] addresses with the engine's tensor library")
        item = dtype_size(m.dtype)
        np_dtype = {1: np.uint8, 2: np.float16, 4: np.float32}[item]
        if DType(m.dtype) == DType.BF16:
            np_dtype = np.uint16
        buf = (ctypes.c_char * d["layer_span_bytes"]).from_address(d["layer_base"][layer])
        flat = np.frombuffer(buf, dtype=np_dtype)
        return np.lib.stride_tricks.as_strided(
            flat, shape=(d["num_pages"], 2, m.block_tokens, m.num_kv_heads, m.head_dim),
            strides=tuple(s * item for s in (d["page_stride"], d["kv_stride"],
                                             d["token_stride"], d["head_stride"], 1)))


class Request:
    """An engine request through the connector: begin (here), start_load, per layer
    wait_layer_load / save_layer, wait_save, finish (also on leaving a with block)."""

    def __init__(self, model, pool, tokens, pages, load_from_tokens,
                 shape=RequestShape.LOAD_AND_SAVE, names=None):
        pool.check_tensors()
        self.model, self.pool = model, pool
        if names is not None and isinstance(tokens, (int, np.integer)):
            self._tokens, n_tokens = None, int(tokens)
        else:
            self._tokens = _tokens(tokens)
            n_tokens = len(self._tokens)
        self._pages = _tokens_like(pages, np.int32)
        if self._pages.ndim != 1:
            raise ValueError(f"pages must be 1-D, not shape {self._pages.shape}")
        d = _c.swiftkv_request_desc_init()
        d.pool = pool.id
        d.tokens = _c.swiftkv_py_address(self._tokens) if n_tokens and self._tokens is not None \
            else 0
        d.n_tokens = n_tokens
        if names is not None:
            self._names, size = _names(names)
            d.names = _c.swiftkv_py_address(self._names) if self._names.size else 0
            d.names_bytes = self._names.size
            d.name_bytes = size
        d.pages = _c.swiftkv_py_address(self._pages) if len(self._pages) else 0
        d.n_pages = len(self._pages)
        d.load_from_tokens = load_from_tokens
        d.shape = int(shape)
        _, self.id = _c.swiftkv_request_begin(model.ctx.handle, d)
        self._open = True
        self.final: Optional[dict] = None

    @_in_call
    def start_load(self, stream=None) -> None:
        """Starts the loads; stream: the engine's CUDA stream for a device pool (an int, a
        torch.cuda.Stream or a cupy Stream), None on the host."""
        _c.swiftkv_start_load(self.model.ctx.handle, self.id, stream_handle(stream))

    @_in_call
    def wait_layer_load(self, layer: int, stream=None) -> int:
        """Layer `layer` is loaded; returns valid_end_tokens (the engine recomputes the rest)."""
        _, v = _c.swiftkv_wait_layer_load(self.model.ctx.handle, self.id, layer,
                                          stream_handle(stream))
        return v

    @_in_call
    def save_layer(self, layer: int, stream=None) -> None:
        _c.swiftkv_save_layer(self.model.ctx.handle, self.id, layer, stream_handle(stream))

    @_in_call
    def wait_save(self, stream=None) -> int:
        _, n = _c.swiftkv_wait_save(self.model.ctx.handle, self.id, stream_handle(stream))
        return n

    @_in_call
    def info(self) -> Record:
        out = _c.swiftkv_request_info_init()
        _c.swiftkv_request_info_get(out, self.model.ctx.handle, self.id)
        return _record("RequestInfo", _struct_fields(out))

    _context = property(lambda self: self.model.ctx)

    def finish(self) -> Record:
        if self._open:
            with_ctx = self.model.ctx
            with_ctx._enter()
            try:
                self._close()
            finally:
                with_ctx._leave()
        return self.final

    close = finish

    def _close(self) -> None:
        if self._open:
            out = _c.swiftkv_request_info_init()
            _c.swiftkv_request_finish(out, self.model.ctx.handle, self.id)
            self.final = _record("RequestInfo", _struct_fields(out))
            self._open = False
            self.model.ctx._forget(self)  # the context holds open requests only

    def _abandon(self) -> None:
        self._open = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()


def _batch(requests: Sequence["Request"], stream):
    """The batch's context, its request ids as a uint64 array, and the stream handle."""
    requests = list(requests)
    if not requests:
        return None, np.zeros(0, dtype=np.uint64), stream_handle(stream)
    ctx = requests[0].model.ctx
    for r in requests:
        if not isinstance(r, Request):
            raise TypeError(f"a batch holds swiftkv.Request objects, not {type(r).__name__}")
        if r.model.ctx is not ctx:
            raise ValueError("the requests of a batch belong to one context")
    ids = np.fromiter((r.id for r in requests), dtype=np.uint64, count=len(requests))
    return ctx, ids, stream_handle(stream)


def wait_layer_load_batch(requests: Sequence["Request"], layer: int, stream=None) -> List[int]:
    """Request.wait_layer_load(layer) for every request of a step in one call (one context;
    their pools may differ). Each request is checked first: a bad one raises with none of them
    changed. Returns each request's valid_end_tokens, in order."""
    ctx, ids, s = _batch(requests, stream)
    if ctx is None:
        return []
    out = np.zeros(len(ids), dtype=np.uint64)
    ctx._enter()
    try:
        _c.swiftkv_wait_layer_load_batch(out, ctx.handle, ids, layer, s)
    finally:
        ctx._leave()
    return [int(v) for v in out]


def save_layer_batch(requests: Sequence["Request"], layer: int, stream=None) -> None:
    """Request.save_layer(layer) for every request of a step in one call; checked as
    wait_layer_load_batch is."""
    ctx, ids, s = _batch(requests, stream)
    if ctx is not None:
        ctx._enter()
        try:
            _c.swiftkv_save_layer_batch(ctx.handle, ids, layer, s)
        finally:
            ctx._leave()


def _address(obj) -> Optional[int]:
    """The address of an array object's first element (None stays None: NULL)."""
    return None if obj is None else tensor_info(obj).address


def _device_of(obj) -> int:
    """Where an array object's memory is; a plain sequence (a list) is host data."""
    if isinstance(obj, (list, tuple, range)):
        return _HOST
    return tensor_info(obj).device


def _tokens_like(values, dtype):
    """Small index arrays (pages, kv_indices) as C-contiguous numpy of dtype, on the host."""
    return np.ascontiguousarray(_host_values(values), dtype=dtype)


# --- Multi-token paged attention -------------------------------------------------------------------


@dataclass
class AttentionDesc:
    """swiftkv_attention_desc."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_tokens: int = _ATTENTION_DEFAULTS.page_tokens
    dtype: DType = DType.F16
    device: int = DEVICE_HOST
    causal: bool = bool(_ATTENTION_DEFAULTS.causal)
    kv_chunk_tokens: int = 0
    sm_scale: float = 0.0
    logits_soft_cap: float = 0.0

    def struct(self):
        d = _c.swiftkv_attention_desc_init()
        for k in ("num_qo_heads", "num_kv_heads", "head_dim", "page_tokens", "device",
                  "kv_chunk_tokens", "sm_scale", "logits_soft_cap"):
            setattr(d, k, getattr(self, k))
        d.dtype = int(self.dtype)
        d.causal = 1 if self.causal else 0
        return d


def attention_workspace_size(desc: AttentionDesc, max_requests: int, max_q_tokens: int) -> int:
    _, n = _c.swiftkv_attention_workspace_size(desc.struct(), max_requests, max_q_tokens)
    return n


def attention_workspace(desc: AttentionDesc, max_requests: int, max_q_tokens: int):
    """A host workspace (numpy uint8, 256-byte aligned) for plans on the host."""
    n = attention_workspace_size(desc, max_requests, max_q_tokens)
    raw = np.zeros(n + 256, np.uint8)
    skip = (-_c.swiftkv_py_address(raw)) % 256
    return raw[skip:skip + n]


class AttentionPlan:
    """A plan over a batch (swiftkv_attention_plan_make) and its runs. On the host every array is
    a numpy array; on a device pass int addresses (data_ptr()) for the workspace and tensors."""

    def __init__(self, desc: AttentionDesc, qo_indptr, kv_indptr, kv_last_page_len, workspace,
                 workspace_bytes: Optional[int] = None, stream=None):
        self.desc = desc
        qo = np.ascontiguousarray(qo_indptr, dtype=np.int32)
        kv = np.ascontiguousarray(kv_indptr, dtype=np.int32)
        last = np.ascontiguousarray(kv_last_page_len, dtype=np.int32)
        if workspace_bytes is None:
            workspace_bytes = tensor_info(workspace).nbytes
        self.workspace = workspace
        self._workspace_address = _address(workspace)
        self.plan = _c.swiftkv_attention_plan_init()
        _c.swiftkv_attention_plan_make(self.plan, desc.struct(), qo, kv, last, len(last),
                                       self._workspace_address, workspace_bytes,
                                       stream_handle(stream))

    def counts(self) -> Record:
        d = _struct_fields(self.plan)
        d.pop("internal", None)
        return _record("AttentionCounts", d)

    def run(self, q, k_base, v_base, kv_indices, out, *, page_stride, token_stride, head_stride,
            num_pages, lse=None, q_strides=None, out_strides=None, stream=None) -> None:
        """q and out: [tokens, heads, head_dim]; k_base/v_base: page 0 of K and V; strides in
        elements (q_strides / out_strides default to the arrays' own). Every array may be any
        array object (numpy, torch, cupy; see swiftkv.tensors) or an int address."""
        a = _c.swiftkv_attention_args_init()
        if isinstance(kv_indices, int) or _device_of(kv_indices) != _HOST:
            idx = kv_indices
        else:
            idx = _tokens_like(kv_indices, np.int32)

        def elem_strides(arr, given):
            if given is not None:
                return given
            t = tensor_info(arr)
            if len(t.strides) < 2:
                raise TypeError("pass q_strides / out_strides with int addresses")
            return t.strides[0], t.strides[1]

        a.q = _address(q)
        a.q_token_stride, a.q_head_stride = elem_strides(q, q_strides)
        a.k_base, a.v_base = _address(k_base), _address(v_base)
        a.page_stride, a.token_stride, a.head_stride = page_stride, token_stride, head_stride
        a.num_pages = num_pages
        a.kv_indices = _address(idx)
        a.out = _address(out)
        a.out_token_stride, a.out_head_stride = elem_strides(out, out_strides)
        a.lse = _address(lse)
        _c.swiftkv_attention_run(self.plan, a, self._workspace_address, stream_handle(stream))
