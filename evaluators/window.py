"""The window store: the objects an evaluator's partition owns that are in the deployment window, as columns.

SEMANTICS section 4: the window is global (a count window counts every
accepted object, a seconds window follows the global watermark), but each
object is kept only by its owner evaluator. The sequencer stamps every row
with the stream clock (objects accepted so far, watermark), so an evaluator
evicts exactly what has left the global window without seeing the other
partitions' objects (DESIGN "Top-k and kNN across evaluators").

The store answers the re-evaluations of the ranked subscriptions (Skype
section 6, Algorithm 2: "fetch all window messages with score >= theta"):
an inverted file ``term -> objects`` gives the objects that share a term
with a subscription, so a re-evaluation scores only those.

Objects are kept as columns (issue 43 item 5, DESIGN "Window objects as
columns"): a micro-batch's objects join the store as one *chunk* of
arrays, and no Python object exists per window object unless a
subscription scores it. A chunk's inverted file is built in bulk (Arrow's
dictionary encoding, one stable sort) when a subscription first asks for
it; its objects leave through per-chunk sorted keys (arrival number,
time, ``expires_at``) and a heap over the chunks, so eviction is a
``searchsorted`` per chunk rather than a step per object. Small chunks
merge like a binary counter (a chunk at most twice the size of the one
after it takes it in), up to :data:`MERGE_ROWS` objects, and a chunk less
than half alive is rewritten with its living objects only, so a store holds
O(objects / MERGE_ROWS + log objects) chunks and at most twice its
objects in memory.

A micro-batch's objects are added before the ranked subscriptions' changes
of that batch are applied, and *arrive* in position order as the evaluator
applies its rows (:meth:`WindowStore.arrive_until`): everything the store
answers is as of the row being applied, as if the objects had been added
one by one.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from skpub.evaluators.durable import (
    CLOSE,
    COMMA,
    NOTHING,
    OPEN,
    json_lists,
    json_numbers,
    json_runs,
    state_documents_of,
    state_rows,
)
from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.ranked import WindowObject
from skpub.kernel.config import Window
from skpub.kernel.parts import json_strings
from skpub.kernel.records import POSITION_BITS

STATE_BLOCK = 25
"""A state block is ``STATE_BLOCK`` x ``STATE_BLOCK`` fine cells: the unit an evaluator saves."""
_BLOCK_ROW = 1 << 20
_TERMS = pa.list_(pa.string())
MERGE_ROWS = 1 << 12
"""Chunks merge only up to this many objects: larger ones are few, and a merge rebuilds the inverted file."""
RESOLUTIONS = 4
"""After this many changes of the terms of interest, a chunk maps every term of its dictionary (once)."""
CACHE_LIMIT = 1 << 16
"""Window objects kept as Python objects (those scored lately, with their tf-idf vectors) before the cache is
emptied: a bound on what the scoring adds to the columns' memory."""


def block_of(cx, cy):  # noqa: ANN001, ANN201 - ints, or int64 arrays of the same shape
    """Return the state-block key of fine cell ``(cx, cy)`` (ints, or int64 arrays: then an array of keys)."""
    return (cy // STATE_BLOCK) * _BLOCK_ROW + cx // STATE_BLOCK


@dataclass(frozen=True, slots=True)
class WindowColumns:
    """Window objects as columns, one row per object, in position order.

    ``pos``, ``number`` (0-based among accepted objects) and ``block`` (state
    block of its cell) are int64 arrays; ``x``, ``y`` (coordinate units),
    ``ts`` and ``expires`` (seconds; +inf when it has none) float64 arrays;
    ``ids`` an Arrow string array and ``terms`` an Arrow ``list<string>``
    array (normalized, repeats kept for tf), all of one length.
    """

    pos: np.ndarray
    ids: pa.Array
    x: np.ndarray
    y: np.ndarray
    terms: pa.Array
    ts: np.ndarray
    expires: np.ndarray
    number: np.ndarray
    block: np.ndarray

    def __len__(self) -> int:
        return len(self.pos)

    def take(self, rows: np.ndarray) -> WindowColumns:
        """Return the rows ``rows`` (an int64 index array) of these columns."""
        return WindowColumns(
            self.pos[rows], self.ids.take(rows), self.x[rows], self.y[rows], self.terms.take(rows),
            self.ts[rows], self.expires[rows], self.number[rows], self.block[rows],
        )  # fmt: skip

    @classmethod
    def concat(cls, parts: list[WindowColumns]) -> WindowColumns:
        """Return ``parts`` one after the other (at least one part)."""
        if len(parts) == 1:
            return parts[0]
        arrays = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _NUMERIC}
        ids = pa.concat_arrays([p.ids for p in parts])
        terms = pa.concat_arrays([p.terms for p in parts])
        return cls(ids=ids, terms=terms, **arrays)

    def objects(self) -> list[WindowObject]:
        """Return the rows as :class:`~skpub.evaluators.ranked.WindowObject` (what a handler scores). O(rows)."""
        out = []
        append = out.append
        for pos, oid, x, y, words, ts, expires, number, block in zip(
            self.pos.tolist(), self.ids.to_pylist(), self.x.tolist(), self.y.tolist(), self.terms.to_pylist(),
            self.ts.tolist(), self.expires.tolist(), self.number.tolist(), self.block.tolist(), strict=True,
        ):  # fmt: skip
            words = tuple(words or ())
            append(WindowObject(pos, oid, x, y, words, frozenset(words), ts, expires, number, block))
        return out


