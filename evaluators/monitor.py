"""The ranked monitor: one evaluator's top-k and kNN work over the objects its partition owns.

Every topk and knn subscription is held by every evaluator (DESIGN "Top-k
and kNN across evaluators"); each evaluator keeps, per subscription, a
buffer (:class:`~skpub.evaluators.skyband.Skyband`) over its own window
store (:class:`~skpub.evaluators.window.WindowStore`), and at every mark (a
snapshot, the end of a micro-batch) reports the subscriptions whose local
result changed as :class:`~skpub.kernel.messages.RankedUpdate` rows for the
merge (:mod:`skpub.evaluators.merge`).

Arrivals reach only the subscriptions they can enter: the subscription index
is an inverted file from term to subscriptions (Skype section 5.3, without
its location quadtree: every evaluator holds every subscription), a knn
``all`` subscription filed under its rarest keyword (CkQST section 3.2),
and an arrival is scored only against the subscriptions that share one of
its terms; a buffer takes it only at or above its threshold (Skype
Lemma 1: an object scoring below ``theta`` cannot affect the subscription).
Expiries are driven by the stream clock the sequencer stamps on every row;
an invalid buffer is refilled once, at the next mark (coalescing a
micro-batch's expiries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.ranked import Entry, Handler, WindowObject, handler_of
from skpub.evaluators.skyband import Skyband
from skpub.evaluators.window import WindowStore
from skpub.kernel.config import Deployment
from skpub.kernel.messages import RankedUpdate
from skpub.kernel.records import KnnSubscription, ObjectRecord, TopkSubscription
from skpub.kernel.text import Vocabulary
from skpub.kernel.wire import ranked_from_spec, ranked_spec

_HANDLERS: dict[tuple, Handler] = {}
"""Handlers shared by the evaluators of one process (a handler never changes once built)."""


def _shared_handler(
    sub: TopkSubscription | KnnSubscription, vocabulary: Vocabulary, max_dist: float, window_none: bool
) -> Handler:
    """Return the handler of ``sub``, built once per process for all the evaluators that hold it."""
    key = (sub.pos, sub.id, id(vocabulary), max_dist, window_none)
    handler = _HANDLERS.get(key)
    if handler is None or handler.sub != sub:
        if len(_HANDLERS) >= 1 << 18:
            _HANDLERS.clear()
        handler = _HANDLERS[key] = handler_of(sub, vocabulary, max_dist, window_none)
    return handler


@dataclass
class _Held:
    """One ranked subscription at this evaluator: its handler, buffer and what was last reported."""

    handler: Handler
    band: Skyband
    terms: list[str]
    reported: tuple | None = None


@dataclass
class MonitorStats:
    """Counters of ranked work at one evaluator.

    Buffers filled for a new (or restored) subscription, re-evaluations
    after expiries and the candidates they scored.
    """

    fills: int = 0
    refills: int = 0
    refill_scored: int = 0


class RankedMonitor:
    """The ranked subscriptions of one evaluator over the window objects it owns.

    Parameters
    ----------
    evaluator_id : int
        This evaluator.
    deployment : Deployment
        Window, space (MaxDist is its diagonal, coordinate units).
    vocabulary : Vocabulary
        idf of topk scores.
    The buffers follow ``deployment.skyband`` (:data:`skpub.kernel.config.SKYBANDS`).
    """

    def __init__(self, evaluator_id: int, deployment: Deployment, vocabulary: Vocabulary) -> None:
        self.evaluator_id = evaluator_id
        self.store = WindowStore(deployment.window)
        self.window_none = deployment.window.kind == "none"
        self.count_window = deployment.window.kind == "count"
        self.max_dist = math.hypot(deployment.space.width, deployment.space.height)
        self.vocabulary = vocabulary
        self.policy = deployment.skyband
        self.subscriptions: dict[str, _Held] = {}
        self.index: dict[str, set[str]] = {}
        self.holders: dict[int, set[str]] = {}
        self.dirty: set[str] = set()
        self.pending: list[RankedUpdate] = []
        self.changed: dict[str, TopkSubscription | KnnSubscription | None] = {}
        self.generation = ""
        self.stats = MonitorStats()

    def __len__(self) -> int:
        return len(self.subscriptions)

    # --- the stream clock and objects -------------------------------------------------

    def advance(self, accepted: int, watermark: float) -> None:
        """Move to the stream clock of a row: objects that left the window leave every buffer."""
        store = self.store
        if accepted == store.accepted and (watermark == store.watermark or watermark != watermark):
            return
        for obj in store.advance(accepted, watermark):
            self._forget(obj.pos)

    def _forget(self, pos: int) -> None:
        for sid in self.holders.pop(pos, ()):
            held = self.subscriptions.get(sid)
            if held is not None and held.band.remove(pos):
                self.dirty.add(sid)

    def add_object(self, record: ObjectRecord, number: int, block: int) -> int:
        """Take an arriving object (accepted as ``number``, in state block ``block``) in; return the work done.

        ``record.ts`` is the time the sequencer stamped (seconds). With
        window none only an object some subscription can see is kept. The
        work is the number of subscriptions scored, which the per-cell cost
        statistics add to the range work (DkM-SKS section 4.2: the load of a
        cell counts its kNN evaluations).
        """
        expires = record.expires_at if record.expires_at is not None else math.inf
        obj = WindowObject(
            record.pos, record.id, record.x, record.y, record.terms, record.term_set, record.ts, expires, number, block
        )
        index = self.index
        hits = [index[t] for t in obj.term_set if t in index]
        targets: set[str] = set().union(*hits) if hits else set()
        if (self.window_none and not targets) or not self.store.add(obj):
            return 0
        subscriptions = self.subscriptions
        for sid in targets:
            held = subscriptions[sid]
            scored = held.handler.goodness(obj)
            if scored is None:
                continue
            kept, dropped = held.band.offer(Entry(scored[0], scored[1], obj.ts, obj.pos, obj.id, expires))
            if kept:
                self.holders.setdefault(obj.pos, set()).add(sid)
                self.dirty.add(sid)
            for pos in dropped:
                self._unhold(pos, sid)
        return len(targets)

    def _unhold(self, pos: int, sid: str) -> None:
        holders = self.holders.get(pos)
        if holders is not None:
            holders.discard(sid)
            if not holders:
                del self.holders[pos]
        self.dirty.add(sid)

    # --- subscriptions ------------------------------------------------------------------

    def subscribe(self, sub: TopkSubscription | KnnSubscription) -> None:
        """Hold a new ranked subscription; its buffer is filled at the next mark (it starts stale)."""
        handler = _shared_handler(sub, self.vocabulary, self.max_dist, self.window_none)
        terms = self._index_terms(handler)
        self.subscriptions[sub.id] = _Held(handler, Skyband(sub.k, self.policy, self.count_window), terms)
        for t in terms:
            self.index.setdefault(t, set()).add(sub.id)
        self.dirty.add(sub.id)
        self.changed[sub.id] = sub

    def _index_terms(self, handler: Handler) -> list[str]:
        """Return the terms a subscription is filed under: all its keywords, or a knn ``all``'s rarest (CkQST 3.2)."""
        if handler.needs_all:
            return [min(handler.keywords, key=lambda t: (len(self.store.postings.get(t, ())), t))]
        return sorted(handler.keywords)

    def unsubscribe(self, sid: str, pos: int) -> bool:
        """End subscription ``sid`` at position ``pos``: report its final local result; False if not held."""
        held = self.subscriptions.get(sid)
        if held is None:
            return False
        self._report(sid, held, pos, ended=True)
        del self.subscriptions[sid]
        self.changed[sid] = None
        for t in held.terms:
            subs = self.index.get(t)
            if subs is not None:
                subs.discard(sid)
                if not subs:
                    del self.index[t]
        for pos_held in list(held.band.entries):
            self._unhold(pos_held, sid)
        self.dirty.discard(sid)
        if self.window_none:
            self._prune_before_oldest()
        return True

    def _prune_before_oldest(self) -> None:
        """Window none: forget objects older than every active subscription (none can see them)."""
        oldest = min((h.handler.sub.pos for h in self.subscriptions.values()), default=None)
        doomed = [p for p in self.store.objects if oldest is None or p < oldest]
        for obj in self.store.discard(doomed):
            self._forget(obj.pos)

    # --- marks --------------------------------------------------------------------------

    def mark(self, pos: int) -> tuple[list[RankedUpdate], list[str]]:
        """Report, as of position ``pos``, every subscription whose local result changed since its last report.

        Returns the reports, and a description of each subscription whose
        report failed (a bug): it is refilled and tried again at the next
        mark, and every other subscription is reported all the same.
        """
        failed, retry = [], set()
        for sid in sorted(self.dirty):
            try:
                self._report(sid, self.subscriptions[sid], pos, ended=False)
            except Exception as exc:  # noqa: BLE001 - one subscription must not stop the others
                failed.append(f"{sid!r}: {type(exc).__name__}: {exc}")
                self.subscriptions[sid].band.stale = True
                retry.add(sid)
        self.dirty = retry
        out, self.pending = self.pending, []
        return out, failed

    def _report(self, sid: str, held: _Held, pos: int, ended: bool) -> None:
        """Queue the report of one subscription at ``pos`` (refilled first if it cannot prove its first k).

        An unchanged result is not reported again, except as the final report of an unsubscribe.
        """
        band = held.band
        if ended and sid not in self.dirty and held.reported is not None:
            rows, bound = held.reported
        else:
            read = band.read(self.store.objects.__contains__)
            if read is None:
                self._refill(held)
                read = band.read(self.store.objects.__contains__)
                if read is None:
                    raise EvaluatorError(f"the buffer of {sid!r} cannot prove its first k right after a refill")
            entries, bound = read
            rows = tuple((e.id, e.value, e.g, e.ts, e.pos) for e in entries)
            if not ended and held.reported == (rows, bound):
                return
            held.reported = (rows, bound)
        sub = held.handler.sub
        self.pending.append(
            RankedUpdate(pos, sid, sub.pos, self.evaluator_id, sub.k, held.handler.field_name, rows, bound, ended)
        )

    def _refill(self, held: _Held) -> None:
        """Re-evaluate one buffer from the window store (Skype Algorithm 2)."""
        handler, band = held.handler, held.band
        for pos in band.entries:
            self._unhold(pos, handler.sub.id)
        candidates = []
        for obj in self.store.sharing(handler.keywords, rarest_only=handler.needs_all):
            scored = handler.goodness(obj)
            if scored is not None:
                candidates.append(Entry(scored[0], scored[1], obj.ts, obj.pos, obj.id, obj.expires_at))
        if band.stale:
            self.stats.fills += 1
        else:
            self.stats.refills += 1
            self.stats.refill_scored += len(candidates)
        band.refill(candidates, len(self.store))
        sid = handler.sub.id
        for pos in band.entries:
            self.holders.setdefault(pos, set()).add(sid)

    # --- durable state (the Spark engine's state store) ---------------------------------

    def take_changes(self) -> tuple[dict[int, bytes | None], bytes | None]:
        """Return the window segments and the subscription changes since the last call.

        Segments as :meth:`WindowStore.take_segments`; subscription changes
        as one JSON document ``{id: [pos, spec] or null}``
        (:func:`skpub.kernel.wire.ranked_spec`; null: ended), None when there
        are none. Buffers are not saved: a restored monitor refills them
        from the store at its next mark.
        """
        changes = None
        if self.changed:
            changes = orjson.dumps(
                {sid: None if sub is None else [sub.pos, ranked_spec(sub)] for sid, sub in self.changed.items()}
            )
        self.changed = {}
        return self.store.take_segments(), changes

    def subscriptions_json(self) -> bytes:
        """Return every held subscription as one :meth:`take_changes` document (a compaction of the changes)."""
        return orjson.dumps(
            {sid: [h.handler.sub.pos, ranked_spec(h.handler.sub)] for sid, h in self.subscriptions.items()}
        )

    def forget_reports(self) -> None:
        """Report every subscription at the next mark (a new merge knows none of the past reports)."""
        for sid, held in self.subscriptions.items():
            held.reported = None
            self.dirty.add(sid)

    @classmethod
    def restore(
        cls,
        evaluator_id: int,
        deployment: Deployment,
        vocabulary: Vocabulary,
        clock: tuple[int, float],
        segments: dict[int, bytes],
        changes: list[bytes],
    ) -> RankedMonitor:
        """Rebuild a monitor from its saved window segments, subscription changes and clock ``(accepted, watermark)``.

        ``changes`` are :meth:`take_changes` documents in order (the first may
        be a :meth:`subscriptions_json` compaction). Every buffer starts
        stale and every subscription is reported at the next mark.

        Raises
        ------
        EvaluatorError
            On damaged state.
        """
        monitor = cls(evaluator_id, deployment, vocabulary)
        monitor.store = WindowStore.restore(deployment.window, clock[0], clock[1], segments)
        held: dict[str, TopkSubscription | KnnSubscription] = {}
        try:
            for data in changes:
                for sid, raw in orjson.loads(data).items():
                    if raw is None:
                        held.pop(sid, None)
                    else:
                        held[sid] = ranked_from_spec(int(raw[0]), sid, raw[1])
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise EvaluatorError(f"damaged ranked subscriptions: {exc}") from None
        for sub in sorted(held.values(), key=lambda s: s.pos):
            monitor.subscribe(sub)
        monitor.changed = {}
        if monitor.window_none:
            monitor._prune_before_oldest()
        return monitor
