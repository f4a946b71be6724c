"""The local engine: the whole pipeline embedded in one process.

Micro-batches of ``deployment.batch_size`` lines go through
:class:`skpub.router.dispatch.Router` (the locator and the sequencer the Spark
engine runs in separate tasks), the same
:class:`skpub.evaluators.evaluator.Evaluator` and the part-file encoding of
:mod:`skpub.kernel.parts`. Evaluators run one after the other; each one's
thread CPU time is measured, so ``max(evaluator time) + routing time`` gives
the parallel time of a batch (DESIGN "Measuring load honestly").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from skpub.app.checkpoint import CHECKPOINT_DIR, Checkpoint
from skpub.app.engines.sink import write_batch
from skpub.app.output import claim_output, mark_success
from skpub.app.summary import BatchReport, RunObserver, RunSummary
from skpub.balancer.operation import apply_moves
from skpub.balancer.policy import decide
from skpub.balancer.transfer import transfer
from skpub.evaluators.evaluator import Evaluator
from skpub.evaluators.merge import RankedMerge
from skpub.kernel.config import Deployment
from skpub.kernel.inputs import batches, iter_lines, take_sample
from skpub.kernel.parts import write_part
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary
from skpub.router.agrid import AGrid
from skpub.router.dispatch import Router
from skpub.router.epoch import RoutingEpoch
from skpub.router.initial import initial_table


def _replay_then(sample: list[bytes], lines: Iterator[bytes]) -> Iterator[bytes]:
    """Yield the sample's lines, free them, then the rest of the input."""
    yield from sample
    sample.clear()
    yield from lines


def rebalance(
    root: Path,
    batch_id: int,
    epoch: RoutingEpoch,
    evaluators: list[Evaluator],
    router: Router,
    deployment: Deployment,
    report: BatchReport,
) -> RoutingEpoch:
    """Decide after micro-batch ``batch_id`` and carry out the operation; return the epoch of the next batch.

    The operation's line goes to ``root/balancer/part-<batch>.jsonl``. The
    transfer completes between two batches (:mod:`skpub.balancer.transfer`),
    so the new epoch is in force from the next batch.
    """
    start = time.perf_counter()
    summaries = [ev.load_summary(batch_id) for ev in evaluators]
    partitioning = epoch.table.partitioning
    operation = decide(deployment.balancer, partitioning, summaries, batch_id)
    if operation is None:
        return epoch
    after = apply_moves(partitioning, operation.moves)
    transfer_start = time.perf_counter()
    moved = transfer(operation, after, evaluators, router.sequencer)
    transfer_seconds = time.perf_counter() - transfer_start
    line = {
        "batch": batch_id,
        "epoch": epoch.number + 1,
        **operation.to_json(),
        "subscription_parts_moved": moved.subscriptions,
        "placements_changed": moved.placements,
        "summary_bytes": sum(s.nbytes() for s in summaries),
        "transfer_seconds": transfer_seconds,
        "seconds": time.perf_counter() - start,
    }
    write_part(root, "balancer", batch_id, [line])
    report.balancer.update({operation.kind: 1, "subscriptions": moved.subscriptions, "placements": moved.placements})
    return RoutingEpoch(epoch.number + 1, batch_id + 1, AGrid(epoch.table.grid, after))


def run_local(
    input_path: str | Path,
    output_dir: str | Path,
    deployment: Deployment,
    observer: RunObserver,
    overwrite: bool = False,
) -> RunSummary:
    """Run the stream at ``input_path`` through the local engine into ``output_dir``.

    ``input_path`` may be ``"-"`` (standard input). The input is read once, as
    a stream: the head is kept as the partitioning sample and replayed.
    ``_SUCCESS`` is written last; a run stopped before it leaves partial
    output, and running again (same arguments) replaces it with exactly what
    a clean run writes.

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
    vocabulary = load_vocabulary(deployment.vocabulary)
    lines = iter_lines(input_path)
    sample = take_sample(lines, deployment.sample_size)
    run_id = uuid.uuid4().hex
    root = claim_output(output_dir, run_id, overwrite)
    Checkpoint(root / CHECKPOINT_DIR).clear()
    epoch = RoutingEpoch(0, 0, initial_table(deployment, vocabulary, sample))
    stream = _replay_then(sample, lines)
    router = Router(deployment, vocabulary)
    evaluators = [Evaluator(e, deployment, vocabulary) for e in range(deployment.evaluators)]
    for e, ev in enumerate(evaluators):
        ev.set_partition(epoch.table.partitioning.boxes_of(e))
    merge = RankedMerge()
    tune_gc()
    observer.start()
    for batch_id, batch in enumerate(batches(stream, deployment.batch_size)):
        routed = router.route_many(batch, batch_id, epoch)
        per_evaluator = routed.rows_for(len(evaluators))
        results = [ev.apply_many(rows, batch_id) for ev, rows in zip(evaluators, per_evaluator, strict=True)]
        merge_start, unproven = time.thread_time(), merge.unproven
        events, snapshots = merge.apply(routed.marks, (u for r in results for u in r.updates))
        merge_seconds = time.thread_time() - merge_start
        report = BatchReport(
            batch_id,
            records=len(batch),
            objects=routed.objects,
            forwarded=routed.forwarded,
            routing_seconds=routed.routing_seconds,
            epoch=epoch.number,
        )
        report.ranked.update(
            reevaluations=sum(r.stats.reevaluations for r in results),
            reevaluated=sum(r.stats.reevaluated for r in results),
            reevaluation_cpu_seconds=sum(r.stats.reevaluation_cpu_seconds for r in results),
            fills=sum(r.stats.fills for r in results),
            unproven=merge.unproven - unproven,
        )
        statistics = [
            r.stats.to_json(r.evaluator, batch_id, r.cpu_seconds, ev.subscriptions)
            for r, ev in zip(results, evaluators, strict=True)
        ]
        sink_start = time.thread_time()
        write_batch(
            root,
            batch_id,
            (r.deliveries for r in results),
            routed.dead_letters + [d for r in results for d in r.dead_letters],
            statistics,
            report,
            events,
            snapshots,
        )
        report.stage_cpu.update(
            parse=routed.parse_cpu_seconds,
            sequencer=routed.sequencer_cpu_seconds,
            evaluators=sum(r.cpu_seconds for r in results),
            merge=merge_seconds,
            sink=time.thread_time() - sink_start,
        )
        if deployment.balancer.mode != "off":
            balance_start = time.thread_time()
            epoch = rebalance(root, batch_id, epoch, evaluators, router, deployment, report)
            report.stage_cpu["balancer"] = time.thread_time() - balance_start
        observer.on_batch(report)
    mark_success(root, run_id)
    return observer.finish()
