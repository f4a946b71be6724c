"""The initial routing table from a workload sample (Tornado section 4.1).

The sample (the head of the stream) is replayed through a cost model: every
object costs 1 in its fine cell (parsing and routing) plus ``q_l``, the number
of sample subscriptions that cover it and share its keyword (Tornado
equation 1). :func:`router.partitioning.cost_partitioning` then cuts the grid
so that the costliest partition is as cheap as possible.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from router.agrid import AGrid
from router.grid import FineGrid
from router.partitioning import cost_partitioning
from router.table import RoutingTable
from router.uniform import UniformGrid
from skpub.config import Deployment
from skpub.geometry import Rect
from skpub.records import ObjectRecord, RangeSubscription, parse_line
from skpub.text import Vocabulary


def sample_cell_costs(lines: Iterable[str], grid: FineGrid, vocabulary: Vocabulary) -> np.ndarray:
    """Estimate per-cell cost from a sample of input lines.

    Returns
    -------
    ndarray, shape (grid.size, grid.size), float64
        Cost per fine cell, indexed ``[cy, cx]``. Invalid lines are ignored
        (they cost nothing to evaluate). O(objects x matching subscriptions).
    """
    costs = np.zeros((grid.size, grid.size))
    by_keyword: dict[str, list[Rect]] = {}
    objects: list[ObjectRecord] = []
    for pos, line in enumerate(lines):
        record = parse_line(line, pos, grid.space)
        if isinstance(record, ObjectRecord):
            objects.append(record)
        elif isinstance(record, RangeSubscription):
            for kw in vocabulary.summary_keywords(record.dnf):
                by_keyword.setdefault(kw, []).append(record.rect)
    for obj in objects:
        q = sum(1 for t in obj.term_set for r in by_keyword.get(t, ()) if r.contains_point(obj.x, obj.y))
        cx, cy = grid.cell_of(obj.x, obj.y)
        costs[cy, cx] += 1 + q
    return costs


def initial_table(deployment: Deployment, vocabulary: Vocabulary, sample: Iterable[str]) -> RoutingTable:
    """Build the epoch-0 routing table of a deployment.

    ``router = "agrid"``: A-Grid over the cost partitioning of the sample;
    ``router = "uniform"``: Uni-Space-Rout (the sample is not read).
    """
    grid = FineGrid(deployment.space, deployment.grid_size)
    if deployment.router == "uniform":
        return UniformGrid(grid, deployment.evaluators)
    costs = sample_cell_costs(sample, grid, vocabulary)
    return AGrid(grid, cost_partitioning(costs, deployment.evaluators))
