"""Planar geometry: closed axis-aligned rectangles and points.

Coordinates are in the deployment's space units (lon/lat degrees for the
GeoNames workload). Rectangles are closed on every side
(``docs/SEMANTICS.md`` section 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rect:
    """A closed axis-aligned rectangle ``[xmin, xmax] x [ymin, ymax]`` in space units."""

    xmin: float
    ymin: float
    xmax: float
    ymax: float

    def contains_point(self, x: float, y: float) -> bool:
        """Return whether the point ``(x, y)`` lies in the closed rectangle."""
        return self.xmin <= x <= self.xmax and self.ymin <= y <= self.ymax

    def intersects(self, other: Rect) -> bool:
        """Return whether the two closed rectangles share at least one point."""
        return (
            self.xmin <= other.xmax and other.xmin <= self.xmax and self.ymin <= other.ymax and other.ymin <= self.ymax
        )

    @property
    def width(self) -> float:
        """Extent along x, in space units."""
        return self.xmax - self.xmin

    @property
    def height(self) -> float:
        """Extent along y, in space units."""
        return self.ymax - self.ymin

    @property
    def diagonal(self) -> float:
        """Length of the diagonal (``MaxDist`` of SEMANTICS section 2), in space units."""
        return math.hypot(self.width, self.height)

    def as_list(self) -> list[float]:
        """Return ``[xmin, ymin, xmax, ymax]``, the JSON form."""
        return [self.xmin, self.ymin, self.xmax, self.ymax]
