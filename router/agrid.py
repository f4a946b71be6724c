"""The Augmented Grid (A-Grid) with neighbor-based range routing (Tornado section 3.1).

Each fine cell stores its rectangle; the partitions map (PM) stores each
rectangle's cell box and owner. A partition is one rectangle in Tornado; here,
after the balancer's corner shifts and migrations, it may be several, and the
search runs over rectangles. To route a range R, start from the rectangle of
R's corner cell and follow, from each rectangle's *dominant cell* (its first
cell inside R, here the min-x/min-y one), two shortcuts: to the cell just
right of the rectangle on the dominant cell's row and to the cell just above
it on the dominant cell's column (Algorithm 1). Every rectangle is expanded
once and looks up at most two cells, so routing costs O(N_r) for N_r
overlapped rectangles, independent of the grid size (Lemma 1).

Where the dominant cell is the rectangle's own corner (it does not stick out
of R on that side) the shortcut target is fixed, so it is precomputed per
rectangle; only rectangles on R's lower and left borders read the grid.
"""

from __future__ import annotations

from skpub.kernel.grid import CellBox, FineGrid
from skpub.router.partitioning import Partitioning
from skpub.router.table import RoutingTable


class AGrid(RoutingTable):
    """Tornado's A-Grid over a cost-balanced partitioning.

    Not thread-safe: a routing unit is single-threaded (it reuses one
    visited-flag array across queries).
    """

    kind = "agrid"

    def __init__(self, grid: FineGrid, partitioning: Partitioning) -> None:
        super().__init__(grid, partitioning)
        rect_of, last = self._rect_of, grid.size - 1
        self._right = [rect_of.item(y0, x1 + 1) if x1 < last else -1 for x0, y0, x1, y1 in self._boxes]
        self._up = [rect_of.item(y1 + 1, x0) if y1 < last else -1 for x0, y0, x1, y1 in self._boxes]
        self._seen = [False] * len(self._boxes)

    def route_rects(self, box: CellBox) -> list[int]:
        """Neighbor-based search (Tornado Algorithm 1); O(N_r).

        Parameters
        ----------
        box : CellBox
            Inclusive cell box ``(cx0, cy0, cx1, cy1)`` of the range.

        Returns
        -------
        list of int
            The overlapped rectangles, each once, in visiting order.
        """
        return self.neighbor_search(box)[0]

    def neighbor_search(self, box: CellBox) -> tuple[list[int], int]:
        """Run Algorithm 1 and return ``(rectangles, shortcut cells followed)``; cells <= 2 N_r + 1."""
        rx0, ry0, rx1, ry1 = box
        owner_item, boxes, right, up, seen = self._rect_of.item, self._boxes, self._right, self._up, self._seen
        first = owner_item(ry0, rx0)
        result = [first]
        seen[first] = True
        cells = 1
        for p in result:
            x0, y0, x1, y1 = boxes[p]
            if y1 < ry1:
                q = up[p] if x0 >= rx0 else owner_item(y1 + 1, rx0)
                cells += 1
                if not seen[q]:
                    seen[q] = True
                    result.append(q)
            if x1 < rx1:
                q = right[p] if y0 >= ry0 else owner_item(ry0, x1 + 1)
                cells += 1
                if not seen[q]:
                    seen[q] = True
                    result.append(q)
        for p in result:
            seen[p] = False
        return result, cells
