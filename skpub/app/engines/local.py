"""The local engine: the whole pipeline embedded in one process, with a parse worker beside it.

Micro-batches of ``deployment.batch_size`` lines go through
:class:`skpub.router.dispatch.Router` (the locator and the sequencer the Spark
engine runs in separate tasks), the same
:class:`skpub.evaluators.evaluator.Evaluator` and the part-file encoding of
:mod:`skpub.kernel.parts`. Evaluators run one after the other; each one's
thread CPU time is measured, so ``max(evaluator time) + routing time`` gives
the parallel time of a batch (DESIGN "Measuring load honestly"). While a
batch is routed, one worker process may parse the next
(:mod:`skpub.app.engines.parse_ahead`).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from skpub.app.checkpoint import CHECKPOINT_DIR, Checkpoint
from skpub.app.engines.parse_ahead import ParseAhead, worth_a_worker
from skpub.app.engines.sink import unique_letters, write_batch
from skpub.app.output import claim_output, mark_success
from skpub.app.summary import BatchReport, EvaluatorCounts, RoutingCounts, RunObserver, RunSummary, count_batch
from skpub.balancer.transfer import balancer_step
from skpub.evaluators.evaluator import Evaluator
from skpub.evaluators.merge import RankedMerge
from skpub.kernel.config import Deployment
from skpub.kernel.inputs import STDIN, batches, iter_lines, take_sample
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import Vocabulary, load_vocabulary, pin_vocabulary
from skpub.kernel.transfer import Handoff, TransferPlan
from skpub.router.dispatch import Router
from skpub.router.epoch import RoutingEpoch
from skpub.router.initial import initial_table
from skpub.router.locate import LocatedItems


def _replay_then(sample: list[bytes], lines: Iterator[bytes]) -> Iterator[bytes]:
    """Yield the sample's lines, free them, then the rest of the input."""
    yield from sample
    sample.clear()
    yield from lines


Sink = Callable[..., BatchReport]
"""Where a batch's outputs go: :func:`~skpub.app.engines.sink.write_batch` bound to its root, or the daemon's logs."""


@dataclass
class Balancing:
    """The local engine's side of the balancer: the plan in flight, its hand-offs and the epoch it publishes."""

    root: Path
    deployment: Deployment
    plan: TransferPlan | None = None
    epoch: RoutingEpoch | None = None
    handoffs: list[Handoff] = field(default_factory=list)

    def start(
        self, batch_id: int, epoch: RoutingEpoch, evaluators: list[Evaluator], router: Router, report: BatchReport
    ) -> RoutingEpoch:
        """Return the epoch of micro-batch ``batch_id``; at a plan's first batch, complete its transfer first.

        The routing update: every target takes its hand-offs over, the
        participants keep their new partitions, the sequencer rehomes the
        placements; then the plan's epoch routes.
        """
        if self.plan is None or self.plan.first_batch != batch_id:
            return epoch
        for e, ev in enumerate(evaluators):
            start = time.thread_time()
            ev.take_over(self.plan, self.handoffs)
            _charge(report, e, start)
        report.balancer["placements"] += router.sequencer.rehome(self.handoffs)
        epoch, self.plan, self.epoch, self.handoffs = self.epoch, None, None, []
        return epoch

    def end(self, batch_id: int, epoch: RoutingEpoch, evaluators: list[Evaluator], report: BatchReport) -> None:
        """After micro-batch ``batch_id``: hand off when it is a plan's transfer batch, else decide.

        A transfer batch decides nothing, so its evaluators only age their
        statistics (no load summary). A hand-off goes through its JSON
        document, as on Spark, so both engines carry the same bytes and
        floats; the rest is :func:`~skpub.balancer.transfer.balancer_step`,
        as on Spark.
        """
        summaries, counters = [], []
        for e, ev in enumerate(evaluators):
            start = time.thread_time()
            if self.plan is None:
                summaries.append(ev.load_summary(batch_id))
            else:
                ev.age_load()
            handoff_start = time.thread_time()
            handoff = ev.hand_off(self.plan) if self.plan is not None else None
            if handoff is not None:
                data = handoff.encode()
                self.handoffs.append(Handoff.decode(data))
                counters.append(handoff.counters(len(data), time.thread_time() - handoff_start))
            _charge(report, e, start)
        settings = self.deployment.balancer
        decided = balancer_step(self.root, settings, batch_id, epoch, self.plan, counters, summaries, report.balancer)
        if decided is not None:
            self.plan, self.epoch = decided


