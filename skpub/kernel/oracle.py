"""The brute-force oracle: a direct replay of ``docs/SEMANTICS.md``.

Every engine's output must equal :func:`replay`. It shares nothing with
the engines but the :class:`~skpub.kernel.config.Deployment` and its
:class:`~skpub.kernel.geometry.Rect` (a closed rectangle test): records,
validation, ids, terms, expressions and idf are its own reading of sections
1 and 2 (:mod:`skpub.kernel.oracle_records`, kept apart from the engines'
parser by an import-linter contract), so a bug in the engines' parsing,
registry or text code cannot pass a differential test. Everything is
recomputed from scratch with no index and no routing:

- range (section 3.1): every active subscription is tested against every
  arriving object;
- topk and knn (sections 3.2, 3.3, 4): after every accepted record, each
  active subscription's result is recomputed from the whole window and
  compared with the previous one; the difference is its ``exit`` and
  ``enter`` events (section 5). A snapshot lists the current results.

Cost O(records x active ranked subscriptions x window); meant for tests
and small replays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from skpub.kernel.config import Deployment
from skpub.kernel.oracle_records import (
    Idf,
    IdLedger,
    KnnSubscription,
    ObjectRecord,
    RangeSubscription,
    Rejection,
    Snapshot,
    TopkSubscription,
    Unsubscribe,
    dead_letter,
    line_bytes,
    load_idf,
    read_record,
)

TOLERANCE = 1e-9
"""Scores and distances closer than this are ties, ordered by the tie-breakers (SEMANTICS section 5)."""


@dataclass
class OracleResult:
    """Deliveries, snapshots and dead letters as the output dictionaries of SEMANTICS section 5.

    ``delivered_after[i]`` is how many deliveries lines ``0..i`` made: the
    deliveries of lines ``a..b`` (a micro-batch) are
    ``deliveries[delivered_after[a - 1]:delivered_after[b]]`` (0 for ``a = 0``),
    so a test compares results at batch boundaries.
    """

    deliveries: list[dict] = field(default_factory=list)
    dead_letters: list[dict] = field(default_factory=list)
    snapshots: list[dict] = field(default_factory=list)
    delivered_after: list[int] = field(default_factory=list)


@dataclass
class _Arrival:
    """An accepted object with what the window needs: its stream position, ts (the watermark when absent), number.

    ``number`` counts accepted objects from 0 (count windows); ``unit`` is its
    unit tf-idf vector, computed once when a topk subscription first scores it.
    """

    record: ObjectRecord
    pos: int
    ts: float
    number: int
    unit: dict[str, float] | None = None


class _Window:
    """The deployment window of SEMANTICS section 4, kept as every accepted object (brute force).

    An object without ``ts`` takes the watermark at its arrival (0 before any
    ``ts``): "ingestion time" on the stream's own clock, so replays are
    deterministic (skpub decision, docs/SEMANTICS.md).
    """

    def __init__(self, deployment: Deployment) -> None:
        self.kind, self.size = deployment.window.kind, deployment.window.size
        self.arrivals: list[_Arrival] = []
        self.accepted = 0
        self.watermark: float | None = None

    def add(self, obj: ObjectRecord, pos: int) -> None:
        ts = obj.ts if obj.ts is not None else (self.watermark if self.watermark is not None else 0.0)
        self.arrivals.append(_Arrival(obj, pos, ts, self.accepted))
        self.accepted += 1
        self.watermark = ts if self.watermark is None else max(self.watermark, ts)

    def holds(self, arrival: _Arrival) -> bool:
        """Whether ``arrival`` is in the window now."""
        obj, watermark = arrival.record, self.watermark
        if obj.expires_at is not None and watermark is not None and watermark >= obj.expires_at:
            return False
        if self.kind == "count":
            return arrival.number >= self.accepted - self.size
        if self.kind == "seconds":
            return arrival.ts > watermark - self.size
        return True

    def members(self, earliest: int | None) -> list[_Arrival]:
        """Return the objects in the window now, and forget the others for good.

        An object that has left never comes back (the count and the watermark
        only grow). With window ``none`` an object older than ``earliest``
        (the oldest active ranked subscription's position; None: there is
        none) can enter no result, now or later.
        """
        if self.kind == "none":
            self.arrivals = [a for a in self.arrivals if earliest is not None and a.pos > earliest]
        self.arrivals = [a for a in self.arrivals if self.holds(a)]
        return self.arrivals


def _unit(weights: dict[str, float], idf: Callable[[str], float]) -> dict[str, float]:
    """Return the unit vector of ``weight(t) * idf(t)``, finite weights of any size (a zero vector: empty).

    When the largest weight, then the largest product with its idf, is
    1e60 or more or 1e-60 or less (but not 0), every value is divided by it
    first: no product may overflow or lose a subnormal's precision, and no
    square may underflow.
    """

    def tamed(values: dict[str, float]) -> dict[str, float]:
        top = max(map(abs, values.values()), default=0.0)
        return {t: v / top for t, v in values.items()} if top >= 1e60 or 0 < top <= 1e-60 else values

    vector = tamed({t: w * idf(t) for t, w in tamed(weights).items()})
    norm = math.sqrt(sum(w * w for w in vector.values()))
    return {t: w / norm for t, w in vector.items()} if norm > 0 else {}


def _ranked(scored: list[tuple[float, float, int, str]], descending: bool, k: int) -> list[tuple[str, float, int]]:
    """Return the first ``k`` of ``(value, ts, pos, id)`` rows by value, ties within the tolerance by (ts, pos) desc.

    Rows are sorted by exact value; a run of rows whose neighbours differ by
    at most the tolerance is one tie group, ordered by the tie-breakers.
    """
    rows = sorted(scored, key=lambda r: -r[0] if descending else r[0])
    out: list[tuple[float, float, int, str]] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or abs(rows[i][0] - rows[i - 1][0]) > TOLERANCE:
            out.extend(sorted(rows[start:i], key=lambda r: (-r[1], -r[2])))
            start = i
            if len(out) >= k:
                break
    return [(oid, value, pos) for value, _, pos, oid in out[:k]]


@dataclass
class _Ranked:
    """An active topk or knn subscription and its current result ``[(object id, score or dist, position)]``.

    ``pos`` is its stream position, ``weights`` a topk subscription's unit
    tf-idf vector, ``keywords`` the terms a candidate must share with it
    (section 3.2).
    """

    sub: TopkSubscription | KnnSubscription
    pos: int
    weights: dict[str, float]
    keywords: frozenset[str]
    result: list[tuple[str, float, int]] = field(default_factory=list)

    @property
    def field_name(self) -> str:
        return "score" if isinstance(self.sub, TopkSubscription) else "dist"

    def candidate(self, arrival: _Arrival, window_none: bool) -> bool:
        """Whether a window object may enter this subscription's result (sections 3.2-4)."""
        sub, terms = self.sub, arrival.record.term_set
        after = arrival.pos > self.pos
        if window_none and not after:
            return False
        if isinstance(sub, TopkSubscription):
            return not terms.isdisjoint(self.keywords)
        if sub.origin == "registration" and not after:
            return False
        return sub.keywords <= terms if sub.match == "all" else not sub.keywords.isdisjoint(terms)

    def recompute(
        self, members: list[_Arrival], window_none: bool, idf: Idf, max_dist: float
    ) -> list[tuple[str, float, int]]:
        sub, rows = self.sub, []
        for arrival in members:
            if not self.candidate(arrival, window_none):
                continue
            obj = arrival.record
            dist = math.hypot(obj.x - sub.x, obj.y - sub.y)
            if isinstance(sub, KnnSubscription):
                rows.append((dist, arrival.ts, arrival.pos, obj.id))
                continue
            if arrival.unit is None:
                tf: dict[str, float] = {}
                for t in obj.terms:
                    tf[t] = tf.get(t, 0.0) + 1.0
                arrival.unit = _unit(tf, idf)
            w_o = arrival.unit
            cosine = sum(w * w_o.get(t, 0.0) for t, w in self.weights.items())
            proximity = 1.0 - dist / max_dist if max_dist > 0 else 1.0
            rows.append((sub.alpha * proximity + (1 - sub.alpha) * cosine, arrival.ts, arrival.pos, obj.id))
        return _ranked(rows, isinstance(sub, TopkSubscription), sub.k)


