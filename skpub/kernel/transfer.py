"""A rebalancing operation's cell transfer as durable documents (Tornado 4.4 over micro-batches).

Both engines realize Tornado's two phases the same way (DESIGN "The
balancer"):

- after micro-batch ``b`` the balancer decides; the decision is a
  :class:`TransferPlan` (its operations' moves and the participants'
  partitions after them), saved, and the epoch that routes by the new partitioning is
  published with ``from_batch = b + 2``;
- micro-batch ``b + 1`` still routes by the old epoch (the *cell transfer
  phase*): each source evaluator applies it, then hands off what its moved
  cells hold as a :class:`Handoff` (range subscriptions clipped to the cells,
  their decayed costs, and the subscriptions it will drop), saved;
- at the start of ``b + 2`` (the *routing update*) each target takes the
  hand-offs over, every participant keeps only its new partition, the
  sequencer moves the placements (:meth:`skpub.router.sequencer.Sequencer.rehome`)
  and the new epoch routes.

No decision is made after ``b + 1``, while a transfer is in flight. Plans
and hand-offs are versioned JSON (never pickle: loading them executes
nothing), written atomically, and are deterministic functions of the stream,
so a replayed batch writes the same documents.

The documents live in a *balancer directory* (``balancer/`` in the Spark
checkpoint): ``plan-<b>.json`` and ``handoff-<b+1>-<source>.json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from skpub.kernel.decode import exact_int
from skpub.kernel.grid import CellBox
from skpub.kernel.records import RangeSubscription, range_from_row, range_row
from skpub.kernel.storage import atomic_write_bytes

FORMAT = 2
"""Format of plan and hand-off documents (2: a plan holds several operations)."""


TEXT_MOVES = ("", "split", "merge")
"""A move's ``text``: cells change owner (""), a plain rectangle is split by text, an evaluator leaves a text one."""


@dataclass(frozen=True)
class Move:
    """Cells ``cells`` (inside one rectangle of ``source``'s partition) go to ``target``.

    ``cost`` is their decayed cost (cost units), ``queries`` the subscriptions
    indexed over them (what the transfer carries), both from the load summaries.
    ``text`` (PS2Stream V-A phase I, :mod:`skpub.balancer.textsplit`):
    ``"split"``: ``cells`` are a whole plain rectangle of ``source``, which
    becomes text-partitioned between ``source`` (primary) and ``target``, and
    only subscriptions with a key ``target`` answers for go; ``"merge"``:
    ``cells`` are a whole text rectangle naming both, which ``source`` leaves,
    ``target`` answering for its terms
    (:meth:`skpub.router.gridt.TermTable.without`); of two evaluators it
    becomes ``target``'s plain rectangle.

    Raises
    ------
    ValueError
        If ``text`` is not one of :data:`TEXT_MOVES`.
    """

    cells: CellBox
    source: int
    target: int
    cost: float = 0.0
    queries: int = 0
    text: str = ""

    def __post_init__(self) -> None:
        if self.text not in TEXT_MOVES:
            raise ValueError(f"a move's text is one of {TEXT_MOVES}, not {self.text!r}")

    def to_json(self) -> dict:
        """Return the move as a JSON object (``text`` only when set)."""
        out = {"cells": list(self.cells), "source": self.source, "target": self.target,
               "cost": self.cost, "queries": self.queries}  # fmt: skip
        return {**out, "text": self.text} if self.text else out

    @classmethod
    def from_json(cls, raw: dict) -> Move:
        """Rebuild a move of :meth:`to_json`.

        Raises
        ------
        TypeError, ValueError, KeyError
            If ``raw`` is not such an object.
        """
        cells = tuple(exact_int(c) for c in raw["cells"])
        if len(cells) != 4:
            raise ValueError("a move's cells are 4 integers")
        text = raw.get("text", "")
        if not isinstance(text, str):
            raise TypeError("a move's text is a string")
        source, target, queries = (exact_int(raw[k]) for k in ("source", "target", "queries"))
        return cls(cells, source, target, float(raw["cost"]), queries, text)


