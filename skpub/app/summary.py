"""Progress and the end-of-run summary.

Engines hand one :class:`BatchReport` per micro-batch to a
:class:`RunObserver`, which prints progress, updates metrics and builds the
:class:`RunSummary` printed at the end. Both engines count a batch the same
way: the routing unit's :class:`RoutingCounts` and each evaluator's
:class:`EvaluatorCounts` (on Spark read from their JSON), folded into the
report by :func:`count_batch`.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from skpub.app.metrics import Metrics
from skpub.app.progress import BYTES, ProgressDisplay
from skpub.kernel.load import imbalance

STAGES = ("parse", "sequencer", "evaluators", "merge", "sink")


@dataclass
class BatchReport:
    """Counters of one micro-batch; evaluator maps are keyed by evaluator index."""

    batch_id: int
    records: int = 0
    input_bytes: int = 0
    """Bytes of input the batch's records took (each with one newline): the progress of ``skpub run``."""
    objects: int = 0
    forwarded: int = 0
    deliveries: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    routing_seconds: float = 0.0
    evaluator_cost: dict[int, int] = field(default_factory=dict)
    evaluator_cpu: dict[int, float] = field(default_factory=dict)
    evaluator_balancer_cpu: dict[int, float] = field(default_factory=dict)
    """Local engine: each evaluator's CPU seconds in the balancer's steps (load summary, hand-off, take-over),
    work its own task does on Spark; part of ``stage_cpu["balancer"]``, the rest is the routing unit's decision."""
    epoch: int = 0
    stage_cpu: Counter = field(default_factory=Counter)
    """CPU seconds per stage: ``parse`` (parallel), ``sequencer`` (serial; on Spark ``restore``, the part of it
    spent rebuilding its state when the task ran in another worker than the last batch), ``evaluators``,
    ``merge`` (top-k/kNN results), ``sink``; on Spark also ``evaluator_restore`` (evaluators rebuilt from the
    state store) and ``state_writes`` (evaluators saving their changed state)."""
    ranked: Counter = field(default_factory=Counter)
    """Top-k/kNN work: ``reevaluations`` (buffers refilled after expiries), ``reevaluated`` (candidates they
    scored), ``reevaluation_cpu_seconds`` (the thread CPU they took), ``fills`` (buffers of new or restored
    subscriptions), ``unproven`` (merged results whose tie chains outran the band, DESIGN "Top-k and kNN")."""
    balancer: Counter = field(default_factory=Counter)
    """Rebalancing: one count per operation kind whose sources handed off after this batch, ``subscriptions``
    (subscription parts they carried), ``placements`` (subscriptions whose evaluators changed at the routing
    update that opened this batch)."""
    hosts: Counter = field(default_factory=Counter)
    """Spark: ``applied`` evaluator batches, ``hosted`` those applied in an evaluator host (the rest were applied
    by the task itself, after rebuilding the evaluator when its worker did not hold it); ``sequenced`` batches,
    ``sequenced_in_host`` those the sequencer's host ran (:mod:`skpub.app.engines.sequencer_host`)."""
    controls: list[tuple[int, str, str]] = field(default_factory=list)
    """``(position, type, id)`` of the accepted subscribe, unsubscribe and snapshot records, in stream order
    (:func:`skpub.router.dispatch.accepted_controls`): what the daemon follows."""

    def costs_per_evaluator(self, evaluators: int) -> list[int]:
        """Return the cost (cost units, DESIGN glossary) of each of evaluators ``0 .. evaluators - 1`` in this batch.

        One that reported nothing cost 0 (on Spark an evaluator with no
        rows in a batch runs no task). O(evaluators).

        Raises
        ------
        ValueError
            If an evaluator ``evaluators`` or above reported (a report of
            another deployment: a bug).
        """
        if any(not 0 <= e < evaluators for e in self.evaluator_cost):
            raise ValueError(
                f"batch {self.batch_id} has costs of evaluators {sorted(self.evaluator_cost)}, not 0-{evaluators - 1}"
            )
        return [self.evaluator_cost.get(e, 0) for e in range(evaluators)]

    def imbalance(self, evaluators: int) -> float:
        """Return this batch's max / mean evaluator cost over ``evaluators`` evaluators.

        :func:`skpub.kernel.load.imbalance` of :meth:`costs_per_evaluator`.
        """
        return imbalance(self.costs_per_evaluator(evaluators))


