"""The worker's half of the vLLM connector: vLLM's KV tensors as a library pool, and the
library's per-layer hooks from vLLM's attention layers. Each step's library requests are begun
at the first hook that needs them, loads start before the forward, saves end on a thread of the
connector's; a request's blocks stay held until its saves are done."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Optional

import torch

import swiftkv

from .. import _engine
from .._torch import DTYPES, device_index
from .common import (Config, Geometry, HookOrderError, RequestMeta, SwiftKVConnectorMetadata,
                     log, marked_drafter_layers, pool_views, weights_identity)
from .events import ChunkEvents, KVEvents
from .lend_region import LendReport, RegionLender
from .lookup import LookupServer, socket_path


class Store:
    """A worker's library context: its model and, once the worker registered vLLM's KV
    tensors, the pool over them. Worker `rank` of `world` (tensor parallelism) keeps its shard
    of the KV heads in a context of its own, with its share of the budgets."""

    def __init__(self, vllm_config, geometry: Geometry, opts: dict, device: Optional[int],
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
            identity = weights_identity(vllm_config)
        if world > 1:
            identity = f"{identity}/tp{rank}of{world}"  # a shard's chunks are its own
        self.desc = swiftkv.ModelDesc(
            name=opts["model_name"] or str(mc.model), num_layers=len(geometry.layer_names),
            num_kv_heads=geometry.num_kv_heads, head_dim=geometry.head_dim,
            block_tokens=page_tokens or geometry.block_tokens, chunk_tokens=chunk,
            dtype=DTYPES[geometry.dtype],
            device=swiftkv.DEVICE_HOST if device is None else device, identity=identity)
        self.model = self.ctx.register_model(self.desc)
        _engine.set_codecs(self.model, opts["host_codec"], opts["disk_codec"],
                           opts["accept_lossy"], "SwiftKVConnector")
        self.geometry = geometry
        self.pool = None
        self.pages_per_block = geometry.block_tokens // self.desc.block_tokens
        # KV events for vLLM's publisher, when vLLM publishes them.
        self.events: Optional[ChunkEvents] = None
        kv_events = getattr(vllm_config, "kv_events_config", None)
        if kv_events is not None and getattr(kv_events, "enable_kv_cache_events", False):
            self.events = ChunkEvents(self.model, geometry.block_tokens, chunk)
            self.ctx.on_chunk_event(self.events.on_chunk_event)
        self.server: Optional[LookupServer] = None
        self.layers: list = []  # vLLM's tensors, in model order
        self._saver: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._saver_lock = threading.Lock()
        # Lent memory from other processes, as the peer tier. A lender that cannot be reached
        # now leaves the tier smaller: the engine serves on from host memory and disk; one that
        # takes memory back is asked again when it lends again (_engine.Borrower).
        self.borrower = _engine.Borrower(self.ctx, self.model, opts["lenders"], log,
                                         "SwiftKVConnector")

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
        self.borrower.close()
        self.ctx.close()


# One store per engine (its engine_id): the scheduler finds the one its worker made.
STORES: dict = {}
STORES_LOCK = threading.Lock()


class Step:
    """The worker's library requests of one engine step."""

    def __init__(self):
        self.entries: list = []   # (meta, swiftkv.Request)
        self.loading: list = []   # the requests that load
        self.saving: list = []    # the requests that save
        self.started = False
        self.next_wait = 0
        self.next_save = 0


def find_store(engine: str) -> Store:
    """The store the worker of `engine` in this process made (the scheduler's half, under
    vLLM's single-process executor, shares it)."""
    with STORES_LOCK:
        store = STORES.get(engine)
    if store is None:
        raise RuntimeError(f"SwiftKVConnector: the scheduler found no worker of engine {engine!r} "
                           "in this process (its register_kv_caches has not run)")
    return store


