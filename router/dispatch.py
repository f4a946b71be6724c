"""The routing unit in one process: the parallel stage, then the serial one.

:class:`Router` runs :class:`~skpub.router.locate.Locator` (parse, validate,
normalize, locate: per line, parallel in the Spark engine) and then the
:class:`~skpub.router.sequencer.Sequencer` (registry, placements, textual
summaries: serial) over one micro-batch, and returns, in stream order, one
:class:`~skpub.kernel.messages.Routed` row per (record, evaluator) plus the
batch's dead letters:

- an object goes to the owner of its fine cell, only if that evaluator's
  textual summary shares a term with it (Tornado section 3.1);
- a range subscription goes to every partition its rectangle overlaps, with
  the cell box of rectangle ∩ partition so the evaluator indexes only its
  own cells;
- an unsubscribe goes to the evaluators that hold the subscription;
- a dead letter goes to the sink, never to an evaluator.

The local engine calls it directly; the Spark engine runs the two stages in
separate tasks (``skpub.app.engines.spark``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from skpub.kernel.config import Deployment
from skpub.kernel.messages import Routed
from skpub.kernel.records import DeadLetter, position_index
from skpub.kernel.registry import IdRegistry
from skpub.kernel.text import Vocabulary
from skpub.router.epoch import RoutingEpoch
from skpub.router.locate import Located, Locator
from skpub.router.sequencer import Decisions, Sequencer


@dataclass
class RoutedBatch:
    """The routing of one micro-batch: rows in stream order, dead letters, counters, CPU seconds per stage."""

    batch_id: int
    rows: list[Routed] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    objects: int = 0
    forwarded: int = 0
    routing_seconds: float = 0.0
    parse_cpu_seconds: float = 0.0
    sequencer_cpu_seconds: float = 0.0


def rejected_letters(decisions: Decisions, items: Sequence[Located], line_of) -> list[DeadLetter]:  # noqa: ANN001
    """Return the dead letters of the sequencer's rejections; ``line_of(pos)`` gives the record's input line."""
    out = []
    for i, reason, message in decisions.rejected:
        pos = items[i].record.pos
        out.append(DeadLetter.for_line(pos, line_of(pos), reason, message))
    return out


class Router:
    """A routing unit: a locator per epoch and the sequencer's state."""

    def __init__(self, deployment: Deployment, vocabulary: Vocabulary, registry: IdRegistry | None = None) -> None:
        self.deployment = deployment
        self.vocabulary = vocabulary
        self.sequencer = Sequencer(
            deployment.evaluators, registry if registry is not None else IdRegistry(deployment.object_id_horizon)
        )

    @property
    def registry(self) -> IdRegistry:
        """The id registry (with the placements): the routing unit's durable state."""
        return self.sequencer.registry

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
        located = Locator(self.deployment, self.vocabulary, epoch.table).locate_lines(lines, batch_id)
        items = located.items
        decisions = self.sequencer.sequence_located(items)
        rows = [
            Routed(e, items[i].record, items[i].cells if b is None else b)
            for i, e, b in zip(decisions.index, decisions.evaluator, decisions.box, strict=True)
        ]
        dead = located.dead_letters + rejected_letters(decisions, items, lambda pos: lines[position_index(pos)])
        return RoutedBatch(
            batch_id,
            rows,
            dead,
            decisions.objects,
            decisions.forwarded,
            time.perf_counter() - start,
            located.cpu_seconds,
            decisions.cpu_seconds,
        )
