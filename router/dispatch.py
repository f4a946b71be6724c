"""The routing unit: parse, validate, and send each record where it must go.

:class:`Router` is the stateful core shared by every engine (the local engine
calls it directly, the Spark engine inside ``mapInArrow``). Per micro-batch it
takes the raw lines and the routing epoch in force and returns, in stream
order, one :class:`Routed` row per (record, evaluator):

- an object goes to the owner of its fine cell, only if that evaluator's
  textual summary shares a term with it (Tornado section 3.1);
- a range subscription goes to every partition its rectangle overlaps
  (A-Grid neighbor search, O(N_p)), with the cell box of rectangle ∩ partition
  so the evaluator indexes only its own cells;
- an unsubscribe goes to the evaluators that hold the subscription;
- a dead letter goes to one evaluator, which passes it to the dead-letter sink.

Its state is the :class:`~skpub.kernel.registry.IdRegistry`, whose active
placements also determine the :class:`~skpub.router.summary.TextualSummaries`
(rebuilt from them when a router is built from a registry). It changes only
through :meth:`Router.route_many`; an engine persists the registry (or its
per-batch journal) so a replayed micro-batch starts from the same state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from skpub.kernel.config import Deployment
from skpub.kernel.grid import intersect_boxes
from skpub.kernel.messages import Routed
from skpub.kernel.records import (
    DeadLetter,
    ObjectRecord,
    RangeSubscription,
    SnapshotMarker,
    Unsubscribe,
    stream_position,
)
from skpub.kernel.registry import IdRegistry
from skpub.kernel.text import Vocabulary
from skpub.router.epoch import RoutingEpoch
from skpub.router.summary import TextualSummaries
from skpub.router.table import RoutingTable


@dataclass
class RoutedBatch:
    """The routing of one micro-batch: rows in stream order plus counters."""

    batch_id: int
    rows: list[Routed] = field(default_factory=list)
    objects: int = 0
    forwarded: int = 0
    dead_letters: int = 0
    routing_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an active subscription lives: its evaluators and summary keywords."""

    evaluators: tuple[int, ...]
    keywords: frozenset[str]

    def to_json(self) -> list:
        """Return ``[evaluators, sorted keywords]``, the durable form."""
        return [list(self.evaluators), sorted(self.keywords)]

    @classmethod
    def from_json(cls, raw: list) -> Placement:
        """Rebuild a placement from :meth:`to_json`.

        Raises
        ------
        TypeError, ValueError
            If ``raw`` is not of that shape.
        """
        evaluators, keywords = raw
        if not all(type(e) is int for e in evaluators) or not all(type(k) is str for k in keywords):
            raise TypeError("a placement is [[evaluator ints], [keyword strings]]")
        return cls(tuple(evaluators), frozenset(keywords))


class Router:
    """A routing unit with its id registry and textual summaries."""

    def __init__(self, deployment: Deployment, vocabulary: Vocabulary, registry: IdRegistry | None = None) -> None:
        self.deployment = deployment
        self.vocabulary = vocabulary
        self.registry = registry if registry is not None else IdRegistry(deployment.object_id_horizon)
        self.summaries = TextualSummaries(deployment.evaluators)
        for placement in self.registry.active.values():
            for e in placement.evaluators:
                self.summaries.add(e, placement.keywords)

    def route_many(self, lines: Sequence[bytes], batch_id: int, epoch: RoutingEpoch) -> RoutedBatch:
        """Route one micro-batch of raw lines, in stream order.

        Parameters
        ----------
        lines : sequence of bytes
            The batch's lines in stream order, as read, without terminators.
        batch_id : int
            Micro-batch id; positions are ``stream_position(batch_id, i)``.
        epoch : RoutingEpoch
            The routing epoch in force for this batch.

        Returns
        -------
        RoutedBatch
            Cost O(len(lines)) plus O(N_p) per range subscription. Never
            raises for a line: one that fails unexpectedly becomes an
            ``internal_error`` dead letter and the batch goes on.
        """
        start = time.perf_counter()
        out = RoutedBatch(batch_id)
        n = self.deployment.evaluators
        for i, line in enumerate(lines):
            pos = stream_position(batch_id, i)
            try:
                self._route_one(line, pos, epoch.table, out)
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                out.rows.append(Routed(pos % n, DeadLetter.internal_error(pos, line, exc)))
                out.dead_letters += 1
        out.routing_seconds = time.perf_counter() - start
        return out

    def _route_one(self, line: bytes, pos: int, table: RoutingTable, out: RoutedBatch) -> None:
        """Parse, validate and route one line into ``out``.

        Everything that can fail (parsing, cell lookups, routing) runs before
        the first state change (registry, summaries, ``out``), so a record that
        raises leaves the router as it was.
        """
        deployment, registry, summaries = self.deployment, self.registry, self.summaries
        record = registry.parse(line, pos, deployment.space, deployment.max_record_bytes)
        if isinstance(record, ObjectRecord):
            cx, cy = table.grid.cell_of(record.x, record.y)
            evaluator = table.owner_of_cell(cx, cy)
            admitted = summaries.admits(evaluator, record.term_set)
            registry.accept(record)
            out.objects += 1
            if admitted:
                out.rows.append(Routed(evaluator, record, (cx, cy, cx, cy)))
                out.forwarded += 1
        elif isinstance(record, RangeSubscription):
            box = table.grid.cell_box(record.rect)
            evaluators = table.route_cells(box)
            keywords = self.vocabulary.summary_keywords(record.dnf)
            rows = [Routed(e, record, intersect_boxes(box, table.partitioning.box(e))) for e in evaluators]
            for e in evaluators:
                summaries.add(e, keywords)
            registry.accept(record, Placement(tuple(evaluators), keywords))
            out.rows.extend(rows)
        elif isinstance(record, Unsubscribe):
            placement = registry.active[record.id]
            rows = [Routed(e, record) for e in placement.evaluators]
            for e in placement.evaluators:
                summaries.remove(e, placement.keywords)
            registry.accept(record)
            out.rows.extend(rows)
        elif isinstance(record, SnapshotMarker):
            registry.accept(record)
        else:
            out.rows.append(Routed(pos % deployment.evaluators, record))
            out.dead_letters += 1
