"""Tornado's shift operations: horizontal, vertical and corner shift (Tornado 4.2, Figure 3; 4.3).

A shift moves cells from an evaluator's rectangle ``a`` to the adjacent
rectangle ``b`` of another evaluator:

- *horizontal shift*: ``a`` and ``b`` share a whole horizontal edge (same
  columns, one above the other); the ``k`` rows of ``a`` next to ``b`` move,
  and both stay rectangles. *Vertical shift*: the same across a whole
  vertical edge, ``k`` columns.
- *corner shift*: ``b`` lies along one side of ``a``, flush with one of its
  corners and shorter than that side, so the two cannot merge; the strip of
  ``a`` across ``b``'s span (all of ``a``'s depth) moves to ``b``. The
  coordinate is fixed by ``b``; an evaluator has at most 8 such shifts per
  rectangle (4 sides x 2 corners). Both stay rectangles.

The cost moved by ``k`` rows or columns comes from the row and column
aggregates of ``a`` (O(m + n)); ``k`` is chosen where the larger of the two
evaluators' costs after the shift is smallest, Tornado's optimal division of
the pair's workload.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from skpub.balancer.operation import Loads, Move, Operation
from skpub.kernel.grid import CellBox
from skpub.router.partitioning import Partitioning


@dataclass(frozen=True)
class ShiftSite:
    """A place where a shift can move cells from rectangle ``a`` to rectangle ``b``.

    ``side`` is where ``b`` lies of ``a`` (``left``, ``right``, ``down``,
    ``up``); ``span`` is, for a corner shift, the inclusive range of ``a``'s
    rows (b left or right) or columns (b down or up) that moves.
    """

    kind: str
    a: int
    b: int
    side: str
    span: tuple[int, int] | None = None


def _side(a: CellBox, b: CellBox) -> str | None:
    if b[0] == a[2] + 1 and b[1] <= a[3] and b[3] >= a[1]:
        return "right"
    if b[2] == a[0] - 1 and b[1] <= a[3] and b[3] >= a[1]:
        return "left"
    if b[1] == a[3] + 1 and b[0] <= a[2] and b[2] >= a[0]:
        return "up"
    if b[3] == a[1] - 1 and b[0] <= a[2] and b[2] >= a[0]:
        return "down"
    return None


def sites(partitioning: Partitioning, pairs: list[tuple[int, int]]) -> Iterator[ShiftSite]:
    """Yield every shift site between the adjacent rectangles ``pairs``, in both directions."""
    boxes = [tuple(b) for b in partitioning.boxes.tolist()]
    for i, j in pairs:
        for a, b in ((i, j), (j, i)):
            A, B = boxes[a], boxes[b]
            side = _side(A, B)
            if side is None:
                continue
            lo, hi = (1, 3) if side in ("left", "right") else (0, 2)
            if (A[lo], A[hi]) == (B[lo], B[hi]):
                yield ShiftSite("vertical_shift" if side in ("left", "right") else "horizontal_shift", a, b, side)
            elif B[lo] == A[lo] and B[hi] < A[hi]:
                yield ShiftSite("corner_shift", a, b, side, (A[lo], B[hi]))
            elif B[hi] == A[hi] and B[lo] > A[lo]:
                yield ShiftSite("corner_shift", a, b, side, (B[lo], A[hi]))


def depth(box: CellBox, side: str) -> int:
    """Rows (side up or down) or columns (left or right) of ``box`` a shift toward ``side`` can take from."""
    return box[2] - box[0] + 1 if side in ("left", "right") else box[3] - box[1] + 1


def moved_cells(box: CellBox, site: ShiftSite, k: int = 0) -> CellBox:
    """Return the cells of ``box`` (rectangle ``site.a``) that the shift moves: ``k`` lines, or the corner strip."""
    x0, y0, x1, y1 = box
    if site.span is not None:
        s0, s1 = site.span
        return (x0, s0, x1, s1) if site.side in ("left", "right") else (s0, y0, s1, y1)
    return {
        "right": (x1 - k + 1, y0, x1, y1),
        "left": (x0, y0, x0 + k - 1, y1),
        "up": (x0, y1 - k + 1, x1, y1),
        "down": (x0, y0, x1, y0 + k - 1),
    }[site.side]


def shift(partitioning: Partitioning, loads: Loads, site: ShiftSite, k: int = 0) -> Operation:
    """Return the shift at ``site`` moving ``k`` lines (ignored for a corner shift), weighed by ``loads``."""
    owners = partitioning.owners
    box = tuple(partitioning.boxes[site.a].tolist())
    cells = moved_cells(box, site, k)
    cost, queries = loads.strip(site.a, cells)
    return loads.operation(site.kind, [Move(cells, int(owners[site.a]), int(owners[site.b]), cost, queries)])


def best_shift(partitioning: Partitioning, loads: Loads, site: ShiftSite) -> Operation | None:
    """Return the shift at ``site`` that best divides the two evaluators' cost (Tornado 4.3); O(depth).

    For a horizontal or vertical shift, ``k`` (1 .. depth - 1) minimizes the
    larger of the two evaluators' costs after the shift; None when the
    rectangle has one line, or the source is not the costlier evaluator.
    """
    source, target = int(partitioning.owners[site.a]), int(partitioning.owners[site.b])
    ca, cb = loads.costs[source], loads.costs[target]
    if ca <= cb:
        return None
    if site.span is not None:
        return shift(partitioning, loads, site)
    box = tuple(partitioning.boxes[site.a].tolist())
    n = depth(box, site.side)
    r = loads.rect_loads[site.a]
    if n < 2 or r is None:
        return None
    lines = r.columns if site.side in ("left", "right") else r.rows
    from_side = lines[::-1] if site.side in ("right", "up") else lines
    moved = np.cumsum(from_side)[:-1]
    k = int(np.argmin(np.maximum(ca - moved, cb + moved))) + 1
    return shift(partitioning, loads, site, k)
