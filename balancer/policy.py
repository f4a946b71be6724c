"""The balancer's decision at a batch boundary: which operation, if any (Tornado 4.2-4.3; PS2Stream V-A).

Modes:

- ``adaptive``: when the balance constraint is violated (max / mean cost >
  ``sigma``), weigh every candidate -- at every site where the source is the
  costlier evaluator, the best horizontal or vertical shift or the corner
  shift; the split/merge of the costliest evaluator, PS2Stream's phase I
  (text split of its costliest rectangles whose load is concentrated, text
  merge out of those it shares, into the least loaded evaluator there),
  GR's migration of grid^t blocks from the most loaded to those under the mean
  (phase II) and the same fan-out of its costliest rectangle's lines
  (:func:`~skpub.balancer.migration.strip_migration`) -- and take the one with the
  largest C_r among those whose gain over ``horizon`` batches, C_r x (1 -
  decay) x horizon, exceeds C_t (Tornado 4.2 compares one statistics
  period's C_r with C_t; a decayed cost holds about 1 / (1 - decay)
  batches). Ties go to the earlier kind in
  :data:`~skpub.balancer.operation.KINDS`, then to the earlier candidate.
  Then again on the evaluators left untouched, while the constraint is
  violated (:func:`adaptive`). Every ``global_period`` batches PS2Stream
  V-B's global adjustment (:mod:`skpub.balancer.globaladjust`) is weighed
  against that decision and taken alone when it reduces the costliest
  evaluator's cost more (:func:`with_global_adjustment`).
- ``chaos``: one legal operation drawn at random, whatever it costs, from a
  generator seeded by ``(seed, batch)``: tests see that rebalancing never
  changes a result.
- ``off``: never.

A decision is a pure function of the partitioning, the summaries (cost
units, never seconds) and the batch id, so a replayed batch decides exactly
as its first attempt.
"""

from __future__ import annotations

import numpy as np

from skpub.balancer.adjacency import adjacent_rectangles, partition_graph
from skpub.balancer.globaladjust import global_adjustment
from skpub.balancer.migration import fan_out_shares, greedy, migration, strip_migration
from skpub.balancer.operation import KINDS, Loads, Move, Operation, touches_text
from skpub.balancer.shift import best_shift, depth, shift, sites
from skpub.balancer.splitmerge import best_split_merge, split_merge
from skpub.balancer.textsplit import mergeable, phase_one, text_merge, text_split
from skpub.balancer.textsplit import splittable as text_splittable
from skpub.kernel.config import BalancerConfig
from skpub.kernel.load import LoadSummary, imbalance
from skpub.router.partitioning import Partitioning

NEGLIGIBLE = 0.01
"""An operation whose C_r is at most this share of the costliest evaluator's cost is not worth a decision.

A decision blocks the next one for a batch (the transfer in flight), so a
shift of empty lines must not take the place of one that matters.
"""


def movable(partitioning: Partitioning, op: Operation) -> bool:
    """Return whether no move of ``op`` moves cells of a text-partitioned rectangle (only phase I changes those)."""
    return not any(touches_text(partitioning, m.cells) for m in op.moves if not m.text)


def candidates(partitioning: Partitioning, loads: Loads) -> list[Operation]:
    """Return the shifts and the split/merge ``adaptive`` weighs, in :data:`KINDS` order.

    O(rectangle pairs x depth + grid). Migrations are drawn per round
    (:func:`adaptive`): their source and targets depend on the rounds before.
    """
    pairs = adjacent_rectangles(partitioning)
    out = [op for site in sites(partitioning, pairs) if (op := best_shift(partitioning, loads, site)) is not None]
    op = best_split_merge(partitioning, loads, partition_graph(partitioning, pairs))
    if op is not None:
        out.append(op)
    return out