HOST_LINES = (
    ("evaluator hosts", "applied", "hosted", "evaluator batches applied in a host"),
    ("sequencer host", "sequenced", "sequenced_in_host", "batches sequenced in its host"),
)
"""The summary's host lines: label, :attr:`BatchReport.hosts` keys of the total and of those done in a host, noun."""


@dataclass
class RoutingCounts:
    """What the routing unit counted of a micro-batch (the Spark sequencer task writes it as JSON).

    ``routing_seconds``: the batch's routing time as the engine measures it
    (:attr:`BatchReport.routing_seconds`); ``dead_letters``: reasons of the
    records the parse and the sequencer rejected; ``controls``: as
    :attr:`BatchReport.controls`; ``placements``: subscriptions whose
    evaluators the routing update opening the batch changed; ``hosted``:
    whether the sequencer's host ran it (Spark; None on the local engine,
    which has no hosts).
    """

    records: int
    input_bytes: int
    objects: int
    forwarded: int
    dead_letters: Counter
    routing_seconds: float
    parse_cpu_seconds: float
    sequencer_cpu_seconds: float
    epoch: int
    controls: list[tuple[int, str, str]]
    restore_cpu_seconds: float = 0.0
    placements: int = 0
    hosted: bool | None = None

    @classmethod
    def from_json(cls, doc: dict) -> RoutingCounts:
        """Read the routing report the Spark sequencer task wrote (``KeyError`` if it is not one)."""
        return cls(
            records=doc["records"],
            input_bytes=doc.get("bytes", 0),
            objects=doc["objects"],
            forwarded=doc["forwarded"],
            dead_letters=Counter(doc["dead_letters"]),
            routing_seconds=doc["parse_cpu_seconds"] + doc["sequencer_cpu_seconds"],
            parse_cpu_seconds=doc["parse_cpu_seconds"],
            sequencer_cpu_seconds=doc["sequencer_cpu_seconds"],
            epoch=doc["epoch"],
            controls=[(int(p), str(t), str(i)) for p, t, i in doc["controls"]],
            restore_cpu_seconds=doc.get("restore_cpu_seconds", 0.0),
            placements=doc.get("placements", 0),
            hosted=bool(doc.get("hosted", False)),
        )


@dataclass
class EvaluatorCounts:
    """What one evaluator counted of a micro-batch (on Spark, the counters its task sends the driver as JSON).

    ``cost`` in cost units (DESIGN glossary); ``deliveries``: its range
    matches; ``ranked``: its top-k/kNN work (:attr:`BatchReport.ranked`
    without ``unproven``, the merge's); ``hosted``: applied in an evaluator
    host (Spark; None on the local engine).
    """

    evaluator: int
    cost: int
    cpu_seconds: float
    deliveries: int
    ranked: Counter
    restore_cpu_seconds: float = 0.0
    state_cpu_seconds: float = 0.0
    sink_cpu_seconds: float = 0.0
    hosted: bool | None = None

    @classmethod
    def from_json(cls, doc: dict) -> EvaluatorCounts:
        """Read an evaluator task's counters (``KeyError`` if they are not)."""
        return cls(
            evaluator=doc["evaluator"],
            cost=doc["cost"],
            cpu_seconds=doc["cpu_seconds"],
            deliveries=doc["deliveries"],
            ranked=Counter(doc["ranked"]),
            restore_cpu_seconds=doc["restore_cpu_seconds"],
            state_cpu_seconds=doc["state_cpu_seconds"],
            sink_cpu_seconds=doc["sink_cpu_seconds"],
            hosted=bool(doc["hosted"]),
        )