class SwiftKVConnectorWorker:
    """The worker's half (see the module's documentation). vLLM calls it from the worker's
    model-runner thread; saves end on the store's saver thread."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.meta: Optional[SwiftKVConnectorMetadata] = None  # the step's, while bound
        # Saves finish on one thread of their own, so that a step does not wait for its saves;
        # a request's blocks are held until its saves are done.
        self.store: Optional[Store] = None
        self.step: Optional[Step] = None
        self.load_errors: set = set()
        self.saving: dict = {}             # req_id -> futures of its saves in flight
        self.handed: set = set()           # req_ids a step had work for (see request_finished)
        self.finished: set = set()         # of those, finished by vLLM, not yet reported
        # A lending engine's KV cache in the library's elastic region (lend_region).
        self.lender: Optional[RegionLender] = \
            RegionLender(cfg, cfg.kv_cache_config, cfg.lend) if cfg.lend else None

    def mem_pool_context(self):
        """Where vLLM allocates its KV cache: the lending region, when the engine lends."""
        return self.lender.allocation() if self.lender is not None else None

    def bind(self, meta) -> None:
        self.meta = meta
        if isinstance(meta, SwiftKVConnectorMetadata):
            self.handed.update(r.req_id for r in meta.requests)
            if meta.lend and self.lender is not None:
                self.lender.apply(meta.lend.release, meta.lend.restore)

    def build_connector_worker_meta(self) -> Optional[LendReport]:
        """The lending orders this worker finished since the last step (none when it does not
        lend)."""
        return self.lender.take_report() if self.lender is not None else None

    def clear(self) -> None:
        if self.step is not None:  # a step vLLM ended without wait_for_save: nothing kept
            for _, req in self.step.entries:
                req.finish()
            self.step = None
        self.meta = None

    def shared(self) -> Store:
        if self.store is None:
            self.store = find_store(self.cfg.engine)
        return self.store

    def register_kv_caches(self, kv_caches: dict) -> None:
        g = self.cfg.geometry
        if set(kv_caches) - self.cfg.drafter != set(g.layer_names):
            raise ValueError(f"SwiftKVConnector: KV tensors for layers {sorted(kv_caches)}, but "
                             f"the KV cache config has {sorted(g.layer_names)}")
        marked = marked_drafter_layers(self.cfg.vllm_config) & set(kv_caches)
        if marked and marked != self.cfg.drafter & set(kv_caches):
            raise ValueError(f"SwiftKVConnector: vLLM's drafter has layers {sorted(marked)}, but "
                             f"the connector took {sorted(self.cfg.drafter)} for the drafter's")
        layers = [kv_caches[n] for n in g.layer_names]
        if self.lender is not None:
            self.lender.check_views(layers)
        views, layout, page_tokens = pool_views(layers, g)
        t = layers[0]
        store = Store(self.cfg.vllm_config, g, self.cfg.opts, device_index(t.device), self.cfg.rank,
                      self.cfg.world, page_tokens)
        try:
            store.pool = store.model.pool_from_tensors(views, layout)
            if not self.cfg.in_process:
                # No lookup names more chunks than the engine's longest sequence holds.
                max_len = int(getattr(self.cfg.vllm_config.model_config, "max_model_len", 0) or 0)
                store.server = LookupServer(
                    store.model, socket_path(self.cfg.opts, self.cfg.engine, self.cfg.rank),
                    store.reset, max_names=max_len // self.cfg.chunk + 1 if max_len else 1 << 16)
        except BaseException:
            store.close()
            raise
        store.layers = layers
        with STORES_LOCK:
            old = STORES.get(self.cfg.engine)
            STORES[self.cfg.engine] = store
        if old is not None:
            old.close()
        self.store = store
        if self.lender is not None:
            self.lender.offer()  # once vLLM's tensors are known to lie in the region

    def handle_preemptions(self, kv_connector_metadata) -> None:
        """vLLM freed the blocks of preempted requests and is about to reuse them: their saves
        in flight, which read those blocks, end first."""
        if isinstance(kv_connector_metadata, SwiftKVConnectorMetadata):
            for rid in kv_connector_metadata.preempted:
                self.drain(rid)

    def drain(self, rid: str) -> None:
        for f in self.saving.pop(rid, []):
            f.result()

    def stream(self):
        return torch.cuda.current_stream() if self.shared().desc.device != swiftkv.DEVICE_HOST \
            else None

    def begin_step(self) -> Step:
        """The step's library requests, begun at the first call that needs them: vLLM calls
        start_load_kv before the forward when the step loads, after it otherwise."""
        if self.step is not None:
            return self.step
        step = Step()
        meta = self.meta
        if not isinstance(meta, SwiftKVConnectorMetadata):
            raise HookOrderError(f"SwiftKVConnector: bound metadata is {type(meta).__name__}")
        store = self.shared()
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
                        log.error("SwiftKVConnector: request %s not begun: %s", r.req_id, e)
                    if r.loads:
                        self.load_errors.update(self.blocks(r, r.load_from))
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
        self.step = step
        return step

    def blocks(self, r: RequestMeta, from_token: int) -> list:
        """The blocks of r's load from from_token on (a block boundary) to its end."""
        b = self.cfg.geometry.block_tokens
        return r.block_ids[from_token // b:(r.load_to + b - 1) // b]

    def start_load_kv(self, forward_context, **kwargs) -> None:
        if self.meta is None:
            raise HookOrderError("SwiftKVConnector: start_load_kv with no metadata bound")
        step = self.begin_step()
        if step.started:
            raise HookOrderError("SwiftKVConnector: start_load_kv twice in one step")
        if step.loading and step.next_wait > 0:
            raise HookOrderError("SwiftKVConnector: start_load_kv after wait_for_layer_load in "
                                 "a step that loads")
        stream = self.stream()
        for req in step.loading:
            req.start_load(stream)
        step.started = True

    def wait_for_layer_load(self, layer_name: str) -> None:
        if layer_name in self.cfg.drafter:
            return  # a drafter's layer: not cached (drafter_layers)
        layer = self.layer(layer_name)
        step = self.begin_step()
        if step.loading and not step.started:
            raise HookOrderError("SwiftKVConnector: wait_for_layer_load before start_load_kv in "
                                 "a step that loads")
        if layer != step.next_wait:
            raise HookOrderError(f"SwiftKVConnector: wait_for_layer_load({layer_name!r}) is layer "
                                 f"{layer}; layer {step.next_wait} is next")
        swiftkv.wait_layer_load_batch(step.loading, layer, self.stream())
        step.next_wait += 1

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        if layer_name in self.cfg.drafter:
            return
        layer = self.layer(layer_name)
        step = self.begin_step()
        if layer != step.next_save:
            raise HookOrderError(f"SwiftKVConnector: save_kv_layer({layer_name!r}) is layer "
                                 f"{layer}; layer {step.next_save} is next")
        if step.next_wait <= layer:
            raise HookOrderError(f"SwiftKVConnector: save_kv_layer({layer_name!r}) before its "
                                 "wait_for_layer_load")
        if kv_layer.data_ptr() != self.shared().layers[layer].data_ptr():
            raise ValueError(f"SwiftKVConnector: save_kv_layer({layer_name!r}) was handed a "
                             "tensor other than the one registered for the layer")
        swiftkv.save_layer_batch(step.saving, layer, self.stream())
        step.next_save += 1

    def wait_for_save(self) -> None:
        """Ends the step: a request whose every layer was saved finishes its saves on the saver
        thread (its blocks stay held until get_finished reports them); the others, and any
        whose load failed (the library may write its pages until it ends), end here."""
        step, self.step = self.step, None
        if step is None:
            return
        layers = len(self.cfg.geometry.layer_names)
        stream = self.stream()
        for r, req in step.entries:
            failed = False
            if r.loads:
                valid = req.info()["valid_end_tokens"] if step.next_wait == layers else \
                    r.load_from
                if valid < r.load_to:
                    self.load_errors.update(self.blocks(r, max(valid, r.load_from)))
                    failed = True
            if r.saves and step.next_save == layers and not failed:
                self.saving.setdefault(r.req_id, []).append(
                    self.shared().saver().submit(self.finish_and_publish, r, req, stream))
                continue
            try:
                if r.saves and step.next_save == layers:
                    req.wait_save(stream)
            finally:
                req.finish()  # before every layer was saved: aborts, saving nothing

    def finish_and_publish(self, r, req, stream) -> None:
        """On the saver thread: r's saves end, then (with KV events on) what they stored is
        published."""
        self.finish_saves(req, stream)
        events = self.shared().events
        if events is not None and r.events is not None:
            try:
                events.saved(r)
            except swiftkv.Error as e:
                log.warning("SwiftKVConnector: KV events of a request's saves lost: %s", e)

    def get_kv_connector_kv_cache_events(self) -> Optional[KVEvents]:
        """The KV events of this worker since the last call (vLLM's model runner asks after
        every step, and carries them to the scheduler)."""
        store = self.store
        if store is None or store.events is None:
            return None
        events = store.events.take()
        return KVEvents(events) if events else None

    @staticmethod
    def finish_saves(req, stream) -> None:
        try:
            req.wait_save(stream)
        except swiftkv.Error as e:  # a cache: the chunks are not saved, nothing else is lost
            log.warning("SwiftKVConnector: saves of a request failed: %s", e)
        finally:
            req.finish()

    def get_finished(self, finished_req_ids: set):
        """The requests vLLM finished whose saves are done: their blocks may be freed. Every
        request a step had work for is reported once, after vLLM finished it (request_finished
        told vLLM to wait for exactly those)."""
        self.finished.update(finished_req_ids & self.handed)
        done = set()
        for rid in self.finished:
            if all(f.done() for f in self.saving.get(rid, [])):
                self.drain(rid)  # raises nothing: a failed save was logged
                done.add(rid)
        self.finished -= done
        self.handed -= done
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def layer(self, layer_name: str) -> int:
        try:
            return self.cfg.index[layer_name]
        except KeyError:
            raise ValueError(f"SwiftKVConnector: {layer_name!r} is not a layer of the KV cache "
                             "config") from None

    def shutdown(self) -> None:
        for rid in list(self.saving):
            self.drain(rid)
        if self.store is not None:
            with STORES_LOCK:
                if STORES.get(self.cfg.engine) is self.store:
                    del STORES[self.cfg.engine]
            self.store.close()
        self.store = None
        if self.lender is not None:
            self.lender.close()