def replay(lines: Iterable[bytes | str], deployment: Deployment) -> OracleResult:
    """Replay a stream of input lines and return exactly what SEMANTICS says it delivers.

    Parameters
    ----------
    lines : iterable of bytes or str
        Records without terminators, as bytes (as read) or str (taken as
        their UTF-8 encoding).
    deployment : Deployment
        Space, window, limits and the vocabulary (idf) of the run.

    Returns
    -------
    OracleResult
        Deliveries in stream order (per record: range matches, then each
        topk/knn subscription's exits then enters, subscriptions in
        registration order), with ``delivered_after`` one per line; snapshots in
        stream order.
    """
    result = OracleResult()
    ids = IdLedger(deployment.object_id_horizon)
    idf = load_idf(deployment.vocabulary)
    space = deployment.space
    max_dist = math.hypot(space.width, space.height)
    ranges: dict[str, RangeSubscription] = {}
    active: dict[str, _Ranked] = {}
    window = _Window(deployment)
    for pos, line in enumerate(lines):
        raw = line_bytes(line)
        record = read_record(raw, space, deployment.max_record_bytes)
        rejection = record if isinstance(record, Rejection) else ids.rejection(record)
        if rejection is not None:
            result.dead_letters.append(dead_letter(raw, rejection))
            result.delivered_after.append(len(result.deliveries))
            continue
        ids.accept(record)
        if isinstance(record, ObjectRecord):
            window.add(record, pos)
            result.deliveries.extend(
                {"sub": sid, "obj": record.id, "event": "match"} for sid, sub in ranges.items() if sub.matches(record)
            )
        elif isinstance(record, RangeSubscription):
            ranges[record.id] = record
        elif isinstance(record, TopkSubscription | KnnSubscription):
            # Terms in sorted order: the summation order of the norm and the cosine, as before the split.
            weights = dict(sorted(record.weights.items())) if isinstance(record, TopkSubscription) else {}
            unit = _unit(weights, idf)
            active[record.id] = _Ranked(record, pos, unit, frozenset(weights))
        elif isinstance(record, Unsubscribe):
            if ranges.pop(record.id, None) is None:
                del active[record.id]
        members = window.members(min((sub.pos for sub in active.values()), default=None))
        for sub in active.values():
            now = sub.recompute(members, window.kind == "none", idf, max_dist)
            result.deliveries.extend(_events(sub, now))
            sub.result = now
        if isinstance(record, Snapshot):
            result.snapshots.extend(
                {"snapshot": record.id, "sub": sid, "results": [[oid, v] for oid, v, _ in sub.result]}
                for sid, sub in active.items()
            )
        result.delivered_after.append(len(result.deliveries))
    return result


def _events(sub: _Ranked, now: list[tuple[str, float, int]]) -> list[dict]:
    """Return the exit and enter events that turn ``sub.result`` into ``now`` (SEMANTICS section 5).

    Objects are told apart by stream position: an id may recur after the
    object-id horizon as a new object.
    """
    before, after = {pos for _, _, pos in sub.result}, {pos for _, _, pos in now}
    name, sid = sub.field_name, sub.sub.id
    exits = [{"sub": sid, "event": "exit", "obj": oid, name: v} for oid, v, pos in sub.result if pos not in after]
    enters = [{"sub": sid, "event": "enter", "obj": oid, name: v} for oid, v, pos in now if pos not in before]
    return exits + enters