_NUMERIC = ("pos", "x", "y", "ts", "expires", "number", "block")


def key_of(obj, way: str):  # noqa: ANN001, ANN201 - WindowColumns (arrays) or WindowObject (a number)
    """Return the key on which ``obj`` (an object, or columns of objects) leaves the window the ``way`` way.

    ``number`` (a count window), ``ts`` (a seconds window) or ``expires``
    (every window): an object leaves once its key is at most
    :meth:`WindowStore.limit` of that way.
    """
    if way == "number":
        return obj.number
    if way == "ts":
        return obj.ts
    return obj.expires if isinstance(obj, WindowColumns) else obj.expires_at


def _empty_int() -> np.ndarray:
    return np.zeros(0, np.int64)


class _Postings:
    """A chunk's inverted file: its term occurrences grouped by term (CSR).

    ``rows[starts[c]:starts[c + 1]]`` are the rows holding the term of code
    ``c`` (its index in ``dictionary``; ascending rows, a row once per
    occurrence). ``code_of`` maps the store's terms of interest (those its
    subscriptions can ask for) to their codes; it is rebuilt in one Arrow
    pass over the dictionary when they change (``version``), rather than
    holding a Python string per distinct term. A chunk that outlives
    :data:`RESOLUTIONS` changes (small batches, ranked keywords coming all
    the time) maps every term of its dictionary once instead, so a change
    costs it nothing more.
    """

    __slots__ = ("dictionary", "rows", "starts", "code_of", "version", "resolutions")

    def __init__(self, terms: pa.Array) -> None:
        lengths = pc.fill_null(pc.list_value_length(terms), 0).to_numpy().astype(np.int64)
        encoded = pc.dictionary_encode(terms.flatten())
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        self.dictionary = encoded.dictionary
        parents = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        keys = np.sort(codes.astype(np.int64) * max(len(lengths), 1) + parents)  # by code, then row: all distinct
        self.rows = keys % max(len(lengths), 1)
        self.starts = np.zeros(len(self.dictionary) + 1, np.int64)
        np.cumsum(np.bincount(codes, minlength=len(self.dictionary)), out=self.starts[1:])
        self.code_of: dict[str, int] = {}
        self.version = -1
        self.resolutions = 0

    def kept(self, alive: np.ndarray) -> _Postings:
        """Return this inverted file for the chunk rewritten with its ``alive`` rows only (same dictionary)."""
        renumbered = np.cumsum(alive) - 1
        keep = alive[self.rows]
        codes = np.repeat(np.arange(len(self.dictionary), dtype=np.int64), np.diff(self.starts))[keep]
        out = _Postings.__new__(_Postings)
        out.dictionary, out.code_of, out.version = self.dictionary, self.code_of, self.version
        out.resolutions = self.resolutions
        out.rows = renumbered[self.rows[keep]]
        out.starts = np.zeros(len(self.dictionary) + 1, np.int64)
        np.cumsum(np.bincount(codes, minlength=len(self.dictionary)), out=out.starts[1:])
        return out

    def resolve(self, interest: pa.Array, terms: list[str], version: int) -> None:
        """Map the terms of interest (``terms``, also as the Arrow array ``interest``) to their codes here."""
        self.version = version
        if self.resolutions >= RESOLUTIONS:
            return  # every term is mapped already
        self.resolutions += 1
        if self.resolutions == RESOLUTIONS:
            self.code_of = dict(zip(self.dictionary.to_pylist(), range(len(self.dictionary)), strict=True))
            return
        where = pc.fill_null(pc.index_in(self.dictionary, value_set=interest), -1).to_numpy()
        codes = np.flatnonzero(where >= 0)
        self.code_of = {terms[j]: c for c, j in zip(codes.tolist(), where[codes].tolist(), strict=True)}

    def holding(self, term: str) -> np.ndarray:
        """Return the rows holding ``term`` (possibly dead or not arrived; a row once per occurrence)."""
        code = self.code_of.get(term)
        if code is None:
            return _empty_int()
        return self.rows[self.starts[code] : self.starts[code + 1]]


