"""Per-cell cost statistics (Tornado section 4, equations 1-2, Figure 5).

``cost(FG[i][j]) = sum of (object_cost + q_l)`` over the objects ``O_l``
received in fine cell ``(i, j)``, where ``q_l`` is the number of
subscriptions that share a keyword with ``O_l`` there (equation 1), plus
``object_cost`` units per object for receiving and indexing it
(``BalancerConfig.object_cost``, PS2Stream Definition 1's c2 against c1;
the initial partitioning counts one unit, :mod:`skpub.router.initial`). Without
that term, a stream whose objects rarely meet a subscription keyword costs
almost nothing while its evaluators are busy: on the drifting GeoNames
stream, 5,000 objects cost about 250 candidates, and balancing candidates
alone left one evaluator with all the work (benchmark (f)). The row, column
and overall aggregates are kept as objects arrive, O(1) each, so a split
position can be found in O(rows + columns) and a partition's cost
(equation 2) read without a scan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

RANKED_WORK = ("reevaluations", "reevaluated", "reevaluation_cpu_seconds", "fills")
"""The top-k/kNN work an evaluator counts per batch (:class:`CellCostStats`)."""


@dataclass
class CellCostStats:
    """Cost statistics of one evaluator over one micro-batch.

    Cell, row and column keys are fine-grid indices (``cy * size + cx``,
    ``cy`` and ``cx``); costs count objects and their candidate subscriptions (unitless).
    ``reevaluations`` counts the top-k/kNN buffers refilled from the window
    store after expiries, ``reevaluated`` the candidates they scored and
    ``reevaluation_cpu_seconds`` their thread CPU time (Skype section 6);
    ``fills`` the buffers filled for a new or restored subscription.
    """

    cells: dict[int, int] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)
    columns: dict[int, int] = field(default_factory=dict)
    overall: int = 0
    objects: int = 0
    reevaluations: int = 0
    reevaluated: int = 0
    reevaluation_cpu_seconds: float = 0.0
    fills: int = 0

    def ranked_work(self) -> Counter:
        """Return the top-k/kNN work counted (``BatchReport.ranked`` of one evaluator, without the merge's)."""
        return Counter({key: getattr(self, key) for key in RANKED_WORK})

    def add(self, cell: int, cx: int, cy: int, cost: int) -> None:
        """Account one object received in fine cell ``(cx, cy)`` that costs ``cost`` units (``object_cost + q_l``)."""
        self.objects += 1
        self.cells[cell] = self.cells.get(cell, 0) + cost
        self.rows[cy] = self.rows.get(cy, 0) + cost
        self.columns[cx] = self.columns.get(cx, 0) + cost
        self.overall += cost

    def add_many(self, cx: np.ndarray, cy: np.ndarray, costs: np.ndarray, size: int) -> None:
        """Account objects received in fine cells ``(cx[i], cy[i])`` costing ``costs[i]`` units each.

        ``cx``, ``cy`` and ``costs``: ndarray, shape (n,), int64; ``size`` the
        fine grid's cells per side. Equal to :meth:`add` per object, in
        O(n log n) numpy work and O(distinct cells) in Python.
        """
        if not len(costs):
            return
        self.objects += len(costs)
        self.overall += int(costs.sum())
        for counts, keys in ((self.cells, cy * size + cx), (self.rows, cy), (self.columns, cx)):
            distinct, at = np.unique(keys, return_inverse=True)
            sums = np.bincount(at, weights=costs).astype(np.int64)
            for key, cost in zip(distinct.tolist(), sums.tolist(), strict=True):
                counts[key] = counts.get(key, 0) + cost

    def to_json(self, evaluator: int, batch_id: int, cpu_seconds: float, subscriptions: int) -> dict:
        """Return the statistics line written to ``DIR/statistics`` every batch."""
        return {
            "batch": batch_id,
            "evaluator": evaluator,
            "objects": self.objects,
            "cost": self.overall,
            "cpu_seconds": cpu_seconds,
            "subscriptions": subscriptions,
            "reevaluations": self.reevaluations,
            "reevaluated": self.reevaluated,
            "reevaluation_cpu_seconds": self.reevaluation_cpu_seconds,
            "fills": self.fills,
            "rows": {str(k): v for k, v in sorted(self.rows.items())},
            "columns": {str(k): v for k, v in sorted(self.columns.items())},
            "cells": {str(k): v for k, v in sorted(self.cells.items())},
        }
