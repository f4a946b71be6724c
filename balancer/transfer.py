"""The balancer's step at a micro-batch boundary, the same on both engines (Tornado 4.4 over micro-batches).

After micro-batch ``b`` the engine gives :func:`plan_after` every evaluator's
load summary; an operation becomes a :class:`~skpub.kernel.transfer.TransferPlan`
and the epoch that routes by its partitioning from ``b + 2``. The engine
saves both before ``b + 1`` starts; in ``b + 1`` the sources hand off
(:meth:`skpub.evaluators.evaluator.Evaluator.hand_off`), and at the start of
``b + 2`` the targets take over and the sequencer rehomes the placements
(:mod:`skpub.kernel.transfer` says why this realizes Tornado's two phases).
No plan is made after ``b + 1``: a transfer is in flight.

Top-k/kNN state does not move: objects are immutable and stay in the window
store of the evaluator that accepted them until they leave the window, and
every evaluator holds every ranked subscription, so the merge sees the same
union of candidates before and after; new objects of the moved cells go to
the target, after a text split to both by their terms, and after an
evaluator leaves a text rectangle its terms' objects to the target, the
others' where they went (DESIGN "The balancer").

Decisions depend on cost units only (never on seconds), so a replayed batch
plans exactly as its first attempt and publishes the same epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from skpub.balancer.operation import apply_moves
from skpub.balancer.policy import decide
from skpub.kernel.config import BalancerConfig
from skpub.kernel.load import LoadSummary
from skpub.kernel.parts import write_part
from skpub.kernel.transfer import TransferPlan
from skpub.router.agrid import AGrid
from skpub.router.epoch import RoutingEpoch
from skpub.router.errors import RoutingError


def plan_after(
    settings: BalancerConfig, epoch: RoutingEpoch, summaries: Sequence[LoadSummary], batch: int
) -> tuple[TransferPlan, RoutingEpoch] | None:
    """Decide after micro-batch ``batch``; return the plan and the epoch it publishes, or None.

    Parameters
    ----------
    settings : BalancerConfig
    epoch : RoutingEpoch
        The epoch that routed ``batch``.
    summaries : sequence of LoadSummary
        Every evaluator's summary at the end of ``batch``.
    batch : int

    Returns
    -------
    (TransferPlan, RoutingEpoch) or None
        The new epoch is number ``epoch.number + 1``, from ``batch + 2``.
        O(moves x rectangles + grid cells) beyond the decision.

    Raises
    ------
    RoutingError
        If a move's cells are not all its source's before the decision (the
        sources hand off what they hold at the end of ``batch + 1``, so a
        decision may not pass cells on twice), or a text move's rectangle is
        not as it says (:func:`~skpub.balancer.operation.apply_moves`).
    """
    operations = decide(settings, epoch.table.partitioning, summaries, batch)
    if not operations:
        return None
    partitioning = epoch.table.partitioning
    moves = tuple(m for op in operations for m in op.moves)
    for m in moves:
        x0, y0, x1, y1 = m.cells
        if not m.text and (partitioning.owner[y0 : y1 + 1, x0 : x1 + 1] != m.source).any():
            raise RoutingError(f"move {m.cells} takes cells evaluator {m.source} does not own before the operation")
    after = apply_moves(partitioning, moves)
    touched = {e for op in operations for e in op.evaluators}
    # and every evaluator whose rectangles the coalescing renumbered or merged (kdt leaves two of one evaluator
    # side by side): each engine's evaluators take their partitions from the plan
    rectangles = {
        e: tuple(after.boxes_of(e))
        for e in range(after.count)
        if e in touched or after.boxes_of(e) != partitioning.boxes_of(e)
    }
    summary_bytes = sum(s.nbytes() for s in summaries)
    decisions = tuple({**op.to_json(), "summary_bytes": summary_bytes} for op in operations)
    plan = TransferPlan(batch, epoch.number + 1, moves, rectangles, decisions)
    return plan, RoutingEpoch(epoch.number + 1, batch + 2, AGrid(epoch.table.grid, after))


def balancer_step(
    root: Path,
    settings: BalancerConfig,
    batch: int,
    epoch: RoutingEpoch | None,
    plan: TransferPlan | None,
    handoffs: Sequence[dict],
    summaries: Sequence[LoadSummary],
    counts: Counter,
) -> tuple[TransferPlan, RoutingEpoch] | None:
    """Take the balancer's step after micro-batch ``batch``, on both engines: log a transfer, or decide.

    When ``batch`` is ``plan``'s transfer batch (its sources handed off:
    ``handoffs`` are their :meth:`~skpub.kernel.transfer.Handoff.counters`),
    its lines (:func:`transfer_lines`) go to ``root/balancer/part-<batch>.jsonl``
    and ``counts`` (the batch report's ``balancer``) take one per operation
    and the subscription parts carried; nothing is decided while a transfer
    is in flight (``epoch`` may then be None). Otherwise the decision of
    :func:`plan_after` over ``summaries`` under ``epoch`` (the one that
    routed ``batch``) is returned, for the engine to keep (and save) as it
    does.

    Raises
    ------
    RoutingError
        As :func:`plan_after`.
    ValueError
        If there is no plan and no ``epoch``.
    """
    if plan is not None:
        lines = transfer_lines(plan, handoffs)
        write_part(root, "balancer", batch, lines)
        for line in lines:
            counts.update({line["operation"]: 1, "subscriptions": line["subscription_parts_moved"]})
        return None
    if epoch is None:
        raise ValueError(f"a decision after batch {batch} needs the epoch that routed it")
    return plan_after(settings, epoch, summaries, batch)


def transfer_lines(plan: TransferPlan, counters: Sequence[dict]) -> list[dict]:
    """Return the balancer log's lines of ``plan`` once its sources handed off: one per operation.

    ``counters`` are the sources' :meth:`~skpub.kernel.transfer.Handoff.counters`;
    an evaluator takes part in one operation of a plan, so each source's
    counters belong to the operation that moves its cells.

    Written as ``balancer/part-<transfer batch>.jsonl``: the decision
    (operation, evaluators, moves, C_r, C_t, summary bytes) and what the
    transfer carried (subscription parts, cells with cost, subscriptions the
    sources drop, hand-off bytes and seconds).
    """
    lines = []
    for decision in plan.decisions:
        sources = {m["source"] for m in decision["moves"]}
        mine = [c for c in counters if c["source"] in sources]
        lines.append({
            "batch": plan.batch,
            "epoch": plan.epoch,
            "transfer_batch": plan.transfer_batch,
            "first_batch": plan.first_batch,
            **decision,
            "subscription_parts_moved": sum(c["parts"] for c in mine),
            "cells_moved": sum(c["cells"] for c in mine),
            "subscriptions_dropped": sum(c["dropped"] for c in mine),
            "bytes": sum(c["bytes"] for c in mine),
            "transfer_seconds": sum(c["seconds"] for c in mine),
        })  # fmt: skip
    return lines
