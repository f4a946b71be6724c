"""PS2Stream's global load adjustment (V-B): a repartitioning of the space on the recent load, as one operation.

PS2Stream checks periodically, on a recent sample, whether repartitioning
the workload would pay, and if so repartitions with its partitioning
algorithm. skpub's recent sample is what the balancer already receives: the
evaluators' decayed cost per grid^t block (:class:`~skpub.kernel.load.BlockLoad`,
recent batches weigh most). :func:`global_adjustment`

1. sums the plain cells' block costs into a grid of grid^t blocks and cuts
   it into one leaf per evaluator with the load-balanced kd-tree
   (:func:`skpub.router.kdtree.kdtree_partitioning`, PS2Stream VI-B's
   space partitioning). A departure: PS2Stream repartitions with its
   kd^t-tree (IV-B), which needs a sample of objects and subscriptions
   with their terms, not block costs; here text-partitioned rectangles
   keep their evaluators (they change only by phase I,
   :mod:`skpub.balancer.textsplit`) and their load is not cut;
2. gives the leaves to the evaluators so that as many subscriptions as
   possible stay where they are, in total (an assignment problem,
   ``scipy.optimize.linear_sum_assignment`` over the subscriptions each
   evaluator holds in each leaf, then the cells);
3. returns the cell moves that turn the current partitioning into it, each
   inside one rectangle of its source as the earlier moves leave it. The
   leaves are whole blocks, so every move's cost is summed exactly from the
   source's block summaries; its subscriptions are the least of three
   upper bounds (the sum over its blocks, which counts a subscription once
   per block, and those over its rows and over its columns of the
   rectangle, Tornado's aggregates).

The moves go through the same transfer and two-phase protocol as every
operation (DESIGN "The balancer"), so the adjustment is exact under the
same tests. PS2Stream avoids the burst of migration by keeping the old
distribution for the subscriptions registered before the repartitioning
until they are few; skpub migrates at once, and only when the gain over the
balancer's horizon pays for the subscriptions moved (gain x its reduction
of the costliest evaluator's cost > C_t,
:func:`skpub.balancer.policy.with_global_adjustment`). A second
distribution would route every object by two tables and needs a
generation on every subscription part for exactly-once delivery (DESIGN
"The balancer", global adjustment).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from skpub.balancer.operation import Loads, Move, Operation, subtract, touches_text
from skpub.kernel.grid import CellBox, intersect_boxes
from skpub.kernel.load import grid_t_block
from skpub.router.errors import RoutingError
from skpub.router.kdtree import kdtree_partitioning
from skpub.router.partitioning import Partitioning

KIND = "global_adjustment"


def block_costs(partitioning: Partitioning, loads: Loads) -> np.ndarray:
    """Return the decayed cost per grid^t block of the plain cells, shape ``(b, b)`` float64, indexed ``[by, bx]``.

    ``b = ceil(size / grid_t_block(size))``. O(blocks reported).
    """
    side = grid_t_block(partitioning.size)
    b = -(-partitioning.size // side)
    costs = np.zeros((b, b))
    for blocks in loads.blocks:
        for block in blocks:
            if not touches_text(partitioning, block.cells):
                costs[block.cells[1] // side, block.cells[0] // side] += block.cost
    return costs


def global_adjustment(
    partitioning: Partitioning, loads: Loads, rng: np.random.Generator | None = None
) -> Operation | None:
    """Return the operation that repartitions the plain cells by a kd-tree over the recent block costs.

    Parameters
    ----------
    partitioning : Partitioning
        The partitioning in force.
    loads : Loads
        The evaluators' summaries (their grid^t blocks give the costs and
        the subscriptions per block).
    rng : numpy Generator, optional
        ``chaos``: draw the block costs and the leaves' evaluators at random
        instead (a legal repartitioning whatever it costs).

    Returns
    -------
    Operation or None
        Kind :data:`KIND`; None when fewer than two evaluators, more
        evaluators than blocks, a leaf that would leave an evaluator with no
        cell, or nothing to move. O(blocks + rectangles x evaluators) plus
        the assignment (O(n^3), n evaluators) and the moves.
    """
    n = partitioning.count
    side = grid_t_block(partitioning.size)
    costs = block_costs(partitioning, loads) if rng is None else rng.random((-(-partitioning.size // side),) * 2)
    if n < 2 or n > costs.size:
        return None
    try:
        tree = kdtree_partitioning(costs, n)
    except RoutingError:
        return None
    leaves = [_cells_of(tuple(box), side, partitioning.size) for box in tree.boxes.tolist()]
    owner = _assign(partitioning, loads, tree, leaves) if rng is None else rng.permutation(n)
    if not _every_evaluator_keeps_a_cell(partitioning, leaves, owner):
        return None
    moves = []
    for i, (box, source) in enumerate(zip(partitioning.boxes.tolist(), partitioning.owners.tolist(), strict=True)):
        if partitioning.texts[i] is not None:
            continue
        held = [tuple(box)]  # the source's pieces of this rectangle as the moves so far leave it
        for leaf, target in zip(leaves, owner.tolist(), strict=True):
            piece = intersect_boxes(tuple(box), leaf)
            if piece is None or target == source:
                continue
            for k in reversed(range(len(held))):
                cells = intersect_boxes(held[k], piece)
                if cells is not None:
                    moves.append(_move(loads, i, cells, source, int(target)))
                    held[k : k + 1] = subtract(held[k], cells)
    return loads.operation(KIND, moves) if moves else None


def _assign(partitioning: Partitioning, loads: Loads, tree: Partitioning, leaves: list[CellBox]) -> np.ndarray:
    """Return the evaluator of each leaf: most subscriptions kept in place, then most cells (linear_sum_assignment).

    ``tree`` is the kd-tree over grid^t blocks, ``leaves`` its leaves in cells.
    """
    n = partitioning.count
    side = grid_t_block(partitioning.size)
    kept = np.zeros((n, n))  # [evaluator, leaf]
    for e, blocks in enumerate(loads.blocks):
        for block in blocks:
            leaf = tree.owner[block.cells[1] // side, block.cells[0] // side]
            if not touches_text(partitioning, block.cells):
                kept[e, leaf] += block.queries
    area = np.zeros((n, n))
    for i, (box, e) in enumerate(zip(partitioning.boxes.tolist(), partitioning.owners.tolist(), strict=True)):
        if partitioning.texts[i] is not None:
            continue
        for j, leaf in enumerate(leaves):
            piece = intersect_boxes(tuple(box), leaf)
            if piece is not None:
                area[e, j] += _area(piece)
    weight = kept + area / (float(area.sum()) + 1.0)  # cells only break ties between equal subscription counts
    rows, cols = linear_sum_assignment(weight, maximize=True)
    owner = np.empty(n, dtype=np.int64)
    owner[cols] = rows
    return owner


def _every_evaluator_keeps_a_cell(partitioning: Partitioning, leaves: list[CellBox], owner: np.ndarray) -> bool:
    """Return whether every evaluator holds a text rectangle or a leaf with a plain cell."""
    sharing = {e for t in partitioning.texts if t is not None for e in t.evaluators}
    for leaf, e in zip(leaves, owner.tolist(), strict=True):
        x0, y0, x1, y1 = leaf
        if e not in sharing and _area(leaf) == int(partitioning.text_cells[y0 : y1 + 1, x0 : x1 + 1].sum()):
            return False
    return True


def _move(loads: Loads, rect: int, cells: CellBox, source: int, target: int) -> Move:
    """Return the move of ``cells`` (inside rectangle ``rect`` of ``source``) with their cost and subscriptions.

    The cost is exact: the leaves are whole grid^t blocks, so every block
    lies inside one move or outside all. The subscriptions are the least
    of the blocks' sum and the rectangle's counts over the move's columns
    and over its rows (each an upper bound).
    """
    inside = [b for b in loads.blocks[source] if intersect_boxes(b.cells, cells) == b.cells]
    queries = sum(b.queries for b in inside)
    load = loads.rect_loads[rect]
    if load is not None:
        x0, y0 = load.box[:2]
        columns = load.column_queries(cells[0] - x0, cells[2] - x0)
        rows = load.row_queries(cells[1] - y0, cells[3] - y0)
        queries = min(queries, columns, rows)
    return Move(cells, source, target, float(sum(b.cost for b in inside)), int(queries))


def _cells_of(blocks: CellBox, side: int, size: int) -> CellBox:
    x0, y0, x1, y1 = blocks
    return (x0 * side, y0 * side, min(size - 1, (x1 + 1) * side - 1), min(size - 1, (y1 + 1) * side - 1))


def _area(box: CellBox) -> int:
    return (box[2] - box[0] + 1) * (box[3] - box[1] + 1)
