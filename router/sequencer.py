"""The serial stage of routing: what depends on stream order, and nothing else.

The :class:`Sequencer` holds the routing unit's state: the id registry
(duplicate and unknown ids, the object-id horizon, the numbering of accepted
objects), the placements of active subscriptions (where each lives, so its
unsubscribe reaches the same evaluators) and the textual summaries (Tornado
section 3.1: an object is forwarded to its owner only if one of its terms is
a summary keyword there). Parsing and locating ran before, in parallel
(:mod:`skpub.router.locate`); the sequencer sees only compact columns: the
kind, id, owner evaluator and terms of every record, and the targets and
summary keywords of subscriptions. Its cost per object is a few dictionary
and set operations.

Its state changes only through :meth:`Sequencer.sequence`; the registry
(with its placements) is the durable part, and the summaries are rebuilt
from the placements when a sequencer is built from a registry.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from skpub.kernel.config import Window
from skpub.kernel.decode import clip
from skpub.kernel.grid import CellBox
from skpub.kernel.registry import IdRegistry
from skpub.kernel.transfer import Handoff, holders_after
from skpub.kernel.wire import KINDS, MARK, OBJECT, ROUTED_SCHEMA, SUBSCRIBE, UNSUBSCRIBE
from skpub.router.gridt import TermRoutes, route_objects
from skpub.router.partitioning import Partitioning
from skpub.router.summary import TextualSummaries

Targets = tuple[tuple[int, CellBox], ...]
"""A range subscription's ``(evaluator, cell box)`` pairs."""
Subscriptions = Mapping[int, tuple[Targets, frozenset[str], bool]]
"""Per ``subscribe`` item of a batch: its targets, its summary keywords, and whether it is ranked (topk or knn)."""
Clock = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Per item: objects accepted so far, the watermark, an object's time (:meth:`Sequencer.clock`)."""


_SHARED: dict = {}
SHARED_PARTS = 1 << 18
"""At most this many distinct evaluator tuples and keywords are shared between placements (beyond it, and
whatever a stream sends, each placement keeps its own: the table is bounded, unlike ``sys.intern``'s)."""


def _shared(part):  # noqa: ANN001, ANN202 - a tuple of ints or a str
    """Return ``part``, or the equal one already shared by other placements (while fewer than the bound)."""
    shared = _SHARED.get(part)
    if shared is None:
        if len(_SHARED) >= SHARED_PARTS:
            return part
        shared = _SHARED[part] = part
    return shared


class Placement(NamedTuple):
    """Where an active subscription lives: its evaluators and summary keywords (a tuple: cheap to build).

    A ``ranked`` (topk or knn) subscription lives at every evaluator, and its
    keywords are not in the range summaries (DESIGN "Top-k and kNN").
    ``keywords`` are distinct and sorted. Build one with :meth:`of`, which
    shares the evaluator tuple and the keyword strings with every other
    placement holding them: about 200 bytes less per active
    subscription than a frozenset and strings of its own (issue 43 item 6).
    """

    evaluators: tuple[int, ...]
    keywords: tuple[str, ...]
    ranked: bool = False

    @classmethod
    def of(cls, evaluators: Iterable[int], keywords: Iterable[str], ranked: bool = False) -> Placement:
        """Return the placement on ``evaluators`` with summary ``keywords``, its parts shared."""
        return cls(_shared(tuple(evaluators)), tuple(_shared(k) for k in sorted(set(keywords))), ranked)

    def to_json(self) -> list:
        """Return ``[evaluators, sorted keywords]`` (``[..., true]`` when ranked), the durable form."""
        out = [list(self.evaluators), list(self.keywords)]
        return [*out, True] if self.ranked else out

    @classmethod
    def from_json(cls, raw: list) -> Placement:
        """Rebuild a placement from :meth:`to_json`.

        Raises
        ------
        TypeError, ValueError
            If ``raw`` is not of that shape.
        """
        evaluators, keywords, *ranked = raw
        if not all(type(e) is int for e in evaluators) or not all(type(k) is str for k in keywords):
            raise TypeError("a placement is [[evaluator ints], [keyword strings]]")
        if ranked not in ([], [True]):
            raise TypeError("a placement's third element, when present, is true (ranked)")
        return cls.of(evaluators, keywords, bool(ranked))


