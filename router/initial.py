"""The initial routing table from a workload sample (Tornado section 4.1).

The sample (the head of the stream) is replayed through a cost model: every
object costs 1 in its fine cell (parsing and routing) plus ``q_l``, the number
of sample subscriptions that cover it and share its keyword (Tornado
equation 1). The evaluators' statistics weigh an object
``BalancerConfig.object_cost`` units (10); this estimate keeps one, because
a stream's head is mostly registrations and its few objects are a noisy
guess: weighed by 10 they made the first phase of the drifting stream less
even (max/mean 1.45-1.70 against 1.30-1.37, benchmarks (f)). Every
subscription costs 1 spread evenly over the fine cells it covers
(registering it) plus one unit per GI^2 index cell it covers (one index
entry each) -- Tornado keeps query counts per cell beside the object costs
for the same reason, and a stream that starts with registrations gives
a sample with no objects at all. Top-k and kNN subscriptions live at every
evaluator and cost where the objects they score live: an object also costs
the number of sample topk/knn subscriptions that share a term with it, the
per-cell form of DkM-SKS equations 4-6 (a subscription's cost is the share
of objects carrying its keywords). :func:`skpub.router.partitioning.cost_partitioning`
then cuts the grid so that the costliest partition is as cheap as possible.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from skpub.kernel.config import Deployment
from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.kernel.text import Vocabulary
from skpub.router.agrid import AGrid
from skpub.router.kdt import kdt_partitioning
from skpub.router.kdtree import kdtree_partitioning
from skpub.router.partitioning import cost_partitioning
from skpub.router.sample import KeyedSample, Sample, parse_sample
from skpub.router.table import RoutingTable
from skpub.router.textpart import text_partitioning
from skpub.router.uniform import UniformGrid


def subscription_costs(boxes: np.ndarray, size: int, index_block: int) -> np.ndarray:
    """Spread each subscription's registration cost over the cells it covers.

    Parameters
    ----------
    boxes : ndarray, shape (n, 4), int64
        Inclusive cell boxes ``[cx0, cy0, cx1, cy1]``.

    Returns
    -------
    ndarray, shape (size, size), float64
        Per cell, indexed ``[cy, cx]``: ``1 / cells + 1 / index_block**2`` for
        every subscription covering it. O(n + size^2) (a 2-D difference array).
    """
    diff = np.zeros((size + 1, size + 1))
    if len(boxes):
        x0, y0, x1, y1 = (boxes[:, i] for i in range(4))
        weight = 1.0 / ((x1 - x0 + 1) * (y1 - y0 + 1)) + 1.0 / index_block**2
        np.add.at(diff, (y0, x0), weight)
        np.add.at(diff, (y0, x1 + 1), -weight)
        np.add.at(diff, (y1 + 1, x0), -weight)
        np.add.at(diff, (y1 + 1, x1 + 1), weight)
    return np.cumsum(np.cumsum(diff, axis=0), axis=1)[:size, :size]


def cell_costs(sample: Sample, size: int, index_block: int) -> np.ndarray:
    """Return the per-cell cost of a parsed sample (Tornado equation 1 and the ranked share, see the module).

    Returns
    -------
    ndarray, shape (size, size), float64
        Cost per fine cell, indexed ``[cy, cx]``. O(objects x matching subscriptions).
    """
    by_keyword: dict[str, list[Rect]] = {}
    for _, rect, keys in sample.ranges:
        for kw in keys:
            by_keyword.setdefault(kw, []).append(rect)
    boxes = np.array([box for box, _, _ in sample.ranges], dtype=np.int64).reshape(-1, 4)
    costs = subscription_costs(boxes, size, index_block)
    ranked = sample.ranked
    columns = (sample.x.tolist(), sample.y.tolist(), sample.cx.tolist(), sample.cy.tolist(), sample.terms)
    for x, y, cx, cy, term_set in zip(*columns, strict=True):
        q = sum(1 for t in term_set for r in by_keyword.get(t, ()) if r.contains_point(x, y))
        costs[cy, cx] += 1 + q + sum(ranked.get(t, 0) for t in term_set)
    return costs


def sample_cell_costs(
    lines: Iterable[bytes | str], grid: FineGrid, vocabulary: Vocabulary, index_block: int, max_record_bytes: int
) -> np.ndarray:
    """Estimate per-cell cost from a sample of input lines: :func:`cell_costs` of :func:`parse_sample`.

    Returns
    -------
    ndarray, shape (grid.size, grid.size), float64
        Cost per fine cell, indexed ``[cy, cx]``.
    """
    return cell_costs(parse_sample(lines, grid, vocabulary, max_record_bytes), grid.size, index_block)


def initial_table(deployment: Deployment, vocabulary: Vocabulary, sample: Iterable[bytes | str]) -> RoutingTable:
    """Build the epoch-0 routing table of a deployment.

    ``router = "agrid"``: A-Grid over the cost partitioning of the sample;
    ``router = "kdtree"``: the leaves of a kd-tree over the sample's costs
    (PS2Stream VI-B), routed as a grid index by the A-Grid's neighbor search;
    ``router = "text"``: every cell text-partitioned with one term
    assignment (PS2Stream VI-B's metric-based text partitioning,
    :mod:`skpub.router.textpart`); ``router = "kdt"``: PS2Stream's hybrid
    kd^t-tree (IV-B, :mod:`skpub.router.kdt`);
    ``router = "uniform"``: Uni-Space-Rout (the sample is not read).
    """
    grid = FineGrid(deployment.space, deployment.grid_size)
    if deployment.router == "uniform":
        return UniformGrid(grid, deployment.evaluators)
    sample = parse_sample(sample, grid, vocabulary, deployment.max_record_bytes)
    costs = cell_costs(sample, grid.size, deployment.index_block)
    if deployment.router == "kdtree":
        return AGrid(grid, kdtree_partitioning(costs, deployment.evaluators))
    if deployment.router in ("text", "kdt"):
        keyed = KeyedSample.of(sample)
        build = text_partitioning if deployment.router == "text" else kdt_partitioning
        return AGrid(grid, build(keyed, costs, deployment.evaluators))
    return AGrid(grid, cost_partitioning(costs, deployment.evaluators))
