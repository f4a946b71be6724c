"""The routing unit in one process: the parallel stage, then the serial one.

:class:`Router` runs :class:`~skpub.router.locate.Locator` (parse, validate,
normalize, locate: objects in bulk, other lines one by one; parallel in the
Spark engine) and then the
:class:`~skpub.router.sequencer.Sequencer` (registry, placements, textual
summaries: serial) over one micro-batch, and returns, in stream order, one
routed row (:data:`~skpub.kernel.wire.ROUTED_SCHEMA`) per (record, evaluator)
plus the batch's dead letters:

- an object goes to the owner of its fine cell, only if that evaluator's
  textual summary shares a term with it (Tornado section 3.1);
- a range subscription goes to every partition its rectangle overlaps, with
  the cell box of rectangle ∩ partition so the evaluator indexes only its
  own cells;
- an unsubscribe goes to the evaluators that hold the subscription;
- a dead letter goes to the sink, never to an evaluator.

The local engine calls it directly; the Spark engine runs the same two stages
(:func:`~skpub.router.locate.located_table`,
:meth:`~skpub.router.sequencer.Sequencer.sequence_table`,
:func:`~skpub.router.sequencer.routed_table`) in separate tasks
(``skpub.app.engines.spark_tasks``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from skpub.kernel.config import Deployment
from skpub.kernel.records import DeadLetter, position_index, stream_position
from skpub.kernel.registry import IdRegistry
from skpub.kernel.text import Vocabulary
from skpub.kernel.wire import ROUTED_SCHEMA, SNAPSHOT, SUBSCRIBE, UNSUBSCRIBE
from skpub.router.epoch import RoutingEpoch
from skpub.router.locate import LocatedItems, Locator
from skpub.router.sequencer import Decisions, Sequencer, evaluator_tables, routed_table


@dataclass
class RoutedBatch:
    """The routing of one micro-batch: routed rows in stream order, dead letters, counters, CPU seconds per stage.

    ``table`` holds one :data:`~skpub.kernel.wire.ROUTED_SCHEMA` row per
    (record, evaluator); :meth:`rows_for` splits them by evaluator.
    ``marks`` are the ``(position, snapshot id)`` where evaluators report
    their ranked results, in stream order (:func:`marks`);
    ``controls`` the accepted control records (:func:`accepted_controls`).
    """

    batch_id: int
    table: pa.Table = field(default_factory=ROUTED_SCHEMA.empty_table)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    objects: int = 0
    forwarded: int = 0
    routing_seconds: float = 0.0
    parse_cpu_seconds: float = 0.0
    sequencer_cpu_seconds: float = 0.0
    marks: list[tuple[int, str]] = field(default_factory=list)
    controls: list[tuple[int, str, str]] = field(default_factory=list)

    def rows_for(self, evaluators: int) -> list[pa.Table]:
        """Return each evaluator's routed rows, in stream order (``evaluators`` tables of :data:`ROUTED_SCHEMA`)."""
        return evaluator_tables(self.table, range(evaluators))


def marks(decisions: Decisions, items: pa.Table, end: int) -> list[tuple[int, str]]:
    """Return the ``(position, snapshot id)`` of the batch's marks, in stream order.

    They are its snapshots sent to every evaluator, then its end (id ``""``)
    when the batch ends with a mark row.
    """
    out = []
    if decisions.snapshots:
        taken = items.select(["pos", "id"]).take(pa.array(decisions.snapshots, pa.int64()))
        out = list(zip(taken.column("pos").to_pylist(), taken.column("id").to_pylist(), strict=True))
    return [*out, (end, "")] if decisions.mark else out


CONTROL_TYPES = {SUBSCRIBE: "subscribe", UNSUBSCRIBE: "unsubscribe", SNAPSHOT: "snapshot"}
"""Record types of the kind codes the daemon follows: subscription definitions and snapshots by id."""


