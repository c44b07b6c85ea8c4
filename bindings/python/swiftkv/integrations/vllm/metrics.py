"""The connector's statistics in vLLM's metrics: what a lending engine lent and took back. The
scheduler's half reports, at each step something changed (``get_kv_connector_stats``), the
lending counts since its last report and the blocks out of vLLM's hands now; vLLM carries them to
its logger (``build_kv_connector_stats``, SwiftKVConnectorStats) and to Prometheus
(``build_prom_metrics``, SwiftKVPromMetrics):

    swiftkv_vllm_lent_blocks             gauge: blocks out of vLLM's hands (lent, or moving)
    swiftkv_vllm_lent_units_total        units lent
    swiftkv_vllm_reclaimed_units_total   units taken back
    swiftkv_vllm_reclaim_seconds         histogram: from a reclaim's start to its blocks' return
    swiftkv_vllm_reclaim_wait_steps_total  steps vLLM waited for a reclaim instead of preempting
    swiftkv_vllm_lend_preemptions_total  preemptions while the engine lent: what a reclaim could
                                         not prevent (past its deadline, or too little lent)
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

COUNTERS = ("units_lent", "units_reclaimed", "steps_waited", "preemptions")


class SwiftKVConnectorStats(KVConnectorStats):
    """data: the counts of COUNTERS since the last report, "reclaim_s" (each reclaim's
    seconds) and "lent_blocks" (the newest count)."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> "SwiftKVConnectorStats":
        mine, theirs = self.data, other.data
        out: dict[str, Any] = {k: mine.get(k, 0) + theirs.get(k, 0) for k in COUNTERS}
        out["reclaim_s"] = list(mine.get("reclaim_s", ())) + list(theirs.get("reclaim_s", ()))
        if "lent_blocks" in theirs or "lent_blocks" in mine:
            out["lent_blocks"] = theirs.get("lent_blocks", mine.get("lent_blocks"))
        return SwiftKVConnectorStats(data=out)

    def reduce(self) -> dict:
        reclaims = list(self.data.get("reclaim_s", ()))
        out = {k: self.data.get(k, 0) for k in COUNTERS}
        out["lent_blocks"] = self.data.get("lent_blocks", 0)
        out["reclaim_s_max"] = round(max(reclaims), 4) if reclaims else 0.0
        return out

    def is_empty(self) -> bool:
        return not self.data


class SwiftKVPromMetrics(KVConnectorPromMetrics):
    """The Prometheus families of the module's documentation, one child per engine."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)

        def per_engine(metric):
            return {i: metric.labels(*values) for i, values in per_engine_labelvalues.items()}

        self.lent_blocks = per_engine(self._gauge_cls(
            name="swiftkv_vllm_lent_blocks",
            documentation="KV blocks out of vLLM's hands: lent to other models, or on their way "
                          "out or back",
            labelnames=labelnames, multiprocess_mode="mostrecent"))
        self.counters = {key: per_engine(self._counter_cls(
            name=name, documentation=doc, labelnames=labelnames)) for key, name, doc in (
            ("units_lent", "swiftkv_vllm_lent_units_total",
             "Lending units of vLLM's KV cache lent to other models"),
            ("units_reclaimed", "swiftkv_vllm_reclaimed_units_total",
             "Lending units taken back from other models"),
            ("steps_waited", "swiftkv_vllm_reclaim_wait_steps_total",
             "Scheduler steps vLLM waited for a reclaim instead of preempting a request"),
            ("preemptions", "swiftkv_vllm_lend_preemptions_total",
             "Preemptions while the engine lent: what a reclaim could not prevent"))}
        self.reclaim_s = per_engine(self._histogram_cls(
            name="swiftkv_vllm_reclaim_seconds",
            documentation="From a reclaim's start to its blocks' return to vLLM",
            buckets=[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
            labelnames=labelnames))

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0) -> None:
        data = transfer_stats_data
        for key, counter in self.counters.items():
            if data.get(key):
                counter[engine_idx].inc(data[key])
        for s in data.get("reclaim_s", ()):
            self.reclaim_s[engine_idx].observe(s)
        if data.get("lent_blocks") is not None:
            self.lent_blocks[engine_idx].set(data["lent_blocks"])
