"""The routing-table interface shared by every spatial router."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import numpy as np

from skpub.kernel.geometry import Rect
from skpub.kernel.grid import CellBox, FineGrid, union_boxes
from skpub.router.partitioning import Partitioning


class RoutingTable(ABC):
    """Maps points and rectangles to the partitions (evaluators) that must see them.

    A point goes to exactly one partition, the owner of its fine cell, in O(1)
    (Tornado section 3.1). A rectangle goes to every partition it overlaps;
    subclasses differ in how they find those.
    """

    kind: str

    def __init__(self, grid: FineGrid, partitioning: Partitioning) -> None:
        if partitioning.size != grid.size:
            raise ValueError("partitioning and grid differ in size")
        self.grid = grid
        self.partitioning = partitioning
        self._owner = partitioning.owner
        self._rect_of = partitioning.rect_of
        self._boxes = [tuple(b) for b in partitioning.boxes.tolist()]
        self._owners = partitioning.owners.tolist()
        self._texts = partitioning.texts
        self._plain = np.array([table is None for table in partitioning.texts], dtype=bool)

    @property
    def count(self) -> int:
        """Number of partitions."""
        return self.partitioning.count

    def owner_of_cell(self, cx: int, cy: int) -> int:
        """Return the partition holding cell ``(cx, cy)``; O(1)."""
        return self._owner.item(cy, cx)

    def owners_of_cells(self, cx: np.ndarray, cy: np.ndarray) -> np.ndarray:
        """Vectorized :meth:`owner_of_cell`: ``(n,)`` int cell coordinates -> ``(n,)`` int64 partitions."""
        return self._owner[cy, cx].astype(np.int64)

    def route_one(self, x: float, y: float) -> int:
        """Return the partition holding the point; O(1)."""
        cx, cy = self.grid.cell_of(x, y)
        return self._owner.item(cy, cx)

    def route_many(self, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        """Vectorized :meth:`route_one`: ``(n,)`` float64 points -> ``(n,)`` int64 partitions."""
        return self.owners_of_cells(*self.grid.cells_of(xs, ys))

    def route_range(self, rect: Rect) -> list[int]:
        """Return every partition that the closed rectangle overlaps, without repeats."""
        return self.route_cells(self.grid.cell_box(rect))

    def route_cells(self, box: CellBox) -> list[int]:
        """Return every partition owning a rectangle the inclusive cell box overlaps, once; O(rectangles overlapped)."""
        return list(dict.fromkeys(self._owners[i] for i in self.route_rects(box)))

    def sole_owners(self, boxes: np.ndarray) -> np.ndarray:
        """Per cell box, the owner of the one rectangle holding it whole, or -1.

        ``boxes`` is ``(n, 4)`` int64, within the grid. A box whose two
        corners lie in the same rectangle lies in it whole (rectangles are
        boxes); such a box goes to that rectangle's owner alone, over itself,
        as :meth:`route_parts` sends it, unless the rectangle is
        text-partitioned (-1 then too). O(n) in numpy.
        """
        boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
        first = self._rect_of[boxes[:, 1], boxes[:, 0]]
        sole = (first == self._rect_of[boxes[:, 3], boxes[:, 2]]) & self._plain[first]
        return np.where(sole, self.partitioning.owners[first], -1).astype(np.int64)

    def route_parts(self, box: CellBox, keys: Iterable[str] = ()) -> list[tuple[int, CellBox]]:
        """Return ``(partition, cells)`` for every partition that must index a range subscription over ``box``.

        A rectangle the box overlaps sends the subscription to its owner, or,
        when text-partitioned, to the evaluator of each of ``keys`` (its
        clauses' least frequent keywords) in the rectangle's term table
        (PS2Stream IV-C, :mod:`skpub.router.gridt`). ``cells`` is the bounding
        box of ``box`` ∩ the rectangles that sent it there: an evaluator
        indexes the subscription over it. It can hold cells of other
        partitions (when the partition has several rectangles), which is
        harmless: an evaluator receives only objects of its own cells, or of
        a text rectangle with the terms it answers for, and GI^2 tests each
        against the subscription's rectangle. When cells move to an
        evaluator that already indexes a subscription over such a box, the
        transfer must merge the two parts (one entry per subscription id,
        over their bounding box), or an object could match it twice.
        O(rectangles overlapped x keys).
        """
        parts: dict[int, CellBox] = {}
        x0, y0, x1, y1 = box
        boxes, owners, texts = self._boxes, self._owners, self._texts
        for i in self.route_rects(box):
            bx0, by0, bx1, by1 = boxes[i]
            cells = (max(x0, bx0), max(y0, by0), min(x1, bx1), min(y1, by1))
            table = texts[i]
            for e in (owners[i],) if table is None else sorted({table.evaluator_of(k) for k in keys}):
                seen = parts.get(e)
                parts[e] = cells if seen is None else union_boxes(seen, cells)
        return list(parts.items())

    @abstractmethod
    def route_rects(self, box: CellBox) -> list[int]:
        """Return every rectangle (index into ``partitioning.boxes``) overlapping the inclusive cell box, once each."""