def count_batch(
    report: BatchReport,
    routing: RoutingCounts,
    evaluators: list[EvaluatorCounts],
    events: int,
    unproven: int,
    dead_letters: Counter,
    merge_seconds: float,
) -> None:
    """Fill ``report`` with a batch's counts, the same way on both engines.

    ``events``: the ranked merge's enter/exit lines; ``unproven``: merged
    results whose tie chains outran the band in this batch;
    ``dead_letters``: reasons of the records the evaluators rejected (one per
    position), besides the routing unit's. Sets every count and the stages'
    CPU but ``sink`` and ``balancer``, which each engine measures its own way.
    """
    report.records, report.input_bytes = routing.records, routing.input_bytes
    report.objects, report.forwarded = routing.objects, routing.forwarded
    report.routing_seconds, report.epoch, report.controls = routing.routing_seconds, routing.epoch, routing.controls
    report.deliveries = sum(e.deliveries for e in evaluators) + events
    report.dead_letters = routing.dead_letters + dead_letters
    for e in sorted(evaluators, key=lambda e: e.evaluator):
        report.evaluator_cost[e.evaluator] = e.cost
        report.evaluator_cpu[e.evaluator] = e.cpu_seconds
        report.ranked.update(e.ranked)
    report.ranked["unproven"] += unproven
    if routing.placements:
        report.balancer["placements"] += routing.placements
    report.stage_cpu.update(
        parse=routing.parse_cpu_seconds,
        sequencer=routing.sequencer_cpu_seconds,
        restore=routing.restore_cpu_seconds,
        evaluator_restore=sum(e.restore_cpu_seconds for e in evaluators),
        state_writes=sum(e.state_cpu_seconds for e in evaluators),
        evaluators=sum(e.cpu_seconds for e in evaluators),
        merge=merge_seconds,
    )
    if routing.hosted is not None:
        report.hosts.update(
            applied=len(evaluators),
            hosted=sum(bool(e.hosted) for e in evaluators),
            sequenced=1,
            sequenced_in_host=int(routing.hosted),
        )


def parallel_seconds(report: BatchReport, routing_units: int = 1) -> float:
    """Return the simulated parallel seconds of one micro-batch (DESIGN "Measuring load honestly").

    The parse stage (per line, no shared state: one task per input split on
    Spark) spread over ``routing_units`` (>= 1) routing units, the sequencer
    (stream order) serial and the routing unit's balancing decision
    (:func:`routing_unit_seconds`), and the slowest evaluator (its rows and
    its share of the balancer's steps: load summary, hand-off and take-over,
    which its own task does on Spark). Seconds of thread CPU, so a run on 2
    cores simulates any number of evaluators.
    """
    return routing_unit_seconds(report, routing_units) + slowest_evaluator_seconds(report)


def routing_unit_seconds(report: BatchReport, routing_units: int = 1) -> float:
    """Return the routing unit's part of a batch's simulated parallel seconds (thread CPU).

    The parse spread over ``routing_units`` (>= 1), the sequencer and the
    balancing decision (:func:`decision_seconds`). Not
    :attr:`BatchReport.routing_seconds`, the batch's routing time as its
    engine measured it (wall seconds on the local engine, parse and
    sequencer CPU on Spark), which the metrics and the run summary report.
    """
    return report.stage_cpu["parse"] / routing_units + report.stage_cpu["sequencer"] + decision_seconds(report)


def slowest_evaluator_seconds(report: BatchReport) -> float:
    """Return the slowest evaluator's CPU seconds in a batch: its rows and its share of the balancer's steps."""
    extra = report.evaluator_balancer_cpu
    return max((cpu + extra.get(e, 0.0) for e, cpu in report.evaluator_cpu.items()), default=0.0)


