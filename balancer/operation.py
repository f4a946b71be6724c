"""Rebalancing operations as cell moves, their costs (Tornado Eqs 4-5), and applying them to a partitioning.

Every operation of the balancer (shift, split/merge, migration) is a list of
:class:`~skpub.kernel.transfer.Move` (kept in the kernel: the evaluators
carry moves out): an inclusive cell box inside one rectangle of a source
evaluator's partition, going to a target evaluator, with the decayed cost and
the subscriptions it carries (from the load summaries). Applying the moves
to a :class:`~skpub.router.partitioning.Partitioning` cuts the source
rectangle around the box (at most four pieces), gives the box to the target,
and coalesces rectangles of one owner that share a whole edge, so shifts and
corner shifts leave rectangles and repeated migrations do not fragment the
grid without end.

A move of PS2Stream's phase I (:mod:`skpub.balancer.textsplit`) keeps its
rectangle whole and changes how it is partitioned: a ``split`` makes a plain
rectangle text-partitioned between two evaluators, a ``merge`` takes an
evaluator out of a text rectangle (one of two evaluators becomes plain);
the protocol and the transfer stay the same.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from skpub.kernel.grid import CellBox
from skpub.kernel.load import BlockLoad, LoadSummary, RectangleLoad
from skpub.kernel.transfer import Move
from skpub.router.errors import RoutingError
from skpub.router.gridt import TermTable
from skpub.router.partitioning import Partitioning

KINDS = (
    "horizontal_shift",
    "vertical_shift",
    "corner_shift",
    "split_merge",
    "text_split",
    "text_merge",
    "migration",
    "global_adjustment",
)
"""Operation names as in the papers (Tornado 4.2; PS2Stream V-A: phase I, text split and merge, before GR; V-B)."""


@dataclass(frozen=True)
class Operation:
    """One rebalancing operation: its moves, applied in order, and the quantities the decision weighs.

    ``c_r`` is the cost reduction (Tornado Eq. 4 in its general form: the
    largest cost of the evaluators it touches before, less the largest after),
    ``c_t`` the transfer overhead
    (Eq. 5: beta x subscriptions moved), both in cost units.
    """

    kind: str
    moves: tuple[Move, ...]
    c_r: float = 0.0
    c_t: float = 0.0
    costs_after: tuple[float, ...] = field(default=(), compare=False)

    @property
    def subscriptions(self) -> int:
        """Subscriptions moved, summed over the moves (a subscription over two moved boxes counts twice)."""
        return sum(m.queries for m in self.moves)

    @property
    def evaluators(self) -> list[int]:
        """The evaluators the operation touches, ascending."""
        return sorted({e for m in self.moves for e in (m.source, m.target)})

    def to_json(self) -> dict:
        """Return the operation as a JSON object (the balancer log's fields)."""
        return {
            "operation": self.kind,
            "evaluators": self.evaluators,
            "moves": [m.to_json() for m in self.moves],
            "c_r": self.c_r,
            "c_t": self.c_t,
            "subscriptions": self.subscriptions,
        }


class Loads:
    """The balancer's view of the load: the partitioning and every evaluator's summary, indexed for the operations.

    Parameters
    ----------
    partitioning : Partitioning
        The routing epoch's partitioning.
    summaries : list of LoadSummary
        One per evaluator (missing ones count as no load).
    beta : float
        Cost units per subscription moved (Tornado's beta, measured: DESIGN "The balancer").
    """

    def __init__(self, partitioning: Partitioning, summaries: list[LoadSummary], beta: float) -> None:
        self.partitioning = partitioning
        self.beta = beta
        n = partitioning.count
        self.costs = np.zeros(n)
        self.queries = np.zeros(n, dtype=np.int64)
        self.blocks: list[tuple[BlockLoad, ...]] = [()] * n
        by_box: dict[CellBox, RectangleLoad] = {}
        self.members: dict[tuple[int, CellBox], RectangleLoad] = {}
        for s in summaries:
            if 0 <= s.evaluator < n:
                self.costs[s.evaluator] = s.cost
                self.queries[s.evaluator] = s.queries
                self.blocks[s.evaluator] = s.blocks
                by_box.update((r.box, r) for r in s.rectangles)
                self.members.update(((s.evaluator, r.box), r) for r in s.rectangles)
        self.rect_loads: list[RectangleLoad | None] = [by_box.get(tuple(b)) for b in partitioning.boxes.tolist()]

    def with_costs(self, costs: np.ndarray) -> Loads:
        """Return this view with evaluator costs ``costs`` (shape (n,), float64): after earlier operations."""
        view = copy.copy(self)
        view.costs = costs
        return view

    def rect_cost(self, i: int) -> float:
        """Decayed cost of rectangle ``i`` (0 without a summary)."""
        r = self.rect_loads[i]
        return r.cost if r is not None else 0.0

    def strip(self, i: int, cells: CellBox) -> tuple[float, int]:
        """Return cost and subscriptions of ``cells``, a strip of rectangle ``i`` (zeros without a summary)."""
        r = self.rect_loads[i]
        return r.strip(cells) if r is not None else (0.0, 0)

    def member_load(self, evaluator: int, box: CellBox) -> tuple[float, int]:
        """Return ``evaluator``'s decayed cost and subscriptions over its rectangle ``box`` (zeros without a summary).

        A text-partitioned rectangle has one per evaluator that shares it.
        """
        r = self.members.get((evaluator, box))
        return (r.cost, r.queries) if r is not None else (0.0, 0)

    def rect_queries(self, i: int) -> int:
        """Subscriptions over rectangle ``i`` (0 without a summary)."""
        r = self.rect_loads[i]
        return r.queries if r is not None else 0

    def operation(self, kind: str, moves: list[Move]) -> Operation:
        """Weigh ``moves`` as one operation: C_r (Eq. 4 over the evaluators the moves touch) and C_t (Eq. 5)."""
        after = self.costs.copy()
        for m in moves:
            after[m.source] -= m.cost
            after[m.target] += m.cost
        touched = sorted({e for m in moves for e in (m.source, m.target)})
        c_r = float(self.costs[touched].max() - after[touched].max()) if touched else 0.0
        c_t = self.beta * sum(m.queries for m in moves)
        return Operation(kind, tuple(moves), c_r, c_t, tuple(after.tolist()))


def subtract(box: CellBox, hole: CellBox) -> list[CellBox]:
    """Return ``box`` less ``hole`` (``hole`` inside ``box``) as at most four disjoint rectangles.

    Full-width strips below and above the hole, then the pieces left and right
    of it in its rows.
    """
    x0, y0, x1, y1 = box
    hx0, hy0, hx1, hy1 = hole
    out = []
    if hy0 > y0:
        out.append((x0, y0, x1, hy0 - 1))
    if hy1 < y1:
        out.append((x0, hy1 + 1, x1, y1))
    if hx0 > x0:
        out.append((x0, hy0, hx0 - 1, hy1))
    if hx1 < x1:
        out.append((hx1 + 1, hy0, x1, hy1))
    return out


def coalesce(rects: list[tuple[CellBox, tuple[int, int]]]) -> list[tuple[CellBox, tuple[int, int]]]:
    """Merge rectangles of one owner key that share a whole edge, until none do; O(r) per pass.

    An owner key is ``(evaluator, text rectangle index or -1)``: rectangles
    merge only with the same key, so a text-partitioned one never merges.

    A rectangle takes part in at most one merge per pass (the edge maps hold
    the pass's starting geometry).
    """
    rects = list(rects)
    merged = True
    while merged:
        merged = False
        below = {(o, b[0], b[2], b[1]): i for i, (b, o) in enumerate(rects)}
        left = {(o, b[1], b[3], b[0]): i for i, (b, o) in enumerate(rects)}
        used: set[int] = set()
        gone: set[int] = set()
        for i, ((x0, y0, x1, y1), o) in enumerate(rects):
            if i in used:
                continue
            j = below.get((o, x0, x1, y1 + 1))
            if j is None or j in used:
                j = left.get((o, y0, y1, x1 + 1))
            if j is None or j in used:
                continue
            jx0, jy0, jx1, jy1 = rects[j][0]
            rects[i] = ((min(x0, jx0), min(y0, jy0), max(x1, jx1), max(y1, jy1)), o)
            used.update((i, j))
            gone.add(j)
            merged = True
        rects = [r for i, r in enumerate(rects) if i not in gone]
    return sorted(rects, key=lambda r: (r[1], r[0][1], r[0][0]))


def apply_moves(partitioning: Partitioning, moves: tuple[Move, ...] | list[Move]) -> Partitioning:
    """Return the partitioning after ``moves``, applied in order.

    Complexity O(moves x rectangles), plus :func:`coalesce` (O(r) per pass,
    a pass per merge in the worst case), plus building the new partitioning
    (O(grid cells), numpy).

    Text-partitioned rectangles keep their term tables and are never cut or
    coalesced; only a move of phase I changes one (:func:`_text_move`).

    Raises
    ------
    RoutingError
        If a move's cells are not inside one rectangle of its source (as the
        earlier moves left it), meet a text-partitioned rectangle, or the
        moves leave an evaluator with no cell; if a text move's rectangle is
        not as :class:`~skpub.kernel.transfer.Move` says.
    """
    tables = list(partitioning.texts)
    # a text rectangle's owner key is (owner, its index in tables), so that coalescing never merges it
    rects = [
        (tuple(b), (o, i if tables[i] is not None else -1))
        for i, (b, o) in enumerate(zip(partitioning.boxes.tolist(), partitioning.owners.tolist(), strict=True))
    ]
    for m in moves:
        if not 0 <= m.target < partitioning.count or m.target == m.source:
            raise RoutingError(f"move {m.cells} targets evaluator {m.target}, not another of {partitioning.count}")
        if m.text:
            _text_move(rects, tables, m)
            continue
        if touches_text(partitioning, m.cells):
            raise RoutingError(f"move {m.cells} meets a text-partitioned rectangle")
        hx0, hy0, hx1, hy1 = m.cells
        i = next(
            (
                i
                for i, ((x0, y0, x1, y1), o) in enumerate(rects)
                if o == (m.source, -1) and x0 <= hx0 <= hx1 <= x1 and y0 <= hy0 <= hy1 <= y1
            ),
            -1,
        )
        if i < 0:
            raise RoutingError(f"move {m.cells} is not inside one rectangle of evaluator {m.source}")
        box = rects[i][0]
        rest = [(piece, (m.source, -1)) for piece in subtract(box, m.cells)]
        rects[i : i + 1] = [*rest, (m.cells, (m.target, -1))]
    held = {o for _, (o, _) in rects} | {e for _, (_, t) in rects if t >= 0 for e in tables[t].evaluators}
    empty = set(range(partitioning.count)) - held
    if empty:
        raise RoutingError(f"the moves leave evaluators {sorted(empty)} with no cell")
    rects = coalesce(rects)
    texts = tuple(tables[t] if t >= 0 else None for _, (_, t) in rects)
    return Partitioning(
        partitioning.size,
        np.array([b for b, _ in rects], dtype=np.int32),
        np.array([o for _, (o, _) in rects], dtype=np.int32),
        texts if any(t is not None for t in texts) else None,
    )


def _text_move(rects: list[tuple[CellBox, tuple[int, int]]], tables: list[TermTable | None], m: Move) -> None:
    """Apply text move ``m`` to ``rects`` (owner keys index ``tables``, which a split extends), in place.

    A split makes ``source``'s plain rectangle ``m.cells`` text-partitioned
    with ``TermTable((source, target))``; a merge makes the text rectangle of
    exactly ``source`` and ``target`` plain, ``target``'s, and takes
    ``source`` out of a text rectangle of three evaluators or more, its terms
    to ``target`` (:meth:`TermTable.without`).

    Raises
    ------
    RoutingError
        If no rectangle is as the move says.
    """
    for i, (box, (owner, t)) in enumerate(rects):
        if box != tuple(m.cells):
            continue
        if m.text == "split" and owner == m.source and t < 0:
            tables.append(TermTable((m.source, m.target)))
            rects[i] = (box, (owner, len(tables) - 1))
            return
        if m.text == "merge" and t >= 0 and {m.source, m.target} <= set(tables[t].evaluators):
            if len(tables[t].evaluators) == 2:
                rects[i] = (box, (m.target, -1))
            else:
                tables.append(tables[t].without(m.source, m.target))
                rects[i] = (box, (tables[-1].primary, len(tables) - 1))
            return
    raise RoutingError(f"text {m.text} {m.cells}: no such rectangle of evaluator {m.source}")


def touches_text(partitioning: Partitioning, cells: CellBox) -> bool:
    """Return whether ``cells`` meets a text-partitioned rectangle (whose cells the balancer never moves)."""
    if not partitioning.has_text:
        return False
    x0, y0, x1, y1 = cells
    return bool(partitioning.text_cells[y0 : y1 + 1, x0 : x1 + 1].any())
