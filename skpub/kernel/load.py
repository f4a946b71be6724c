"""Load summaries: what an evaluator tells the balancer at each batch boundary (Tornado 4.3).

Tornado's distributed load balancing keeps detailed statistics at the
evaluators and sends the routing layer a summary: here, per rectangle of the
evaluator's partition, its row, column and overall cost aggregates (Figure 5)
and its query-count aggregates, and per grid^t block of the partition (the
migration unit of PS2Stream V-A) its cost and query count. Costs are
decayed cost units (Tornado Eq. 1's candidate subscriptions per object,
range and ranked, DkM-SKS 4.2, plus ``BalancerConfig.object_cost`` per
object), never seconds, so a decision made from a summary is the same on a
replay.

The summary lives in the kernel because the evaluators build it and the
balancer reads it, and neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skpub.kernel.grid import CellBox

GRID_T_SIDE = 40
"""grid^t blocks per side of the space: the migration unit GR selects (PS2Stream V-A), whatever the fine grid."""


def imbalance(loads: Sequence[float] | np.ndarray) -> float:
    """Return ``max / mean`` of ``loads``, one per evaluator (1.0 is even balance, and the value when all are 0).

    The one measure of balance: the balancer's trigger (sigma bounds it),
    the run summary, the ``skpub_evaluator_imbalance`` gauge, ``skpub
    simulate`` and the balancer benchmark. An evaluator with no load counts,
    as 0. O(evaluators).
    """
    mean = float(np.mean(loads)) if len(loads) else 0.0
    return float(np.max(loads)) / mean if mean > 0 else 1.0


def grid_t_block(grid_size: int) -> int:
    """Return the fine cells per side of a grid^t block: ``ceil(grid_size / GRID_T_SIDE)`` (25 on 1000 x 1000)."""
    return max(1, -(-grid_size // GRID_T_SIDE))


@dataclass(frozen=True)
class RectangleLoad:
    """The aggregates of one rectangle of a partition.

    Attributes
    ----------
    box : CellBox
        The rectangle ``(cx0, cy0, cx1, cy1)``, inclusive, ``w = cx1 - cx0 + 1`` columns and ``h`` rows.
    columns : ndarray, shape (w,), float64
        Decayed cost per column (Tornado's column aggregates).
    rows : ndarray, shape (h,), float64
        Decayed cost per row.
    starts_x, ends_x : ndarray, shape (w,), int64
        Subscription parts (a subscription's box clipped to the rectangle)
        whose first / last column is each column.
    starts_y, ends_y : ndarray, shape (h,), int64
        The same per row. The subscriptions a strip of columns ``[a, b]``
        holds are ``queries - #(ends_x < a) - #(starts_x > b)``: exact, O(w).
    """

    box: CellBox
    columns: np.ndarray
    rows: np.ndarray
    starts_x: np.ndarray
    ends_x: np.ndarray
    starts_y: np.ndarray
    ends_y: np.ndarray

    @property
    def cost(self) -> float:
        """Overall decayed cost of the rectangle (Tornado Eq. 2)."""
        return float(self.columns.sum())

    @property
    def queries(self) -> int:
        """``queryCount``: subscriptions indexed over the rectangle."""
        return int(self.starts_x.sum())

    def strip(self, cells: CellBox) -> tuple[float, int]:
        """Return the cost and subscriptions of ``cells``, whole rows or columns of the rectangle; O(w + h).

        Raises
        ------
        ValueError
            If ``cells`` spans neither every row nor every column of the rectangle.
        """
        x0, y0, x1, y1 = self.box
        if (cells[1], cells[3]) == (y0, y1):
            a, b = cells[0] - x0, cells[2] - x0
            return float(self.columns[a : b + 1].sum()), self.column_queries(a, b)
        if (cells[0], cells[2]) == (x0, x1):
            a, b = cells[1] - y0, cells[3] - y0
            return float(self.rows[a : b + 1].sum()), self.row_queries(a, b)
        raise ValueError(f"{cells} is not a strip of {self.box}")

    def column_queries(self, a: int, b: int) -> int:
        """Return the subscriptions overlapping columns ``a .. b`` (offsets into the rectangle); O(w)."""
        return self.queries - int(self.ends_x[:a].sum()) - int(self.starts_x[b + 1 :].sum())

    def row_queries(self, a: int, b: int) -> int:
        """Return the subscriptions overlapping rows ``a .. b`` (offsets into the rectangle); O(h)."""
        return self.queries - int(self.ends_y[:a].sum()) - int(self.starts_y[b + 1 :].sum())


@dataclass(frozen=True)
class BlockLoad:
    """One grid^t block ∩ partition: ``cells`` (an inclusive box inside one rectangle), cost and query count."""

    cells: CellBox
    cost: float
    queries: int


@dataclass(frozen=True)
class LoadSummary:
    """An evaluator's load summary for the balancer at the end of ``batch``.

    ``rectangles`` follow the order of the evaluator's rectangles in the
    routing epoch; ``blocks`` cover the partition's cells that have cost or
    subscriptions (blocks with neither are left out: they weigh nothing and
    move for free).
    """

    evaluator: int
    batch: int
    rectangles: tuple[RectangleLoad, ...]
    blocks: tuple[BlockLoad, ...]

    @property
    def cost(self) -> float:
        """The evaluator's decayed cost: the sum over its rectangles."""
        return sum(r.cost for r in self.rectangles)

    @property
    def queries(self) -> int:
        """Subscription parts over the evaluator's rectangles."""
        return sum(r.queries for r in self.rectangles)

    def nbytes(self) -> int:
        """Bytes of the summary as sent: 8 per cost or count, 4 per cell coordinate (a block: 4 + 8 + 16)."""
        per_rect = sum(
            16 + 8 * (len(r.columns) + len(r.rows)) + 8 * (len(r.starts_x) * 2 + len(r.starts_y) * 2)
            for r in self.rectangles
        )
        return 16 + per_rect + 28 * len(self.blocks)

    def to_json(self) -> dict:
        """Return the summary as a JSON object (floats exact: orjson and json write their shortest round trip)."""
        return {
            "evaluator": self.evaluator,
            "batch": self.batch,
            "rectangles": [
                [list(r.box), r.columns.tolist(), r.rows.tolist(), r.starts_x.tolist(), r.ends_x.tolist(),
                 r.starts_y.tolist(), r.ends_y.tolist()]
                for r in self.rectangles
            ],
            "blocks": [[list(b.cells), b.cost, b.queries] for b in self.blocks],
        }  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict) -> LoadSummary:
        """Rebuild a summary of :meth:`to_json`.

        Raises
        ------
        ValueError
            If ``raw`` is not such a summary: fields missing or of the wrong
            type, aggregates that do not fit their rectangle, costs that are
            not finite or are negative (JSON's ``null`` would read as NaN).
        """
        try:
            rects = []
            for box, columns, rows, starts_x, ends_x, starts_y, ends_y in raw["rectangles"]:
                x0, y0, x1, y1 = (int(c) for c in box)
                w, h = x1 - x0 + 1, y1 - y0 + 1
                floats = [np.array(v, dtype=np.float64) for v in (columns, rows)]
                counts = [np.array(v, dtype=np.int64) for v in (starts_x, ends_x, starts_y, ends_y)]
                if [len(a) for a in (*floats, *counts)] != [w, h, w, w, h, h]:
                    raise ValueError(f"the aggregates of rectangle {box} do not fit it")
                if not all(np.isfinite(a).all() and (a >= 0).all() for a in floats):
                    raise ValueError(f"the costs of rectangle {box} are not finite numbers from 0")
                rects.append(RectangleLoad((x0, y0, x1, y1), *floats, *counts))
            blocks = tuple(
                BlockLoad(tuple(int(c) for c in cells), float(cost), int(queries))
                for cells, cost, queries in raw["blocks"]
            )
            if not all(math.isfinite(b.cost) and b.cost >= 0 for b in blocks):
                raise ValueError("a block's cost is not a finite number from 0")
            return cls(int(raw["evaluator"]), int(raw["batch"]), tuple(rects), blocks)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"damaged load summary: {exc}") from None
