"""Partitions: disjoint rectangles of fine cells that tile the grid, each owned by an evaluator.

Partition ``p``, the rectangles evaluator ``p`` owns, is its spatial range
(Tornado section 3.1). Two initial constructions (one rectangle each):

- :func:`cost_partitioning`, Tornado section 4.1: a priority queue of
  partitions ordered by cost; the costliest is split where the larger half's
  cost is smallest, until there are ``n`` partitions.
- :func:`uniform_partitioning`, the Uni-Space-Rout baseline of Tornado
  section 5.1: equal spatial ranges whatever the load.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from skpub.kernel.grid import CellBox, grid_shape
from skpub.router.errors import RoutingError
from skpub.router.gridt import TermTable, routing_classes


@dataclass(frozen=True)
class Partitioning:
    """A tiling of the ``size x size`` fine grid by disjoint cell rectangles, each owned by an evaluator.

    Evaluator ``p``'s *partition* is the union of the rectangles it holds.
    The initial partitionings give every evaluator one rectangle; the
    balancer's corner shifts, split/merge and migrations (``skpub.balancer``)
    leave partitions of several rectangles. Routing stays neighbor-based over
    the rectangles (:class:`skpub.router.agrid.AGrid`).

    A rectangle with a :class:`~skpub.router.gridt.TermTable` in ``texts`` is
    *text-partitioned* (a kd^t-tree leaf partitioned by text, PS2Stream
    IV-B): every evaluator of its table holds it, each for its terms, and
    its owner is the table's primary. The balancer never moves its cells
    (:attr:`text_cells`).

    Attributes
    ----------
    size : int
        Fine-grid cells per side.
    boxes : ndarray, shape (r, 4), int32
        Inclusive cell rectangles ``[cx0, cy0, cx1, cy1]``, disjoint, covering the grid.
    owners : ndarray, shape (r,), int32
        ``owners[i]`` is the evaluator owning rectangle ``i`` (the primary of
        a text-partitioned one); None means ``arange(r)``. Every evaluator
        ``0 .. count - 1`` holds at least one rectangle.
    texts : tuple of (TermTable or None), length r, optional
        The term table of each text-partitioned rectangle; None (default):
        none is.
    rect_of : ndarray, shape (size, size), int32
        ``rect_of[cy, cx]`` is the rectangle holding cell ``(cx, cy)`` (derived).
    owner : ndarray, shape (size, size), int32
        ``owner[cy, cx]`` is the evaluator owning cell ``(cx, cy)`` (derived).
    text_cells : ndarray, shape (size, size), bool
        Whether cell ``(cx, cy)`` is in a text-partitioned rectangle (derived).
    text_class : ndarray, shape (r,), int32
        Rectangle ``i``'s routing class in ``term_tables``, -1 without a table
        (derived, :func:`~skpub.router.gridt.routing_classes`).
    term_tables : tuple of TermTable
        One table per routing class (derived).

    Raises
    ------
    RoutingError
        If the rectangles leave a cell uncovered or cover one twice, an
        evaluator below the largest one holds no rectangle, or a text
        rectangle's owner is not its table's primary.
    """

    size: int
    boxes: np.ndarray
    owners: np.ndarray | None = None
    texts: tuple[TermTable | None, ...] | None = None
    rect_of: np.ndarray = field(init=False, repr=False, compare=False)
    owner: np.ndarray = field(init=False, repr=False, compare=False)
    text_cells: np.ndarray = field(init=False, repr=False, compare=False)
    text_class: np.ndarray = field(init=False, repr=False, compare=False)
    term_tables: tuple[TermTable, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        boxes = np.asarray(self.boxes, dtype=np.int32).reshape(-1, 4)
        owners = np.arange(len(boxes), dtype=np.int32) if self.owners is None else np.asarray(self.owners, np.int32)
        if owners.shape != (len(boxes),):
            raise RoutingError("one owner per rectangle")
        texts = (None,) * len(boxes) if self.texts is None else tuple(self.texts)
        if len(texts) != len(boxes):
            raise RoutingError("one term table (or None) per rectangle")
        holders = set(owners.tolist())
        for i, table in enumerate(texts):
            if table is not None:
                if table.primary != owners[i]:
                    raise RoutingError(f"text rectangle {i} is owned by {owners[i]}, not its primary {table.primary}")
                holders.update(table.evaluators)
        if len(boxes) == 0 or holders != set(range(max(holders) + 1)):
            raise RoutingError("every evaluator 0 .. n-1 must hold at least one rectangle")
        slots = max((len(t.ring) for t in texts if t is not None), default=0)
        if slots > len(holders):  # a ring keeps the length it was built with: one slot per evaluator at most
            raise RoutingError(f"a hash ring of {slots} slots among {len(holders)} evaluators")
        rect_of = np.full((self.size, self.size), -1, dtype=np.int32)
        area = 0
        for i, (x0, y0, x1, y1) in enumerate(boxes.tolist()):
            if not (0 <= x0 <= x1 < self.size and 0 <= y0 <= y1 < self.size):
                raise RoutingError(f"rectangle {i} {(x0, y0, x1, y1)} is outside the grid")
            rect_of[y0 : y1 + 1, x0 : x1 + 1] = i
            area += (x1 - x0 + 1) * (y1 - y0 + 1)
        if area != self.size * self.size or (rect_of < 0).any():
            raise RoutingError("partitions must tile the fine grid exactly once")
        owner = owners[rect_of]
        text_cells = np.array([t is not None for t in texts], dtype=bool)[rect_of]
        text_class, term_tables = routing_classes(texts)
        for array in (boxes, owners, rect_of, owner, text_cells, text_class):
            array.flags.writeable = False
        object.__setattr__(self, "boxes", boxes)
        object.__setattr__(self, "owners", owners)
        object.__setattr__(self, "texts", texts)
        object.__setattr__(self, "rect_of", rect_of)
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "text_cells", text_cells)
        object.__setattr__(self, "text_class", text_class)
        object.__setattr__(self, "term_tables", term_tables)
        object.__setattr__(self, "_count", max(holders) + 1)
        object.__setattr__(self, "_has_text", any(t is not None for t in texts))

    @property
    def count(self) -> int:
        """Number of partitions (evaluators)."""
        return self._count

    @property
    def has_text(self) -> bool:
        """Whether any rectangle is text-partitioned (found at construction: O(1))."""
        return self._has_text

    def boxes_of(self, p: int) -> list[CellBox]:
        """Return the rectangles evaluator ``p`` holds (owned, or text rectangles naming it), in order."""
        return [
            tuple(b)
            for b, o, t in zip(self.boxes.tolist(), self.owners.tolist(), self.texts, strict=True)
            if o == p or (t is not None and p in t.evaluators)
        ]


def _box_cost(prefix: np.ndarray, box: CellBox) -> float:
    x0, y0, x1, y1 = box
    return float(prefix[y1 + 1, x1 + 1] - prefix[y0, x1 + 1] - prefix[y1 + 1, x0] + prefix[y0, x0])


def best_split(costs: np.ndarray, box: CellBox) -> tuple[CellBox, CellBox] | None:
    """Split ``box`` where the costlier half is cheapest (Tornado section 4.1).

    Tries every vertical and horizontal cut in O(width + height) after one
    pass over the box's cells; ties go to the cut nearest the middle of the
    longer side, which keeps zero-cost regions square.

    Parameters
    ----------
    costs : ndarray, shape (size, size), float64
        Per-cell cost ``cost(FG[i][j])`` (Tornado equation 1), indexed ``[cy, cx]``.
    box : CellBox
        The partition to split.

    Returns
    -------
    (CellBox, CellBox) or None
        The two halves, or None for a single cell.
    """
    x0, y0, x1, y1 = box
    block = costs[y0 : y1 + 1, x0 : x1 + 1]
    candidates = []
    for axis, lo, hi in ((0, x0, x1), (1, y0, y1)):
        if hi == lo:
            continue
        line = block.sum(axis=0) if axis == 0 else block.sum(axis=1)
        left = np.cumsum(line)[:-1]
        worst = np.maximum(left, line.sum() - left)
        middle = (len(line) - 2) / 2
        order = np.lexsort((np.abs(np.arange(len(worst)) - middle), worst))
        k = int(order[0])
        candidates.append((float(worst[k]), -(hi - lo), axis, lo + k))
    if not candidates:
        return None
    _, _, axis, cut = min(candidates)
    if axis == 0:
        return (x0, y0, cut, y1), (cut + 1, y0, x1, y1)
    return (x0, y0, x1, cut), (x0, cut + 1, x1, y1)


def cost_partitioning(costs: np.ndarray, n: int) -> Partitioning:
    """Partition the fine grid into ``n`` rectangles of balanced cost (Tornado section 4.1).

    Parameters
    ----------
    costs : ndarray, shape (size, size), float64, non-negative
        Per-cell cost from a workload sample, indexed ``[cy, cx]``.
    n : int
        Number of partitions (evaluators).

    Returns
    -------
    Partitioning
        Complexity O(n log n + n * size) plus one O(size^2) prefix sum.

    Raises
    ------
    RoutingError
        If ``n`` exceeds the number of cells.
    """
    size = costs.shape[0]
    if n > size * size:
        raise RoutingError(f"cannot cut {size}x{size} cells into {n} partitions")
    prefix = np.zeros((size + 1, size + 1))
    prefix[1:, 1:] = np.cumsum(np.cumsum(costs, axis=0), axis=1)
    heap: list[tuple[float, int, int, CellBox]] = []
    seq = 0

    def push(box: CellBox) -> None:
        nonlocal seq
        area = (box[2] - box[0] + 1) * (box[3] - box[1] + 1)
        heapq.heappush(heap, (-_box_cost(prefix, box), -area, seq, box))
        seq += 1

    push((0, 0, size - 1, size - 1))
    done: list[CellBox] = []
    while heap and len(heap) + len(done) < n:
        box = heapq.heappop(heap)[3]
        halves = best_split(costs, box)
        if halves is None:
            done.append(box)
            continue
        push(halves[0])
        push(halves[1])
    boxes = sorted(done + [item[3] for item in heap], key=lambda b: (b[1], b[0]))
    return Partitioning(size, np.array(boxes, dtype=np.int32))


def uniform_partitioning(size: int, n: int) -> Partitioning:
    """Cut the grid into ``n`` equal spatial ranges (Uni-Space-Rout, Tornado section 5.1).

    Raises
    ------
    RoutingError
        If the grid has fewer cells per side than the partition layout needs
        (a :class:`~skpub.kernel.config.Deployment` of the uniform router
        refuses such a layout already).
    """
    cols, rows = grid_shape(n)
    if cols > size or rows > size:
        raise RoutingError(f"a {size}x{size} grid cannot hold {cols}x{rows} uniform partitions")
    xs = [size * i // cols for i in range(cols + 1)]
    ys = [size * j // rows for j in range(rows + 1)]
    boxes = [(xs[i], ys[j], xs[i + 1] - 1, ys[j + 1] - 1) for j in range(rows) for i in range(cols)]
    return Partitioning(size, np.array(boxes, dtype=np.int32))