class _Chunk:
    """A run of window objects in position order: which are alive, which have arrived, and their eviction keys.

    ``queues[name]`` is ``[order, keys, next]``: the rows with a key for
    that way of leaving, sorted by it, and how many of them have been evicted.
    """

    __slots__ = ("cols", "seq", "alive", "live", "arrived", "queues", "postings")

    def __init__(self, cols: WindowColumns, seq: int, keys: Mapping[str, np.ndarray], arrived: int) -> None:
        self.cols, self.seq = cols, seq
        self.alive = np.ones(len(cols), bool)
        self.live = len(cols)
        self.arrived = arrived
        self.queues: dict[str, list] = {}
        for name, key in keys.items():
            rows = np.flatnonzero(~np.isnan(key) & (key != math.inf)) if key.dtype.kind == "f" else None
            values = key if rows is None else key[rows]
            order = np.argsort(values, kind="stable")
            self.queues[name] = [order if rows is None else rows[order], values[order], 0]
        self.postings: _Postings | None = None

    def __len__(self) -> int:
        return len(self.cols)

    def counted(self) -> np.ndarray:
        """Return which rows are alive and have arrived."""
        counted = self.alive.copy()
        counted[self.arrived :] = False
        return counted


class WindowStore:
    """The window objects one evaluator owns, with eviction by count, watermark and ``expires_at``.

    Memory O(objects held + their term occurrences) in arrays (at most twice
    the rows held, and a rewritten chunk keeps its first dictionary of
    terms), heaps of O(chunks) entries, and no Python object per window
    object but the last :data:`CACHE_LIMIT` scored. :meth:`add` is O(n log
    n) for a batch of n objects (amortized O(log objects) copies per object
    by the chunk merges); :meth:`advance` is O(1); forgetting what has left
    costs O(log chunks) per chunk with any, plus O(k) numpy work for the k
    objects that leave, when an answer first needs it.

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
        self.accepted = 0
        self.watermark = -math.inf
        self._chunks: list[_Chunk] = []  # in position order, none overlapping
        self._firsts: list[int] = []  # the first position of each
        self._by_seq: dict[int, _Chunk] = {}
        self._seq = 0
        self.ways: tuple[str, ...] = {"count": ("number", "expires"), "seconds": ("ts", "expires")}.get(
            self.kind, ("expires",)
        )
        """The ways an object leaves this window, by the key it leaves on: arrival ``number``, ``ts``, ``expires``."""
        self._heaps: dict[str, list[tuple[float, int]]] = {name: [] for name in self.ways}
        self._held = 0
        self._until = 0  # objects before this position have arrived
        self._interest: set[str] = set()
        self._interest_terms: list[str] = []
        self._interest_array = pa.array([], pa.string())
        self._interest_version = 0
        self._cache: dict[int, WindowObject] = {}
        self.segments: dict[int, int] = {}
        self.arrived: list[WindowColumns] = []
        self.emptied: set[int] = set()

    def __len__(self) -> int:
        self._arrive()
        self._settle()
        return self._held

    def __contains__(self, pos: int) -> bool:
        self._arrive()
        self._settle()
        found = self._locate(pos)
        return found is not None and found[1] < found[0].arrived

    # --- arrivals -----------------------------------------------------------------------

    def holds_many(self, cols: WindowColumns, accepted: np.ndarray, watermark: np.ndarray) -> np.ndarray:
        """Return which objects the window holds as each arrives, given each row's stamped clock.

        ``accepted`` (int64) and ``watermark`` (float64, NaN when unset) are
        the clocks the sequencer stamped on the rows, in stream order; a
        row's clock is the running maximum of them and of the store's own
        (NaN ignored), as :meth:`advance` would have moved it row by row. An
        object not held at its own arrival (a late one) never enters.
        """
        accepted = np.maximum.accumulate(np.maximum(accepted, self.accepted))
        watermark = np.fmax.accumulate(np.fmax(watermark, self.watermark))
        held = ~(watermark >= cols.expires)
        if self.kind == "count":
            held &= cols.number >= accepted - self.size
        elif self.kind == "seconds":
            held &= cols.ts > watermark - self.size
        return held

    def add(self, cols: WindowColumns) -> None:
        """Keep objects ``cols``, held by the window when they arrive; they arrive at :meth:`arrive_until`.

        Positions ascend and follow every object added before.

        Raises
        ------
        EvaluatorError
            If a position does not (a bug upstream); nothing is added.
        """
        if not len(cols):
            return
        if np.any(cols.pos[1:] <= cols.pos[:-1]) or (self._chunks and cols.pos[0] <= self._chunks[-1].cols.pos[-1]):
            raise EvaluatorError("window objects must arrive in position order, after every object held")
        self._arrive()
        self._settle()
        self._until = int(cols.pos[0])  # what was added before has arrived; these arrive from now on
        self._merge_tail()
        self._append(cols, arrived=0)
        for segment, count in _segment_counts(cols.pos):
            self.segments[segment] = self.segments.get(segment, 0) + count
        if self.durable:
            self.arrived.append(cols)

    def arrive_until(self, pos: float) -> None:
        """Let every object added before position ``pos`` (exclusive; ``math.inf``: all) be held from now on."""
        if pos > self._until:
            self._until = pos

    def _arrive(self) -> None:
        """Apply :meth:`arrive_until` to the chunks (the last ones are the only ones with objects to come)."""
        until = self._until
        for chunk in reversed(self._chunks):
            if chunk.arrived == len(chunk):
                break
            end = len(chunk) if until == math.inf else int(np.searchsorted(chunk.cols.pos, until, side="left"))
            if end <= chunk.arrived:
                continue
            self._held += int(np.count_nonzero(chunk.alive[chunk.arrived : end]))
            chunk.arrived = end

    # --- the clock and leaving ----------------------------------------------------------

    def advance(self, accepted: int, watermark: float) -> None:
        """Move the clock to ``accepted`` objects and ``watermark`` (NaN: none yet). O(1).

        The clock only moves forward (a stale stamp changes nothing). An
        object leaves a count window once ``number < accepted - size``, a
        seconds window once ``ts <= watermark - size``, and any window once
        ``expires_at <= watermark``; the store forgets it when it next needs
        to (every answer is as of the clock), and :class:`Departures` tells
        a caller which of the objects it tracks have left.
        """
        if accepted > self.accepted:
            self.accepted = accepted
        if watermark > self.watermark:  # NaN (no watermark yet) compares False
            self.watermark = watermark

    def _settle(self) -> None:
        """Forget every object that has left the window by the clock: a ``searchsorted`` per chunk with any."""
        touched: dict[int, _Chunk] = {}
        for name, heap in self._heaps.items():
            limit = self.limit(name)
            while heap and heap[0][0] <= limit:
                _, seq = heapq.heappop(heap)
                chunk = self._by_seq.get(seq)
                if chunk is None:
                    continue  # merged or rewritten since
                queue = chunk.queues[name]
                order, keys, start = queue
                end = int(np.searchsorted(keys, limit, side="right"))
                queue[2] = end
                if end < len(keys):
                    heapq.heappush(heap, (keys[end].item(), seq))
                self._kill(chunk, order[start:end])
                touched[seq] = chunk
        for chunk in touched.values():
            self._tidy(chunk)

    def _staying(self, chunk: _Chunk, rows: np.ndarray) -> np.ndarray:
        """Return which of ``rows`` (of ``chunk``) have not left the window by the clock, settled or not."""
        staying = np.ones(len(rows), bool)
        for name in self.ways:
            staying &= key_of(chunk.cols, name)[rows] > self.limit(name)
        return staying

    def limit(self, name: str) -> float:
        """Return the key at or below which an object leaves by ``name`` at the current clock."""
        if name == "number":
            return self.accepted - self.size - 1
        if name == "ts":
            return self.watermark - self.size
        return self.watermark

    def discard(self, positions: Iterable[int]) -> np.ndarray:
        """Forget the objects at ``positions`` (those still held, or still to arrive); return their positions."""
        self._settle()
        gone = []
        for pos in positions:
            found = self._locate(pos)
            if found is not None:
                gone.append(self._kill(found[0], np.array([found[1]], np.int64)))
                self._tidy(found[0])
        return np.concatenate(gone) if gone else _empty_int()

    def discard_before(self, pos: float) -> np.ndarray:
        """Forget every held object before position ``pos`` (``math.inf``: all held); return their positions."""
        self._arrive()
        self._settle()
        gone = []
        for chunk in list(self._chunks):
            if chunk.cols.pos[0] >= pos:
                break
            end = min(chunk.arrived, int(np.searchsorted(chunk.cols.pos, pos, side="left")))
            gone.append(self._kill(chunk, np.arange(end, dtype=np.int64)))
            self._tidy(chunk)
        return np.concatenate(gone) if gone else _empty_int()

    def _kill(self, chunk: _Chunk, rows: np.ndarray) -> np.ndarray:
        """Mark ``rows`` of ``chunk`` gone (those alive); return their positions."""
        rows = rows[chunk.alive[rows]]
        if not len(rows):
            return _empty_int()
        chunk.alive[rows] = False
        chunk.live -= len(rows)
        self._held -= int(np.count_nonzero(rows < chunk.arrived))
        positions = chunk.cols.pos[rows]
        for segment, count in _segment_counts(positions):
            left = self.segments[segment] - count
            if left:
                self.segments[segment] = left
            else:
                del self.segments[segment]
                if self.durable:
                    self.emptied.add(segment)
        if self._cache:
            for pos in positions.tolist():
                self._cache.pop(pos, None)
        return positions

    # --- chunks -------------------------------------------------------------------------

    def _chunk(self, cols: WindowColumns, arrived: int) -> _Chunk:
        """Return a new chunk of ``cols`` (its first ``arrived`` rows arrived), not yet in the store."""
        chunk = _Chunk(cols, self._seq, {name: key_of(cols, name) for name in self.ways}, arrived)
        self._seq += 1
        return chunk

    def _register(self, i: int, chunk: _Chunk) -> None:
        """Put ``chunk`` at index ``i`` of the chunks, with its departure keys in the heaps."""
        self._chunks.insert(i, chunk)
        self._firsts.insert(i, int(chunk.cols.pos[0]))
        self._by_seq[chunk.seq] = chunk
        for name, (_, keys, start) in chunk.queues.items():
            heap = self._heaps[name]
            if start < len(keys):
                heapq.heappush(heap, (keys[start].item(), chunk.seq))
            if len(heap) > 2 * len(self._chunks) + 64:  # entries of chunks merged, rewritten or dropped since
                heap[:] = [(key, seq) for key, seq in heap if seq in self._by_seq]
                heapq.heapify(heap)

    def _unregister(self, chunk: _Chunk) -> int:
        """Take ``chunk`` out of the store's chunks (its heap entries go stale); return its index."""
        i = self._chunks.index(chunk)
        del self._chunks[i], self._firsts[i], self._by_seq[chunk.seq]
        return i

    def _append(self, cols: WindowColumns, arrived: int) -> None:
        self._register(len(self._chunks), self._chunk(cols, arrived))

    def _merge_tail(self) -> None:
        """Merge the last chunks while one is at most twice the next (all of theirs arrived), up to :data:`MERGE_ROWS`.

        A store of n objects then holds O(n / MERGE_ROWS + log n) chunks
        however small its batches. All or nothing: the merged chunk is built
        before the two leave.
        """
        chunks = self._chunks
        while (
            len(chunks) >= 2
            and chunks[-1].arrived == len(chunks[-1])
            and chunks[-2].live <= 2 * chunks[-1].live
            and chunks[-2].live + chunks[-1].live <= MERGE_ROWS
        ):
            before, last = chunks[-2], chunks[-1]
            cols = WindowColumns.concat([c.cols.take(np.flatnonzero(c.alive)) for c in (before, last)])
            merged = self._chunk(cols, arrived=len(cols)) if len(cols) else None
            self._unregister(last)
            i = self._unregister(before)
            if merged is not None:
                self._register(i, merged)

    def _tidy(self, chunk: _Chunk) -> None:
        """Drop an empty chunk; rewrite one less than half alive (all arrived) with its living objects."""
        if chunk.live and (chunk.live * 2 >= len(chunk) or chunk.arrived < len(chunk)):
            return
        if chunk.seq not in self._by_seq:
            return
        if not chunk.live:
            self._unregister(chunk)
            return
        fresh = self._chunk(chunk.cols.take(np.flatnonzero(chunk.alive)), arrived=chunk.live)
        if chunk.postings is not None:
            fresh.postings = chunk.postings.kept(chunk.alive)
        self._register(self._unregister(chunk), fresh)

    def _locate(self, pos: int) -> tuple[_Chunk, int] | None:
        """Return the chunk and row of the object at ``pos``, alive (arrived or not); None if there is none."""
        i = bisect.bisect_right(self._firsts, pos) - 1
        if i < 0:
            return None
        chunk = self._chunks[i]
        row = int(np.searchsorted(chunk.cols.pos, pos))
        if row < len(chunk) and chunk.cols.pos[row] == pos and chunk.alive[row]:
            return chunk, row
        return None

    # --- reading ------------------------------------------------------------------------

    def get(self, pos: int) -> WindowObject | None:
        """Return the held object at ``pos`` as a :class:`WindowObject`, or None."""
        self._arrive()
        self._settle()
        found = self._locate(pos)
        if found is None or found[1] >= found[0].arrived:
            return None
        return self._objects(found[0], np.array([found[1]], np.int64))[0]

    def remember(self, obj: WindowObject) -> None:
        """Keep ``obj`` (an object of this store, as a :class:`WindowObject`) for the next reads of it."""
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[obj.pos] = obj

    def _objects(self, chunk: _Chunk, rows: np.ndarray) -> list[WindowObject]:
        """Return rows ``rows`` of ``chunk`` as window objects (those scored lately as they were, tf-idf included)."""
        cache = self._cache
        positions = chunk.cols.pos[rows].tolist()
        found = {pos: cache[pos] for pos in positions if pos in cache}
        if len(found) < len(positions):
            missing = np.array([i for i, pos in enumerate(positions) if pos not in found], np.int64)
            for obj in chunk.cols.take(rows[missing]).objects():
                self.remember(obj)
                found[obj.pos] = obj
        return [found[pos] for pos in positions]

    def interest(self, terms: Iterable[str]) -> None:
        """Name the terms the store's lookups will ask for (the keywords of the subscriptions held and arriving).

        Each chunk maps them to its codes once, in one Arrow pass over its
        dictionary, when they change; a lookup of another term still
        answers right, after mapping it in every chunk.
        """
        wanted = set(terms)
        if wanted != self._interest:
            self._interest = wanted
            self._interest_terms = sorted(wanted)
            self._interest_array = pa.array(self._interest_terms, pa.string())
            self._interest_version += 1

    def _index(self, chunk: _Chunk, terms: list[str]) -> _Postings:
        """Return ``chunk``'s inverted file, built on first use (O(term occurrences)), ``terms`` mapped."""
        if chunk.postings is None:
            chunk.postings = _Postings(chunk.cols.terms)
        if not self._interest.issuperset(terms):
            self.interest(self._interest.union(terms))
        if chunk.postings.version != self._interest_version:
            chunk.postings.resolve(self._interest_array, self._interest_terms, self._interest_version)
        return chunk.postings

    def shares_any(self, terms: Iterable[str]) -> bool:
        """Whether a held object contains one of ``terms``: O(chunks x terms) lookups, and a mask of the rows found."""
        self._arrive()
        terms = list(terms)
        for chunk in self._chunks:
            postings = self._index(chunk, terms)
            for t in terms:
                rows = postings.holding(t)
                if len(rows):
                    rows = rows[: np.searchsorted(rows, chunk.arrived)]
                    rows = rows[chunk.alive[rows]]
                    if len(rows) and self._staying(chunk, rows).any():
                        return True
        return False

    def sharing(self, terms: Iterable[str], rarest_only: bool = False) -> list[WindowObject]:
        """Return the held objects that contain at least one of ``terms`` (only the rarest one's, if asked).

        ``rarest_only`` serves knn ``all``: every candidate holds every
        keyword, so the shortest posting list is a superset of them (CkQST
        section 3.2 indexes an AND query under its least frequent keyword).
        In position order.
        """
        self._arrive()
        self._settle()
        terms = list(terms)
        found: dict[str, list[tuple[_Chunk, np.ndarray]]] = {t: [] for t in terms}
        for chunk in self._chunks:
            postings = self._index(chunk, terms)
            for t in terms:
                rows = postings.holding(t)
                rows = rows[rows < chunk.arrived]
                rows = rows[chunk.alive[rows]]
                if len(rows):
                    found[t].append((chunk, rows))
        if rarest_only and terms:
            rarest = min(terms, key=lambda t: sum(len(np.unique(rows)) for _, rows in found[t]))
            lists = found[rarest]
        else:
            lists = [pair for t in terms for pair in found[t]]
        by_chunk: dict[int, tuple[_Chunk, list[np.ndarray]]] = {}
        for chunk, rows in lists:
            by_chunk.setdefault(chunk.seq, (chunk, []))[1].append(rows)
        out: list[WindowObject] = []
        for chunk in self._chunks:
            if chunk.seq in by_chunk:
                out.extend(self._objects(chunk, np.unique(np.concatenate(by_chunk[chunk.seq][1]))))
        return out

    def held(self) -> WindowColumns | None:
        """Return every held object as columns in position order (None when there is none). O(objects held)."""
        self._arrive()
        self._settle()
        parts = [c.cols.take(np.flatnonzero(c.counted())) for c in self._chunks]
        parts = [p for p in parts if len(p)]
        return WindowColumns.concat(parts) if parts else None

    def _held_of(self, cols: WindowColumns) -> np.ndarray:
        """Return which rows of ``cols`` (objects added to this store, in position order) are held now."""
        held = np.zeros(len(cols), bool)
        for chunk in self._chunks:
            lo = int(np.searchsorted(cols.pos, chunk.cols.pos[0], side="left"))
            hi = int(np.searchsorted(cols.pos, chunk.cols.pos[-1], side="right"))
            if lo >= hi:
                continue
            wanted = cols.pos[lo:hi]
            rows = np.minimum(np.searchsorted(chunk.cols.pos, wanted), len(chunk) - 1)
            held[lo:hi] = (chunk.cols.pos[rows] == wanted) & chunk.alive[rows] & (rows < chunk.arrived)
        return held

    # --- durable state ------------------------------------------------------------------

    def take_segments(self) -> dict[int, bytes | None]:
        """Return the segments to save since the last call: new ones serialized, emptied ones as None.

        Keys are micro-batch ids of arrival (positions ``>> POSITION_BITS``).
        """
        self._arrive()
        self._settle()
        by_segment: dict[int, list[WindowColumns]] = {}
        for cols in self.arrived:
            kept = cols.take(np.flatnonzero(self._held_of(cols)))
            for segment, part in segments_of(kept):
                by_segment.setdefault(segment, []).append(part)
        out: dict[int, bytes | None] = {s: encode_segment(WindowColumns.concat(p)) for s, p in by_segment.items()}
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
        parts = [cols for data in segments.values() if len(cols := decode_segment(data))]
        if parts:
            cols = WindowColumns.concat(parts)
            cols = cols.take(np.argsort(cols.pos, kind="stable"))
            if np.any(cols.pos[1:] == cols.pos[:-1]):
                raise EvaluatorError("damaged window segments: a position is in two of them")
            n = len(cols)
            held = store.holds_many(cols, np.full(n, store.accepted), np.full(n, store.watermark))
            store.add(cols.take(np.flatnonzero(held)))
        store.arrive_until(math.inf)
        store.arrived, store.emptied = [], set()
        return store


