"""PS2Stream's local load adjustment, phase II: the Minimum Cost Migration problem (PS2Stream V-A).

When the balance constraint is violated, the most loaded evaluator w_o moves
a set of its grid^t blocks G_s to the least loaded one w_l: the cheapest set
(sum of sizes S_g, here the subscriptions a block holds) whose load (sum of
L_g, here the block's decayed cost) reaches tau = (L(w_o) - L(w_l)) / 2
(Definition 4; NP-hard, Theorem 2). skpub's adaptive policy fans out: w_o
moves a set to each evaluator under the mean in turn, each tau its deficit
(:func:`fan_out_shares`), so that a hot spot on one evaluator spreads in one
operation (DESIGN "The balancer"). Selection algorithms, each a function of
``(loads, sizes, tau)`` returning the chosen indices:

- :func:`greedy` (GR, the default): scan by relative cost S_g / L_g
  ascending, marking cells GS while the load stays under tau and GL when
  one would reach it; the answer is the cheapest GS_1..GS_t + {g'} seen
  (Figure 5). O(n log n).
- :func:`dynamic` (DP): the knapsack recurrence A(i, j) over integer sizes
  up to P, the greedy answer's cost. O(n P) time and memory.
- :func:`by_size` (SI): largest sizes first until tau. :func:`random_cells`
  (RA): random order until tau (seeded).
- :func:`optimum`: the 0-1 program solved exactly by ``scipy.optimize.milp``
  (HiGHS), the yardstick of the benchmark on small instances.

:func:`strip_migration` is the same fan-out over whole lines of the source's
costliest rectangle with two lines or more, for a hot spot inside one grid^t
block (skpub's, not the paper's: DESIGN "Operations, one module each").

Phase I (split or merge text-partitioned rectangles before phase II) is
:mod:`skpub.balancer.textsplit`; :func:`migration` takes no block of a text
rectangle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from skpub.balancer.operation import Loads, Move, Operation, touches_text
from skpub.router.partitioning import Partitioning

Selector = Callable[[np.ndarray, np.ndarray, float], list[int]]
"""``(loads (n,) float64, sizes (n,) int64, tau) -> chosen indices``."""


def _until(order: np.ndarray, loads: np.ndarray, tau: float) -> list[int]:
    chosen, total = [], 0.0
    for g in order.tolist():
        if total >= tau:
            break
        chosen.append(g)
        total += loads[g]
    return chosen


def greedy(loads: np.ndarray, sizes: np.ndarray, tau: float) -> list[int]:
    """GR (PS2Stream V-A.2, Figure 5): the cheapest ``GS_1 .. GS_t + {g'}`` in the relative-cost scan.

    Blocks of no load are never taken. If no set reaches ``tau``, every
    loaded block is returned.
    """
    loaded = np.flatnonzero(loads > 0)
    with np.errstate(over="ignore"):  # a load of a few ulps gives inf: such a block comes last, as it should
        relative = sizes[loaded] / loads[loaded]
    order = loaded[np.lexsort((loaded, relative))]
    gs: list[int] = []
    gs_load, gs_size = 0.0, 0
    best: tuple[int, int, int] | None = None  # (size, GS cells before g', g')
    for g in order.tolist():
        if gs_load + loads[g] < tau:
            gs.append(g)
            gs_load += loads[g]
            gs_size += int(sizes[g])
        elif best is None or gs_size + sizes[g] < best[0]:
            best = (gs_size + int(sizes[g]), len(gs), g)
    return [*gs[: best[1]], best[2]] if best is not None else gs


def dynamic(loads: np.ndarray, sizes: np.ndarray, tau: float) -> list[int]:
    """DP (PS2Stream V-A.1): max load per size budget j <= P, then the least j reaching ``tau``.

    P is the greedy answer's size, an upper bound of the optimum. O(n P)
    time and memory.
    """
    upper = int(sizes[greedy(loads, sizes, tau)].sum())
    n = len(loads)
    best = np.zeros(upper + 1)
    took = np.zeros((n, upper + 1), dtype=bool)
    for i in range(n):
        s, load = int(sizes[i]), loads[i]
        if load <= 0 or s > upper:
            continue
        candidate = np.full(upper + 1, -np.inf)
        candidate[s:] = best[: upper + 1 - s] + load
        took[i] = candidate > best
        best = np.maximum(best, candidate)
    reach = np.flatnonzero(best >= tau * (1 - 1e-9))
    j = int(reach[0]) if len(reach) else upper
    chosen = []
    for i in range(n - 1, -1, -1):
        if took[i, j]:
            chosen.append(i)
            j -= int(sizes[i])
    return sorted(chosen)


def by_size(loads: np.ndarray, sizes: np.ndarray, tau: float) -> list[int]:
    """SI (PS2Stream VI-D): loaded blocks in descending order of size until ``tau``."""
    loaded = np.flatnonzero(loads > 0)
    return _until(loaded[np.lexsort((loaded, -sizes[loaded]))], loads, tau)


def random_cells(loads: np.ndarray, sizes: np.ndarray, tau: float, seed: int = 0) -> list[int]:
    """RA (PS2Stream VI-D): loaded blocks in a random (seeded) order until ``tau``."""
    loaded = np.flatnonzero(loads > 0)
    return _until(np.random.default_rng(seed).permutation(loaded), loads, tau)


def optimum(loads: np.ndarray, sizes: np.ndarray, tau: float) -> list[int]:
    """Solve the Minimum Cost Migration (Definition 4) exactly, as a 0-1 program, with ``scipy.optimize.milp``.

    Exponential in the worst case: for benchmarks on small instances. If
    ``tau`` exceeds the total load, every loaded cell. The constraint is
    scaled to ``loads / tau >= 1`` so that HiGHS's absolute feasibility
    tolerance (1e-6) is relative to tau.
    """
    if tau >= loads.sum():
        return np.flatnonzero(loads > 0).tolist()
    if tau <= 0:
        return []
    n = len(loads)
    result = milp(
        c=sizes.astype(float),
        constraints=LinearConstraint((loads / tau).reshape(1, -1), lb=1.0, ub=np.inf),
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
    )
    if result.x is None:
        raise RuntimeError(f"milp found no solution: {result.message}")
    return np.flatnonzero(result.x > 0.5).tolist()


SELECTORS: dict[str, Selector] = {"GR": greedy, "DP": dynamic, "SI": by_size, "RA": random_cells}


def migration(
    partitioning: Partitioning,
    loads: Loads,
    source: int,
    shares: Sequence[tuple[int, float]],
    select: Selector = greedy,
) -> Operation | None:
    """Return the migration of ``source``'s blocks to the targets of ``shares``, in turn, chosen by ``select``.

    Parameters
    ----------
    shares : sequence of (target, tau)
        Each target and the load (cost units) to move to it. PS2Stream's
        pair is ``[(w_l, (L(w_o) - L(w_l)) / 2)]``; the adaptive policy's
        fan-out gives each evaluator under the mean its deficit
        (:func:`fan_out_shares`). Each target's blocks are chosen among those
        no earlier target took, and what a target got beyond its share
        (a block is indivisible) comes off the shares after it.

    Returns
    -------
    Operation or None
        None when ``source`` has no loaded block, no share is positive, or
        the chosen blocks would leave it no cell. O(blocks log blocks) per
        target with :func:`greedy`.
    """
    # a text rectangle's cells move only by phase I (skpub.balancer.textsplit): its blocks are not candidates
    blocks = tuple(b for b in loads.blocks[source] if not touches_text(partitioning, b.cells))
    owned = sum((x1 - x0 + 1) * (y1 - y0 + 1) for x0, y0, x1, y1 in partitioning.boxes_of(source))
    free = np.ones(len(blocks), dtype=bool)
    costs = np.array([b.cost for b in blocks])
    sizes = np.array([b.queries for b in blocks], dtype=np.int64)
    moves: list[Move] = []
    left = sum(tau for _, tau in shares if tau > 0)
    for target, tau in shares:
        tau = min(tau, left)  # a block's overshoot for one target is taken from the next ones' shares
        if tau <= 0 or target == source or not free.any():
            continue
        index = np.flatnonzero(free)
        chosen = index[select(costs[index], sizes[index], tau)].tolist()
        left -= float(costs[chosen].sum())
        area = sum((blocks[i].cells[2] - blocks[i].cells[0] + 1) * (blocks[i].cells[3] - blocks[i].cells[1] + 1)
                   for i in chosen)  # fmt: skip
        if not chosen or area >= owned:
            break
        owned -= area
        free[chosen] = False
        moves.extend(Move(blocks[i].cells, source, target, blocks[i].cost, blocks[i].queries) for i in sorted(chosen))
    return loads.operation("migration", moves) if moves else None


def strip_migration(
    partitioning: Partitioning, loads: Loads, source: int, shares: Sequence[tuple[int, float]]
) -> Operation | None:
    """Return the migration of strips of lines of ``source``'s costliest rectangle to the targets of ``shares``.

    The grid^t blocks :func:`migration` moves are indivisible, and shifts
    move lines only to an adjacent evaluator: a hot spot condensed into one
    grid^t block whose neighbours are hot too (Tornado 5.4's shift) could
    move nowhere. Here the rectangle's lines (whole columns or whole rows)
    move, as in a shift, but to any evaluator, as in a migration. From one
    edge, the first target takes the most lines whose cost stays within its
    share (Tornado's column and row aggregates, Eq. 2, give each line's cost
    exactly): water filling up to the mean, as :func:`fan_out_shares` means
    it, which an indivisible grid^t block cannot do. When not even the next
    line of cost fits the share, the target takes it only if that leaves
    the target below what the source keeps; otherwise the walk ends. The
    next target takes the lines after them; as in :func:`migration`, what a
    target got comes off the shares after it. The source keeps at least one
    line (:func:`_strip_spans`).

    Parameters
    ----------
    partitioning : Partitioning
        The partitioning in force (the rectangles and their owners).
    loads : Loads
        The summaries' view, its ``costs`` as the decision's earlier rounds leave them.
    source : int
        The evaluator giving lines.
    shares : sequence of (target, tau)
        As :func:`migration`'s (:func:`fan_out_shares`), cost units.

    Returns
    -------
    Operation or None
        A ``migration`` over the costliest of ``source``'s plain rectangles
        (not text-partitioned, with a summary) that has two lines or more:
        of the four walks (columns or rows, from either edge) the one of
        largest C_r, ties to the fewer subscriptions moved, then to the
        earlier walk. None when there is no such rectangle, no positive
        share, or no walk moves a line. O(targets x (w + h)) per walk for a
        ``w`` x ``h`` rectangle.
    """
    owners = partitioning.owners.tolist()
    boxes = partitioning.boxes.tolist()
    plain = [
        i for i, owner in enumerate(owners)
        if owner == source and partitioning.texts[i] is None and loads.rect_loads[i] is not None
        and (boxes[i][2] > boxes[i][0] or boxes[i][3] > boxes[i][1])
    ]  # fmt: skip
    shares = [(target, tau) for target, tau in shares if tau > 0 and target != source]
    if not plain or not shares:
        return None
    rect = max(plain, key=lambda i: (loads.rect_cost(i), -i))
    x0, y0, x1, y1 = boxes[rect]
    r = loads.rect_loads[rect]
    kept = float(loads.costs[source])
    targets = [(float(loads.costs[t]), tau) for t, tau in shares]
    best: Operation | None = None
    for lines, lo, columns in ((r.columns, x0, True), (r.rows, y0, False)):
        for backwards in (False, True):
            order = np.arange(len(lines))[::-1] if backwards else np.arange(len(lines))
            spans = _strip_spans(lines[order], kept, targets)
            moves = []
            for (target, _), (first, last) in zip(shares, spans, strict=False):
                a, b = sorted((int(order[first]), int(order[last])))
                cells = (lo + a, y0, lo + b, y1) if columns else (x0, lo + a, x1, lo + b)
                moves.append(Move(cells, source, target, *loads.strip(rect, cells)))
            if not moves:
                continue
            op = loads.operation("migration", moves)
            if best is None or (op.c_r, -op.c_t) > (best.c_r, -best.c_t):
                best = op
    return best


def _strip_spans(lines: np.ndarray, kept: float, targets: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """Return each target's run of lines ``(first, last)``, in walk order, for :func:`strip_migration`.

    ``lines`` (shape (n,), float64, not negative) are the line costs in
    walk order, ``kept`` the source's cost, ``targets`` each target's
    ``(cost, share)`` in turn. A target takes the most lines whose cost
    stays within its share, without lines of no cost at the end; when not
    even the next line of cost fits, it takes the lines up to that one only
    if that leaves it below what the source keeps, else the walk ends.
    Every run carries cost; the last line always stays with the source.
    O(targets x n).
    """
    cumulative = np.cumsum(lines)
    spans: list[tuple[int, int]] = []
    taken, left = 0, sum(tau for _, tau in targets)
    for cost, tau in targets:
        available = len(lines) - 1 - taken
        tau = min(tau, left)
        if available <= 0 or tau <= 0:
            break
        reach = cumulative[taken : taken + available] - (cumulative[taken - 1] if taken else 0.0)
        k = int(np.searchsorted(reach, tau, side="right"))  # the most lines within the share
        if k == 0 or reach[k - 1] <= 0:  # no line of cost fits: the first one, if the target stays below the source
            j = int(np.searchsorted(reach, 0.0, side="right"))
            if j == len(reach) or not cost + reach[j] < kept - reach[j]:
                break
            k = j + 1
        k = int(np.searchsorted(reach, reach[k - 1], side="left")) + 1  # no lines of no cost after the last of cost
        spans.append((taken, taken + k - 1))
        taken, left, kept = taken + k, left - float(reach[k - 1]), kept - float(reach[k - 1])
    return spans


def pair_shares(loads: Loads, source: int, target: int) -> list[tuple[int, float]]:
    """PS2Stream's pair: ``target`` takes tau = half the cost gap (none when ``source`` is not the costlier)."""
    return [(target, (loads.costs[source] - loads.costs[target]) / 2)]


def fan_out_shares(costs: np.ndarray, source: int, free: Sequence[int]) -> list[tuple[int, float]]:
    """Return the shares of a fan-out migration from ``source`` to the ``free`` evaluators under the mean.

    Water filling: the least loaded first, each taking its deficit (mean
    less its cost) until ``source``'s excess over the mean is spent. With
    one evaluator under the mean and two evaluators, this is PS2Stream's
    tau = half the gap; with a hot spot on one evaluator of many it spreads
    the hot spot in one operation instead of halving it per operation.
    """
    mean = float(np.mean(costs))
    excess = float(costs[source]) - mean
    out = []
    for target in sorted(free, key=lambda e: (costs[e], e)):
        if excess <= 0 or costs[target] >= mean or target == source:
            break
        share = min(excess, mean - float(costs[target]))
        out.append((target, share))
        excess -= share
    return out
