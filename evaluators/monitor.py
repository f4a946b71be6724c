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

Reports are sparse: a subscription's *home* evaluator (its position modulo
the evaluators) reports it at its first mark, at its end, and whenever its
local result changes; any other evaluator only when its local result
differs from the last one it reported, which starts as the empty result
the merge assumes of an evaluator it has not heard from. The saved state
keeps every subscription's last report, and a restored buffer is rebuilt
from it (it is a valid buffer whose threshold is the report's bound), so a
restore neither refills nor reports again (unless the report names an
object the restored store no longer holds: then it is refilled and sent).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from skpub.evaluators.durable import state_document, state_rows
from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.ranked import Entry, Handler, WindowObject, handler_of
from skpub.evaluators.skyband import Skyband
from skpub.evaluators.window import Departures, WindowColumns, WindowStore
from skpub.kernel.config import Deployment
from skpub.kernel.messages import RankedUpdate
from skpub.kernel.records import KnnSubscription, TopkSubscription
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
    if handler is None or (handler.sub is not sub and handler.sub != sub):
        if len(_HANDLERS) >= 1 << 18:
            _HANDLERS.clear()
        handler = _HANDLERS[key] = handler_of(sub, vocabulary, max_dist, window_none)
    return handler


Report = tuple[tuple[tuple[str, float, float, float, int], ...], float]
"""A report's content: rows ``(object id, value, g, ts, position)`` and the bound (see :class:`RankedUpdate`)."""
EMPTY_REPORT: Report = ((), -math.inf)
"""The report the merge assumes of an evaluator it has not heard from: no candidate, nothing left out."""


@dataclass(slots=True)
class _Held:
    """One ranked subscription at this evaluator: its handler, buffer and what was last reported.

    ``reported`` is None when the merge must hear from this evaluator at the next mark whatever the result.
    """

    handler: Handler
    band: Skyband
    terms: list[str]
    home: bool
    reported: Report | None


@dataclass
class MonitorStats:
    """Counters of ranked work at one evaluator.

    Buffers filled for a new subscription (or a restored one whose report
    could not be rebuilt), re-evaluations after expiries, the candidates they
    scored and their thread CPU time (seconds; Skype section 8 compares the
    policies by re-evaluation cost per expired object).
    """

    fills: int = 0
    refills: int = 0
    refill_scored: int = 0
    refill_cpu_seconds: float = 0.0


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
    durable : bool
        Keep what :meth:`take_changes` returns (the Spark engine's state);
        the local engine keeps nothing it does not need.
    The buffers follow ``deployment.skyband`` (:data:`skpub.kernel.config.SKYBANDS`).
    """

    def __init__(
        self, evaluator_id: int, deployment: Deployment, vocabulary: Vocabulary, durable: bool = False
    ) -> None:
        self.evaluator_id = evaluator_id
        self.durable = durable
        self.store = WindowStore(deployment.window, durable)
        self.holders: dict[int, set[str]] = {}
        self.departures = Departures(self.store, self.holders)
        self.window_none = deployment.window.kind == "none"
        self.count_window = deployment.window.kind == "count"
        self.max_dist = math.hypot(deployment.space.width, deployment.space.height)
        self.vocabulary = vocabulary
        self.evaluators = deployment.evaluators
        self.policy = deployment.skyband
        self.subscriptions: dict[str, _Held] = {}
        self.index: dict[str, set[str]] = {}
        self.keywords: dict[str, int] = {}  # keyword of a held subscription -> how many hold it
        self._keywords_version = 0  # changes with the keys of ``keywords``
        self._interest_version = -1  # the version the window store's terms of interest were last set at
        self.dirty: set[str] = set()
        self.pending: list[RankedUpdate] = []
        self.changed: dict[str, TopkSubscription | KnnSubscription | None] = {}
        self.reports_changed: set[str] = set()
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
        store.advance(accepted, watermark)
        for pos in self.departures.left():
            self._forget(pos)

    def _forget(self, pos: int) -> None:
        for sid in self.holders.pop(pos, ()):
            held = self.subscriptions.get(sid)
            if held is not None and held.band.remove(pos):
                self.dirty.add(sid)

    def receive(
        self, objects: WindowColumns, accepted: np.ndarray, watermark: np.ndarray, keywords: Iterable[str] = ()
    ) -> np.ndarray:
        """Keep a micro-batch's objects in the window store; return the rows a subscription may score.

        ``accepted`` (int64) and ``watermark`` (float64, NaN when unset) are
        each row's stream clock, as the sequencer stamped it. An object is
        kept when the window holds it at its own clock (with window none,
        only one that shares a term with a subscription). The rows returned
        (ascending) are the objects kept that share a term with a held
        subscription or with ``keywords`` (those of the subscriptions the
        batch brings): each must then go through :meth:`arrive`, in stream
        order with the batch's other ranked rows; the others arrive in bulk
        as the store's arrival position passes them. O(n log n) in
        numpy and Arrow for n objects, no Python step per object.
        """
        store = self.store
        kept = store.holds_many(objects, accepted, watermark)
        index, keywords = self.index, set(keywords)
        shares = np.zeros(len(objects), bool)
        flat = objects.terms.flatten()
        if index or keywords:
            if 4 * len(flat) < len(index):  # a few object terms against many keywords: look each one up
                hit = np.fromiter((t in index or t in keywords for t in flat.to_pylist()), bool, len(flat))
            else:  # one Arrow pass (its hash table costs O(keywords))
                terms = pa.array(sorted(keywords.union(index)), pa.string())
                hit = pc.is_in(flat, value_set=terms).to_numpy(zero_copy_only=False)
            shares[pc.list_parent_indices(objects.terms).to_numpy()[hit]] = True
        if self.window_none:
            kept &= shares
        if not keywords <= self.keywords.keys() or self._interest_version != self._keywords_version:
            store.interest(self.keywords.keys() | keywords)
            self._interest_version = self._keywords_version
        store.add(objects if kept.all() else objects.take(np.flatnonzero(kept)))
        return np.flatnonzero(kept & shares)

    def arrive(self, obj: WindowObject, accepted: int, watermark: float) -> int:
        """Let object ``obj`` (kept by :meth:`receive`) arrive at its clock and be scored; return the work done.

        The work is the number of subscriptions scored, which the per-cell
        cost statistics add to the range work (DkM-SKS section 4.2: the load
        of a cell counts its kNN evaluations). With window none an object no
        subscription can see is not kept.
        """
        self.advance(accepted, watermark)
        store = self.store
        store.arrive_until(obj.pos + 1)
        index = self.index
        hits = [index[t] for t in obj.term_set if t in index] if index else []
        if not hits:
            if self.window_none:
                store.discard([obj.pos])
            return 0
        store.remember(obj)
        return self.offer(obj, hits[0] if len(hits) == 1 else set().union(*hits))

    def offer(self, obj: WindowObject, targets: set[str]) -> int:
        """Offer a held object to the buffers of ``targets``, the subscriptions sharing a term with it."""
        subscriptions = self.subscriptions
        for sid in targets:
            held = subscriptions[sid]
            scored = held.handler.goodness(obj)
            if scored is None:
                continue
            band = held.band
            kept, dropped = band.offer(Entry(scored[0], scored[1], obj.ts, obj.pos, obj.id, obj.expires_at))
            if kept:
                self._hold(obj, sid)
                self.dirty.add(sid)
            elif obj.pos in band.dropped:  # left out, it may raise the bound of the report
                self.dirty.add(sid)
            for pos in dropped:
                self._unhold(pos, sid)
        return len(targets)

    def _hold(self, obj: WindowObject, sid: str) -> None:
        """Note that the buffer of ``sid`` holds ``obj`` (whose departure is then watched)."""
        holders = self.holders.get(obj.pos)
        if holders is None:
            holders = self.holders[obj.pos] = set()
            self.departures.track(obj)
        holders.add(sid)

    def _unhold(self, pos: int, sid: str) -> None:
        holders = self.holders.get(pos)
        if holders is not None:
            holders.discard(sid)
            if not holders:
                del self.holders[pos]
        self.dirty.add(sid)

    # --- subscriptions ------------------------------------------------------------------

    def subscribe(self, sub: TopkSubscription | KnnSubscription) -> None:
        """Hold a new ranked subscription; its buffer is filled at the next mark (it starts stale), if it must be.

        When no object the store holds shares a keyword with it, the buffer
        is valid and empty at once (what a fill would give), and only the
        home evaluator reports it at the next mark: another one's result is
        the empty one the merge assumes. With rare keywords that is most new
        subscriptions at most evaluators.
        """
        handler = _shared_handler(sub, self.vocabulary, self.max_dist, self.window_none)
        terms = self._index_terms(handler)
        home = sub.pos % self.evaluators == self.evaluator_id
        self.store.arrive_until(sub.pos)
        stale = self.store.shares_any(terms)
        band = Skyband(sub.k, self.policy, self.count_window, stale=stale)
        self.subscriptions[sub.id] = _Held(handler, band, terms, home, None if home else EMPTY_REPORT)
        for t in terms:
            self.index.setdefault(t, set()).add(sub.id)
        for t in handler.keywords:
            held = self.keywords.get(t, 0)
            self.keywords[t] = held + 1
            self._keywords_version += not held
        if stale or home:
            self.dirty.add(sub.id)
        if self.durable:
            self.changed[sub.id] = sub

    def _index_terms(self, handler: Handler) -> list[str]:
        """Return the terms a subscription is filed under: all its keywords, or a knn ``all``'s rarest (CkQST 3.2).

        Rarest by the deployment's document frequencies (ties by the term),
        not by the window's contents when it subscribes: a fixed choice, so
        an evaluator restored from its state files it where the live one
        did, and the cost it counts (hence the balancer's decisions) is the
        same.
        """
        if handler.needs_all:
            df = self.vocabulary.df
            return [min(handler.keywords, key=lambda t: (df.get(t, 1), t))]
        return sorted(handler.keywords)

    def unsubscribe(self, sid: str, pos: int) -> bool:
        """End subscription ``sid`` at position ``pos``: report its final local result; False if not held.

        The home evaluator always sends the final report (the merge ends the
        subscription on it); another one only if its result changed since its last report.

        Raises
        ------
        Exception
            Whatever reading the final result raised (a bug). The subscription
            is ended all the same, and the home evaluator sends its last
            report as the final one, so the merge ends it too.
        """
        held = self.subscriptions.get(sid)
        if held is None:
            return False
        self.store.arrive_until(pos)
        try:
            if held.home or held.reported is None or sid in self.dirty:
                self._report(sid, held, pos, ended=True)
        except Exception:
            if held.home:
                self._queue(sid, held, pos, held.reported or EMPTY_REPORT, ended=True)
            raise
        finally:
            self._end(sid, held)
        return True

    def _end(self, sid: str, held: _Held) -> None:
        """Forget an ended subscription: its buffer, index entries and saved state."""
        del self.subscriptions[sid]
        if self.durable:
            self.changed[sid] = None
            self.reports_changed.discard(sid)
        for t in held.terms:
            subs = self.index.get(t)
            if subs is not None:
                subs.discard(sid)
                if not subs:
                    del self.index[t]
        for t in held.handler.keywords:
            left = self.keywords.pop(t) - 1
            if left:
                self.keywords[t] = left
            else:
                self._keywords_version += 1
        for pos_held in list(held.band.entries):
            self._unhold(pos_held, sid)
        self.dirty.discard(sid)
        if self.window_none:
            self._prune_before_oldest()

    def withdraw(self, positions: list[int]) -> None:
        """Forget the objects at ``positions``, kept before their rows failed (their lines became dead letters)."""
        for pos in self.store.discard(positions).tolist():
            self._forget(pos)

    def _prune_before_oldest(self) -> None:
        """Window none: forget objects older than every active subscription (none can see them)."""
        oldest = min((h.handler.sub.pos for h in self.subscriptions.values()), default=math.inf)
        for pos in self.store.discard_before(oldest).tolist():
            self._forget(pos)

    # --- marks --------------------------------------------------------------------------

    def mark(self, pos: int) -> tuple[list[RankedUpdate], list[str]]:
        """Report, as of position ``pos``, every subscription whose local result changed since its last report.

        Returns the reports, and a description of each subscription whose
        report failed (a bug): it is refilled and tried again at the next
        mark, and every other subscription is reported all the same.
        """
        self.store.arrive_until(pos)
        failed, retry = [], set()
        for sid in sorted(self.dirty):
            try:
                self._report(sid, self.subscriptions[sid], pos, ended=False)
            except Exception as exc:  # noqa: BLE001 - one subscription must not stop the others
                failed.append(f"{sid!r}: {type(exc).__name__}: {exc}")
                self.subscriptions[sid].band.stale = True
                if self.durable:
                    self.reports_changed.add(sid)
                retry.add(sid)
        self.dirty = retry
        out, self.pending = self.pending, []
        return out, failed

    def _report(self, sid: str, held: _Held, pos: int, ended: bool) -> None:
        """Queue the report of one subscription at ``pos`` (refilled first if it cannot prove its first k).

        A result equal to the last one reported is not sent again, except as
        the home evaluator's final report (an unsubscribe).
        """
        if sid in self.dirty or held.reported is None:
            band = held.band
            read = band.read(self.store.__contains__)
            if read is None:
                self._refill(held)
                read = band.read(self.store.__contains__)
                if read is None:
                    raise EvaluatorError(f"the buffer of {sid!r} cannot prove its first k right after a refill")
            entries, bound = read
            report = (tuple((e.id, e.value, e.g, e.ts, e.pos) for e in entries), bound)
            if report != held.reported:
                held.reported = report
                if self.durable:
                    self.reports_changed.add(sid)
            elif not (ended and held.home):
                return
        elif not (ended and held.home):
            return
        self._queue(sid, held, pos, held.reported, ended)

    def _queue(self, sid: str, held: _Held, pos: int, report: Report, ended: bool) -> None:
        rows, bound = report
        sub = held.handler.sub
        self.pending.append(
            RankedUpdate(pos, sid, sub.pos, self.evaluator_id, sub.k, held.handler.field_name, rows, bound, ended)
        )

    def _refill(self, held: _Held) -> None:
        """Re-evaluate one buffer from the window store (Skype Algorithm 2)."""
        start = time.thread_time()
        handler, band = held.handler, held.band
        for pos in band.entries:
            self._unhold(pos, handler.sub.id)
        candidates, objects = [], {}
        for obj in self.store.sharing(handler.keywords, rarest_only=handler.needs_all):
            scored = handler.goodness(obj)
            if scored is not None:
                candidates.append(Entry(scored[0], scored[1], obj.ts, obj.pos, obj.id, obj.expires_at))
                objects[obj.pos] = obj
        fill = band.stale
        band.refill(candidates, len(self.store))
        sid = handler.sub.id
        for pos in band.entries:
            self._hold(objects[pos], sid)
        if fill:
            self.stats.fills += 1
        else:
            self.stats.refills += 1
            self.stats.refill_scored += len(candidates)
            self.stats.refill_cpu_seconds += time.thread_time() - start

    # --- durable state (the Spark engine's state store) ---------------------------------

    def take_changes(self) -> tuple[dict[int, bytes | None], bytes | None]:
        """Return the window segments and the ranked changes since the last call.

        Segments as :meth:`WindowStore.take_segments`. Ranked changes as one
        state document (:func:`skpub.evaluators.durable.state_document`,
        key ``ranked``) ``{"subscriptions": {id: [pos, spec] or null},
        "reports": {id: [rows, bound] or null}}`` (specs as
        :func:`skpub.kernel.wire.ranked_spec`; a null subscription ended; a
        null report must be refilled and sent again; the bound null for
        -inf), None when nothing changed. Call it after a mark: every buffer
        then reads its last report (or a tighter bound, when a dropped object
        has left since: the saved bound stays a valid, looser one), which is
        what :meth:`restore` rebuilds.
        """
        subscriptions = {sid: None if sub is None else [sub.pos, ranked_spec(sub)] for sid, sub in self.changed.items()}
        reports = {sid: self._saved_report(self.subscriptions[sid]) for sid in self.reports_changed}
        self.changed, self.reports_changed = {}, set()
        changes = None
        if subscriptions or reports:
            changes = state_document({"subscriptions": subscriptions, "reports": reports}, "ranked")
        return self.store.take_segments(), changes

    @staticmethod
    def _saved_report(held: _Held) -> list | None:
        if held.band.stale or held.reported is None:
            return None
        rows, bound = held.reported
        return [rows, None if bound == -math.inf else bound]

    def subscriptions_json(self) -> bytes:
        """Return every held subscription and report as one :meth:`take_changes` document (a compaction)."""
        subscriptions = {sid: [h.handler.sub.pos, ranked_spec(h.handler.sub)] for sid, h in self.subscriptions.items()}
        reports = {
            sid: self._saved_report(h)
            for sid, h in self.subscriptions.items()
            if h.home or h.reported != EMPTY_REPORT or h.band.stale
        }
        return state_document({"subscriptions": subscriptions, "reports": reports}, "ranked")

    def forget_reports(self) -> None:
        """Report every subscription anew at the next mark (a new merge knows none of the past reports).

        The home evaluator sends each one; another evaluator only a non-empty result.
        """
        for sid, held in self.subscriptions.items():
            held.reported = None if held.home else EMPTY_REPORT
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
        durable: bool = True,
    ) -> RankedMonitor:
        """Rebuild a monitor from its saved window segments, ranked changes and clock ``(accepted, watermark)``.

        ``changes`` are :meth:`take_changes` documents in order (the first may
        be a :meth:`subscriptions_json` compaction). Each buffer is rebuilt
        from its subscription's last report (:meth:`Skyband.restore`); one
        without a saved report had reported the empty result; one whose
        report is null, or names an object the store no longer holds, starts
        stale and is sent at the next mark. O(window objects + reported entries).

        Raises
        ------
        EvaluatorError
            On damaged state.
        """
        monitor = cls(evaluator_id, deployment, vocabulary, durable)
        monitor.store = WindowStore.restore(deployment.window, clock[0], clock[1], segments, durable)
        monitor.departures = Departures(monitor.store, monitor.holders)
        held: dict[str, TopkSubscription | KnnSubscription] = {}
        reports: dict[str, list | None] = {}
        try:
            for data in changes:
                doc = state_rows(data, "ranked")
                for sid, raw in doc["subscriptions"].items():
                    reports.pop(sid, None)
                    if raw is None:
                        held.pop(sid, None)
                    else:
                        held[sid] = ranked_from_spec(int(raw[0]), sid, raw[1])
                reports.update(doc["reports"])
            monitor.store.interest(t for sub in held.values() for t in sub.keywords)
            for sub in sorted(held.values(), key=lambda s: s.pos):
                monitor.subscribe(sub)
                monitor._rebuild(monitor.subscriptions[sub.id], reports.get(sub.id, False))
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise EvaluatorError(f"damaged ranked subscriptions: {exc}") from None
        monitor.changed, monitor.reports_changed = {}, set()
        if monitor.window_none:
            monitor._prune_before_oldest()
        return monitor

    def _rebuild(self, held: _Held, saved: list | None | bool) -> None:
        """Set one restored subscription's buffer and last report from its saved report (False: none saved)."""
        sid = held.handler.sub.id
        if saved is False and not held.home:
            held.band.restore([], -math.inf)
            self.dirty.discard(sid)
            return
        if not saved:
            held.reported = None
            self.dirty.add(sid)
            return
        raw_rows, raw_bound = saved
        rows = tuple((str(oid), float(value), float(g), float(ts), int(pos)) for oid, value, g, ts, pos in raw_rows)
        bound = -math.inf if raw_bound is None else float(raw_bound)
        held.reported = (rows, bound)
        objects = [self.store.get(pos) for *_, pos in rows]
        if any(obj is None for obj in objects):
            held.band.stale = True
            self.dirty.add(sid)
            return
        held.band.restore(
            [
                Entry(g, value, ts, pos, oid, obj.expires_at)
                for (oid, value, g, ts, pos), obj in zip(rows, objects, strict=True)
            ],
            bound,
        )
        for obj in objects:
            self._hold(obj, sid)
        self.dirty.discard(sid)
