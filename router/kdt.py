"""PS2Stream's hybrid partitioning: the kd^t-tree (ICDE 2017, section IV-B, Algorithm 1).

Space partitioning replicates subscriptions with large ranges over many
evaluators; text partitioning replicates objects whose terms many
subscriptions share. The kd^t-tree picks per region (Figure 2):

1. **Phase one** (lines 1-12): from the root, a node whose objects and
   subscriptions are textually similar (cosine of their key counts at least
   ``delta``) goes to ``N_s``; otherwise it is split like a kd-tree node, at
   the objects' median on the axis whose halves are least similar, unless
   that similarity barely changes (within ``epsilon``): then the node is
   consistent and goes to ``N_t`` (text partitioning only).
2. **ComputeNumberPartitions** (lines 13-16), when there are fewer nodes than
   evaluators: a dynamic program over ``L[i, j] = min_k L[i-1, j-k] + C[i, k]``
   gives each node its number of parts so that the total load is least;
   **PartitionNode** cuts an ``N_t`` node by text and an ``N_s`` node by text
   or space, whichever loads less.
3. **MergeNodesIntoPartitions** (lines 17-27): leaves, heaviest first, go to
   an evaluator holding a sibling (another term group of the same region) if
   that does not raise the largest load, else to the least loaded one; while
   the largest load is more than ``sigma`` times the smallest and there are
   fewer than ``theta`` leaves, the heaviest leaf is cut in two and the merge
   redone.
4. **Text alone where it loads less** (ours): the result gives way to
   the metric-based text partitioning (:mod:`skpub.router.textpart`, the
   ``text`` router: the same ``m`` key groups over the whole space, its
   primaries spread by space) when the whole space cut by text into ``m``
   groups has a lower total load (every evaluator's Definition 1, each
   object and subscription it handles counted once) and a largest load no
   higher: the choice PartitionNode makes for a node, made once more for
   the root. A result that is itself the whole space cut by text (phase
   one stopped at the root) is laid out the same way
   (:func:`~skpub.router.textpart.spread_by_space`), so that the window
   objects do not all go to one primary. On a small sample, phase one's
   similarities fall as nodes shrink, so a region whose ranges are large
   and keywords selective (PS2Stream's Q2) can end as many small N_t nodes;
   with as many nodes as evaluators, none is cut by text, and the result is
   a space partitioning that files each large range at several evaluators.

Loads are Definition 1 (:mod:`skpub.router.workload`). The result is a
:class:`~skpub.router.partitioning.Partitioning`: a space leaf is a
rectangle of one evaluator, a region cut by text one rectangle whose
:class:`~skpub.router.gridt.TermTable` assigns each key of the sample to the
evaluator of its group (grid^t, section IV-C: the grid is the fine grid,
each cell pointing to its rectangle's table).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from skpub.kernel.grid import CellBox
from skpub.router.gridt import TermTable
from skpub.router.kdtree import kdtree_partitioning, median_cut
from skpub.router.partitioning import Partitioning
from skpub.router.sample import KeyedSample
from skpub.router.textpart import spread_by_space
from skpub.router.workload import LoadModel, cosine, group_terms, space_load, term_weights


@dataclass(frozen=True)
class KdtSettings:
    """Algorithm 1's thresholds.

    ``delta``: text similarity at or above which a node is left to the
    space-or-text choice (N_s): 0.7 on GeoNames, where one frequent term
    weighs heavily in the cosine (the whole space of the Q3 scenario scores
    0.70; with 0.3 phase one never splits it); ``epsilon``: a split that changes the
    similarity by less leaves the node whole (N_t); ``sigma``: the balance
    constraint L_max / L_min; ``theta``: most leaves per evaluator;
    ``min_objects``: phase one does not split a node with fewer sample
    objects (keyed ones) than this.
    """

    delta: float = 0.7
    epsilon: float = 0.02
    sigma: float = 1.3
    theta: int = 8
    min_objects: int = 200
    model: LoadModel = field(default_factory=LoadModel)


@dataclass(frozen=True)
class Leaf:
    """One unit MergeNodesIntoPartitions places: a region, whole (``terms`` None) or one term group of it.

    ``objects`` and ``subscriptions`` index the sample's: those the unit
    handles (a term group's: those its keys reach). ``load`` is Definition 1
    over them: their candidate pairs, plus ``c2`` per object and ``c3`` per
    subscription.
    """

    box: CellBox
    objects: np.ndarray
    subscriptions: np.ndarray
    load: float
    text_only: bool = False
    terms: tuple[str, ...] | None = None


class _Builder:
    def __init__(self, sample: KeyedSample, settings: KdtSettings) -> None:
        self.sample, self.settings, self.model = sample, settings, settings.model

    def counts(self, objects: np.ndarray, subscriptions: np.ndarray) -> tuple[Counter, Counter]:
        return self.sample.term_counts(objects, subscriptions)

    def region(self, box: CellBox, objects: np.ndarray, subscriptions: np.ndarray, text_only: bool = False) -> Leaf:
        """Return the region ``box`` whole, with the objects and subscriptions (of the given ones) it holds."""
        objects = self.sample.objects_in(box, objects)
        subscriptions = self.sample.subscriptions_over(box, subscriptions)
        o, q = self.counts(objects, subscriptions)
        load = space_load(self.model, o, q, len(objects), len(subscriptions))
        return Leaf(box, objects, subscriptions, load, text_only)

    def similarity(self, leaf: Leaf) -> float:
        return cosine(*self.counts(leaf.objects, leaf.subscriptions))

    def halves(self, leaf: Leaf, axis: int) -> tuple[Leaf, Leaf] | None:
        """Cut a region at its objects' median cell on ``axis`` (0 = x), as a kd-tree does; None if one line wide."""
        x0, y0, x1, y1 = leaf.box
        lo, hi = (x0, x1) if axis == 0 else (y0, y1)
        if hi <= lo:
            return None
        coords = (self.sample.cx if axis == 0 else self.sample.cy)[leaf.objects]
        line = np.bincount(coords - lo, minlength=hi - lo + 1).astype(float)
        c = lo + median_cut(line, 0.5, 1, 1)
        boxes = ((x0, y0, c, y1), (c + 1, y0, x1, y1)) if axis == 0 else ((x0, y0, x1, c), (x0, c + 1, x1, y1))
        return tuple(self.region(b, leaf.objects, leaf.subscriptions, leaf.text_only) for b in boxes)  # type: ignore[return-value]

    def phase_one(self, root: Leaf) -> list[Leaf]:
        """Lines 1-12: the nodes of N_s (text_only False) and N_t (text_only True), in box order."""
        settings, pending, done = self.settings, [root], []
        while pending:
            node = pending.pop()
            sim = self.similarity(node)
            if sim >= settings.delta:
                done.append(node)
                continue
            small = len(node.objects) < settings.min_objects
            cuts = [] if small else [h for a in (0, 1) if (h := self.halves(node, a))]
            if not cuts:
                done.append(replace(node, text_only=True))
                continue
            alpha, children = min(((min(self.similarity(c) for c in h), h) for h in cuts), key=lambda t: t[0])
            if abs(alpha - sim) <= settings.epsilon:
                done.append(replace(node, text_only=True))
            else:
                pending.extend(children)
        return sorted(done, key=lambda leaf: (leaf.box[1], leaf.box[0]))

    def by_text(self, leaf: Leaf, k: int) -> list[Leaf] | None:
        """Cut a region's keys into ``k`` groups (None when it has fewer keys)."""
        o, q = self.counts(leaf.objects, leaf.subscriptions)
        weights = term_weights(self.model, o, q)
        if leaf.terms is not None:
            weights = {t: w for t, w in weights.items() if t in leaf.terms}
        if len(weights) < k:
            return None
        return self.groups(leaf, group_terms(weights, k), o, q)

    def groups(self, leaf: Leaf, term_groups: list[list[str]], o: Counter, q: Counter) -> list[Leaf]:
        """Return each term group of ``leaf`` as a leaf: the objects it reaches and the subscriptions filed there.

        Its load is Definition 1: its pairs, an object once however many of
        its keys the group answers for, a subscription once however many of
        its clauses' keys. O(objects x keys + subscriptions x clauses).
        """
        group_of = {t: g for g, terms in enumerate(term_groups) for t in terms}
        objects: list[list[int]] = [[] for _ in term_groups]
        for i in leaf.objects.tolist():
            for g in {group_of[t] for t in self.sample.keys[i] if t in group_of}:
                objects[g].append(i)
        subscriptions: list[list[int]] = [[] for _ in term_groups]
        for i in leaf.subscriptions.tolist():
            for g in {group_of[t] for t in self.sample.sub_keys[i] if t in group_of}:
                subscriptions[g].append(i)
        model, out = self.model, []
        for g, terms in enumerate(term_groups):
            pairs = sum(o.get(t, 0) * q[t] for t in terms)
            load = model.c1 * pairs + model.c2 * len(objects[g]) + model.c3 * len(subscriptions[g])
            reached, filed = np.array(objects[g], dtype=np.int64), np.array(subscriptions[g], dtype=np.int64)
            out.append(replace(leaf, objects=reached, subscriptions=filed, load=load, terms=tuple(terms)))
        return out

    def evaluator_loads(self, leaves: list[Leaf], owner: list[int]) -> list[float]:
        """Return each evaluator's Definition 1 over its leaves, each object and subscription it handles once.

        A subscription over two rectangles of one evaluator is filed there
        once (its parts are indexed over their union box), as is an object
        that two of its term groups reach (one row). Evaluators holding no
        leaf are left out. O(leaves x sample) with numpy.
        """
        model, out = self.model, []
        for e in sorted(set(owner)):
            held = [leaf for leaf, o in zip(leaves, owner, strict=True) if o == e]
            pairs = sum(leaf.load - model.c2 * len(leaf.objects) - model.c3 * len(leaf.subscriptions) for leaf in held)
            objects = np.unique(np.concatenate([leaf.objects for leaf in held]))
            subscriptions = np.unique(np.concatenate([leaf.subscriptions for leaf in held]))
            out.append(pairs + model.c2 * len(objects) + model.c3 * len(subscriptions))
        return out

    def text_is_better(self, by_text: list[Leaf], leaves: list[Leaf], owner: list[int]) -> bool:
        """Whether the root's term groups ``by_text``, one per evaluator, beat the hybrid ``leaves`` (step 4).

        Better: a total load (PS2Stream's objective, the sum of
        :meth:`evaluator_loads`) lower by more than rounding, and a largest
        evaluator load no higher (the hybrid went through the balance loop;
        the text cut must not undo it).
        """
        text = self.evaluator_loads(by_text, list(range(len(by_text))))
        hybrid = self.evaluator_loads(leaves, owner)
        return sum(text) < sum(hybrid) * (1 - 1e-9) and max(text) <= max(hybrid)

    def by_space(self, leaf: Leaf, k: int, depth: int = 0) -> list[Leaf] | None:
        """Cut a region into ``k`` kd-tree leaves (None when it has fewer cells)."""
        if k == 1:
            return [leaf]
        x0, y0, x1, y1 = leaf.box
        if (x1 - x0 + 1) * (y1 - y0 + 1) < k:
            return None
        for axis in (depth % 2, 1 - depth % 2):
            halves = self.halves(leaf, axis)
            if halves is None:
                continue
            low, high = self.by_space(halves[0], k // 2, depth + 1), self.by_space(halves[1], k - k // 2, depth + 1)
            if low is not None and high is not None:
                return low + high
        return None

    def partition_node(self, leaf: Leaf, k: int) -> list[Leaf] | None:
        """PartitionNode: N_t by text; N_s (or a space leaf) by text or space, whichever loads less in total."""
        if k == 1:
            return [leaf]
        if leaf.terms is not None or leaf.text_only:
            return self.by_text(leaf, k)
        options = [p for p in (self.by_space(leaf, k), self.by_text(leaf, k)) if p is not None]
        return min(options, key=lambda parts: sum(p.load for p in parts)) if options else None

    def number_of_parts(self, nodes: list[Leaf], m: int) -> list[int]:
        """ComputeNumberPartitions: each node's number of parts, summing to ``m``, least total load (a DP)."""
        n = len(nodes)
        cost = [[math.inf] * (m + 1) for _ in range(n)]
        for i, node in enumerate(nodes):
            for k in range(1, m - n + 2):
                parts = self.partition_node(node, k)
                if parts is not None:
                    cost[i][k] = sum(p.load for p in parts)
        best = [[math.inf] * (m + 1) for _ in range(n + 1)]
        choice = [[0] * (m + 1) for _ in range(n + 1)]
        best[0][0] = 0.0
        for i in range(1, n + 1):
            for j in range(i, m + 1):
                for k in range(1, j - i + 2):
                    value = best[i - 1][j - k] + cost[i - 1][k]
                    if value < best[i][j]:
                        best[i][j], choice[i][j] = value, k
        if math.isinf(best[n][m]):
            return [1] * (n - 1) + [m - n + 1]
        parts, j = [], m
        for i in range(n, 0, -1):
            parts.append(choice[i][j])
            j -= choice[i][j]
        return parts[::-1]

    def merge(self, leaves: list[Leaf], m: int) -> tuple[list[int], list[float]]:
        """MergeNodesIntoPartitions: each leaf's evaluator and the evaluators' loads."""
        loads = [0.0] * m
        holders: dict[CellBox, set[int]] = {}
        owner = [0] * len(leaves)
        for i in sorted(range(len(leaves)), key=lambda i: (-leaves[i].load, i)):
            leaf = leaves[i]
            smallest = min(range(m), key=lambda e: (loads[e], e))
            siblings = sorted(holders.get(leaf.box, ()), key=lambda e: (loads[e], e))
            target = smallest
            if siblings and loads[siblings[0]] + leaf.load <= max(loads):
                target = siblings[0]
            owner[i] = target
            loads[target] += leaf.load
            holders.setdefault(leaf.box, set()).add(target)
        empty = [e for e in range(m) if e not in owner]
        for e in empty:  # more leaves than evaluators, yet one got none: give it the lightest leaf of a crowded one
            counts = Counter(owner)
            i = min((i for i in range(len(leaves)) if counts[owner[i]] > 1), key=lambda i: (leaves[i].load, i))
            loads[owner[i]] -= leaves[i].load
            owner[i] = e
            loads[e] += leaves[i].load
        return owner, loads

    def split_heaviest(self, leaves: list[Leaf], loads: list[float], owner: list[int]) -> list[Leaf] | None:
        """Lines 24-25: cut the heaviest leaf (of the most loaded evaluator) in two; None if none can be cut."""
        worst = max(range(len(loads)), key=lambda e: (loads[e], -e))
        for i in sorted((i for i in range(len(leaves)) if owner[i] == worst), key=lambda i: (-leaves[i].load, i)):
            parts = self.partition_node(leaves[i], 2)
            if parts is not None and len(parts) == 2:
                return leaves[:i] + parts + leaves[i + 1 :]
        return None


def kdt_partitioning(
    sample: KeyedSample, costs: np.ndarray, m: int, settings: KdtSettings | None = None
) -> Partitioning:
    """Build the kd^t-tree of Algorithm 1 over a sample and return it as a partitioning for ``m`` evaluators.

    Parameters
    ----------
    sample : KeyedSample
        The stream's head, reduced to keyed objects and range subscriptions.
    costs : ndarray, shape (size, size), float64
        The sample's per-cell cost (Tornado Eq. 1), for the fallback.
    m : int
        Evaluators, >= 1.

    Returns
    -------
    Partitioning
        Space leaves as rectangles of one evaluator; a region cut by text as
        one rectangle with a term table (primary: the evaluator of its
        heaviest group). With no keyed object or no range subscription in the
        sample there is no text to weigh, and the kd-tree baseline's
        partitioning is returned; so it is when the regions and their keys
        cannot make ``m`` parts. The ``text`` router's partitioning
        instead when the whole space cut by text loads less in total and
        no more at its most loaded evaluator (step 4 of the module's
        docstring). Cost O(nodes x m x sample) for the program,
        plus O(theta m x sample) for the balance loop and the comparison.
    """
    settings = settings or KdtSettings()
    size = costs.shape[0]
    if m == 1 or not len(sample.keys) or not len(sample.sub_keys):
        return kdtree_partitioning(costs, m)
    builder = _Builder(sample, settings)
    everything = (np.arange(len(sample.keys)), np.arange(len(sample.sub_keys)))
    root = builder.region((0, 0, size - 1, size - 1), *everything)
    nodes = builder.phase_one(root)
    counts = builder.number_of_parts(nodes, m) if len(nodes) < m else [1] * len(nodes)
    leaves = []
    for node, k in zip(nodes, counts, strict=True):
        leaves += builder.partition_node(node, k) or [node]
    if len(leaves) < m:  # too few cells and keys to give every evaluator a part: space alone
        return kdtree_partitioning(costs, m)
    owner, loads = builder.merge(leaves, m)
    while max(loads) > settings.sigma * max(min(loads), 1e-9) and len(leaves) < settings.theta * m:
        more = builder.split_heaviest(leaves, loads, owner)
        if more is None:
            break
        leaves = more
        owner, loads = builder.merge(leaves, m)
    by_text = builder.by_text(root, m)
    if by_text is not None and builder.text_is_better(by_text, leaves, owner):
        leaves, owner = by_text, list(range(m))
    part = _as_partitioning(size, leaves, owner)
    if len(part.boxes) == 1 and part.texts[0] is not None and len(part.texts[0].evaluators) == m:
        return spread_by_space(costs, m, dict(part.texts[0].assigned))  # the whole space cut by text, as `text` lays it
    return part


def _as_partitioning(size: int, leaves: list[Leaf], owner: list[int]) -> Partitioning:
    """One rectangle per region: one evaluator's, or a term table over its groups' evaluators."""
    regions: dict[CellBox, list[int]] = {}
    for i, leaf in enumerate(leaves):
        regions.setdefault(leaf.box, []).append(i)
    boxes, owners, texts = [], [], []
    for box, members in sorted(regions.items(), key=lambda item: (item[0][1], item[0][0])):
        evaluators = list(dict.fromkeys(owner[i] for i in sorted(members, key=lambda i: (-leaves[i].load, i))))
        boxes.append(box)
        owners.append(evaluators[0])
        if len(evaluators) == 1:
            texts.append(None)
        else:
            assigned = {t: owner[i] for i in members for t in leaves[i].terms or ()}
            texts.append(TermTable(tuple(evaluators), assigned))
    return Partitioning(size, np.array(boxes, dtype=np.int32), np.array(owners, dtype=np.int32), tuple(texts))
