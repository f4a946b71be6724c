"""The window store: the objects an evaluator's partition owns that are in the deployment window.

SEMANTICS section 4: the window is global (a count window counts every
accepted object, a seconds window follows the global watermark), but each
object is kept only by its owner evaluator. The sequencer stamps every row
with the stream clock (objects accepted so far, watermark), so an evaluator
evicts exactly what has left the global window without seeing the other
partitions' objects (DESIGN "Top-k and kNN across evaluators").

The store answers the re-evaluations of the ranked subscriptions (Skype
section 6, Algorithm 2: "fetch all window messages with score >= theta"):
an inverted file ``term -> positions`` gives the objects that share a term
with a subscription, so a re-evaluation scores only those.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping

import orjson

from skpub.evaluators.durable import state_document, state_rows
from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.ranked import WindowObject
from skpub.kernel.config import Window
from skpub.kernel.records import POSITION_BITS

STATE_BLOCK = 25
"""A state block is ``STATE_BLOCK`` x ``STATE_BLOCK`` fine cells: the unit an evaluator saves."""
_BLOCK_ROW = 1 << 20


def block_of(cx: int, cy: int) -> int:
    """Return the state-block key of fine cell ``(cx, cy)``."""
    return (cy // STATE_BLOCK) * _BLOCK_ROW + cx // STATE_BLOCK


class WindowStore:
    """The window objects one evaluator owns, with eviction by count, watermark and ``expires_at``.

    Memory O(objects held + their distinct terms). :meth:`advance` is
    amortized O(1) per evicted object (a FIFO for the count window, heaps
    for times), plus O(terms) to unindex it.

    ``durable`` keeps what :meth:`take_segments` needs (the arrivals since
    its last call); without it the store keeps only the window.

    Saved state (the Spark engine's state store) is one *segment* per
    micro-batch of arrivals: :meth:`take_segments` serializes the objects
    that arrived since its last call and names the segments whose objects
    have all left. A segment is written once; objects that left it since are
    dropped again when it is read back (:meth:`restore` applies the clock).
    One state entry per batch, not per state block, because a state store
    call costs about a millisecond: per-block entries cost 11 s per 235,000
    GeoNames objects. Inside a segment every object records its state block
    (read by nothing today: window objects never move between evaluators,
    DESIGN "Top-k/kNN state does not move").
    """

    def __init__(self, window: Window, durable: bool = False) -> None:
        self.kind, self.size = window.kind, window.size
        self.durable = durable
        self.objects: dict[int, WindowObject] = {}
        self.postings: dict[str, set[int]] = {}
        self._arrivals: deque[tuple[int, int]] = deque()
        self._by_ts: list[tuple[float, int]] = []
        self._by_expiry: list[tuple[float, int]] = []
        self.segments: dict[int, int] = {}
        self.arrived: list[WindowObject] = []
        self.emptied: set[int] = set()
        self.accepted = 0
        self.watermark = -math.inf

    def __len__(self) -> int:
        return len(self.objects)

    def holds(self, obj: WindowObject, number: int) -> bool:
        """Whether object ``obj`` (accepted as number ``number``, 0-based) is in the window at the current clock."""
        if self.watermark >= obj.expires_at:
            return False
        if self.kind == "count":
            return number >= self.accepted - self.size
        if self.kind == "seconds":
            return obj.ts > self.watermark - self.size
        return True

    def add(self, obj: WindowObject) -> bool:
        """Keep ``obj`` if it is in the window now; return whether it was kept (a late object never enters)."""
        number, pos = obj.number, obj.pos
        if not self.holds(obj, number):
            return False
        self.objects[pos] = obj
        segment = pos >> POSITION_BITS
        self.segments[segment] = self.segments.get(segment, 0) + 1
        if self.durable:
            self.arrived.append(obj)
        postings = self.postings
        for t in obj.term_set:
            posting = postings.get(t)
            if posting is None:
                postings[t] = {pos}
            else:
                posting.add(pos)
        if self.kind == "count":
            self._arrivals.append((number, obj.pos))
        elif self.kind == "seconds":
            heapq.heappush(self._by_ts, (obj.ts, obj.pos))
        if obj.expires_at < math.inf:
            heapq.heappush(self._by_expiry, (obj.expires_at, obj.pos))
        return True

    def advance(self, accepted: int, watermark: float) -> list[WindowObject]:
        """Move the clock to ``accepted`` objects and ``watermark`` (NaN: none yet); return the objects that left.

        The clock only moves forward (a stale stamp changes nothing).
        """
        if accepted > self.accepted:
            self.accepted = accepted
        if watermark > self.watermark:  # NaN (no watermark yet) compares False
            self.watermark = watermark
        arrivals, by_ts, by_expiry, kind = self._arrivals, self._by_ts, self._by_expiry, self.kind
        oldest, edge = self.accepted - self.size, self.watermark - self.size
        if not (
            (by_expiry and by_expiry[0][0] <= self.watermark)
            or (kind == "count" and arrivals and arrivals[0][0] < oldest)
            or (kind == "seconds" and by_ts and by_ts[0][0] <= edge)
        ):
            return []  # nothing leaves: the common case, once per routed row
        gone: list[int] = []
        if kind == "count":
            while arrivals and arrivals[0][0] < oldest:
                gone.append(arrivals.popleft()[1])
        elif kind == "seconds":
            while by_ts and by_ts[0][0] <= edge:
                gone.append(heapq.heappop(by_ts)[1])
        while by_expiry and by_expiry[0][0] <= self.watermark:
            gone.append(heapq.heappop(by_expiry)[1])
        return self.discard(gone)

    def discard(self, positions: Iterable[int]) -> list[WindowObject]:
        """Forget the objects at ``positions`` (those still held); return them."""
        out = []
        for pos in positions:
            obj = self.objects.pop(pos, None)
            if obj is None:
                continue
            out.append(obj)
            segment = pos >> POSITION_BITS
            left = self.segments[segment] - 1
            if left:
                self.segments[segment] = left
            else:
                del self.segments[segment]
                if self.durable:
                    self.emptied.add(segment)
            for t in obj.term_set:
                posting = self.postings[t]
                posting.discard(pos)
                if not posting:
                    del self.postings[t]
        if len(self._by_expiry) > 2 * len(self.objects) + 64:  # entries of objects that left otherwise
            self._by_expiry = [(t, p) for t, p in self._by_expiry if p in self.objects]
            heapq.heapify(self._by_expiry)
        return out

    def sharing(self, terms: Iterable[str], rarest_only: bool = False) -> Iterable[WindowObject]:
        """Return the held objects that contain at least one of ``terms`` (only the rarest one's, if asked).

        ``rarest_only`` serves knn ``all``: every candidate holds every
        keyword, so the shortest posting list is a superset of them (CkQST
        section 3.2 indexes an AND query under its least frequent keyword).
        """
        lists = [self.postings.get(t, ()) for t in terms]
        if rarest_only:
            positions: Iterable[int] = min(lists, key=len, default=())
        else:
            positions = set().union(*lists) if len(lists) > 1 else (lists[0] if lists else ())
        objects = self.objects
        return [objects[p] for p in positions]

    def take_segments(self) -> dict[int, bytes | None]:
        """Return the segments to save since the last call: new ones serialized, emptied ones as None.

        Keys are micro-batch ids of arrival (positions ``>> POSITION_BITS``).
        """
        objects = self.objects
        out: dict[int, bytes | None] = {}
        by_segment: dict[int, list[WindowObject]] = {}
        for obj in self.arrived:
            if obj.pos in objects:
                by_segment.setdefault(obj.pos >> POSITION_BITS, []).append(obj)
        out.update((segment, encode_segment(objs)) for segment, objs in by_segment.items())
        out.update((segment, None) for segment in self.emptied if segment not in self.segments)
        self.arrived, self.emptied = [], set()
        return out

    @classmethod
    def restore(
        cls, window: Window, accepted: int, watermark: float, segments: Mapping[int, bytes], durable: bool = True
    ) -> WindowStore:
        """Rebuild a store at clock ``(accepted, watermark)`` from the segments of :meth:`take_segments`.

        Objects that have left the window by that clock are dropped.

        Raises
        ------
        EvaluatorError
            If a segment is damaged or of another format.
        """
        store = cls(window, durable)
        store.advance(accepted, watermark)
        objects = sorted((obj for data in segments.values() for obj in decode_segment(data)), key=lambda o: o.number)
        for obj in objects:
            store.add(obj)
        store.arrived, store.emptied = [], set()
        return store


def encode_segment(objects: Iterable[WindowObject]) -> bytes:
    """Serialize window objects as a versioned JSON document (never pickle: state must not execute on load).

    Each object is ``[pos, id, x, y, [terms], ts, expires_at or null, number, block]``.
    """
    rows = [
        [
            o.pos,
            o.id,
            o.x,
            o.y,
            list(o.terms),
            o.ts,
            None if o.expires_at == math.inf else o.expires_at,
            o.number,
            o.block,
        ]
        for o in objects
    ]
    return state_document(rows, "objects")


def decode_segment(data: bytes) -> list[WindowObject]:
    """Rebuild window objects from :func:`encode_segment` output.

    Raises
    ------
    EvaluatorError
        If ``data`` is not such a document of this format version.
    """
    try:
        out = []
        for pos, oid, x, y, terms, ts, expires_at, number, block in state_rows(data, "objects"):
            if type(pos) is not int or not isinstance(oid, str) or not all(isinstance(t, str) for t in terms):
                raise TypeError("an object has an integer position, a string id and string terms")
            words = tuple(terms)
            expires = math.inf if expires_at is None else float(expires_at)
            out.append(
                WindowObject(
                    pos, oid, float(x), float(y), words, frozenset(words), float(ts), expires, int(number), int(block)
                )
            )
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise EvaluatorError(f"damaged window segment: {exc}") from None
    return out
