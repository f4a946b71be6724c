"""The merge stage of ranked results: keyed by subscription, it turns local results into exact global ones.

Every evaluator holds every topk and knn subscription over the objects it
owns and reports, at each mark, the subscriptions whose local result
changed (:class:`~skpub.kernel.messages.RankedUpdate`). The merge keeps the
last report of each (subscription, evaluator) and, per mark, computes the
global result of every subscription reported, diffs it against the result
at the previous mark and writes the ``exit`` then ``enter`` events of that
net change (docs/SEMANTICS.md section 5, skpub's decision: inside a batch,
not in the order of the records that caused them); at a snapshot mark it
writes one line per active subscription.

Exactness (DESIGN "Top-k and kNN across evaluators", point 4): each report
holds every local candidate within the band of the local k-th group's floor
and a ``bound`` above the goodness of every local candidate it left out. The
global first k computed from the union equal those of all candidates when
the floor of the global k-th tie group, less the tie tolerance, is above
every bound: then every object that could join or bridge that group, or
rank above it, was reported. A report that fails this check (a chain of
near ties longer than the band across evaluators) is counted in
``unproven``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from skpub.evaluators.ranked import TOLERANCE, Entry, rank
from skpub.kernel.messages import RankedUpdate

Result = list[tuple[str, float, int]]
"""A result: ``(object id, score or distance, position)`` in result order."""


@dataclass
class _Merged:
    """One subscription at the merge: its evaluators' last reports and its last result."""

    sub_pos: int
    k: int
    field_name: str
    reports: dict[int, tuple[tuple, float]] = field(default_factory=dict)
    result: Result = field(default_factory=list)


class RankedMerge:
    """The global results of the ranked subscriptions, fed by the evaluators' reports.

    Memory O(subscriptions x evaluators x reported entries).
    """

    def __init__(self) -> None:
        self.subscriptions: dict[str, _Merged] = {}
        self.unproven = 0
        self.changed: set[str] = set()

    def apply(self, marks: Iterable[tuple[int, str]], updates: Iterable[RankedUpdate]) -> tuple[list[dict], list[dict]]:
        """Apply one micro-batch's reports, mark by mark; return its events and snapshot lines.

        Parameters
        ----------
        marks : iterable of (position, snapshot id)
            The batch's marks in stream order; id ``""`` is the batch's end.
        updates : iterable of RankedUpdate
            Every evaluator's reports of the batch (any order); a report at
            position p belongs to the first mark at or after p.

        Returns
        -------
        (events, snapshots)
            Event dictionaries (SEMANTICS section 5), per subscription mark
            by mark, each mark's net change (exits, then enters: the decision
            in docs/SEMANTICS.md section 5), and snapshot lines in stream order (subscriptions
            by registration). O(reported entries x log) per mark.
        """
        pending = sorted(updates, key=lambda u: (u.pos, u.sub_pos, u.evaluator))
        events: list[dict] = []
        snapshots: list[dict] = []
        i = 0
        for pos, snapshot in marks:
            touched: dict[str, bool] = {}
            while i < len(pending) and pending[i].pos <= pos:
                update = pending[i]
                merged = self.subscriptions.get(update.sub)
                if merged is None:
                    merged = self.subscriptions[update.sub] = _Merged(update.sub_pos, update.k, update.field_name)
                merged.reports[update.evaluator] = (update.entries, update.bound)
                touched[update.sub] = touched.get(update.sub, False) or update.ended
                i += 1
            for sid in sorted(touched, key=lambda s: self.subscriptions[s].sub_pos):
                merged = self.subscriptions[sid]
                now = self._result(merged)
                events.extend(_events(sid, merged, now))
                if now != merged.result or not merged.result:
                    self.changed.add(sid)
                merged.result = now
                if touched[sid]:
                    del self.subscriptions[sid]
                    self.changed.add(sid)
            if snapshot:
                snapshots.extend(
                    {"snapshot": snapshot, "sub": sid, "results": [[oid, v] for oid, v, _ in m.result]}
                    for sid, m in sorted(self.subscriptions.items(), key=lambda item: item[1].sub_pos)
                )
        return events, snapshots

    def _result(self, merged: _Merged) -> Result:
        """Return the global first k of one subscription from its evaluators' reports."""
        entries = [
            Entry(g, value, ts, pos, oid, math.inf)
            for rows, _ in merged.reports.values()
            for oid, value, g, ts, pos in rows
        ]
        head, floor = rank(entries, merged.k)
        bound = max((b for _, b in merged.reports.values()), default=-math.inf)
        if bound > -math.inf and not (len(head) >= merged.k and floor - TOLERANCE > bound):
            self.unproven += 1
        return [(e.id, e.value, e.pos) for e in head[: merged.k]]


