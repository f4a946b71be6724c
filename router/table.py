"""The routing-table interface shared by every spatial router."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from skpub.kernel.geometry import Rect
from skpub.kernel.grid import CellBox, FineGrid
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
        self._boxes = [tuple(b) for b in partitioning.boxes.tolist()]

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

    @abstractmethod
    def route_cells(self, box: CellBox) -> list[int]:
        """Return every partition that overlaps the inclusive cell box, without repeats."""
