"""Prometheus metrics of a run (``--metrics-port``).

Metrics live in an explicit registry (never the global one), use the
``skpub_`` prefix and base units, and carry no high-cardinality labels:
``reason`` has the dead-letter codes, ``evaluator`` the evaluator indices.
``skpub_dead_letters_total{reason="internal_error"}`` counts records the
engine failed on (a bug; the run went on): alert on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from skpub.kernel.errors import MetricsError

if TYPE_CHECKING:
    from skpub.app.summary import BatchReport

ROUTING_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The metrics one run exports; update them with :meth:`observe_batch`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.objects = Counter("skpub_objects", "Valid objects ingested", registry=r)
        self.forwarded = Counter(
            "skpub_objects_forwarded", "Objects forwarded to an evaluator (passed the textual summary)", registry=r
        )
        self.deliveries = Counter("skpub_deliveries", "Deliveries written", registry=r)
        self.dead_letters = Counter("skpub_dead_letters", "Rejected records", ["reason"], registry=r)
        self.batches = Counter("skpub_batches", "Micro-batches completed", registry=r)
        self.evaluator_cost = Counter(
            "skpub_evaluator_cost",
            "Cost units: candidate subscriptions examined per object (Tornado eq. 1) plus object_cost per object",
            ["evaluator"],
            registry=r,
        )
        self.evaluator_load = Gauge(
            "skpub_evaluator_load", "Cost units of the last micro-batch per evaluator", ["evaluator"], registry=r
        )
        self.imbalance = Gauge(
            "skpub_evaluator_imbalance",
            "Max / mean evaluator cost of the last micro-batch, every evaluator counted (1 is even)",
            registry=r,
        )
        self.rebalance_operations = Counter(
            "skpub_rebalance_operations", "Balancer operations carried out", ["operation"], registry=r
        )
        self.migrated_subscriptions = Counter(
            "skpub_migrated_subscriptions", "Subscription parts carried by the balancer's moves", registry=r
        )
        self.evaluator_cpu = Counter(
            "skpub_evaluator_cpu_seconds", "Evaluator thread CPU time", ["evaluator"], registry=r
        )
        self.routing_seconds = Histogram(
            "skpub_batch_routing_seconds", "Routing time per micro-batch", buckets=ROUTING_BUCKETS, registry=r
        )
        self.epoch = Gauge("skpub_routing_epoch", "Routing epoch in force", registry=r)

    def observe_batch(self, report: BatchReport, evaluators: int) -> None:
        """Account one :class:`skpub.app.summary.BatchReport` of a deployment of ``evaluators`` evaluators."""
        self.objects.inc(report.objects)
        self.forwarded.inc(report.forwarded)
        self.deliveries.inc(report.deliveries)
        for reason, count in report.dead_letters.items():
            self.dead_letters.labels(reason=reason).inc(count)
        for e, cost in enumerate(report.costs_per_evaluator(evaluators)):  # a silent evaluator's load is 0
            self.evaluator_cost.labels(evaluator=str(e)).inc(cost)
            self.evaluator_load.labels(evaluator=str(e)).set(cost)
        self.imbalance.set(report.imbalance(evaluators))
        for kind, count in report.balancer.items():
            if kind == "subscriptions":
                self.migrated_subscriptions.inc(count)
            elif kind != "placements":
                self.rebalance_operations.labels(operation=kind).inc(count)
        for e, cpu in report.evaluator_cpu.items():
            self.evaluator_cpu.labels(evaluator=str(e)).inc(cpu)
        self.routing_seconds.observe(report.routing_seconds)
        self.epoch.set(report.epoch)
        self.batches.inc()

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP on ``addr:port`` from a daemon thread.

        Raises
        ------
        MetricsError
            If ``port`` is outside 1-65535 or cannot be bound (in use, not permitted).
        """
        if not 1 <= port <= 65535:
            raise MetricsError(f"metrics port {port} is outside 1-65535")
        try:
            start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from None
