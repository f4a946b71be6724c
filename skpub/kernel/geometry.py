"""Planar geometry: closed axis-aligned rectangles and points.

Coordinates are in the deployment's space units (lon/lat degrees for the
GeoNames workload). Rectangles are closed on every side
(``docs/SEMANTICS.md`` section 2).
"""

from __future__ import annotations

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

    @property
    def width(self) -> float:
        """Extent along x, in space units."""
        return self.xmax - self.xmin

    @property
    def height(self) -> float:
        """Extent along y, in space units."""
        return self.ymax - self.ymin

    def as_list(self) -> list[float]:
        """Return ``[xmin, ymin, xmax, ymax]``, the JSON form."""
        return [self.xmin, self.ymin, self.xmax, self.ymax]