def _events(sid: str, merged: _Merged, now: Result) -> list[dict]:
    """Return the ``exit`` events then the ``enter`` events that turn the last result into ``now``.

    Objects are told apart by position (an id may recur after the object-id horizon).
    """
    before, after = {pos for _, _, pos in merged.result}, {pos for _, _, pos in now}
    name = merged.field_name
    exits = [{"sub": sid, "event": "exit", "obj": oid, name: v} for oid, v, pos in merged.result if pos not in after]
    enters = [{"sub": sid, "event": "enter", "obj": oid, name: v} for oid, v, pos in now if pos not in before]
    return exits + enters


def _result_json(merged: _Merged) -> list:
    return [merged.sub_pos, merged.k, merged.field_name, [list(row) for row in merged.result]]


def _merged_from_json(raw: list) -> _Merged:
    sub_pos, k, field_name, result = raw
    if type(sub_pos) is not int or type(k) is not int or field_name not in ("score", "dist"):
        raise TypeError("a merged subscription is [position, k, 'score' or 'dist', result]")
    rows = [(str(oid), float(value), int(pos)) for oid, value, pos in result]
    return _Merged(sub_pos, k, field_name, result=rows)


def take_changes(merge: RankedMerge) -> dict[str, list | None]:
    """Return the results changed since the last call (None: the subscription ended), as JSON values.

    The merge's durable state is its results: the reports are rebuilt by the
    evaluators, which report anew to a new merge (each subscription's home
    evaluator always, the others their non-empty results; an evaluator not
    heard from counts as empty).
    """
    out = {sid: _result_json(merge.subscriptions[sid]) if sid in merge.subscriptions else None for sid in merge.changed}
    merge.changed = set()
    return out


def results_json(merge: RankedMerge) -> dict[str, list]:
    """Return every result as a JSON value (the merge's base: its whole durable state)."""
    return {sid: _result_json(m) for sid, m in merge.subscriptions.items()}


def apply_changes(merge: RankedMerge, changes: dict) -> None:
    """Apply :func:`results_json` or :func:`take_changes` output to ``merge``.

    Raises
    ------
    ValueError
        If ``changes`` is not of that shape (damaged state).
    """
    try:
        for sid, raw in changes.items():
            if raw is None:
                merge.subscriptions.pop(sid, None)
            else:
                merge.subscriptions[sid] = _merged_from_json(raw)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"damaged merge state: {exc}") from None


def encode_updates(updates: list[RankedUpdate]) -> bytes:
    """Serialize ranked reports for the driver: a JSON array of their fields (the bound as null for -inf)."""
    return orjson.dumps(
        [
            [
                u.pos,
                u.sub,
                u.sub_pos,
                u.evaluator,
                u.k,
                u.field_name,
                u.entries,
                None if u.bound == -math.inf else u.bound,
                u.ended,
            ]
            for u in updates
        ]
    )


def decode_updates(data: bytes) -> list[RankedUpdate]:
    """Rebuild the reports of :func:`encode_updates` (data from this run's own evaluators)."""
    out = []
    for pos, sub, sub_pos, evaluator, k, field_name, entries, bound, ended in orjson.loads(data):
        rows = tuple((oid, value, g, ts, p) for oid, value, g, ts, p in entries)
        out.append(
            RankedUpdate(
                pos, sub, sub_pos, evaluator, k, field_name, rows, -math.inf if bound is None else bound, ended
            )
        )
    return out
