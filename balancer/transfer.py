"""Carrying out an operation between two micro-batches in one process (Tornado 4.4 at a batch boundary).

Within a micro-batch every record is routed by the batch's epoch, so when
every evaluator of the process is between batches, Tornado's two phases
take no time: the cell transfer (each move's range subscriptions, clipped to
the moved cells, and its per-cell statistics go from source to target, in
the order of the moves) completes before the routing update (the sequencer's
placements and textual summaries, then the next batch's epoch). No record
is in flight, so none needs forwarding. The Spark engine spreads the same
steps over two batches (DESIGN "The balancer").

Top-k/kNN state does not move: objects are immutable and stay in the window
store of the evaluator that accepted them until they leave the window, and
every evaluator holds every ranked subscription, so the merge sees the same
union of candidates before and after; new objects of the moved cells go to
the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skpub.balancer.operation import Operation
from skpub.evaluators.evaluator import Evaluator
from skpub.router.partitioning import Partitioning
from skpub.router.sequencer import Sequencer


@dataclass(frozen=True)
class TransferReport:
    """What a transfer moved: subscription parts carried by the moves and placements changed."""

    subscriptions: int
    placements: int


def transfer(
    operation: Operation, after: Partitioning, evaluators: Sequence[Evaluator], sequencer: Sequencer
) -> TransferReport:
    """Move the state of ``operation``'s cells between ``evaluators`` and update ``sequencer``'s placements.

    Parameters
    ----------
    operation : Operation
        Its moves, applied in order (a split/merge first empties Z into Y).
    after : Partitioning
        The partitioning once the moves are applied (:func:`~skpub.balancer.operation.apply_moves`).
    evaluators : sequence of Evaluator
        Every evaluator, indexed by id, between two micro-batches.
    sequencer : Sequencer
        The routing unit's serial state.

    Returns
    -------
    TransferReport
        Cost O(moves x subscriptions held by the sources).
    """
    touched: set[str] = set()
    carried = 0
    for move in operation.moves:
        source, target = evaluators[move.source], evaluators[move.target]
        parts = source.export_cells(move.cells)
        target.import_subscriptions(parts)
        target.load.put(source.load.take(move.cells))
        carried += len(parts)
        touched.update(sub.id for sub, _ in parts)
    for e in operation.evaluators:
        rectangles = after.boxes_of(e)
        touched.update(evaluators[e].retain(rectangles))
        evaluators[e].set_partition(rectangles)
    changed = 0
    for sid in sorted(touched):
        holders = tuple(e for e, ev in enumerate(evaluators) if ev.holds(sid))
        if set(holders) != set(sequencer.registry.active[sid].evaluators):
            sequencer.place(sid, holders)
            changed += 1
    return TransferReport(carried, changed)