@dataclass(frozen=True)
class TextRows:
    """The rows of a micro-batch's decisions that carry objects in text-partitioned rectangles (grid^t).

    Attributes
    ----------
    entry : ndarray, shape (rows,), int64
        Per decision row, its entry in ``terms``; -1 for a row of another kind
        (every term, window copy kept).
    terms : pyarrow.ListArray of string
        The terms a row answers for (GI^2's restricted match), distinct and sorted.
    beyond : ndarray, shape (rows,), bool
        Rows an object's terms sent beyond its owner: they keep no window copy.
    """

    entry: np.ndarray
    terms: pa.ListArray
    beyond: np.ndarray


@dataclass
class Decisions:
    """What the sequencer decided for one micro-batch.

    Row ``r`` sends item ``index[r]`` to ``evaluator[r]`` (int64 arrays of
    shape (rows,)), in stream order; the rows ``box_rows`` (int64, ascending)
    carry a subscription's cell box there, ``boxes[k]`` (int64, shape
    (len(box_rows), 4), fine-grid cells) for row ``box_rows[k]``; every other row keeps the
    item's own cells (an object's cell, or nothing). ``rejected`` holds ``(item, reason,
    message)`` for records the stream so far rejects (``duplicate_id``,
    ``unknown_id``) and for items that failed
    (``internal_error``). ``objects`` counts accepted objects, ``forwarded``
    those admitted by a textual summary; ``accepted`` are their items.
    ``snapshots`` are the snapshot items sent to every evaluator (while
    ranked subscriptions are active), and ``mark`` says that the batch ends
    with a mark row to every evaluator (DESIGN "Top-k and kNN"). ``clock``
    stamps the items (:meth:`Sequencer.clock`, set by
    :meth:`Sequencer.sequence_table`) and ``end_clock`` is ``(objects
    accepted, watermark)`` at the batch's end.
    """

    index: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    evaluator: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    box_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    boxes: np.ndarray = field(default_factory=lambda: np.empty((0, 4), np.int64))
    only: TextRows | None = None
    """Rows of objects in text-partitioned rectangles, when the batch has some."""
    rejected: list[tuple[int, str, str]] = field(default_factory=list)
    objects: int = 0
    forwarded: int = 0
    accepted: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    snapshots: list[int] = field(default_factory=list)
    mark: bool = False
    clock: Clock | None = None
    end_clock: tuple[int, float] = (0, math.nan)


class OtherRows(NamedTuple):
    """The rows a micro-batch's subscribes, unsubscribes and snapshots send, in no particular order.

    ``items``, ``evaluators`` (int64, shape (rows,)): row ``r`` sends item
    ``items[r]`` to evaluator ``evaluators[r]``; an item's rows are in the
    order of its targets (a subscribe), of its placement's evaluators (an
    unsubscribe) or of the evaluators (a snapshot). ``boxes`` (int64, shape (rows, 4)): a range subscribe's
    cell box at that evaluator, -1 in every column for a row without one.
    """

    items: np.ndarray
    evaluators: np.ndarray
    boxes: np.ndarray


Admit = Callable[[TextualSummaries, np.ndarray], Sequence[bool]]
"""``admit(summaries, objects)``: for the accepted object items ``objects``, whether each passes its owner's summary
(for an object in a text-partitioned rectangle: whether its primary's window store needs it)."""
Spread = Callable[[TextualSummaries, np.ndarray], tuple[np.ndarray, TermRoutes]]
"""``spread(summaries, objects)``: of the accepted object items ``objects`` (ascending), those in text-partitioned
rectangles (ascending), and where their terms send them, ``TermRoutes.objects`` indexing that array (grid^t's H1
and H2, :func:`skpub.router.gridt.route_objects`)."""