def adaptive(partitioning: Partitioning, loads: Loads, sigma: float, gain: float = 1.0) -> list[Operation]:
    """Return the operations of one decision, in rounds, each on evaluators no earlier round touched.

    A round weighs, on the costs the earlier rounds leave: every shift and
    the split/merge of :func:`candidates` whose evaluators are all untouched,
    PS2Stream V-A's phase I for the costliest untouched evaluator (text
    splits of its costliest rectangles towards the least loaded untouched
    one, text merges into untouched ones: :func:`~skpub.balancer.textsplit.phase_one`)
    and phase II, the fan-out migration (GR's grid^t blocks, or its costliest
    rectangle's lines: :func:`~skpub.balancer.migration.strip_migration`)
    from it to the untouched ones under the mean; it takes the
    one with the largest C_r among those with ``gain`` x C_r > C_t (Tornado
    4.2; ties to the earlier kind in :data:`KINDS`, then the earlier
    candidate), and whose C_r is more than :data:`NEGLIGIBLE` of the
    costliest evaluator's cost. Rounds go on while the balance constraint is violated
    (max / mean > ``sigma``) and an operation qualifies; at most
    ``evaluators // 2`` operations. An evaluator takes part in at most one
    operation, so every move's cells are its source's before the decision
    (the hand-off's rule) and each source's hand-off belongs to one operation.

    ``gain`` turns C_r, a reduction of decayed cost, into the reduction over
    the batches the operation is expected to pay for (Tornado compares C_r
    and C_t over one statistics period: ``gain = 1``).
    """
    if partitioning.count < 2 or imbalance(loads.costs) <= sigma:
        return []
    fixed = [op for op in candidates(partitioning, loads) if movable(partitioning, op)]
    chosen: list[Operation] = []
    touched: set[int] = set()
    view = loads
    free = list(range(partitioning.count))
    while len(free) > 1 and imbalance(view.costs) > sigma:
        options = [view.operation(op.kind, list(op.moves)) for op in fixed if touched.isdisjoint(op.evaluators)]
        source = max(free, key=lambda e: (view.costs[e], -e))
        options += phase_one(partitioning, view, source, [e for e in free if e != source])
        shares = fan_out_shares(view.costs, source, free)
        fan = migration(partitioning, view, source, shares, greedy)
        if fan is not None and movable(partitioning, fan):
            options.append(fan)
        strips = strip_migration(partitioning, view, source, shares)
        if strips is not None:
            options.append(strips)
        best = None
        floor = NEGLIGIBLE * float(view.costs.max())
        for op in sorted(options, key=lambda o: KINDS.index(o.kind)):
            if op.c_r > floor and gain * op.c_r > op.c_t and (best is None or op.c_r > best.c_r):
                best = op
        if best is None:
            break
        chosen.append(best)
        touched.update(best.evaluators)
        free = [e for e in free if e not in touched]
        view = view.with_costs(np.array(best.costs_after))
    return chosen


def with_global_adjustment(
    partitioning: Partitioning, loads: Loads, local: list[Operation], sigma: float, gain: float
) -> list[Operation]:
    """Return PS2Stream V-B's global adjustment alone if it beats the local decision ``local``, else ``local``.

    Both are measured alike, by how much they lower the costliest
    evaluator's cost over all evaluators (the last local operation's costs
    after are the decision's: :func:`adaptive` weighs each round on the
    costs the earlier ones leave). The adjustment must also qualify like
    every operation: the balance constraint violated, ``gain`` x that
    reduction > C_t, and the reduction more than :data:`NEGLIGIBLE` of the
    costliest evaluator's cost.
    """
    if imbalance(loads.costs) <= sigma:
        return local
    op = global_adjustment(partitioning, loads)
    if op is None:
        return local
    top = float(loads.costs.max())
    reduction = top - max(op.costs_after)
    if gain * reduction <= op.c_t or reduction <= NEGLIGIBLE * top:
        return local
    local_reduction = top - max(local[-1].costs_after, default=top) if local else 0.0
    return [op] if reduction > local_reduction else local