class Departures:
    """The objects a caller watches (those a buffer holds), by when they leave the window: which have left.

    One heap per way of leaving of ``store``'s window; O(log n) per object
    tracked, and O(1) to find that none has left. ``watched`` is what the
    caller still watches (positions): entries of the others are dropped when
    a heap grows past twice its size, so memory follows it.
    """

    def __init__(self, store: WindowStore, watched: Container[int]) -> None:
        self.store, self.watched = store, watched
        self.heaps: dict[str, list[tuple[float, int]]] = {name: [] for name in store.ways}

    def track(self, obj: WindowObject) -> None:
        """Watch ``obj``, an object the store holds."""
        for name, heap in self.heaps.items():
            key = key_of(obj, name)
            if key < math.inf:
                heapq.heappush(heap, (key, obj.pos))
                if len(heap) > 2 * len(self.watched) + 64:
                    heap[:] = sorted({entry for entry in heap if entry[1] in self.watched})  # sorted: a heap

    def left(self) -> list[int]:
        """Return the positions of the objects tracked that have left by the store's clock (each once per way)."""
        out = []
        for name, heap in self.heaps.items():
            limit = self.store.limit(name)
            while heap and heap[0][0] <= limit:
                out.append(heapq.heappop(heap)[1])
        return out


def _segment_counts(positions: np.ndarray) -> list[tuple[int, int]]:
    """Return ``(segment, objects)`` of ``positions`` (a batch's positions share one segment: one pass then)."""
    first, last = int(positions.min()) >> POSITION_BITS, int(positions.max()) >> POSITION_BITS
    if first == last:
        return [(first, len(positions))]
    segments, counts = np.unique(positions >> POSITION_BITS, return_counts=True)
    return list(zip(segments.tolist(), counts.tolist(), strict=True))