def decision_seconds(report: BatchReport) -> float:
    """Return the routing unit's balancer CPU seconds in a batch: its decision (evaluators' steps are theirs)."""
    return max(0.0, report.stage_cpu["balancer"] - sum(report.evaluator_balancer_cpu.values()))


@dataclass
class BalanceRecord:
    """What the run's balance was, batch by batch, in O(1) memory.

    Imbalance is max / mean of the evaluators' cost in one batch (cost
    units, DESIGN glossary: Tornado Eq. 1's candidates plus ``object_cost``
    per object; every evaluator counted, an idle one as 0); batches
    with no cost are skipped. A batch routed by another epoch than the
    batch before was opened by a routing update (a rebalancing's
    operations land there, DESIGN "The balancer"); where both batches had
    cost, the update is weighed: the imbalance of the batch before against
    the batch it opened. ``total``, ``before`` and ``after`` are sums.
    """

    batches: int = 0
    total: float = 0.0
    last: float = 1.0
    updates: int = 0
    before: float = 0.0
    after: float = 0.0
    _epoch: int | None = field(default=None, init=False, repr=False)
    _previous: float | None = field(default=None, init=False, repr=False)

    @property
    def mean(self) -> float:
        """Max/mean evaluator cost per batch with cost, averaged (1.0 before any)."""
        return self.total / self.batches if self.batches else 1.0

    def add(self, epoch: int, costs: list[int] | list[float]) -> None:
        """Account one batch routed by ``epoch`` whose evaluators' costs are ``costs`` (one per evaluator)."""
        balance = imbalance(costs) if sum(costs) > 0 else None
        if balance is not None:
            self.batches += 1
            self.total += balance
            self.last = balance
            if self._epoch is not None and epoch != self._epoch and self._previous is not None:
                self.updates += 1
                self.before += self._previous
                self.after += balance
        self._epoch, self._previous = epoch, balance

    def format(self) -> str | None:
        """Return the summary's ``balance`` line, None before any batch with cost."""
        if not self.batches:
            return None
        line = (
            f"  balance           max/mean evaluator cost per batch {self.mean:.2f} on average,"
            f" {self.last:.2f} in the last batch with cost"
        )
        if self.updates:
            line += (
                f"; around {self.updates} routing update{'s' if self.updates > 1 else ''}:"
                f" {self.before / self.updates:.2f} in the batch before, {self.after / self.updates:.2f} in the"
                " batch opened, on average"
            )
        return line


