"""SwiftKVConnector: vLLM's KVConnectorBase_V1 over the library, a thin front that hands each of
vLLM's calls to the half of its role (scheduler.py, worker.py), as vLLM's own offloading
connector does."""

from __future__ import annotations

from typing import Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from .common import Config, HookOrderError
from .events import KVEvents
from .scheduler import SwiftKVConnectorScheduler
from .worker import SwiftKVConnectorWorker


class SwiftKVConnector(KVConnectorBase_V1):
    """libswiftkv behind vLLM's KVConnectorBase_V1 (see the package's documentation)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.cfg = Config.of(vllm_config, self._kv_transfer_config, kv_cache_config,
                             worker=role == KVConnectorRole.WORKER)
        self.connector_scheduler: Optional[SwiftKVConnectorScheduler] = None
        self.connector_worker: Optional[SwiftKVConnectorWorker] = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = SwiftKVConnectorScheduler(self.cfg)
        else:
            self.connector_worker = SwiftKVConnectorWorker(self.cfg)

    def _scheduler(self) -> SwiftKVConnectorScheduler:
        if self.connector_scheduler is None:
            raise HookOrderError("SwiftKVConnector: a scheduler's call on a worker's connector")
        return self.connector_scheduler

    def _worker(self) -> SwiftKVConnectorWorker:
        if self.connector_worker is None:
            raise HookOrderError("SwiftKVConnector: a worker's call on the scheduler's connector")
        return self.connector_worker

    @property
    def unkeyed_requests(self) -> int:
        """Requests whose chunks vLLM's block hashes could not name (docs/vllm.md)."""
        return self._scheduler().unkeyed_requests

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a save that does not happen is a later miss, nothing lost

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        return True  # the per-layer hooks cannot be captured into a CUDA graph

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> Optional[str]:
        """A lending engine's KV cache is block-outermost, so that its last blocks are one
        range of memory (lend_region); else vLLM chooses."""
        extra = getattr(getattr(vllm_config, "kv_transfer_config", None),
                        "kv_connector_extra_config", None) or {}
        return "BLHNC" if extra.get("lend") else None

    def shutdown(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.shutdown()
        if self.connector_scheduler is not None:
            self.connector_scheduler.shutdown()

    # ---- worker side --------------------------------------------------------------------------

    def get_mem_pool_context(self):
        return self._worker().mem_pool_context()

    def register_kv_caches(self, kv_caches: dict) -> None:
        self._worker().register_kv_caches(kv_caches)

    def build_connector_worker_meta(self):
        return self._worker().build_connector_worker_meta()

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._worker().bind(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self._worker().clear()
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata) -> None:
        self._worker().handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._worker().start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker().wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        self._worker().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        self._worker().wait_for_save()

    def get_finished(self, finished_req_ids: set):
        return self._worker().get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set:
        return self._worker().get_block_ids_with_load_errors()

    def get_kv_connector_kv_cache_events(self) -> Optional[KVEvents]:
        return self._worker().get_kv_connector_kv_cache_events()

    # ---- scheduler side -----------------------------------------------------------------------

    def reset_cache(self) -> bool:
        return self._scheduler().reset_cache()

    def get_kv_connector_stats(self):
        if self.connector_scheduler is not None:
            return self.connector_scheduler.kv_connector_stats()
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        from .metrics import SwiftKVConnectorStats
        return SwiftKVConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        from .metrics import SwiftKVPromMetrics
        return SwiftKVPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        self._scheduler().bind_gpu_block_pool(gpu_block_pool)

    def has_pending_block_frees(self) -> bool:
        return self._scheduler().has_pending_block_frees()

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self._scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def get_external_cache_hit_sources(self, request, num_external_tokens: int) -> dict:
        return self._scheduler().get_external_cache_hit_sources(request, num_external_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self._scheduler().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        self._scheduler().update_connector_output(connector_output)

    def take_events(self):
        return self._scheduler().take_events()

    def request_finished(self, request, block_ids):
        return self._scheduler().request_finished(request, block_ids)
