"""kd-tree partitioning: the space-only baseline of PS2Stream section VI-B.

PS2Stream compares its hybrid kd^t-tree with the best space-partitioning
baseline, kd-tree partitioning (AQWA, and Tornado's first prototype): a
kd-tree over the workload whose every leaf is one partition, "transformed to
a grid index to accelerate the workload distribution in the dispatchers".
Here the tree is built over the sample's per-cell costs (the same cost model
as the A-Grid's, :mod:`skpub.router.initial`), and the leaves are routed by
the A-Grid's neighbor search over the fine grid (that grid index).

The difference from :func:`skpub.router.partitioning.cost_partitioning`
(Tornado 4.1, always splits the costliest partition at its best cut) is the
kd-tree's shape: a node that must hold ``k`` partitions is cut once, on
alternating axes by depth (x first), at its load median weighted
``floor(k / 2) : ceil(k / 2)``, and each side is cut again for its share.
Every leaf gets about ``1 / n`` of the load whatever the cut leaves next to
it, which is why the kd-tree balances well and why, with large ranges, it
replicates subscriptions over many leaves (PS2Stream Figure 7b).
"""

from __future__ import annotations

import numpy as np

from skpub.kernel.grid import CellBox
from skpub.router.errors import RoutingError
from skpub.router.partitioning import Partitioning


def median_cut(line: np.ndarray, share: float, lo_min: int, hi_min: int) -> int:
    """Return the index ``c`` of the last cell of the low side of a weighted median cut of ``line``.

    Parameters
    ----------
    line : ndarray, shape (w,), float64
        Cost per column (or row) of the node, w >= 2.
    share : float
        The low side's wanted share of the cost, in (0, 1).
    lo_min, hi_min : int
        The fewest columns each side may keep (so that each can hold its
        partitions).

    Returns
    -------
    int
        ``lo_min - 1 <= c <= w - hi_min - 1``: the cut whose low-side cost is
        nearest ``share`` of the total; a zero-cost line is cut in proportion
        to its width. O(w).
    """
    w = len(line)
    total = float(line.sum())
    if total <= 0:
        return min(max(int(round(w * share)) - 1, lo_min - 1), w - hi_min - 1)
    left = np.cumsum(line)[lo_min - 1 : w - hi_min]
    return lo_min - 1 + int(np.argmin(np.abs(left - share * total)))


def _split_shape(width: int, height: int, k: int, preferred: int) -> tuple[int, int, int, int]:
    """Return ``(axis, k_lo, lo_min, hi_min)`` for cutting a ``width x height`` node of ``k`` partitions.

    The preferred axis (0 = x) and ``k_lo = k // 2`` when both sides can hold
    their partitions; else the other axis, then the nearest feasible ``k_lo``
    (only tiny grids need it). ``width * height >= k`` guarantees one exists.
    """
    for axis in (preferred, 1 - preferred):
        extent, across = (width, height) if axis == 0 else (height, width)
        if extent < 2:
            continue
        for k_lo in sorted(range(1, k), key=lambda j: (abs(2 * j - k), j)):
            lo_min, hi_min = -(-k_lo // across), -(-(k - k_lo) // across)
            if lo_min + hi_min <= extent:
                return axis, k_lo, lo_min, hi_min
    raise RoutingError(f"a {width}x{height} node cannot hold {k} partitions")


def kdtree_partitioning(costs: np.ndarray, n: int) -> Partitioning:
    """Partition the fine grid into ``n`` leaves of a load-balanced kd-tree (PS2Stream VI-B).

    Parameters
    ----------
    costs : ndarray, shape (size, size), float64, non-negative
        Per-cell cost from a workload sample, indexed ``[cy, cx]``.
    n : int
        Number of partitions (evaluators), >= 1.

    Returns
    -------
    Partitioning
        One rectangle per evaluator, in leaf order (low side first).
        O(n * size) after one O(size^2) pass per tree level.

    Raises
    ------
    RoutingError
        If ``n`` exceeds the number of cells or is below 1.
    """
    size = costs.shape[0]
    if not 1 <= n <= size * size:
        raise RoutingError(f"cannot cut {size}x{size} cells into {n} partitions")
    leaves: list[CellBox] = []

    def cut(box: CellBox, k: int, depth: int) -> None:
        if k == 1:
            leaves.append(box)
            return
        x0, y0, x1, y1 = box
        axis, k_lo, lo_min, hi_min = _split_shape(x1 - x0 + 1, y1 - y0 + 1, k, depth % 2)
        block = costs[y0 : y1 + 1, x0 : x1 + 1]
        c = median_cut(block.sum(axis=axis), k_lo / k, lo_min, hi_min)
        if axis == 0:
            cut((x0, y0, x0 + c, y1), k_lo, depth + 1)
            cut((x0 + c + 1, y0, x1, y1), k - k_lo, depth + 1)
        else:
            cut((x0, y0, x1, y0 + c), k_lo, depth + 1)
            cut((x0, y0 + c + 1, x1, y1), k - k_lo, depth + 1)

    cut((0, 0, size - 1, size - 1), n, 0)
    return Partitioning(size, np.array(leaves, dtype=np.int32))