class Sequencer:
    """The routing unit's serial state: id registry, placements, textual summaries, the stream clock.

    Parameters
    ----------
    evaluators : int
        Number of evaluators.
    registry : IdRegistry
        The id registry with the placements (its durable state).
    window : Window, optional
        The deployment window (default none).
    """

    def __init__(self, evaluators: int, registry: IdRegistry, window: Window | None = None) -> None:
        self.registry = registry
        self.summaries = TextualSummaries(evaluators)
        self.window = window or Window()
        self.ranked_keywords: Counter[str] = Counter()
        self.ranked_active = 0
        for placement in registry.active.values():
            self._add_placement(placement)

    def _add_placement(self, placement: Placement) -> None:
        if placement.ranked:
            self.ranked_keywords.update(placement.keywords)
            self.ranked_active += 1
        else:
            for e in placement.evaluators:
                self.summaries.add(e, placement.keywords)

    def _remove_placement(self, placement: Placement) -> None:
        if placement.ranked:
            counts = self.ranked_keywords
            for keyword in placement.keywords:
                counts[keyword] -= 1
                if not counts[keyword]:
                    del counts[keyword]
            self.ranked_active -= 1
        else:
            for e in placement.evaluators:
                self.summaries.remove(e, placement.keywords)

    def replay(self, objects: list[str], changes: list) -> None:
        """Apply one batch's journaled registry changes (:func:`skpub.router.state.decode_journal`), summaries too.

        Raises
        ------
        CheckpointError
            If a change does not fit the registry (a damaged journal).
        """
        registry = self.registry
        registry.replay_objects(objects)
        for change in changes:
            rtype, rid, placement = change
            ended = registry.active.get(rid) if rtype in ("unsubscribe", "place") else None
            registry.replay([change])
            if ended is not None:
                self._remove_placement(ended)
            if rtype in ("subscribe", "place"):
                self._add_placement(placement)

    def place(self, rid: str, evaluators: tuple[int, ...]) -> None:
        """Move active range subscription ``rid`` to ``evaluators`` (a rebalancing moved its cells), summaries too.

        Raises
        ------
        KeyError
            If ``rid`` is not active.
        """
        old = self.registry.active[rid]
        new = old._replace(evaluators=_shared(tuple(sorted(evaluators))))
        self._remove_placement(old)
        self.registry.place(rid, new)
        self._add_placement(new)

    def rehome(self, handoffs: Iterable[Handoff]) -> int:
        """Move the placements of the subscriptions a transfer carried (its routing update); return how many changed.

        Each changes through :meth:`place` (journaled), in id order, to the
        holders :func:`~skpub.kernel.transfer.holders_after` gives. O(parts
        carried + subscriptions dropped).
        """
        handoffs = list(handoffs)
        named = {sid for h in handoffs for sid in h.dropped}
        named.update(sub.id for h in handoffs for c in h.carried for sub, _ in c.subscriptions)
        before = {sid: self.registry.active[sid].evaluators for sid in named}
        changed = holders_after(before, handoffs)
        for sid, evaluators in changed.items():
            self.place(sid, evaluators)
        return len(changed)

    @property
    def watermark(self) -> float:
        """The largest object time so far (seconds), NaN before the first object."""
        w = self.registry.watermark
        return math.nan if w is None else w

    def sequence(
        self,
        kinds: np.ndarray,
        ids: Sequence[str],
        owners: np.ndarray,
        subscriptions: Subscriptions,
        admit: Admit,
        spread: Spread | None = None,
    ) -> Decisions:
        """Decide one micro-batch, given its records' compact columns in stream order.

        Parameters
        ----------
        kinds : ndarray, shape (n,), int
            Kind code of item ``i`` (:data:`skpub.kernel.wire.KIND_CODES`).
        ids : sequence of str, length n
            Record ids.
        owners : ndarray, shape (n,), int
            An object's owner evaluator (ignored for other kinds).
        subscriptions : mapping
            ``item -> (targets, summary keywords, ranked)`` for every
            ``subscribe`` item (:data:`Subscriptions`).
        admit : callable
            Tests the batch's accepted objects against the textual summaries
            (:meth:`TextualSummaries.admits` or its vectorized form).
        spread : callable, optional
            Routes the accepted objects of text-partitioned rectangles by
            their terms (:data:`Spread`); such an object goes to its owner
            (the rectangle's primary) when ``admit`` says its window store
            needs it or a term sends it there, and to every other evaluator
            a term sends it to, with no window copy.

        Returns
        -------
        Decisions
            Object ids live in their own namespace, so objects are decided
            apart from the other records: when the batch's object ids are
            distinct and none is held (the common case) they are accepted in
            bulk (vectorized, :class:`~skpub.kernel.horizon.ObjectIdHorizon`); otherwise one by one in
            stream order, horizon evictions included. The summaries an
            object is tested against are those after every subscribe of its
            micro-batch and before its unsubscribes: a superset of the summary
            at the object's position, so an object that can match is never
            held back, and the test runs once per batch (vectorized). O(1)
            per object, O(targets) per subscription. Never raises for an
            item: one that fails becomes an ``internal_error`` rejection.
        """
        out = Decisions()
        kinds = np.asarray(kinds)
        objects = np.flatnonzero(kinds == OBJECT)
        accepted = self._accept_objects(objects, [ids[i] for i in objects.tolist()], out.rejected)
        ranked_before = self.ranked_active
        rows, ended = self._sequence_others(kinds, ids, subscriptions, out)
        out.objects = len(accepted)
        out.accepted = accepted
        mask = np.asarray(admit(self.summaries, accepted), dtype=bool) if len(accepted) else np.zeros(0, bool)
        owners = np.asarray(owners)
        failed = len(out.rejected)
        chosen, routes = (
            self._spread(spread, accepted, out.rejected) if spread is not None and len(accepted) else _NO_ROUTES
        )
        if len(out.rejected) > failed:
            mask = mask & ~np.isin(accepted, [item for item, _, _ in out.rejected[failed:]])
        routed_item = chosen[routes.objects]
        at_owner = routes.evaluators == owners[routed_item]
        if at_owner.any():
            mask = mask.copy()
            mask[np.searchsorted(accepted, routed_item[at_owner])] = True  # accepted items are ascending
        admitted = accepted[mask]
        beyond = np.flatnonzero(~at_owner)
        out.mark = bool(ranked_before or self.ranked_active or any(p.ranked for p in ended))
        for placement in ended:
            self._remove_placement(placement)
        out.forwarded = len(admitted) + len(beyond)
        index = np.concatenate([admitted, routed_item[beyond], rows.items])
        order = np.argsort(index, kind="stable")
        out.index = index[order]
        out.evaluator = np.concatenate([owners[admitted].astype(np.int64), routes.evaluators[beyond], rows.evaluators])[
            order
        ]
        at = np.empty(len(order), np.int64)
        at[order] = np.arange(len(order))  # the output row of each row above
        boxed = np.flatnonzero(rows.boxes[:, 0] >= 0)
        out.box_rows = at[out.forwarded + boxed]
        out.boxes = rows.boxes[boxed]
        if len(chosen):
            out.only = _text_rows(admitted, chosen, routed_item[at_owner], np.flatnonzero(at_owner), beyond, routes,
                                  len(rows.items), order)  # fmt: skip
        out.rejected.sort(key=lambda r: r[0])
        return out

    def _spread(self, spread: Spread, items: np.ndarray, rejected: list) -> tuple[np.ndarray, TermRoutes]:
        """Run ``spread`` on the batch's objects, or, should it fail, on each alone.

        An object that fails alone becomes an ``internal_error`` rejection and
        goes nowhere: it is returned in neither array, and :meth:`sequence`
        admits no rejected object (SEMANTICS 1: one record never stops the run).
        """
        try:
            return spread(self.summaries, items)
        except Exception:  # noqa: BLE001 - retried one by one below
            parts = []
            for item in items.tolist():
                try:
                    parts.append(spread(self.summaries, np.array([item], np.int64)))
                except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                    rejected.append((item, "internal_error", clip(f"{type(exc).__name__}: {exc}", 500)))
            chosen = np.concatenate([np.empty(0, np.int64), *(c for c, _ in parts)])
            starts = np.cumsum([0, *(len(c) for c, _ in parts)])[:-1].tolist()
            none = _NO_ROUTES[1]
            return chosen, TermRoutes(
                np.concatenate([none.objects, *(r.objects + s for (_, r), s in zip(parts, starts, strict=True))]),
                np.concatenate([none.evaluators, *(r.evaluators for _, r in parts)]),
                pa.concat_arrays([none.terms, *(r.terms for _, r in parts)]),
            )

    def _accept_objects(self, items: np.ndarray, oids: list[str], rejected: list) -> np.ndarray:
        """Register the batch's object ids (stream order); return the items accepted."""
        rejections = self.registry.accept_objects(oids)
        if not rejections:
            return items
        rejected.extend((int(items[k]), *rejection) for k, rejection in rejections.items())
        return np.delete(items, list(rejections))

    def _sequence_others(
        self,
        kinds: np.ndarray,
        ids: Sequence[str],
        subscriptions: Subscriptions,
        out: Decisions,
    ) -> tuple[OtherRows, list[Placement]]:
        """Decide the batch's subscribes, unsubscribes and snapshots in stream order.

        Returns the rows they send and the placements their unsubscribes end
        (removed from the summaries after the batch's objects are tested). A
        topk or knn subscribe, its unsubscribe, and a snapshot while one is
        active go to every evaluator. A batch of range subscribes and
        unsubscribes (the common case) is decided at once
        (:meth:`_sequence_in_bulk`), any other record by record
        (:meth:`_sequence_one_by_one`); both decide the same.
        """
        others = np.flatnonzero(kinds != OBJECT)
        codes = kinds[others]
        if len(others):
            bulk = self._sequence_in_bulk(others, codes, ids, subscriptions, out)
            if bulk is not None:
                return bulk
        return self._sequence_one_by_one(others, codes, ids, subscriptions, out)

    def _sequence_in_bulk(
        self,
        others: np.ndarray,
        codes: np.ndarray,
        ids: Sequence[str],
        subscriptions: Subscriptions,
        out: Decisions,
    ) -> tuple[OtherRows, list[Placement]] | None:
        """:meth:`_sequence_one_by_one` for a batch of range subscribes and unsubscribes only (the common case).

        Returns None, having changed nothing but the placements' shared parts,
        for any other batch: one with a snapshot or a ranked subscribe, a
        target naming no evaluator, or one that is not what
        :meth:`sequence_table` gives (an evaluator or a cell that is no
        integer, a box of other than four cells, an unhashable id, a
        subscribe missing from ``subscriptions``). The
        registry checks and accepts the changes in one pass
        (:meth:`IdRegistry.accept_subscriptions`: duplicate and unknown ids
        are rejected as one by one), the placements are built in one pass
        over the subscribes, and the rows in numpy.
        """
        is_subscribe = codes == SUBSCRIBE
        if np.count_nonzero(is_subscribe) + np.count_nonzero(codes == UNSUBSCRIBE) < len(others):
            return None
        items = others.tolist()
        try:  # everything that can fail comes before the first state change; a failure leaves it to the records
            specs = [subscriptions[i] for i in others[is_subscribe].tolist()]
            if any(ranked for _, _, ranked in specs):
                return None
            targets = [target for spec in specs for target in spec[0]]
            evaluators = np.array([e for e, _ in targets]).reshape(len(targets))
            boxes = np.array([box for _, box in targets]).reshape(len(targets), 4)
            if len(targets) and not (
                evaluators.dtype.kind == boxes.dtype.kind == "i"  # integers only, as one by one (no None, no float)
                and 0 <= evaluators.min()
                and evaluators.max() < len(self.summaries.counts)
            ):
                return None
            evaluators, boxes = evaluators.astype(np.int64), boxes.astype(np.int64)
            hash(tuple(ids[i] for i in items))  # an id the registry cannot hold fails here, not in its pass
            placements = iter([Placement.of((e for e, _ in spec[0]), spec[1]) for spec in specs])
            changes = [("subscribe", ids[i], next(placements)) if sub else ("unsubscribe", ids[i], None)
                       for i, sub in zip(items, is_subscribe.tolist(), strict=True)]  # fmt: skip
        except Exception:  # noqa: BLE001 - decided record by record, where one that fails is rejected alone
            return None
        rejections, ended = self.registry.accept_subscriptions(changes)
        out.rejected.extend((items[k], *rejection) for k, rejection in rejections.items())
        accepted = np.ones(len(others), bool)
        accepted[list(rejections)] = False
        for k in np.flatnonzero(accepted & is_subscribe).tolist():
            self._add_placement(changes[k][2])
        per_subscribe = np.fromiter((len(spec[0]) for spec in specs), np.int64, len(specs))
        taken = np.repeat(accepted[is_subscribe], per_subscribe)
        ended_at = [p.evaluators for p in ended]
        ended_count = np.fromiter(map(len, ended_at), np.int64, len(ended_at))
        ended_rows = int(ended_count.sum())
        rows = OtherRows(
            np.concatenate([np.repeat(others[is_subscribe], per_subscribe)[taken],
                            np.repeat(others[~is_subscribe & accepted], ended_count)]),
            np.concatenate([evaluators[taken], np.fromiter(chain.from_iterable(ended_at), np.int64, ended_rows)]),
            np.concatenate([boxes[taken], np.full((ended_rows, 4), -1, np.int64)]),
        )  # fmt: skip
        return rows, ended

    def _sequence_one_by_one(
        self,
        others: np.ndarray,
        codes: np.ndarray,
        ids: Sequence[str],
        subscriptions: Subscriptions,
        out: Decisions,
    ) -> tuple[OtherRows, list[Placement]]:
        """:meth:`_sequence_others` record by record, in stream order.

        A record that fails becomes an ``internal_error`` rejection, and the batch goes on.
        """
        registry, summaries, rejected = self.registry, self.summaries, out.rejected
        everyone = tuple(range(len(summaries.counts)))
        rows: list[tuple[int, int, CellBox | None]] = []
        ended: list[Placement] = []
        for i, code in zip(others.tolist(), codes.tolist(), strict=True):
            kind = KINDS[code]
            try:
                rejection = registry.check(kind, ids[i])
                if rejection is not None:
                    rejected.append((i, *rejection))
                elif kind == "subscribe":
                    # Everything that can fail comes before the first state change.
                    targets, keywords, ranked = subscriptions[i]
                    if ranked:
                        targets = tuple((e, None) for e in everyone)
                    targets = tuple((operator.index(e), None if box is None else _cell_box(box)) for e, box in targets)
                    placement = Placement.of((e for e, _ in targets), keywords, ranked)
                    if not all(0 <= e < len(everyone) for e in placement.evaluators):
                        raise ValueError(f"targets {placement.evaluators} name an evaluator that does not exist")
                    registry.accept_id(kind, ids[i], placement)
                    self._add_placement(placement)
                    rows.extend((i, e, cells) for e, cells in targets)
                elif kind == "unsubscribe":
                    placement = registry.accept_id(kind, ids[i])
                    ended.append(placement)
                    rows.extend((i, e, None) for e in placement.evaluators)
                else:
                    registry.accept_id(kind, ids[i])
                    if self.ranked_active:
                        out.snapshots.append(i)
                        rows.extend((i, e, None) for e in everyone)
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                rejected.append((i, "internal_error", clip(f"{type(exc).__name__}: {exc}", 500)))
        no_box = (-1, -1, -1, -1)
        return OtherRows(
            np.fromiter((i for i, _, _ in rows), np.int64, len(rows)),
            np.fromiter((e for _, e, _ in rows), np.int64, len(rows)),
            np.array([no_box if box is None else box for _, _, box in rows], np.int64).reshape(-1, 4),
        ), ended

    def clock(self, items: pa.Table, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stamp the batch's items with the stream clock and advance it (SEMANTICS section 4).

        Parameters
        ----------
        items : pyarrow.Table
            The batch's located records in stream order (``ts`` column, seconds).
        accepted : ndarray of int
            The items of the accepted objects, in stream order.

        Returns
        -------
        (count, watermark, ts) : ndarrays of shape (len(items),)
            ``count`` (int64): objects accepted up to and including item
            ``i`` since the stream began; ``watermark`` (float64, NaN before
            any object) the largest object time then; ``ts`` an accepted
            object's time, which is the watermark at its arrival (0 before
            any) when it has none (docs/SEMANTICS.md). O(n) in numpy.
        """
        n = items.num_rows
        count_after = np.zeros(n, np.int64)
        count_after[accepted] = 1
        count_after = np.cumsum(count_after) + self.registry.objects_accepted - len(accepted)
        ts = np.full(n, np.nan)
        if len(accepted):
            raw = pc.fill_null(items.column("ts"), math.nan).to_numpy()[accepted]
            own = ~np.isnan(raw)
            before = np.fmax.accumulate(np.concatenate([[self.watermark], np.where(own, raw, np.nan)]))[:-1]
            first_clockless = np.flatnonzero(~own & np.isnan(before))
            if len(first_clockless):  # the first object without ts, before any ts, sets the watermark to 0
                raw = raw.copy()
                raw[first_clockless[0]] = 0.0
                own[first_clockless[0]] = True
                before = np.fmax.accumulate(np.concatenate([[self.watermark], np.where(own, raw, np.nan)]))[:-1]
            ts[accepted] = np.where(own, raw, before)
        watermark = np.fmax.accumulate(np.concatenate([[self.watermark], ts]))[1:]
        if n and not math.isnan(watermark[-1]):
            self.registry.advance_clock(float(watermark[-1]))
        return count_after, watermark, ts

    def sequence_table(self, items: pa.Table, partitioning: Partitioning | None = None) -> Decisions:
        """:meth:`sequence` for a micro-batch's located records in stream order (:data:`LOCATED_SCHEMA` rows).

        The records stay columns: the summary test filters the objects'
        terms in Arrow (:meth:`TextualSummaries.admits_many`), and only
        subscriptions' targets become Python values. ``partitioning`` is the
        batch's epoch's: an object in one of its text-partitioned rectangles
        goes where its terms send it (:func:`skpub.router.gridt.route_objects`
        against the textual summaries, grid^t's H2), in Arrow and numpy.
        """
        owners = items.column("evaluator").to_numpy()
        terms = items.column("terms").combine_chunks()
        text = None
        if partitioning is not None and partitioning.has_text:
            cx = pc.fill_null(items.column("cx0"), 0).to_numpy()
            cy = pc.fill_null(items.column("cy0"), 0).to_numpy()
            text = (items.column("kind").to_numpy() == OBJECT) & partitioning.text_cells[cy, cx]

        def admit(summaries: TextualSummaries, objects: np.ndarray) -> np.ndarray:
            if text is None:  # every item at once, without taking the objects' terms: other records hold none
                admitted = summaries.admits_many(owners, terms)
            else:  # text objects go by spread
                plain = objects[~text[objects]]
                admitted = np.zeros(len(owners), bool)
                if len(plain):
                    admitted[plain] = summaries.admits_many(owners[plain], terms.take(pa.array(plain)))
            return self._window_needs(terms)[objects] | admitted[objects]

        def spread(summaries: TextualSummaries, objects: np.ndarray) -> tuple[np.ndarray, TermRoutes]:
            chosen = objects[text[objects]]
            classes = partitioning.text_class[partitioning.rect_of[cy[chosen], cx[chosen]]]
            chosen_terms = terms.take(pa.array(chosen))
            tables = partitioning.term_tables
            return chosen, route_objects(
                tables, classes, chosen_terms, summaries.counts, summaries.key_array(terms.type.value_type)
            )

        decisions = self.sequence(
            items.column("kind").to_numpy(),
            items.column("id").to_pylist(),
            owners,
            _subscriptions(items),
            admit,
            spread if text is not None else None,
        )
        decisions.clock = self.clock(items, decisions.accepted)
        decisions.end_clock = (self.registry.objects_accepted, self.watermark)
        return decisions

    def _window_needs(self, terms: pa.ListArray) -> np.ndarray:
        """Return, per item, whether its owner's window store needs the object (DESIGN "Top-k and kNN").

        With a count or seconds window any object may enter the result of a
        ranked subscription yet to come; with window none only one that
        shares a term with an active one (checked after the batch's
        subscribes: a superset).
        """
        n = len(terms)
        if self.window.kind != "none":
            return np.ones(n, bool)
        if not self.ranked_keywords:
            return np.zeros(n, bool)
        hits = pc.is_in(pc.list_flatten(terms), pa.array(list(self.ranked_keywords), pa.string()))
        parents = pc.list_parent_indices(terms).to_numpy()
        out = np.zeros(n, bool)
        out[parents[hits.to_numpy(zero_copy_only=False)]] = True
        return out


_NO_ROUTES = (
    np.empty(0, np.int64),
    TermRoutes(np.empty(0, np.int64), np.empty(0, np.int64), pa.array([], pa.list_(pa.string()))),
)


def _text_rows(
    admitted: np.ndarray,
    chosen: np.ndarray,
    owned_items: np.ndarray,
    owned_routes: np.ndarray,
    beyond: np.ndarray,
    routes: TermRoutes,
    others: int,
    order: np.ndarray,
) -> TextRows | None:
    """Return the :class:`TextRows` of decision rows ``[admitted, beyond, others]`` taken in ``order``.

    An admitted object in a text-partitioned rectangle (``chosen``) answers
    at its owner for the terms its route there names (``owned_items``, route
    ``owned_routes``), or for none when it came only for its window store; a
    route ``beyond`` its owner answers for its terms and keeps no window copy.
    """
    empty = len(routes.terms)
    terms = pa.concat_arrays([routes.terms, pa.array([[]], pa.list_(pa.string()))])
    owned = np.searchsorted(owned_items, admitted)
    has_route = owned < len(owned_items)
    has_route[has_route] = owned_items[owned[has_route]] == admitted[has_route]
    picked = np.searchsorted(chosen, admitted)
    is_text = picked < len(chosen)
    is_text[is_text] = chosen[picked[is_text]] == admitted[is_text]
    at_owner = np.where(has_route, owned_routes[np.minimum(owned, len(owned_routes) - 1)] if len(owned_routes) else -1,
                        np.where(is_text, empty, -1))  # fmt: skip
    entry = np.concatenate([at_owner, beyond, np.full(others, -1, np.int64)])[order]
    if not (entry >= 0).any():
        return None
    copyless = np.concatenate([np.zeros(len(admitted), bool), np.ones(len(beyond), bool), np.zeros(others, bool)])
    return TextRows(entry, terms, copyless[order])


def _cell_box(box: Sequence[int]) -> CellBox:
    """Return ``box`` as four ints; raise TypeError or ValueError if it is not four integers."""
    x0, y0, x1, y1 = map(operator.index, box)
    return x0, y0, x1, y1


def _subscriptions(items: pa.Table) -> dict[int, tuple[Targets, frozenset[str], bool]]:
    """Return ``item -> (targets, summary keywords, ranked)`` for the subscribe rows."""
    rows = np.flatnonzero(pc.equal(items.column("kind"), SUBSCRIBE).to_numpy(zero_copy_only=False))
    if not len(rows):
        return {}
    subset = items.select(["targets", "boxes", "keywords", "spec"]).take(pa.array(rows)).to_pydict()
    out = {}
    columns = (rows.tolist(), subset["targets"], subset["boxes"], subset["keywords"], subset["spec"])
    for i, targets, boxes, keywords, spec in zip(*columns, strict=True):
        out[i] = (
            tuple((e, tuple(boxes[4 * j : 4 * j + 4])) for j, e in enumerate(targets or ())),
            frozenset(keywords or ()),
            spec is not None,
        )
    return out


def evaluator_tables(routed: pa.Table, keys: Sequence[int]) -> list[pa.Table]:
    """Return, per key of ``keys``, the routed rows whose ``evaluator`` is that key, in the table's (stream) order.

    One stable sort of the ``evaluator`` column, then one Arrow ``take`` per
    key. O(rows log rows).
    """
    column = routed.column("evaluator").to_numpy()
    order = np.argsort(column, kind="stable")
    ordered = column[order]
    tables = []
    for key in keys:
        lo, hi = np.searchsorted(ordered, [key, key + 1])
        tables.append(routed.take(pa.array(order[lo:hi])))
    return tables


def routed_table(items: pa.Table, decisions: Decisions, keys: Sequence[int], end: int = 0) -> pa.Table:
    """Return the routed rows (:data:`ROUTED_SCHEMA`): the items the decisions name, in their order.

    Row ``r`` is item ``decisions.index[r]`` with ``evaluator`` set to
    ``keys[decisions.evaluator[r]]`` and, for a subscription, its cell box
    there (``decisions.boxes``). Records are taken from the columns (Arrow ``take``), never rebuilt
    as Python objects. ``decisions.clock`` stamps ``accepted``,
    ``watermark`` and objects' ``ts``; when ``decisions.mark``, every
    evaluator also gets a mark row at position ``end`` (the batch's end).
    """
    selected = items.select(list(ROUTED_SCHEMA.names))
    if decisions.clock is not None:
        count, watermark, ts = decisions.clock
        for name, values in (("accepted", pa.array(count)), ("watermark", pa.array(watermark)), ("ts", pa.array(ts))):
            selected = selected.set_column(selected.schema.get_field_index(name), name, values)
    taken = selected.take(pa.array(decisions.index, type=pa.int64()))
    evaluator = pa.array(np.asarray(keys, dtype=np.int32)[decisions.evaluator], pa.int32())
    taken = taken.set_column(0, "evaluator", evaluator)
    if len(decisions.box_rows):
        for c, name in enumerate(("cx0", "cy0", "cx1", "cy1")):
            column = pc.fill_null(taken.column(name), -1).to_numpy().copy()
            column[decisions.box_rows] = decisions.boxes[:, c]
            taken = taken.set_column(taken.schema.get_field_index(name), name, pa.array(column, pa.int32()))
    if decisions.only is not None:
        text = decisions.only
        only = text.terms.take(pa.array(text.entry, pa.int64(), mask=text.entry < 0))
        window = pa.array(np.zeros(len(text.beyond), bool), pa.bool_(), mask=~text.beyond)
        for name, values in (("only", only), ("window", window)):
            taken = taken.set_column(taken.schema.get_field_index(name), name, values)
    taken = taken.cast(ROUTED_SCHEMA)
    if not decisions.mark:
        return taken
    count, watermark = decisions.end_clock
    n = len(keys)
    marks = {
        "evaluator": pa.array(keys, pa.int32()),
        "pos": pa.array([end] * n, pa.int64()),
        "kind": pa.array([MARK] * n, pa.int8()),
        "id": pa.array([""] * n, pa.string()),
        "accepted": pa.array([count] * n, pa.int64()),
        "watermark": pa.array([float(watermark)] * n, pa.float64()),
    }
    nulls = {name: pa.nulls(n, ROUTED_SCHEMA.field(name).type) for name in ROUTED_SCHEMA.names if name not in marks}
    return pa.concat_tables([taken, pa.table({**marks, **nulls}, schema=ROUTED_SCHEMA)])
