"""Top-k and kNN subscriptions as an evaluator sees them: one handler per kind, entries and their order.

A ranked subscription gives every window object it can see a *value*: the
score of a ``topk`` subscription (SEMANTICS 3.2, Skype Eq 1), the distance of
a ``knn`` one (SEMANTICS 3.3, DkM-SKS Definition 1), or None when the object
is not a candidate. Inside skpub values are turned into a *goodness* ``g``
(the score, or minus the distance), so that every buffer, bound and merge
reads "higher is better" whatever the kind.

The order of a result is SEMANTICS 3.2/3.3 with the skpub tie rule
(docs/SEMANTICS.md): entries sorted by ``g``, neighbours within
:data:`TOLERANCE` chain into one tie group, a group is ordered by (ts desc,
position desc). Because groups chain, the order of a set is not the order of
its subsets: :func:`rank` also returns the *floor* of the group that holds the
k-th entry, which the buffers (:mod:`skpub.evaluators.skyband`) and the merge
(:mod:`skpub.evaluators.merge`) use to prove that what they left out cannot
change the first k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from skpub.kernel.records import KnnSubscription, TopkSubscription
from skpub.kernel.text import Vocabulary

TOLERANCE = 1e-9
"""Values closer than this are ties (SEMANTICS section 5)."""


@dataclass(slots=True)
class WindowObject:
    """An accepted object of an evaluator's window store, as a subscription scores it.

    The store keeps its objects as columns (:mod:`skpub.evaluators.window`)
    and builds this view of one only to score it (a bounded number are
    cached, with their tf-idf vectors).

    ``ts`` is the object's time (the watermark at its arrival when it had
    none, as the sequencer stamps it; seconds), ``expires_at`` +inf when it
    has none, ``number`` its 0-based number among accepted objects and
    ``block`` the state block of its cell. ``unit`` is its unit tf-idf
    vector, computed once, when a topk subscription first scores it.
    """

    pos: int
    id: str
    x: float
    y: float
    terms: tuple[str, ...]
    term_set: frozenset[str]
    ts: float
    expires_at: float
    number: int
    block: int
    unit: dict[str, float] | None = None


@dataclass(slots=True)
class Entry:
    """One object in one subscription's buffer: its goodness, reported value and tie-breakers."""

    g: float
    value: float
    ts: float
    pos: int
    id: str
    expires_at: float


PLAIN_WEIGHTS = (1e-60, 1e60)
"""Largest absolute value strictly between these: products with an idf and squares are normal floats as they are."""


def _within(values: dict[str, float]) -> dict[str, float]:
    """Return ``values``, divided by the largest absolute one when that lies outside :data:`PLAIN_WEIGHTS`."""
    top = max((abs(v) for v in values.values()), default=0.0)
    if top and not PLAIN_WEIGHTS[0] < top < PLAIN_WEIGHTS[1]:
        return {t: v / top for t, v in values.items()}
    return values


def weighted_unit(weights: Iterable[tuple[str, float]], idf: Callable[[str], float]) -> dict[str, float]:
    """Return the unit vector of ``weight(t) * idf(t)`` (SEMANTICS 3.2: ``w_s`` and ``w_o``); a zero vector: empty.

    Finite weights of any size: the weights, then their products with the
    idf, are divided by their largest absolute value whenever it lies
    outside :data:`PLAIN_WEIGHTS` (5e-324, 1e200; or an idf of 0 beside a
    weight of 1e-160), so that no product overflows to infinity or loses a
    subnormal's precision and no square underflows (either made a nonzero
    vector empty, or skewed it). The direction, all that the unit vector
    keeps, is the same; ordinary weights are not divided and keep every
    bit. O(terms).
    """
    vector = _within({t: w * idf(t) for t, w in _within(dict(weights)).items()})
    norm = math.sqrt(sum(w * w for w in vector.values()))
    return {t: w / norm for t, w in vector.items()} if norm > 0 else {}


def object_unit(obj: WindowObject, vocabulary: Vocabulary) -> dict[str, float]:
    """Return (and cache) the object's unit tf-idf vector ``w_o(t) = tf(t, o) * idf(t)`` (SEMANTICS 3.2)."""
    if obj.unit is None:
        tf: dict[str, float] = {}
        for t in obj.terms:
            tf[t] = tf.get(t, 0.0) + 1.0
        obj.unit = weighted_unit(tf.items(), vocabulary.idf)
    return obj.unit