@dataclass
class RunSummary:
    """Totals of a run. Seconds are wall-clock unless named ``cpu``."""

    engine: str
    router: str
    evaluators: int
    batches: int = 0
    records: int = 0
    input_bytes: int = 0
    objects: int = 0
    forwarded: int = 0
    deliveries: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    routing_seconds: float = 0.0
    evaluator_cost: list[int] = field(default_factory=list)
    evaluator_cpu: list[float] = field(default_factory=list)
    steady_objects: int = 0
    steady_seconds: float = 0.0
    skipped_inputs: list[str] = field(default_factory=list)
    stage_cpu: Counter = field(default_factory=Counter)
    ranked: Counter = field(default_factory=Counter)
    hosts: Counter = field(default_factory=Counter)
    balancer: Counter = field(default_factory=Counter)
    balancer_mode: str = "off"
    balance: BalanceRecord = field(default_factory=BalanceRecord)
    log_file: str | None = None
    output: str | None = None
    """The output directory (SEMANTICS 5), named at the end of the summary."""

    @property
    def objects_per_second(self) -> float:
        """Valid objects per wall-clock second of processing (setup excluded)."""
        return self.objects / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_objects_per_second(self) -> float:
        """Objects per second after the first micro-batch (which pays the engine's warm-up)."""
        return self.steady_objects / self.steady_seconds if self.steady_seconds > 0 else 0.0

    @property
    def serial_fraction(self) -> float:
        """Share of the stages' CPU that is serial (the sequencer): Amdahl's bound on speed-up is its inverse."""
        total = sum(self.stage_cpu[k] for k in STAGES)
        return self.stage_cpu["sequencer"] / total if total > 0 else 0.0

    def format(self) -> str:
        """Return the human-readable summary printed at the end of ``skpub run``."""
        dead = ", ".join(f"{r}={n}" for r, n in sorted(self.dead_letters.items())) or "none"
        cost, cpu = self.evaluator_cost, self.evaluator_cpu
        lines = [
            f"skpub run summary ({self.engine} engine, {self.router} router, {self.evaluators} evaluators)",
            f"  batches           {self.batches}",
            f"  records           {self.records}",
            f"  objects           {self.objects} ({self.objects_per_second:,.0f} objects/s over {self.seconds:.1f} s;"
            f" {self.steady_objects_per_second:,.0f}/s after the first batch)",
            f"  forwarded         {self.forwarded} (objects that passed a textual summary)",
            f"  deliveries        {self.deliveries}",
            f"  dead letters      {sum(self.dead_letters.values())} ({dead})",
            f"  routing time      {self.routing_seconds:.2f} s",
            f"  evaluator cost    max {max(cost, default=0)} / mean {sum(cost) / max(len(cost), 1):.1f}"
            f" = {imbalance(cost):.2f}",
            f"  evaluator cpu     max {max(cpu, default=0):.2f} s / mean {sum(cpu) / max(len(cpu), 1):.2f} s"
            f" = {imbalance(cpu):.2f}",
        ]
        if self.ranked:
            r = self.ranked
            lines.append(
                f"  top-k/kNN         {r['reevaluations']} re-evaluations ({r['reevaluated']} candidates scored,"
                f" {r['reevaluation_cpu_seconds']:.3f} s CPU)"
                f" · {r['fills']} buffer fills · {r['unproven']} unproven merges"
            )
        if self.stage_cpu:
            stages = " · ".join(f"{k} {self.stage_cpu[k]:.2f} s" for k in STAGES)
            per_object = self.stage_cpu["sequencer"] / self.objects * 1e6 if self.objects else 0.0
            lines.append(f"  stage cpu         {stages}")
            if self.stage_cpu["restore"] or self.stage_cpu["evaluator_restore"] or self.stage_cpu["state_writes"]:
                lines.append(
                    f"  state             sequencer restore {self.stage_cpu['restore']:.2f} s"
                    f" · evaluator restore {self.stage_cpu['evaluator_restore']:.2f} s"
                    f" · state store writes {self.stage_cpu['state_writes']:.2f} s"
                )
            lines.append(
                f"  serial            {self.serial_fraction:.1%} of stage CPU, {per_object:.2f} us per object"
                f" (speed-up bound {1 / max(self.serial_fraction, 1e-9):,.1f}x)"
            )
        if self.balancer_mode != "off":
            kinds = {k: n for k, n in sorted(self.balancer.items()) if k not in ("subscriptions", "placements")}
            done = ", ".join(f"{k} {n}" for k, n in kinds.items()) or "no operation"
            lines.append(
                f"  balancer          {self.balancer_mode}: {done}; {self.balancer['subscriptions']} subscription"
                f" parts moved, {self.balancer['placements']} placements changed"
            )
        balance = self.balance.format()
        if balance:
            lines.append(balance)
        for label, total, hosted, what in HOST_LINES:
            if self.hosts[total]:
                done, of = self.hosts[hosted], self.hosts[total]
                why = "" if done == of else " (the others by their task: hosts off, or see the engine log)"
                lines.append(f"  {label:<17} {done} of {of} {what}{why}")
        if self.output:
            lines.append(f"  outputs           {self.output}/ (deliveries/, dead_letters/, snapshots/, statistics/)")
        if self.log_file:
            lines.append(f"  engine log        {self.log_file}")
        if self.skipped_inputs:
            shown = ", ".join(self.skipped_inputs[:10]) + (" ..." if len(self.skipped_inputs) > 10 else "")
            lines.append(f"  skipped inputs    {len(self.skipped_inputs)} not *.jsonl: {shown}")
        internal = self.dead_letters.get("internal_error", 0)
        if internal:
            lines.append(f"  INTERNAL ERRORS   {internal} records failed inside the engine (a bug; see dead_letters/)")
        return "\n".join(lines)