def segments_of(cols: WindowColumns) -> list[tuple[int, WindowColumns]]:
    """Split objects in position order by segment (micro-batch of arrival, ``pos >> POSITION_BITS``)."""
    if not len(cols):
        return []
    segment = cols.pos >> POSITION_BITS
    cuts = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(cols)]
    return [
        (int(segment[a]), cols.take(np.arange(a, b, dtype=np.int64)))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def encode_segment(cols: WindowColumns) -> bytes:
    """Serialize window objects as a versioned JSON document (never pickle: state must not execute on load).

    Each object is ``[pos, id, x, y, [terms], ts, expires_at or null, number,
    block]``. The text is written in Arrow, with no Python object per object
    (issue 43, item 5): strings as orjson writes them
    (:func:`~skpub.kernel.parts.json_strings`), floats as their shortest
    round-trip digits (:func:`~skpub.evaluators.durable.json_numbers`), so
    :func:`decode_segment` reads back the same columns. O(objects + terms) in C.
    """
    lengths = pc.list_value_length(cols.terms).to_numpy(zero_copy_only=False)
    words = json_runs(json_strings(pc.list_flatten(cols.terms)), lengths)
    pieces = [OPEN, json_numbers(cols.pos), COMMA, json_strings(cols.ids), COMMA, json_numbers(cols.x), COMMA,
              json_numbers(cols.y), COMMA, json_lists(words), COMMA, json_numbers(cols.ts), COMMA,
              json_numbers(cols.expires), COMMA, json_numbers(cols.number), COMMA, json_numbers(cols.block),
              CLOSE]  # fmt: skip
    rows = pc.binary_join_element_wise(*pieces, NOTHING)
    return state_documents_of(pa.LargeListArray.from_arrays(pa.array([0, len(rows)], pa.int64()), rows), "objects")[
        0
    ].as_py()


def decode_segment(data: bytes) -> WindowColumns:
    """Rebuild window objects from :func:`encode_segment` output, as columns.

    Raises
    ------
    EvaluatorError
        If ``data`` is not such a document of this format version.
    """
    try:
        rows = state_rows(data, "objects")
        for row in rows:
            pos, oid, _, _, terms, *_ = row
            if type(pos) is not int or not isinstance(oid, str) or not all(isinstance(t, str) for t in terms):
                raise TypeError("an object has an integer position, a string id and string terms")
        columns = list(zip(*rows, strict=True)) if rows else [()] * 9
        pos, ids, x, y, terms, ts, expires, number, block = columns
        return WindowColumns(
            np.array(pos, np.int64),
            pa.array(ids, pa.string()),
            np.array(x, np.float64),
            np.array(y, np.float64),
            pa.array([list(t) for t in terms], _TERMS),
            np.array(ts, np.float64),
            np.array([math.inf if e is None else e for e in expires], np.float64),
            np.array(number, np.int64),
            np.array(block, np.int64),
        )
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise EvaluatorError(f"damaged window segment: {exc}") from None