@dataclass
class TopkHandler:
    """A ``topk`` subscription: score = alpha * (1 - dist / MaxDist) + (1 - alpha) * cosine (Skype Eq 1).

    ``weights`` is its unit tf-idf vector (``weight(t) * idf(t)``, normalized)
    and ``keywords`` the terms a candidate must share with it.
    """

    sub: TopkSubscription
    weights: dict[str, float]
    keywords: frozenset[str]
    max_dist: float
    vocabulary: Vocabulary
    window_none: bool
    field_name: str = field(default="score", init=False)
    needs_all: bool = field(default=False, init=False)

    @classmethod
    def of(cls, sub: TopkSubscription, vocabulary: Vocabulary, max_dist: float, window_none: bool) -> TopkHandler:
        """Build the handler of ``sub``."""
        weights = weighted_unit(sub.weights, vocabulary.idf)
        return cls(sub, weights, sub.keywords, max_dist, vocabulary, window_none)

    def goodness(self, obj: WindowObject) -> tuple[float, float] | None:
        """Return ``(g, score)`` of ``obj``, or None when it shares no term (or, window none, came before)."""
        if obj.term_set.isdisjoint(self.keywords) or (self.window_none and obj.pos < self.sub.pos):
            return None
        sub = self.sub
        unit = object_unit(obj, self.vocabulary)
        cosine = sum(w * unit.get(t, 0.0) for t, w in self.weights.items())
        proximity = 1.0 - math.hypot(obj.x - sub.x, obj.y - sub.y) / self.max_dist if self.max_dist > 0 else 1.0
        score = sub.alpha * proximity + (1 - sub.alpha) * cosine
        return score, score


@dataclass
class KnnHandler:
    """A boolean ``knn`` subscription: candidates meet the keyword predicate, ranked by distance (CkQST 3.1)."""

    sub: KnnSubscription
    keywords: frozenset[str]
    window_none: bool
    needs_all: bool
    field_name: str = field(default="dist", init=False)

    @classmethod
    def of(cls, sub: KnnSubscription, window_none: bool) -> KnnHandler:
        """Build the handler of ``sub``; ``from: registration`` behaves as window none does."""
        return cls(sub, sub.keywords, window_none or sub.from_ == "registration", sub.match == "all")

    def goodness(self, obj: WindowObject) -> tuple[float, float] | None:
        """Return ``(-dist, dist)`` of ``obj``, or None when it fails the predicate or came before (if it must not)."""
        sub = self.sub
        if self.window_none and obj.pos < sub.pos:
            return None
        if not (sub.keywords <= obj.term_set if self.needs_all else not sub.keywords.isdisjoint(obj.term_set)):
            return None
        dist = math.hypot(obj.x - sub.x, obj.y - sub.y)
        return -dist, dist


Handler = TopkHandler | KnnHandler
"""A ranked subscription's handler: ``keywords`` are the terms a candidate shares with it, and
``needs_all`` says that a candidate holds every one of them (knn ``all``)."""


def handler_of(
    sub: TopkSubscription | KnnSubscription, vocabulary: Vocabulary, max_dist: float, window_none: bool
) -> Handler:
    """Return the handler of a ranked subscription: the one place that tells the kinds apart."""
    if isinstance(sub, TopkSubscription):
        return TopkHandler.of(sub, vocabulary, max_dist, window_none)
    return KnnHandler.of(sub, window_none)


def rank(entries: list[Entry], k: int) -> tuple[list[Entry], float]:
    """Return the tie groups that make the first ``k`` entries, in result order, and the floor of the last one.

    Parameters
    ----------
    entries : list of Entry
        Any set of entries (distinct positions).
    k : int
        The result size, at least 1.

    Returns
    -------
    (head, floor)
        ``head`` holds every entry of the tie groups up to and including the
        one that holds the k-th entry (all entries when there are fewer), in
        result order: sorted by ``g`` descending, neighbours within
        :data:`TOLERANCE` chained into groups, each group by (ts, pos)
        descending (docs/SEMANTICS.md, ties); the result is ``head[:k]``.
        ``floor`` is the lowest ``g`` of the last group in ``head`` (-inf for
        no entries). O(n log n).
    """
    rows = sorted(entries, key=lambda e: -e.g)
    head: list[Entry] = []
    floor = -math.inf
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i - 1].g - rows[i].g > TOLERANCE:
            group = rows[start:i]
            group.sort(key=lambda e: (e.ts, e.pos), reverse=True)
            head.extend(group)
            floor = rows[i - 1].g
            start = i
            if len(head) >= k:
                break
    return head, floor
