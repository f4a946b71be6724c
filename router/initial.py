"""The initial routing table from a workload sample (Tornado section 4.1).

The sample (the head of the stream) is replayed through a cost model: every
object costs 1 in its fine cell (parsing and routing) plus ``q_l``, the number
of sample subscriptions that cover it and share its keyword (Tornado
equation 1). Every subscription costs 1 spread evenly over the fine cells it
covers (registering it) plus one unit per GI^2 index cell it covers (one
index entry each) -- Tornado keeps query counts per cell beside the object
costs for the same reason, and a stream that starts with registrations gives
a sample with no objects at all. Top-k and kNN subscriptions live at every
evaluator and cost where the objects they score live: an object also costs
the number of sample topk/knn subscriptions that share a term with it, the
per-cell form of DkM-SKS equations 4-6 (a subscription's cost is the share
of objects carrying its keywords). :func:`skpub.router.partitioning.cost_partitioning`
then cuts the grid so that the costliest partition is as cheap as possible.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from skpub.kernel.config import Deployment
from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.kernel.objects import ObjectColumns, decode_objects
from skpub.kernel.records import KnnSubscription, ObjectRecord, RangeSubscription, TopkSubscription, parse_line
from skpub.kernel.text import Vocabulary
from skpub.router.agrid import AGrid
from skpub.router.kdtree import kdtree_partitioning
from skpub.router.partitioning import cost_partitioning
from skpub.router.table import RoutingTable
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


def sample_cell_costs(
    lines: Iterable[bytes | str], grid: FineGrid, vocabulary: Vocabulary, index_block: int, max_record_bytes: int
) -> np.ndarray:
    """Estimate per-cell cost from a sample of input lines.

    Returns
    -------
    ndarray, shape (grid.size, grid.size), float64
        Cost per fine cell, indexed ``[cy, cx]``. Invalid lines are ignored
        (they cost nothing to evaluate). O(objects x matching subscriptions);
        objects are decoded in bulk (:func:`~skpub.kernel.objects.decode_objects`), other lines one by one.
    """
    lines = [line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line for line in lines]
    try:
        objects, rest = decode_objects(lines, 0, grid.space, max_record_bytes)
    except Exception:  # noqa: BLE001 - a failing bulk decoder leaves every line to the line-by-line path
        objects, rest = ObjectColumns.from_records([]), list(range(len(lines)))
    parsed = [parse_line(lines[i], i, grid.space, max_record_bytes) for i in rest]
    more = ObjectColumns.from_records([r for r in parsed if type(r) is ObjectRecord])
    objects = ObjectColumns.concat([objects, more])
    by_keyword: dict[str, list[Rect]] = {}
    ranked: Counter[str] = Counter()
    boxes = []
    for record in parsed:
        if isinstance(record, RangeSubscription):
            boxes.append(grid.cell_box(record.rect))
            for kw in vocabulary.summary_keywords(record.dnf):
                by_keyword.setdefault(kw, []).append(record.rect)
        elif isinstance(record, TopkSubscription | KnnSubscription):
            ranked.update(record.keywords)
    costs = subscription_costs(np.array(boxes, dtype=np.int64).reshape(-1, 4), grid.size, index_block)
    columns = objects.x.tolist(), objects.y.tolist(), objects.terms.to_pylist()
    for x, y, terms in zip(*columns, strict=True):
        term_set = set(terms)
        q = sum(1 for t in term_set for r in by_keyword.get(t, ()) if r.contains_point(x, y))
        cx, cy = grid.cell_of(x, y)
        costs[cy, cx] += 1 + q + sum(ranked.get(t, 0) for t in term_set)
    return costs


def initial_table(deployment: Deployment, vocabulary: Vocabulary, sample: Iterable[bytes | str]) -> RoutingTable:
    """Build the epoch-0 routing table of a deployment.

    ``router = "agrid"``: A-Grid over the cost partitioning of the sample;
    ``router = "kdtree"``: the leaves of a kd-tree over the sample's costs
    (PS2Stream VI-B), routed as a grid index by the A-Grid's neighbor search;
    ``router = "uniform"``: Uni-Space-Rout (the sample is not read).
    """
    grid = FineGrid(deployment.space, deployment.grid_size)
    if deployment.router == "uniform":
        return UniformGrid(grid, deployment.evaluators)
    costs = sample_cell_costs(sample, grid, vocabulary, deployment.index_block, deployment.max_record_bytes)
    if deployment.router == "kdtree":
        return AGrid(grid, kdtree_partitioning(costs, deployment.evaluators))
    return AGrid(grid, cost_partitioning(costs, deployment.evaluators))
