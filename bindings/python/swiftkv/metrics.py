"""The context's counters for Prometheus: ``Collector(ctx)`` is a prometheus_client collector
over ``Context.metrics_text()`` (swiftkv_metrics_text), so that an engine that already serves
/metrics adds libswiftkv's with one line:

    from prometheus_client import REGISTRY
    from swiftkv.metrics import Collector
    REGISTRY.register(Collector(ctx))

The names, types and units are those of swiftkv_metrics_text (docs/api.md). prometheus_client
is needed only when collect() runs.
"""

from __future__ import annotations

__all__ = ["Collector"]


class Collector:
    """A prometheus_client collector of one context's metrics. After the context is closed it
    yields nothing."""

    def __init__(self, ctx, *, prefix: str = ""):
        self.ctx = ctx
        self.prefix = prefix  # put before every name (e.g. "engine_a_")

    def collect(self):
        from prometheus_client.parser import text_string_to_metric_families

        if self.ctx._h is None:
            return
        for family in text_string_to_metric_families(self.ctx.metrics_text()):
            if self.prefix:
                family.name = self.prefix + family.name
                family.samples = [type(s)(self.prefix + s.name, *s[1:]) for s in family.samples]
            yield family