class RunObserver:
    """Collects batch reports: progress lines, metrics, the summary."""

    def __init__(
        self,
        summary: RunSummary,
        metrics: Metrics | None = None,
        stream: TextIO | None = sys.stderr,
        every_seconds: float = 5.0,
        total_bytes: int | None = None,
    ) -> None:
        self.summary = summary
        self.metrics = metrics
        self.stream = stream
        self.every_seconds = every_seconds
        self.total_bytes = total_bytes
        self.started = self._last_batch = time.perf_counter()
        self._display: ProgressDisplay | None = None
        summary.evaluator_cost = [0] * summary.evaluators
        summary.evaluator_cpu = [0.0] * summary.evaluators

    def note(self, text: str) -> None:
        """Print one progress line about the run's setup (nothing when quiet)."""
        if self._display is not None:
            self._display.note(text)
        elif self.stream:
            print(f"[skpub] {text}", file=self.stream, flush=True)

    def start(self) -> None:
        """Restart the run clock: throughput counts from here (after setup); show the progress from here."""
        self.started = self._last_batch = time.perf_counter()
        if self.stream and self._display is None:
            self._display = ProgressDisplay(self.stream, self.total_bytes, BYTES, self.every_seconds)
            first = "first micro-batch (Spark warm-up)" if self.summary.engine == "spark" else "first micro-batch"
            self._display.update(0, first, "started", force=not self._display.live)

    def on_batch(self, report: BatchReport) -> None:
        """Account one micro-batch; print a progress line at most every ``every_seconds``."""
        s = self.summary
        s.batches += 1
        s.records += report.records
        s.input_bytes += report.input_bytes
        s.objects += report.objects
        s.forwarded += report.forwarded
        s.deliveries += report.deliveries
        s.dead_letters.update(report.dead_letters)
        s.routing_seconds += report.routing_seconds
        for e, c in report.evaluator_cost.items():
            s.evaluator_cost[e] += c
        for e, c in report.evaluator_cpu.items():
            s.evaluator_cpu[e] += c
        s.stage_cpu.update(report.stage_cpu)
        s.ranked.update(report.ranked)
        s.hosts.update(report.hosts)
        s.balancer.update(report.balancer)
        s.balance.add(report.epoch, report.costs_per_evaluator(s.evaluators))
        now = time.perf_counter()
        if s.batches > 1:
            s.steady_objects += report.objects
            s.steady_seconds += now - self._last_batch
        self._last_batch = now
        s.seconds = now - self.started
        if self.metrics:
            self.metrics.observe_batch(report, s.evaluators)
        if self._display is not None:
            self._display.update(s.input_bytes, f"batch {report.batch_id}", self._figures(), force=s.batches == 1)

    def finish(self) -> RunSummary:
        """Close the run (and its progress display) and return its summary."""
        self.summary.seconds = time.perf_counter() - self.started
        if self._display is not None:
            done = max(self.summary.input_bytes, self.total_bytes or 0)  # CRLF, a BOM, a resumed run: all read
            self._display.update(done, "done", self._figures(), force=True)
        self.close()
        return self.summary

    def close(self) -> None:
        """Stop the progress display (a failed or interrupted run too: the terminal gets its cursor back)."""
        if self._display is not None:
            self._display.close()
            self._display = None

    def _figures(self) -> str:
        """Return the progress figures: records, objects/s, deliveries, dead letters."""
        s = self.summary
        return (
            f"{s.records:,} records · {s.objects_per_second:,.0f} objects/s · {s.deliveries:,} deliveries"
            f" · {sum(s.dead_letters.values()):,} dead letters"
        )
