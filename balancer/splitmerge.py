"""Tornado's split/merge (Tornado 4.2, Figure 4, Eqs 4-5; the best split of 4.3).

An overloaded evaluator X splits its costliest rectangle into X1 (kept) and
X2; two adjacent underloaded evaluators Y and Z merge (Z's rectangles go to
Y), and Z, now empty, takes X2. The number of evaluators stays fixed.

The split is where ``|cost(X1) - cost(X2)|`` is smallest over every vertical
and horizontal cut, found from the rectangle's column and row aggregates in
O(m + n). X2 is the half with fewer subscriptions (it is the half that
moves). The merging pair is the adjacent pair (in the partitions' adjacency
graph) of least combined cost, not containing X; Z is the one of the two
with fewer subscriptions. Then

    C_r = cost(X) - max(cost(X1), cost(X2), cost(Y) + cost(Z))   (Eq. 4)
    C_t = beta x (queryCount(X2) + queryCount(Z))                 (Eq. 5)

(:meth:`~skpub.balancer.operation.Loads.operation` computes C_r as the
largest evaluator cost before less after, which is Eq. 4 when X is the
costliest.)
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from skpub.balancer.operation import Loads, Move, Operation
from skpub.kernel.grid import CellBox
from skpub.kernel.load import RectangleLoad
from skpub.router.partitioning import Partitioning


def best_split(load: RectangleLoad) -> tuple[CellBox, CellBox] | None:
    """Return the halves of ``load.box`` whose costs differ least (Tornado 4.3); O(w + h); None for one cell.

    Ties go to the vertical cut (columns), then to the cut nearest the middle.
    """
    x0, y0, x1, y1 = load.box
    best = None
    for axis, lines, lo, hi in ((0, load.columns, x0, x1), (1, load.rows, y0, y1)):
        if hi == lo:
            continue
        left = np.cumsum(lines)[:-1]
        diff = np.abs(2 * left - lines.sum())
        middle = (len(lines) - 2) / 2
        k = int(np.lexsort((np.abs(np.arange(len(diff)) - middle), diff))[0])
        key = (float(diff[k]), axis)
        if best is None or key < best[0]:
            best = (key, axis, lo + k)
    if best is None:
        return None
    _, axis, cut = best
    if axis == 0:
        return (x0, y0, cut, y1), (cut + 1, y0, x1, y1)
    return (x0, y0, x1, cut), (x0, cut + 1, x1, y1)


def merging_pair(loads: Loads, graph: nx.Graph, exclude: int) -> tuple[int, int] | None:
    """Return ``(y, z)``: the adjacent pair of least combined cost without ``exclude``; z has fewer subscriptions."""
    best = None
    for u, v in graph.edges:
        if exclude in (u, v):
            continue
        key = (loads.costs[u] + loads.costs[v], min(u, v), max(u, v))
        if best is None or key < best:
            best = key
    if best is None:
        return None
    u, v = best[1], best[2]
    return (u, v) if (loads.queries[v], v) <= (loads.queries[u], u) else (v, u)


def split_merge(
    partitioning: Partitioning, loads: Loads, x: int, rect: int, halves: tuple[CellBox, CellBox], y: int, z: int
) -> Operation:
    """Return the split/merge that splits rectangle ``rect`` of ``x`` into ``halves`` and merges ``z`` into ``y``.

    The half with fewer subscriptions moves to ``z`` (the second on a tie).
    """
    weighed = [loads.strip(rect, h) for h in halves]
    moving = 0 if weighed[0][1] < weighed[1][1] else 1
    moves = [
        Move(tuple(b), z, y, loads.rect_cost(i), loads.rect_queries(i))
        for i, b in enumerate(partitioning.boxes.tolist())
        if partitioning.owners[i] == z
    ]
    cost, queries = weighed[moving]
    moves.append(Move(halves[moving], x, z, cost, queries))
    return loads.operation("split_merge", moves)


def best_split_merge(partitioning: Partitioning, loads: Loads, graph: nx.Graph) -> Operation | None:
    """Return Tornado's split/merge for the costliest evaluator, or None when none applies.

    X is the costliest evaluator and its costliest rectangle is split; the
    merging pair is :func:`merging_pair`. O(w + h + edges of the graph).
    """
    if partitioning.count < 3:
        return None
    x = int(np.argmax(loads.costs))
    texts = partitioning.texts
    rects = [i for i in range(len(partitioning.boxes)) if partitioning.owners[i] == x and texts[i] is None]
    if not rects:  # X answers only for terms of text-partitioned rectangles, which only phase I reshapes
        return None
    rect = max(rects, key=lambda i: (loads.rect_cost(i), -i))
    load = loads.rect_loads[rect]
    halves = best_split(load) if load is not None else None
    pair = merging_pair(loads, graph, x)
    if halves is None or pair is None:
        return None
    return split_merge(partitioning, loads, x, rect, halves, *pair)