@dataclass(frozen=True)
class TransferPlan:
    """A decision taken after micro-batch ``batch``: ``moves`` in order, and the partitions they leave.

    ``rectangles[e]`` is evaluator ``e``'s partition after the moves, for every
    evaluator the moves touch or whose rectangles the new partitioning
    renumbers or merges; ``epoch`` is the number of the epoch that routes
    by it from ``batch + 2``; ``decisions`` the operations' JSON, one each
    (the balancer log's fields: kind, evaluators, moves, C_r, C_t, ...), whose
    moves, in order, are ``moves``.
    """

    batch: int
    epoch: int
    moves: tuple[Move, ...]
    rectangles: dict[int, tuple[CellBox, ...]]
    decisions: tuple[dict, ...]

    @property
    def transfer_batch(self) -> int:
        """The micro-batch after which the sources hand off (still routed by the old epoch)."""
        return self.batch + 1

    @property
    def first_batch(self) -> int:
        """The first micro-batch routed by the new partitioning."""
        return self.batch + 2

    @property
    def sources(self) -> list[int]:
        """Evaluators that hand off, ascending."""
        return sorted({m.source for m in self.moves})

    def to_json(self) -> dict:
        """Return the plan as a JSON object."""
        return {
            "format": FORMAT,
            "batch": self.batch,
            "epoch": self.epoch,
            "moves": [m.to_json() for m in self.moves],
            "rectangles": [[e, [list(b) for b in boxes]] for e, boxes in sorted(self.rectangles.items())],
            "decisions": list(self.decisions),
        }

    @classmethod
    def from_json(cls, raw: dict) -> TransferPlan:
        """Rebuild a plan of :meth:`to_json`.

        Raises
        ------
        ValueError
            If ``raw`` is not such a plan, or is of another format.
        """
        try:
            _check_format(raw)
            rectangles = {exact_int(e): tuple(_box(b) for b in boxes) for e, boxes in raw["rectangles"]}
            return cls(
                exact_int(raw["batch"]),
                exact_int(raw["epoch"]),
                tuple(Move.from_json(m) for m in raw["moves"]),
                rectangles,
                tuple(dict(d) for d in raw["decisions"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"damaged transfer plan: {exc}") from None


@dataclass(frozen=True)
class Carried:
    """What move ``move`` (an index into the plan's moves) carries to ``target``.

    ``subscriptions`` are ``(subscription, cell box ∩ moved cells)`` in
    stream order; ``costs`` are ``(cell id, decayed cost units)``, ascending
    by cell.
    """

    move: int
    target: int
    subscriptions: tuple[tuple[RangeSubscription, CellBox], ...]
    costs: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Handoff:
    """What source evaluator ``source`` hands off after transfer micro-batch ``batch``.

    ``carried`` follows the plan's move order; ``dropped`` are the range
    subscriptions it holds that meet none of its new rectangles (it drops
    them when the routing update comes), sorted.
    """

    batch: int
    source: int
    carried: tuple[Carried, ...]
    dropped: tuple[str, ...]

    @property
    def parts(self) -> int:
        """Subscription parts carried."""
        return sum(len(c.subscriptions) for c in self.carried)

    def counters(self, nbytes: int, seconds: float) -> dict:
        """Return what the source reports of it: parts, cells with cost and drops, ``nbytes`` bytes, ``seconds``."""
        return {
            "source": self.source,
            "parts": self.parts,
            "cells": sum(len(c.costs) for c in self.carried),
            "dropped": len(self.dropped),
            "bytes": nbytes,
            "seconds": seconds,
        }

    def encode(self) -> bytes:
        """Return the hand-off as a JSON document (floats exactly as held)."""
        return orjson.dumps({
            "format": FORMAT,
            "batch": self.batch,
            "source": self.source,
            "carried": [
                [c.move, c.target, [range_row(sub, box) for sub, box in c.subscriptions], [list(p) for p in c.costs]]
                for c in self.carried
            ],
            "dropped": list(self.dropped),
        })  # fmt: skip

    @classmethod
    def decode(cls, data: bytes) -> Handoff:
        """Rebuild a hand-off of :meth:`encode`.

        Raises
        ------
        ValueError
            If ``data`` is not such a document, or is of another format.
        """
        try:
            raw = orjson.loads(data)
            _check_format(raw)
            carried = tuple(
                Carried(
                    exact_int(move),
                    exact_int(target),
                    tuple(range_from_row(row) for row in subs),
                    tuple((exact_int(cell), float(cost)) for cell, cost in costs),
                )
                for move, target, subs, costs in raw["carried"]
            )
            dropped = tuple(raw["dropped"])
            if not all(isinstance(s, str) for s in dropped):
                raise TypeError("dropped subscription ids are strings")
            return cls(exact_int(raw["batch"]), exact_int(raw["source"]), carried, dropped)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"damaged hand-off: {exc}") from None


def plan_path(directory: str | Path, batch: int) -> Path:
    """Return the file of the plan decided after micro-batch ``batch``."""
    return Path(directory) / f"plan-{batch:08d}.json"


def handoff_path(directory: str | Path, batch: int, source: int) -> Path:
    """Return the file of ``source``'s hand-off after transfer micro-batch ``batch``."""
    return Path(directory) / f"handoff-{batch:08d}-{source:03d}.json"


def write_plan(directory: str | Path, plan: TransferPlan) -> None:
    """Save ``plan`` atomically (a replay writes the same plan again)."""
    atomic_write_bytes(plan_path(directory, plan.batch), orjson.dumps(plan.to_json()))


def read_plan(directory: str | Path, batch: int) -> TransferPlan | None:
    """Return the plan decided after micro-batch ``batch``, or None when there was none.

    Raises
    ------
    ValueError
        If the plan's file is damaged.
    """
    path = plan_path(directory, batch)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return TransferPlan.from_json(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"damaged transfer plan {path}: {exc}") from None


def write_handoff(directory: str | Path, handoff: Handoff) -> int:
    """Save ``handoff`` atomically; return its bytes."""
    data = handoff.encode()
    atomic_write_bytes(handoff_path(directory, handoff.batch, handoff.source), data)
    return len(data)


def read_handoffs(directory: str | Path, plan: TransferPlan) -> list[Handoff]:
    """Return the hand-offs of every source of ``plan``, in source order.

    Raises
    ------
    ValueError
        If one is missing or damaged (the transfer batch committed, so each source wrote its own).
    """
    out = []
    for source in plan.sources:
        path = handoff_path(directory, plan.transfer_batch, source)
        try:
            out.append(Handoff.decode(path.read_bytes()))
        except OSError as exc:
            raise ValueError(f"the hand-off {path} of plan {plan.batch} is missing: {exc}") from None
    return out


def holders_after(before: dict[str, tuple[int, ...]], handoffs: Iterable[Handoff]) -> dict[str, tuple[int, ...]]:
    """Return the evaluators that hold each moved range subscription once ``handoffs`` are taken over.

    ``before`` gives the holders of (at least) every subscription the
    hand-offs name. A source drops what it lists as dropped; a target gains
    what it is carried (drops first: an evaluator that is both keeps a
    subscription it is carried). Only subscriptions whose holders change
    are returned, sorted by id.
    """
    handoffs = list(handoffs)
    holders: dict[str, set[int]] = {}
    for h in handoffs:
        for sid in h.dropped:
            holders.setdefault(sid, set(before[sid])).discard(h.source)
    for h in handoffs:
        for c in h.carried:
            for sub, _ in c.subscriptions:
                holders.setdefault(sub.id, set(before[sub.id])).add(c.target)
    return {sid: tuple(sorted(e)) for sid, e in sorted(holders.items()) if set(before[sid]) != e}


def _check_format(raw: dict) -> None:
    if raw["format"] != FORMAT:
        raise ValueError(f"format {raw['format']!r}, this skpub reads format {FORMAT}")


def _box(raw: list) -> CellBox:
    box = tuple(exact_int(c) for c in raw)
    if len(box) != 4:
        raise ValueError("a cell box is 4 integers")
    return box
