"""The scheduler's half of the vLLM connector: it looks a request's chunks up by vLLM's block
hashes (in its own process's store, or across the workers' lookup sockets), offers the cached run
after vLLM's own prefix-cache hit, and hands the workers each step's loads and saves."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import swiftkv

from .common import (HIT_SOURCES, Config, EventInfo, HookOrderError, RequestMeta,
                     SwiftKVConnectorMetadata, chunk_names, log)
from .events import KVEvents
from .lend_region import LendGeometry, LendReport, blocks_of_share
from .lending import LendOptions, TailLender
from .lookup import LookupClient, socket_path
from .metrics import COUNTERS, SwiftKVConnectorStats
from .worker import find_store


@dataclasses.dataclass
class Scheduled:
    """What the scheduler side keeps of a request between steps."""

    request: Any                           # vllm.v1.request.Request
    block_ids: list = dataclasses.field(default_factory=list)
    load: Optional[tuple] = None           # (from, to) accepted, not yet handed to a step
    chunks_done: int = 0                   # chunks already loaded, saved or handed to a step


class SwiftKVConnectorScheduler:
    """The scheduler's half (see the module's documentation). vLLM calls it from its scheduler's
    thread only."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.scheduled: dict = {}  # req_id -> Scheduled
        self.matched: dict = {}    # req_id -> (local tokens, external tokens, tiers, chunk)
        self.handed_out: set = set()  # req_ids a step had work for (preemption included)
        self.client: Optional[LookupClient] = None  # the workers, when in other processes
        # Requests whose chunks vLLM's block hashes could not name (none offered, none saved).
        self.unkeyed: set = set()
        self.unkeyed_requests = 0
        self.published: list = []  # KV events from the workers, not yet taken by vLLM
        # A lending engine's policy over vLLM's block pool (lending.TailLender), once vLLM
        # binds the pool, and the ranks that finished each unit's release or restore.
        self.lender: Optional[TailLender] = None
        self.lend_geometry: Optional[LendGeometry] = None
        self._acks: tuple = ({}, {})  # (released, restored): unit -> ranks done
        self._reported = dict.fromkeys(COUNTERS, 0)  # the counts at the last stats report
        self._reported_blocks = 0

    def bind_gpu_block_pool(self, pool) -> None:
        lend = self.cfg.lend
        if lend is None:
            return
        geo = LendGeometry.of(self.cfg.kv_cache_config, lend)
        n = int(pool.num_gpu_blocks)
        if n != geo.num_blocks:
            raise ValueError(f"SwiftKVConnector: vLLM's block pool has {n} blocks, its KV cache "
                             f"config {geo.num_blocks}")
        self.lend_geometry = geo
        self.lender = TailLender(pool, LendOptions(
            unit_blocks=geo.unit_blocks,
            high_free_blocks=blocks_of_share(lend["high_free_blocks"], n),
            low_free_blocks=blocks_of_share(lend["low_free_blocks"], n),
            keep_blocks=int(lend["keep_blocks"]),
            reclaim_deadline_s=float(lend["reclaim_deadline_s"]),
            capacity_blocks=geo.capacity_blocks))
        log.info("SwiftKVConnector: lends %d units of %d blocks above %d free blocks, takes them "
                 "back below %d", self.lender.num_units, geo.unit_blocks,
                 self.lender.opts.high_free_blocks, self.lender.opts.low_free_blocks)

    def kv_connector_stats(self) -> Optional[SwiftKVConnectorStats]:
        """Lending's counts since the last call and the blocks out of vLLM's hands, when any
        changed (metrics.py); None otherwise, or when the engine does not lend."""
        if self.lender is None:
            return None
        st = self.lender.stats
        now = {"units_lent": st.units_lent, "units_reclaimed": st.units_reclaimed,
               "steps_waited": st.steps_waited, "preemptions": st.preemptions}
        data = {k: now[k] - self._reported[k] for k in COUNTERS}
        blocks = self.lender.lent_blocks()
        if not any(data.values()) and not st.reclaim_s and blocks == self._reported_blocks:
            return None
        data["reclaim_s"], st.reclaim_s = st.reclaim_s, []
        data["lent_blocks"] = blocks
        self._reported, self._reported_blocks = now, blocks
        return SwiftKVConnectorStats(data=data)

    def has_pending_block_frees(self) -> bool:
        return self.lender is not None and self.lender.has_pending_block_frees()

    def _lend_reports(self, report) -> None:
        """Counts each rank's report; a unit is released or restored once every rank did."""
        if not isinstance(report, LendReport) or self.lender is None:
            return
        done = ([], [])
        for acks, got, out in zip(self._acks, (report.released, report.restored), done):
            for unit, ranks in got.items():
                have = acks.setdefault(unit, set())
                have.update(ranks)
                if len(have) == self.cfg.world:
                    del acks[unit]
                    out.append(unit)
        if done[0] or done[1]:
            self.lender.workers_done(done[0], done[1])

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def reset_cache(self) -> bool:
        """vLLM's reset of the connector's cache (``reset_prefix_cache(reset_connector=True)``,
        the server's ``/reset_prefix_cache?reset_external=true``, and a pause that clears the
        caches, as around a weight update, after which cached K/V would be stale): every worker
        drops every chunk of the model it holds, in every tier, once the saves it was finishing
        have finished. A chunk the controller pinned stays. False, the reason logged, where a
        worker cannot be reached: vLLM reports the reset failed."""
        try:
            if self.cfg.in_process:
                dropped = find_store(self.cfg.engine).reset()
            else:
                dropped = self.workers().reset()
        except (RuntimeError, swiftkv.Error) as e:
            log.error("SwiftKVConnector: the cache was not reset: %s", e)
            return False
        log.info("SwiftKVConnector: cache reset: %d chunks dropped", dropped)
        return True

    def workers(self) -> LookupClient:
        """The connections to the workers' lookup sockets, made at first use."""
        if self.client is None:
            self.client = LookupClient(
                [socket_path(self.cfg.opts, self.cfg.engine, r) for r in range(self.cfg.world)],
                float(self.cfg.opts["lookup_timeout_s"]))
        return self.client

    def residency(self, names: np.ndarray) -> np.ndarray:
        """Where each named chunk is held: this process's worker's lookup, or every worker's,
        where the workers run in processes of their own."""
        if self.cfg.in_process:
            return find_store(self.cfg.engine).model.lookup_named(names).residency
        return self.workers().lookup(names)

    def names(self, request, tokens: int) -> Optional[np.ndarray]:
        """The names of the full chunks of request's first `tokens` tokens, or None (counted,
        logged once) when vLLM's block hashes cannot name them: nothing is then offered or
        saved for the request."""
        chunks = tokens // self.cfg.chunk
        names = chunk_names(getattr(request, "block_hashes", ()),
                            self.cfg.chunk // self.cfg.geometry.block_tokens, chunks)
        if names is None and chunks > 0 and request.request_id not in self.unkeyed:
            self.unkeyed.add(request.request_id)
            self.unkeyed_requests += 1
            if self.unkeyed_requests == 1:
                log.warning("SwiftKVConnector: request %s has no block hashes of vLLM's to key "
                            "its chunks by (%d for %d tokens): nothing is loaded or saved for "
                            "it, nor for others like it", request.request_id,
                            len(getattr(request, "block_hashes", ())), request.num_tokens)
        return names

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        g = self.cfg.geometry
        chunk = self.cfg.chunk
        n = request.num_tokens
        cap = (n - 1) // g.block_tokens * g.block_tokens  # vLLM computes the last token
        if cap <= num_computed_tokens or not self.cfg.loads:
            return 0, False
        names = self.names(request, n // chunk * chunk)
        if names is None:
            return 0, False
        residency = self.residency(names)
        first = num_computed_tokens // chunk
        end = first
        while end < len(residency) and residency[end] != swiftkv.Tier.DROPPED:
            end += 1
        matched = min(end * chunk, cap)
        if matched <= num_computed_tokens:
            return 0, False
        self.matched[request.request_id] = (num_computed_tokens,
                                            matched - num_computed_tokens,
                                            residency[first:end].copy(), chunk)
        return matched - num_computed_tokens, False

    def get_external_cache_hit_sources(self, request, num_external_tokens: int) -> dict:
        m = self.matched.get(request.request_id)
        if not num_external_tokens or m is None:
            return {CacheHitSource.HOST: num_external_tokens} if num_external_tokens else {}
        local, _, tiers, chunk = m
        out: dict = {}
        first = local // chunk
        for t in range(local, local + num_external_tokens, self.cfg.geometry.block_tokens):
            src = HIT_SOURCES.get(swiftkv.Tier(int(tiers[t // chunk - first])),
                                  CacheHitSource.EXTERNAL_UNSPECIFIED)
            out[src] = out.get(src, 0) + self.cfg.geometry.block_tokens
        return out

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        s = Scheduled(request)
        if num_external_tokens > 0:
            m = self.matched.get(request.request_id)
            if m is None or num_external_tokens > m[1]:
                raise HookOrderError(f"SwiftKVConnector: update_state_after_alloc of "
                                     f"{request.request_id!r} with {num_external_tokens} external "
                                     "tokens that get_num_new_matched_tokens did not offer")
            s.load = (m[0], m[0] + num_external_tokens)
        chunk = self.cfg.chunk
        s.chunks_done = (s.load[1] if s.load else request.num_computed_tokens) // chunk
        self.scheduled[request.request_id] = s

    def build_connector_meta(self, scheduler_output) -> SwiftKVConnectorMetadata:
        meta = SwiftKVConnectorMetadata()
        chunk = self.cfg.chunk
        steps = [(r.req_id, r.num_computed_tokens, r.block_ids, True)
                 for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            steps.append((req_id, cached.num_computed_tokens[i], cached.new_block_ids[i],
                          req_id in cached.resumed_req_ids))
        for req_id, start, new_blocks, replace in steps:
            s = self.scheduled.get(req_id)
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
            if load is None and (end // chunk <= s.chunks_done or not self.cfg.saves):
                continue  # no chunk completes this step, or nothing is saved
            names = self.names(s.request, end)
            if names is None:
                continue  # cannot be keyed: nothing loaded (none was offered), nothing saved
            first_new = s.chunks_done
            s.chunks_done = max(s.chunks_done, end // chunk)
            self.handed_out.add(req_id)
            r = RequestMeta(req_id, end, names, list(s.block_ids), saves=self.cfg.saves)
            if self.cfg.publish and self.cfg.saves and s.chunks_done > first_new:
                r.events = self.event_info(s.request, first_new, s.chunks_done)
            if load is not None:
                r.load_from, r.load_to = load
            meta.requests.append(r)
        meta.preempted = set(scheduler_output.preempted_req_ids or ())
        if self.lender is not None:
            if scheduler_output.preempted_req_ids and self.lender.lent_blocks():
                self.lender.stats.preemptions += len(scheduler_output.preempted_req_ids)
            meta.lend = self.lender.plan()
        return meta

    def event_info(self, request, first: int, end: int) -> EventInfo:
        """What the workers publish of chunks [first, end) of request, should they store them."""
        per = self.cfg.chunk // self.cfg.geometry.block_tokens
        hashes = request.block_hashes
        lora = getattr(request, "lora_request", None)
        chunk = self.cfg.chunk
        return EventInfo(first, list(hashes[first * per:end * per]),
                         hashes[first * per - 1] if first else None,
                         np.fromiter(request.all_token_ids[first * chunk:end * chunk],
                                     dtype=np.uint32),
                         getattr(lora, "adapter_id", None) if lora else None,
                         getattr(lora, "name", None) if lora else None)

    def update_connector_output(self, connector_output) -> None:
        """The workers' KV events of a step (the chunks every worker stored or dropped), kept
        for take_events; a lending engine's reports of its orders, and its fencing of the tail
        blocks vLLM freed."""
        events = getattr(connector_output, "kv_cache_events", None)
        if isinstance(events, KVEvents):
            self.published.extend(events.aggregate().get_all_events())
        if self.lender is not None:
            self._lend_reports(getattr(connector_output, "kv_connector_worker_meta", None))
            self.lender.after_frees()

    def take_events(self):
        """The KV events since the last call, for vLLM's publisher: BlockStored and
        BlockRemoved of the library's chunks, as their blocks, with the medium of the tier."""
        events, self.published = self.published, []
        return events

    def request_finished(self, request, block_ids):
        """A request a step had work for may have saves in flight: vLLM keeps its blocks until
        the worker's get_finished reports it (every such request is reported once)."""
        self.scheduled.pop(request.request_id, None)
        self.matched.pop(request.request_id, None)
        self.unkeyed.discard(request.request_id)
        if request.request_id in self.handed_out:
            self.handed_out.discard(request.request_id)
            return True, None
        return False, None