class LocalPipeline:
    """The local engine's data plane between batches: routing unit, evaluators, ranked merge and balancer.

    ``run_local`` feeds it a file's micro-batches; the daemon (``skpub
    serve``) feeds it the ingest log's. :meth:`new` starts one whose
    initial partitioning is computed from a sample (lines of the stream's
    head); :mod:`skpub.app.engines.local_checkpoint` restores one from its
    parts. ``root`` receives the balancer's log
    (``root/balancer/part-<batch>.jsonl``).
    """

    def __init__(
        self,
        root: Path,
        deployment: Deployment,
        epoch: RoutingEpoch,
        router: Router,
        evaluators: list[Evaluator],
        merge: RankedMerge,
    ) -> None:
        self.epoch, self.router, self.evaluators, self.merge = epoch, router, evaluators, merge
        self.balancing = Balancing(root, deployment) if deployment.balancer.mode != "off" else None

    @classmethod
    def new(cls, root: Path, deployment: Deployment, vocabulary: Vocabulary, sample: list[bytes]) -> LocalPipeline:
        """Return a pipeline at the stream's start, partitioned from ``sample`` (Tornado 4.1)."""
        epoch = RoutingEpoch(0, 0, initial_table(deployment, vocabulary, sample))
        evaluators = [Evaluator(e, deployment, vocabulary) for e in range(deployment.evaluators)]
        for e, ev in enumerate(evaluators):
            ev.set_partition(epoch.table.partitioning.boxes_of(e))
        return cls(root, deployment, epoch, Router(deployment, vocabulary), evaluators, RankedMerge())

    def epoch_for(self, batch_id: int) -> RoutingEpoch:
        """Return the routing epoch of micro-batch ``batch_id``, the next one to step or the one after it.

        Known a batch ahead: a plan decided after batch ``b`` routes from
        ``b + 2`` on (:attr:`~skpub.kernel.transfer.TransferPlan.first_batch`),
        so the one after the next batch to step is routed by the plan in
        flight if that plan's first batch has come, else by the current epoch.
        """
        balancing = self.balancing
        if balancing is not None and balancing.plan is not None and balancing.plan.first_batch <= batch_id:
            assert balancing.epoch is not None  # set with the plan
            return balancing.epoch
        return self.epoch

    def step(self, batch_id: int, batch: list[bytes], sink: Sink, located: LocatedItems | None = None) -> BatchReport:
        """Run micro-batch ``batch_id`` of lines ``batch`` and hand its outputs to ``sink``; return its report.

        ``sink`` is called as :func:`~skpub.app.engines.sink.write_batch` is,
        without its ``root``, and completes the report. ``located``: the
        batch's parse stage if a parse worker ran it
        (:mod:`skpub.app.engines.parse_ahead`; used only if it was run under
        the batch's epoch). Never raises for a line (SEMANTICS 1).
        """
        evaluators, balancing = self.evaluators, self.balancing
        report = BatchReport(batch_id, records=len(batch), input_bytes=sum(map(len, batch)) + len(batch))
        if balancing is not None:
            balance_start = time.thread_time()
            self.epoch = balancing.start(batch_id, self.epoch, evaluators, self.router, report)
            report.stage_cpu["balancer"] = time.thread_time() - balance_start
        epoch = self.epoch
        routed = self.router.route_many(batch, batch_id, epoch, located)
        split = time.thread_time()
        per_evaluator = routed.rows_for(len(evaluators))  # the Spark sequencer task's files, one per evaluator
        split = time.thread_time() - split
        results = [ev.apply_many(rows, batch_id) for ev, rows in zip(evaluators, per_evaluator, strict=True)]
        merge_start, unproven = time.thread_time(), self.merge.unproven
        events, snapshots = self.merge.apply(routed.marks, (u for r in results for u in r.updates))
        merge_seconds = time.thread_time() - merge_start
        statistics = [
            r.stats.to_json(r.evaluator, batch_id, r.cpu_seconds, ev.subscriptions)
            for r, ev in zip(results, evaluators, strict=True)
        ]
        routing = RoutingCounts(
            records=report.records,
            input_bytes=report.input_bytes,
            objects=routed.objects,
            forwarded=routed.forwarded,
            dead_letters=Counter(d.reason for d in routed.dead_letters),
            routing_seconds=routed.routing_seconds,
            parse_cpu_seconds=routed.parse_cpu_seconds,
            sequencer_cpu_seconds=routed.sequencer_cpu_seconds + split,
            epoch=epoch.number,
            controls=routed.controls,
        )
        counts = [
            EvaluatorCounts(r.evaluator, r.stats.overall, r.cpu_seconds, len(r.deliveries), r.stats.ranked_work())
            for r in results
        ]
        letters = unique_letters(d for r in results for d in r.dead_letters)  # one per record, whichever failed
        dead = Counter(d.reason for d in letters)
        count_batch(report, routing, counts, len(events), self.merge.unproven - unproven, dead, merge_seconds)
        sink_start = time.thread_time()
        sink(batch_id, [r.deliveries for r in results], routed.dead_letters + letters, statistics, report, events,
             snapshots)  # fmt: skip
        report.stage_cpu["sink"] = time.thread_time() - sink_start
        if balancing is not None:
            balance_start = time.thread_time()
            balancing.end(batch_id, epoch, evaluators, report)
            report.stage_cpu["balancer"] += time.thread_time() - balance_start
        return report