def chaos(partitioning: Partitioning, loads: Loads, rng: np.random.Generator) -> Operation | None:
    """Return one legal operation drawn with ``rng``, or None when none is legal.

    Every draw is legal (:func:`movable`; :func:`~skpub.balancer.operation.apply_moves`
    refuses anything else): shifts and migrations start from rectangles
    that are not text-partitioned, split/merge only between evaluators
    owning none, and a global adjustment leaves text rectangles alone.
    A kind is drawn among the possible ones, then an instance: a text split
    of a random plain rectangle towards a random other evaluator, a text
    merge of a random text rectangle by a random one of its evaluators into
    a random other (:mod:`skpub.balancer.textsplit`); a shift site
    (a horizontal or vertical one only where the rectangle keeps a line) and
    its number of lines; a split/merge of a random rectangle at a random cut
    with a random adjacent pair of other evaluators; or a migration of a
    random strip of whole rows or columns of a random rectangle to a random
    other evaluator (never its owner's last cell); or a global adjustment
    on random block costs with the leaves given to random evaluators
    (:func:`~skpub.balancer.globaladjust.global_adjustment`; another kind
    when that moves nothing). Every one is weighed from
    the summaries like an adaptive candidate.
    """
    n = partitioning.count
    if n < 2:
        return None
    pairs = adjacent_rectangles(partitioning)
    boxes = [tuple(b) for b in partitioning.boxes.tolist()]
    owners = partitioning.owners.tolist()
    counts = np.bincount(owners, minlength=n)
    # the cells of a text-partitioned rectangle move only by text split/merge: no spatial draw starts from one
    spatial = [t is None for t in partitioning.texts]
    spatial_owners = set(range(n)) - {owners[i] for i, plain in enumerate(spatial) if not plain}
    shifts = [
        s for s in sites(partitioning, pairs) if spatial[s.a] and (s.span is not None or depth(boxes[s.a], s.side) > 1)
    ]
    splittable = [i for i, b in enumerate(boxes) if spatial[i] and (b[2] > b[0] or b[3] > b[1])]
    graph = partition_graph(partitioning, pairs) if n >= 3 else None
    edges = [(y, z) for y, z in graph.edges if {y, z} <= spatial_owners] if graph is not None else []
    strippable = [
        i for i, b in enumerate(boxes) if spatial[i] and (b[2] > b[0] or b[3] > b[1] or counts[owners[i]] > 1)
    ]
    plain = [i for i in range(len(boxes)) if text_splittable(partitioning, i)]
    merges = [(i, e) for i, t in enumerate(partitioning.texts) if t is not None for e in t.evaluators
              if mergeable(partitioning, i, e)]  # fmt: skip
    options = (
        ("shift", shifts),
        ("split_merge", splittable and edges),
        ("migration", strippable),
        ("text_split", plain),
        ("text_merge", merges),
        ("global_adjustment", True),
    )
    kinds = [k for k, some in options if some]
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "global_adjustment":
        op = global_adjustment(partitioning, loads, rng)
        if op is not None or len(kinds) == 1:
            return op
        kinds.remove(kind)  # it moved nothing: one of the other kinds
        kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "text_split":
        rect = plain[int(rng.integers(len(plain)))]
        target = int(rng.choice([e for e in range(n) if e != owners[rect]]))
        return text_split(partitioning, loads, rect, target)
    if kind == "text_merge":
        rect, source = merges[int(rng.integers(len(merges)))]
        target = int(rng.choice([e for e in partitioning.texts[rect].evaluators if e != source]))
        return text_merge(partitioning, loads, rect, source, target)
    if kind == "shift":
        site = shifts[int(rng.integers(len(shifts)))]
        lines = depth(boxes[site.a], site.side)
        return shift(partitioning, loads, site, int(rng.integers(1, lines)) if lines > 1 else 1)
    if kind == "split_merge":
        rect = splittable[int(rng.integers(len(splittable)))]
        others = [(y, z) for y, z in edges if owners[rect] not in (y, z)]
        if others:
            y, z = others[int(rng.integers(len(others)))]
            x0, y0, x1, y1 = boxes[rect]
            vertical = x1 > x0 and (y1 == y0 or rng.random() < 0.5)
            cut = int(rng.integers(x0, x1)) if vertical else int(rng.integers(y0, y1))
            halves = (
                ((x0, y0, cut, y1), (cut + 1, y0, x1, y1)) if vertical else ((x0, y0, x1, cut), (x0, cut + 1, x1, y1))
            )
            return split_merge(
                partitioning, loads, owners[rect], rect, halves, *((z, y) if rng.random() < 0.5 else (y, z))
            )
    rect = strippable[int(rng.integers(len(strippable)))]
    x0, y0, x1, y1 = boxes[rect]
    # a strip must leave the owner a cell: of one rectangle, cut along an axis with two lines or more
    axes = [axis for axis, extent in (("rows", y1 - y0), ("columns", x1 - x0)) if extent or counts[owners[rect]] > 1]
    rows = axes[int(rng.integers(len(axes)))] == "rows"
    lo, hi = (y0, y1) if rows else (x0, x1)
    while True:
        a, b = sorted(rng.integers(lo, hi + 1, 2).tolist())
        if counts[owners[rect]] > 1 or (a, b) != (lo, hi):
            break
    cells = (x0, a, x1, b) if rows else (a, y0, b, y1)
    source = owners[rect]
    target = int(rng.choice([e for e in range(n) if e != source]))
    return loads.operation("migration", [Move(cells, source, target, *loads.strip(rect, cells))])


def decide(
    settings: BalancerConfig, partitioning: Partitioning, summaries: list[LoadSummary], batch: int
) -> list[Operation]:
    """Return the operations to apply after micro-batch ``batch`` (none, one, or with ``adaptive`` several).

    Parameters
    ----------
    settings : BalancerConfig
    partitioning : Partitioning
        The partitioning in force for ``batch``.
    summaries : list of LoadSummary
        The evaluators' summaries at the end of ``batch``.
    batch : int
        The micro-batch id (seeds ``chaos`` together with ``settings.seed``).

    Returns
    -------
    list of Operation
        On disjoint evaluators; apply their moves in order with
        :func:`skpub.balancer.operation.apply_moves`.
    """
    if settings.mode == "off":
        return []
    loads = Loads(partitioning, summaries, settings.beta)
    if settings.mode == "chaos":
        op = chaos(partitioning, loads, np.random.default_rng([settings.seed, batch]))
        return [op] if op is not None else []
    gain = (1 - settings.decay) * settings.horizon
    local = adaptive(partitioning, loads, settings.sigma, gain)
    # a decision is not made while a transfer is in flight (one batch of two): two chances per period,
    # none in the first (the initial partitioning was just made from the first batch's sample)
    period = settings.global_period
    if period and batch >= period and batch % period < 2:
        return with_global_adjustment(partitioning, loads, local, settings.sigma, gain)
    return local