def accepted_controls(decisions: Decisions, items: pa.Table) -> list[tuple[int, str, str]]:
    """Return ``(position, type, id)`` of the batch's accepted subscribe, unsubscribe and snapshot records.

    Accepted: located (valid) and not rejected by the sequencer. In stream
    order; O(items) vectorized, O(controls) in Python.
    """
    kinds = items.column("kind").to_numpy(zero_copy_only=False)
    wanted = np.isin(kinds, list(CONTROL_TYPES))
    wanted[[i for i, _, _ in decisions.rejected]] = False
    rows = np.flatnonzero(wanted)
    if not len(rows):
        return []
    taken = items.select(["pos", "kind", "id"]).take(pa.array(rows, pa.int64()))
    return [
        (pos, CONTROL_TYPES[kind], rid)
        for pos, kind, rid in zip(
            taken.column("pos").to_pylist(),
            taken.column("kind").to_pylist(),
            taken.column("id").to_pylist(),
            strict=True,
        )
    ]


def rejected_letters(
    decisions: Decisions, positions: pa.Array | pa.ChunkedArray, line_of: Callable[[int], bytes]
) -> list[DeadLetter]:
    """Return the dead letters of the sequencer's rejections; ``line_of(pos)`` gives the record's input line."""
    out = []
    for i, reason, message in decisions.rejected:
        pos = positions[i].as_py()
        out.append(DeadLetter.for_line(pos, line_of(pos), reason, message))
    return out


class Router:
    """A routing unit: a locator per epoch and the sequencer's state."""

    def __init__(self, deployment: Deployment, vocabulary: Vocabulary, registry: IdRegistry | None = None) -> None:
        self.deployment = deployment
        self.vocabulary = vocabulary
        self.sequencer = Sequencer(
            deployment.evaluators,
            registry if registry is not None else IdRegistry(deployment.object_id_horizon),
            deployment.window,
        )

    @property
    def registry(self) -> IdRegistry:
        """The id registry (with the placements): the routing unit's durable state."""
        return self.sequencer.registry

    def locate(self, lines: Sequence[bytes], batch_id: int, epoch: RoutingEpoch, first: int = 0) -> LocatedItems:
        """Run the parse stage of ``lines``, lines ``first``, ... of micro-batch ``batch_id``, under ``epoch``.

        What :meth:`route_many` does first, for the whole batch.
        """
        locator = Locator(self.deployment, self.vocabulary, epoch.table)
        return locator.locate_items(lines, batch_id, epoch.number, first)

    def route_many(
        self, lines: Sequence[bytes], batch_id: int, epoch: RoutingEpoch, located: LocatedItems | None = None
    ) -> RoutedBatch:
        """Route one micro-batch of raw lines, in stream order.

        Parameters
        ----------
        lines : sequence of bytes
            The batch's lines in stream order, as read, without terminators.
        batch_id : int
            Micro-batch id; positions are ``stream_position(batch_id, i)``.
        epoch : RoutingEpoch
            The routing epoch in force for this batch.
        located : LocatedItems, optional
            The batch's parse stage, already run elsewhere (the local
            engine's parse worker, :mod:`skpub.app.engines.parse_ahead`);
            used only if it is all of this batch's lines under this
            epoch, else the stage runs here.

        Returns
        -------
        RoutedBatch
            The same columns and decisions the Spark engine's tasks make.
            Cost O(len(lines)) plus O(N_p) per range subscription. Never
            raises for a line: one that fails unexpectedly becomes an
            ``internal_error`` dead letter and the batch goes on.
        """
        start = time.perf_counter()
        whole = (batch_id, epoch.number, 0, len(lines))
        ahead = located is not None and (located.batch_id, located.epoch, located.first, located.lines) == whole
        if not ahead:
            located = self.locate(lines, batch_id, epoch)
        items = located.items
        serial = time.thread_time()
        decisions = self.sequencer.sequence_table(items, epoch.table.partitioning)
        end = stream_position(batch_id, len(lines))
        table = routed_table(items, decisions, range(self.deployment.evaluators), end)
        dead = rejected_letters(decisions, items.column("pos"), lambda pos: lines[position_index(pos)])
        serial = time.thread_time() - serial
        return RoutedBatch(
            batch_id,
            table,
            located.dead_letters + dead,
            decisions.objects,
            decisions.forwarded,
            time.perf_counter() - start + (located.cpu_seconds if ahead else 0.0),  # its parse CPU when ahead
            located.cpu_seconds,
            serial,
            marks(decisions, items, end),
            accepted_controls(decisions, items),
        )