def _charge(report: BatchReport, evaluator: int, start: float) -> None:
    """Add the thread CPU since ``start`` to ``evaluator``'s balancer seconds in ``report``."""
    cpu = report.evaluator_balancer_cpu
    cpu[evaluator] = cpu.get(evaluator, 0.0) + time.thread_time() - start


def _with_next(
    items: Iterator[list[bytes]], ahead: Callable[[], bool]
) -> Iterator[tuple[list[bytes], list[bytes] | None]]:
    """Yield each item with the one after it (None after the last), reading ahead only while ``ahead()`` holds.

    When ``ahead()`` is false an item is yielded with None, and the next is
    read only once the consumer asks for it.
    """
    current = next(items, None)
    while current is not None:
        if not ahead():
            yield current, None
            current = next(items, None)
            continue
        upcoming = next(items, None)
        yield current, upcoming
        current = upcoming


def run_local(
    input_path: str | Path,
    output_dir: str | Path,
    deployment: Deployment,
    observer: RunObserver,
    overwrite: bool = False,
    parse_ahead: bool | None = None,
) -> RunSummary:
    """Run the stream at ``input_path`` through the local engine into ``output_dir``.

    ``input_path`` may be ``"-"`` (standard input). The input is read once, as
    a stream: the head is kept as the partitioning sample and replayed.
    ``_SUCCESS`` is written last; a run stopped before it leaves partial
    output, and running again (same arguments) replaces it with exactly what
    a clean run writes.

    While a micro-batch is routed and evaluated, a worker process parses the
    next one (:mod:`skpub.app.engines.parse_ahead`) if ``parse_ahead`` is
    true, or by default (None) when the input is files (not standard input,
    where a batch would wait for the next to be read) and
    :func:`~skpub.app.engines.parse_ahead.worth_a_worker` says so for
    ``deployment.batch_size``; the results are the same either way. With
    the worker, batch ``b`` is routed once batch ``b + 1`` is read.

    Returns
    -------
    skpub.app.summary.RunSummary

    Raises
    ------
    skpub.kernel.errors.InputError
        If the input is missing, or a directory without ``*.jsonl`` files.
    skpub.kernel.errors.OutputError
        If ``output_dir`` holds files skpub did not write, or a finished run
        and ``overwrite`` is false.
    skpub.kernel.errors.CheckpointError
        If a checkpoint folder in ``output_dir`` holds files skpub did not write.
    """
    deployment = pin_vocabulary(deployment)
    vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
    lines = iter_lines(input_path)
    sample = take_sample(lines, deployment.sample_size)
    run_id = uuid.uuid4().hex
    root = claim_output(output_dir, run_id, overwrite)
    Checkpoint(root / CHECKPOINT_DIR).clear()
    pipeline = LocalPipeline.new(root, deployment, vocabulary, sample)
    if parse_ahead is None:
        parse_ahead = str(input_path) != STDIN and worth_a_worker(deployment.batch_size)
    tune_gc()
    observer.start()
    sink = functools.partial(write_batch, root)
    with ParseAhead(deployment, pipeline.router.locate) as ahead:

        def working() -> bool:  # read as the run goes on: a worker that failed reads nothing ahead
            return bool(parse_ahead) and ahead.failure is None

        stream = _with_next(batches(_replay_then(sample, lines), deployment.batch_size), working)
        for batch_id, (batch, upcoming) in enumerate(stream):
            located = ahead.take(batch_id)
            if upcoming is not None:
                ahead.submit(batch_id + 1, upcoming, pipeline.epoch_for(batch_id + 1))
            observer.on_batch(pipeline.step(batch_id, batch, sink, located))
            if ahead.failure is not None and parse_ahead:
                observer.note(f"parse worker stopped ({ahead.failure}); parsing in this process from now on")
                parse_ahead = False
    mark_success(root, run_id)
    return observer.finish()
