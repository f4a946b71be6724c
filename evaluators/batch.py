"""One micro-batch of one evaluator on the Spark engine: what applying it takes, what it gives, and applying it.

The Spark stateful processor (:mod:`skpub.evaluators.spark_processor`)
applies a batch in the evaluator's host (:mod:`skpub.evaluators.host`,
served by :func:`host_handler`) or, when the host cannot, in its own Python
worker; both call :func:`apply_batch`. Nothing here imports PySpark, so a
host starts without it: with the path Spark gives its workers (``pyspark.zip``
first, compiled anew in every process), importing this module took 0.34 s,
the processor module 0.72 s (an import-linter contract keeps it so).
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import pyarrow as pa

from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.evaluator import Evaluator
from skpub.evaluators.merge import encode_updates
from skpub.evaluators.state import EvaluatorState, clock_of, restore_evaluator
from skpub.kernel.host import recv_message, send_message
from skpub.kernel.parts import delivery_lines
from skpub.kernel.records import DeadLetter
from skpub.kernel.runtime import tune_gc
from skpub.kernel.transfer import read_handoffs, read_plan, write_handoff
from skpub.kernel.wire import read_rows_file

RANKED_COMPACT_EVERY = 16
"""When an evaluator holds more than this many saved ranked-subscription changes, one document of all replaces them."""


@dataclass
class BatchInput:
    """What applying one micro-batch of one evaluator needs: state version, file of routed rows (JSON-ready)."""

    run_id: str
    evaluator: int
    batch_id: int
    version: int
    generation: str
    deployment_json: str
    saved_ranked: int
    rows_path: str
    rows: int
    balancer_dir: str = ""
    partition: str = ""


@dataclass
class BatchOutcome:
    """What one evaluator's micro-batch gives the state store and the driver."""

    counters: dict
    dead_letters: list[DeadLetter]
    updates: bytes
    deliveries: bytes
    statistics: dict
    blocks: dict[int, bytes | None]
    window: dict[int, bytes | None]
    ranked: bytes | None
    compacted: bytes | None
    clock: tuple[int, float, str]
    load: bytes | None = None

    def to_message(self) -> tuple[dict, list[bytes]]:
        """Return the outcome as a host message (header and blobs; None entries carry no blob)."""
        blobs = [self.updates, self.deliveries]
        changes = {}
        for name in ("blocks", "window"):
            entries = getattr(self, name)
            changes[name] = [[k, v is not None] for k, v in entries.items()]
            blobs += [v for v in entries.values() if v is not None]
        for name in ("ranked", "compacted", "load"):
            value = getattr(self, name)
            changes[name] = value is not None
            if value is not None:
                blobs.append(value)
        header = {
            "status": "ok",
            "counters": self.counters,
            "statistics": self.statistics,
            "dead_letters": [[d.pos, d.line, d.reason, d.message] for d in self.dead_letters],
            "clock": list(self.clock),
            **changes,
        }
        return header, blobs

    @classmethod
    def from_message(cls, header: dict, blobs: list[bytes]) -> BatchOutcome:
        """Rebuild the outcome of :meth:`to_message`."""
        rest = iter(blobs[2:])
        maps = {
            name: {int(k): next(rest) if present else None for k, present in header[name]}
            for name in ("blocks", "window")
        }
        ranked = next(rest) if header["ranked"] else None
        compacted = next(rest) if header["compacted"] else None
        load = next(rest) if header["load"] else None
        return cls(
            header["counters"],
            [DeadLetter(*row) for row in header["dead_letters"]],
            blobs[0],
            blobs[1],
            header["statistics"],
            maps["blocks"],
            maps["window"],
            ranked,
            compacted,
            clock_of(header["clock"]),
            load,
        )


def apply_batch(evaluator: Evaluator, rows: pa.Table, batch: BatchInput, restore_seconds: float) -> BatchOutcome:
    """Apply one micro-batch's routed rows (:data:`~skpub.kernel.wire.ROUTED_SCHEMA`) to ``evaluator``.

    Returns its deliveries (part-file bytes) and statistics, which the task
    writes, the state changes and the driver's counters. An evaluator that
    last reported to another merge generation reports anew (the home
    evaluator every ranked subscription, the others their non-empty results).
    """
    e, batch_id = batch.evaluator, batch.batch_id
    if evaluator.monitor.generation != batch.generation:
        evaluator.monitor.forget_reports()
        evaluator.monitor.generation = batch.generation
    if batch.balancer_dir:
        take_over(evaluator, batch)
    result = evaluator.apply_many(rows, batch_id)
    balancer = hand_off(evaluator, batch) if batch.balancer_dir else {}
    start = time.thread_time()
    blocks = evaluator.take_dirty_blocks()
    window, ranked = evaluator.monitor.take_changes()
    compacted = None
    if ranked is not None and batch.saved_ranked + 1 > RANKED_COMPACT_EVERY:
        compacted = evaluator.monitor.subscriptions_json()
    store = evaluator.monitor.store
    state = time.thread_time() - start
    start = time.thread_time()
    stats = result.stats.to_json(e, batch_id, result.cpu_seconds, evaluator.subscriptions)
    deliveries = delivery_lines(result.deliveries)
    counters = {
        "evaluator": e,
        "deliveries": len(result.deliveries),
        "cost": stats["cost"],
        "cpu_seconds": result.cpu_seconds,
        "sink_cpu_seconds": time.thread_time() - start,
        "restore_cpu_seconds": restore_seconds,
        "state_cpu_seconds": state,
        "ranked": dict(result.stats.ranked_work()),
        **balancer,
    }
    clock = (store.accepted, store.watermark, evaluator.monitor.generation)
    updates = encode_updates(result.updates)
    load = evaluator.load.to_document() if batch.balancer_dir else None
    return BatchOutcome(
        counters, result.dead_letters, updates, deliveries, stats, blocks, window, ranked, compacted, clock, load
    )


