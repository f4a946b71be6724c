"""The fine grid FG of Tornado section 3.1.

The space is cut into ``size x size`` equal cells. Cell ``(cx, cy)`` has id
``cy * size + cx``. The same floating-point formula maps points and rectangle
corners to cells, and it is monotone, so a point inside a closed rectangle
always falls in a cell of the rectangle's cell range: routing by cells never
loses a match on a cell or partition border. Values beyond the space (a
rectangle may reach any finite coordinate) clamp to the border cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from skpub.kernel.geometry import Rect

CellBox = tuple[int, int, int, int]
"""Inclusive cell rectangle ``(cx0, cy0, cx1, cy1)``."""


@dataclass(frozen=True, slots=True)
class FineGrid:
    """A ``size x size`` grid over ``space`` (coordinate units)."""

    space: Rect
    size: int

    def _index(self, v: float, lo: float, extent: float) -> int:
        # Clamp before scaling: a rectangle may reach +-1.7e308 (SEMANTICS
        # section 1), where the scaled value would overflow to inf.
        if v <= lo:
            return 0
        if v >= lo + extent:
            return self.size - 1
        i = int((v - lo) / extent * self.size // 1)
        return self.size - 1 if i >= self.size else i

    def cell_of(self, x: float, y: float) -> tuple[int, int]:
        """Return the cell ``(cx, cy)`` holding the point; O(1)."""
        s = self.space
        return self._index(x, s.xmin, s.width), self._index(y, s.ymin, s.height)

    def cells_of(self, xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorized :meth:`cell_of`.

        Parameters
        ----------
        xs, ys : ndarray, shape (n,), float64

        Returns
        -------
        cx, cy : ndarray, shape (n,), int64
        """
        s = self.space
        with np.errstate(over="ignore"):  # a far corner (up to +-1.7e308) scales to +-inf: clipped below
            cx = np.floor((np.asarray(xs, dtype=np.float64) - s.xmin) / s.width * self.size)
            cy = np.floor((np.asarray(ys, dtype=np.float64) - s.ymin) / s.height * self.size)
        last = self.size - 1
        return np.clip(cx, 0, last).astype(np.int64), np.clip(cy, 0, last).astype(np.int64)

    def cell_box(self, rect: Rect) -> CellBox:
        """Return the inclusive cell range covered by ``rect`` (clipped to the grid)."""
        cx0, cy0 = self.cell_of(rect.xmin, rect.ymin)
        cx1, cy1 = self.cell_of(rect.xmax, rect.ymax)
        return cx0, cy0, cx1, cy1

    def cell_boxes(self, rects: np.ndarray) -> np.ndarray:
        """Vectorized :meth:`cell_box`: ``(n, 4)`` float64 ``[xmin, ymin, xmax, ymax]`` -> ``(n, 4)`` int64 boxes."""
        rects = np.asarray(rects, dtype=np.float64).reshape(-1, 4)
        cx0, cy0 = self.cells_of(rects[:, 0], rects[:, 1])
        cx1, cy1 = self.cells_of(rects[:, 2], rects[:, 3])
        return np.stack([cx0, cy0, cx1, cy1], axis=1)


def intersect_boxes(a: CellBox, b: CellBox) -> CellBox | None:
    """Return the intersection of two inclusive cell boxes, or None if disjoint."""
    box = (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    return box if box[0] <= box[2] and box[1] <= box[3] else None


def union_boxes(a: CellBox, b: CellBox) -> CellBox:
    """Return the bounding box of two inclusive cell boxes."""
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


BOX_TESTS_PER_STEP = 1 << 20
"""Box pairs :func:`meets_any` tests in one numpy step (a few MiB of temporaries)."""


def meets_any(boxes: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Return, per box of ``boxes``, whether it meets (shares a cell with) any box of ``others``.

    Parameters
    ----------
    boxes, others : ndarray, shapes (n, 4) and (m, 4), int
        Inclusive cell boxes ``(x0, y0, x1, y1)``.

    Returns
    -------
    ndarray, shape (n,), bool
        O(n x m) in numpy, in steps of at most :data:`BOX_TESTS_PER_STEP`
        pairs, so memory stays bounded however many boxes there are.
    """
    a = np.asarray(boxes, dtype=np.int64).reshape(-1, 1, 4)
    b = np.asarray(others, dtype=np.int64).reshape(1, -1, 4)
    if not b.shape[1]:
        return np.zeros(len(a), bool)
    step = max(1, BOX_TESTS_PER_STEP // b.shape[1])
    x0, y0, x1, y1 = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    out = [
        ((c[..., 0] <= x1) & (c[..., 2] >= x0) & (c[..., 1] <= y1) & (c[..., 3] >= y0)).any(axis=1)
        for c in (a[k : k + step] for k in range(0, len(a), step))
    ]
    return np.concatenate([np.zeros(0, bool), *out])


def grid_shape(n: int) -> tuple[int, int]:
    """Return ``(columns, rows)`` with ``columns * rows == n`` (``n`` >= 1), as square as possible.

    The layout of ``n`` uniform partitions (Tornado 5.1's Uni-Space-Rout);
    O(sqrt(n)).
    """
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return n // rows, rows
