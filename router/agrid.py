"""The Augmented Grid (A-Grid) with neighbor-based range routing (Tornado section 3.1).

Each fine cell stores its partition; the partitions map (PM) stores each
partition's cell box. To route a range R, start from R's corner cell and
follow, from each partition's *dominant cell* (its first cell inside R, here
the min-x/min-y one), two shortcuts: to the cell just right of the partition
on the dominant cell's row and to the cell just above it on the dominant
cell's column (Algorithm 1). Every partition is expanded once and pushes at
most two cells, so routing costs O(N_p) for N_p overlapped partitions,
independent of the grid size (Lemma 1).
"""

from __future__ import annotations

from router.grid import CellBox
from router.table import RoutingTable


class AGrid(RoutingTable):
    """Tornado's A-Grid over a cost-balanced partitioning."""

    kind = "agrid"

    def route_cells(self, box: CellBox) -> list[int]:
        """Neighbor-based search (Tornado Algorithm 1); O(N_p) partitions visited.

        Parameters
        ----------
        box : CellBox
            Inclusive cell box ``(cx0, cy0, cx1, cy1)`` of the range.

        Returns
        -------
        list of int
            The overlapped partitions, in visiting order.
        """
        return self.neighbor_search(box)[0]

    def neighbor_search(self, box: CellBox) -> tuple[list[int], int]:
        """Run Algorithm 1 and return ``(partitions, cells popped)``; pops <= 2 N_p + 1."""
        rx0, ry0, rx1, ry1 = box
        owner, boxes = self._owner, self._boxes
        result: list[int] = []
        visited: set[int] = set()
        stack = [(rx0, ry0)]
        pops = 0
        while stack:
            cx, cy = stack.pop()
            pops += 1
            p = owner.item(cy, cx)
            if p in visited:
                continue
            visited.add(p)
            result.append(p)
            x0, y0, x1, y1 = boxes[p]
            if y1 < ry1:
                stack.append((x0 if x0 > rx0 else rx0, y1 + 1))
            if x1 < rx1:
                stack.append((x1 + 1, y0 if y0 > ry0 else ry0))
        return result, pops