def take_over(evaluator: Evaluator, batch: BatchInput) -> None:
    """Before the batch: complete the transfer whose routing update opens it (its plan and hand-offs), if any.

    Then the evaluator takes its partition in the batch's epoch unless it
    has it (a new evaluator's first batch).

    Raises
    ------
    EvaluatorError
        If the plan or a hand-off is damaged or missing.
    """
    try:
        plan = read_plan(batch.balancer_dir, batch.batch_id - 2)
        if plan is not None:
            evaluator.take_over(plan, read_handoffs(batch.balancer_dir, plan))
    except ValueError as exc:
        raise EvaluatorError(str(exc)) from None
    evaluator.ensure_partition([tuple(box) for box in json.loads(batch.partition)])


def hand_off(evaluator: Evaluator, batch: BatchInput) -> dict:
    """After the batch: the load summary for the driver, or the hand-off when the batch is a plan's transfer batch.

    Returns the counters' ``load`` (:meth:`~skpub.kernel.load.LoadSummary.to_json`) when the driver
    decides after this batch; in a transfer batch (which decides nothing) the statistics only age, and a
    source returns its ``handoff`` (:meth:`~skpub.kernel.transfer.Handoff.counters`); the hand-off is
    written atomically (a replay writes the same document again).

    Raises
    ------
    EvaluatorError
        If the plan is damaged.
    """
    try:
        plan = read_plan(batch.balancer_dir, batch.batch_id - 1)
    except ValueError as exc:
        raise EvaluatorError(str(exc)) from None
    if plan is None:
        return {"load": evaluator.load_summary(batch.batch_id).to_json()}
    evaluator.age_load()
    start = time.thread_time()
    handoff = evaluator.hand_off(plan)
    if handoff is None:
        return {}
    nbytes = write_handoff(batch.balancer_dir, handoff)
    return {"handoff": handoff.counters(nbytes, time.thread_time() - start)}


def read_rows(batch: BatchInput) -> pa.Table:
    """Return the batch's routed rows (the file the sequencer task wrote).

    Raises
    ------
    EvaluatorError
        If the file cannot be read as Arrow, or does not hold the rows the sequencer counted.
    """
    try:
        table = read_rows_file(batch.rows_path, batch.rows, "routed rows", f"evaluator {batch.evaluator}")
    except ValueError as exc:
        raise EvaluatorError(str(exc)) from None
    return table


def host_handler() -> Callable[[socket.socket], None]:
    """Return the request handler of an evaluator host: it keeps the last evaluator it applied a batch to."""
    held: dict[tuple[str, int], tuple[int, Evaluator]] = {}

    def handle(conn: socket.socket) -> None:
        tune_gc()
        try:
            header, _ = recv_message(conn)
            batch = BatchInput(**{f.name: header[f.name] for f in fields(BatchInput)})
            key = (batch.run_id, batch.evaluator)
            cached = held.pop(key, None)
            held.clear()
            start = time.thread_time()
            if cached is not None and cached[0] == batch.version:
                evaluator = cached[1]
            elif batch.version < 0:
                evaluator = restore_evaluator(batch.evaluator, batch.deployment_json, None)
            else:
                send_message(conn, {"status": "restore"})
                state = EvaluatorState.from_message(*recv_message(conn))
                evaluator = restore_evaluator(batch.evaluator, batch.deployment_json, state)
            restore = time.thread_time() - start
            outcome = apply_batch(evaluator, read_rows(batch), batch, restore)
            send_message(conn, *outcome.to_message())
            held[key] = (batch.batch_id, evaluator)
        except Exception as exc:  # noqa: BLE001 - the worker applies the batch itself
            held.clear()
            with contextlib.suppress(OSError):
                send_message(conn, {"status": "error", "message": f"{type(exc).__name__}: {exc}"})

    return handle
