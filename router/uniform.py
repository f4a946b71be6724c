"""Uni-Space-Rout: equal spatial partitions (the baseline of Tornado section 5.1).

Partitions form a ``columns x rows`` layout of equal cell ranges
(:func:`skpub.router.partitioning.uniform_partitioning`), so a range is routed by
arithmetic on the layout: the overlapped columns times the overlapped rows,
O(N_p). It ignores where the load is, which is what it is a baseline for.
"""

from __future__ import annotations

import bisect

from skpub.kernel.grid import CellBox, FineGrid, grid_shape
from skpub.router.partitioning import uniform_partitioning
from skpub.router.table import RoutingTable


class UniformGrid(RoutingTable):
    """Routing table over :func:`uniform_partitioning` of ``n`` partitions."""

    kind = "uniform"

    def __init__(self, grid: FineGrid, n: int) -> None:
        super().__init__(grid, uniform_partitioning(grid.size, n))
        self.columns, self.rows = grid_shape(n)
        self._x_starts = [grid.size * i // self.columns for i in range(self.columns)]
        self._y_starts = [grid.size * j // self.rows for j in range(self.rows)]

    def route_rects(self, box: CellBox) -> list[int]:
        """Return the partitions (one rectangle each) of the overlapped layout columns x rows; O(N_p)."""
        cx0, cy0, cx1, cy1 = box
        i0 = bisect.bisect_right(self._x_starts, cx0) - 1
        i1 = bisect.bisect_right(self._x_starts, cx1) - 1
        j0 = bisect.bisect_right(self._y_starts, cy0) - 1
        j1 = bisect.bisect_right(self._y_starts, cy1) - 1
        return [j * self.columns + i for j in range(j0, j1 + 1) for i in range(i0, i1 + 1)]
