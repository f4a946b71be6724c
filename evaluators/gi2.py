"""GI^2, the Grid-Inverted-Index for boolean range subscriptions (PS2Stream section IV-C), as arrays.

PS2Stream's structure: the evaluator's cells (blocks of ``index_block x
index_block`` fine cells) each hold an inverted index ``keyword -> [entries]``.
A subscription is entered, in every index cell its rectangle ∩ partition
overlaps, in the list of the least frequent keyword of each of its DNF
clauses (so an OR expression has one entry per clause keyword). An object
looks up only its own index cell and only the lists of its own terms, then
the exact rectangle and expression are checked.

Here the lists are flat arrays (issue 43, "GI^2 as arrays"), so a whole
micro-batch of objects is matched by a fixed number of numpy passes rather
than a Python step per (object, candidate) pair:

- *Term ids.* Each index numbers the terms of the subscriptions it holds
  (``term_ids``, dense ints in arrival order). An object's terms are mapped
  through it by exact string equality once per batch (Arrow's ``index_in``
  against the known terms in id order, or, when the known terms outnumber
  the batch's four to one, a dict lookup per distinct term), so a term id never
  stands for two strings and no hash collision can change a result. The
  ids are this index's own: they never leave the process, and a restore
  numbers the terms anew (DESIGN "Term ids are per index").
- *Postings.* One ``int64`` key per list entry, ``cell << 32 | term id``
  (``cell`` the index cell, ``gy * 2**15 + gx``, or :data:`_WIDE`), with the
  subscription's slot beside it; kept sorted in a main array and a smaller
  delta array, merged when the delta grows past a fraction of the main one
  (a log-structured merge, so an insert costs O(its entries) amortized and a
  batch's inserts one sort). New subscriptions wait in Python lists and
  their entries in arrays (:class:`_Pending`) until the next lookup, or
  until they hold 16,384 entries, which turns them into the sorted arrays
  at once; a batch's subscriptions are filed together
  (:meth:`GI2Index.insert_many`).
- *Subscriptions.* One slot per indexed subscription: rectangle (``float64``),
  the cell box it is indexed over (``int32``), the stream positions it is
  live between (``born`` its subscribe, ``died`` its unsubscribe), and its
  clauses as term-id runs with each clause's keyword. No Python record is
  kept: a live subscription costs its id and a few dozen array bytes.
- *Matching a batch* (:meth:`GI2Index.match_many`): the objects' ``(row,
  term)`` pairs become keys, ``searchsorted`` finds each key's entries, and
  the candidates (Tornado's ``q_l``) are those live at the object's
  position; the rectangle test and the clause test (every term of some
  clause among the object's terms, by a ``searchsorted`` over the sorted
  ``(row, term)`` keys) run on the candidate arrays. Liveness by position is
  what lets one pass serve a batch in which subscriptions arrive and leave
  between objects: a subscription matches the objects after its subscribe
  and before its unsubscribe, as SEMANTICS section 3 says.

Deletion is lazy (PS2Stream IV-C): an unsubscribed or moved-away slot stays
until dead slots outnumber live ones (and :data:`COMPACT_MIN_DELETED`); then
:meth:`GI2Index.compact` drops them, renumbers the slots and the terms, so
memory stays O(live entries).

A *wide* subscription, one that would need more than ``WIDE_ENTRIES``
entries (index cells covered x clause keywords), is not copied into each
cell: its entries go to the evaluator-wide cell :data:`_WIDE` that every
object also looks up, so no subscription costs more than ``WIDE_ENTRIES``
entries however large its rectangle (a whole-space rectangle with 256
clauses would otherwise write 62,500 x 256). The bound is on entries, not
cells, so ordinary rectangles with a few keywords stay in their cells.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from skpub.evaluators.durable import COMMA, NOTHING, OPEN, json_lists, json_numbers, json_runs, json_token
from skpub.kernel.config import INDEX_SIDE
from skpub.kernel.grid import CellBox
from skpub.kernel.parts import json_strings
from skpub.kernel.records import RangeSubscription
from skpub.kernel.text import Vocabulary

COMPACT_MIN_DELETED = 1024
WIDE_ENTRIES = 65_536
SIDE = INDEX_SIDE
"""Index cells per side a cell key can name (a deployment checks ``grid_size // index_block < SIDE``)."""
_WIDE = SIDE * SIDE
_LOW = (1 << 32) - 1
_NEVER = np.iinfo(np.int64).max
_DELTA_MIN = 1 << 16
_NO_IDS = pa.array([], pa.string()).dictionary_encode()
CHUNK_OBJECTS = 1 << 14
"""Objects matched at once by :meth:`GI2Index.match_many` (their candidates are arrays)."""
EXPANSION = 1 << 22
"""Most (candidate, clause term) pairs a clause test expands at once."""
_PENDING_MAX = 1 << 14
"""Most entries kept pending (:class:`_Pending`) before they are merged into the sorted arrays."""
_INSERT_ENTRIES = 1 << 13
"""Most entries :meth:`GI2Index.insert_many` lays out at once (one subscription at least)."""


@dataclass
class ObjectBatch:
    """The objects of one micro-batch as the index reads them, row ``i`` one object, in stream order.

    Attributes
    ----------
    pos : ndarray, shape (n,), int64
        Stream positions, ascending.
    x, y : ndarray, shape (n,), float64
        Coordinates, space units.
    cx, cy : ndarray, shape (n,), int64
        Fine cells.
    terms : pyarrow list array of strings, length n
        Normalized terms (repeats allowed).
    only : pyarrow list array of strings, length n, or None
        Per row, null (every term) or the terms this evaluator answers for
        (an object of a text-partitioned rectangle, PS2Stream IV-C).
    """

    pos: np.ndarray
    x: np.ndarray
    y: np.ndarray
    cx: np.ndarray
    cy: np.ndarray
    terms: pa.Array
    only: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.pos)

    def slice(self, start: int, stop: int) -> ObjectBatch:
        """Return rows ``start`` to ``stop`` (views, no copy)."""
        only = None if self.only is None else self.only.slice(start, stop - start)
        return ObjectBatch(
            self.pos[start:stop], self.x[start:stop], self.y[start:stop], self.cx[start:stop], self.cy[start:stop],
            self.terms.slice(start, stop - start), only,
        )  # fmt: skip


@dataclass
class BatchMatches:
    """What :meth:`GI2Index.match_many` found.

    ``rows`` (ndarray, int64) and ``sids`` (a dictionary-encoded Arrow
    string array: each distinct id once) are the matches ``(object row,
    subscription id)``, ordered by row, then by the
    subscription's subscribe position (a canonical order: the same after a
    restore, a move or a compaction, so a replay writes the same bytes);
    ``examined`` (ndarray, shape (n,), int64) the candidates of each object,
    ``q_l`` of Tornado equation 1.
    """

    rows: np.ndarray
    sids: pa.DictionaryArray
    examined: np.ndarray


@dataclass
class _Pending:
    """Subscriptions inserted since the last lookup (slot ``first + i`` is row ``i``) and their entries.

    The subscriptions' columns are Python lists; the entries are int64 key and int32 slot arrays, one per
    insert run or widening, ``entries`` of them in all.
    """

    first: int = 0
    rects: list = field(default_factory=list)
    boxes: list = field(default_factory=list)
    born: list = field(default_factory=list)
    died: list = field(default_factory=list)
    trivial: list = field(default_factory=list)
    clauses: list = field(default_factory=list)  # per slot: its clause count
    clause_lengths: list = field(default_factory=list)
    clause_keys: list = field(default_factory=list)
    terms: list = field(default_factory=list)
    keys: list = field(default_factory=list)  # entries of new and widened slots, in int64 arrays
    slots: list = field(default_factory=list)  # their slots, in int32 arrays
    entries: int = 0  # in ``keys``


class _Grow:
    """A numpy array that grows geometrically: ``values[:n]`` is the content."""

    def __init__(self, dtype: type, width: int = 0) -> None:
        self.values = np.empty((16, width) if width else 16, dtype=dtype)
        self.n = 0

    def extend(self, values: np.ndarray | list) -> None:
        values = np.asarray(values, dtype=self.values.dtype)
        end = self.n + len(values)
        if end > len(self.values):
            grown = np.empty((max(end, 2 * len(self.values)), *self.values.shape[1:]), dtype=self.values.dtype)
            grown[: self.n] = self.values[: self.n]
            self.values = grown
        self.values[self.n : end] = values
        self.n = end

    @property
    def view(self) -> np.ndarray:
        return self.values[: self.n]

    def replace(self, values: np.ndarray) -> None:
        self.values, self.n = np.array(values, dtype=self.values.dtype), len(values)


def _expand(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(owner, index)``: for each ``i``, every ``index`` in ``range(lo[i], hi[i])`` with ``owner`` ``i``."""
    lengths = hi - lo
    owner = np.repeat(np.arange(len(lo)), lengths)
    starts = np.cumsum(lengths) - lengths
    return owner, np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts - lo, lengths)


_COMMA_OPEN, _CLOSE_COMMA, _CLOSE_CLOSE = map(json_token, (",[", "],", "]]"))


def _member(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Return, per element of ``keys``, whether it is in the ascending array ``sorted_keys``."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def _merge(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge two key-sorted ``(keys, slots)`` runs (a stable sort of two runs: O(n) in timsort)."""
    keys = np.concatenate([a[0], b[0]])
    order = np.argsort(keys, kind="stable")
    return keys[order], np.concatenate([a[1], b[1]])[order]


class GI2Index:
    """The GI^2 index of one evaluator.

    Parameters
    ----------
    index_block : int
        Fine cells per side of one index cell.
    vocabulary : Vocabulary
        Picks each clause's least frequent keyword.

    Raises
    ------
    ValueError
        From :meth:`insert`, if a box reaches index cell :data:`SIDE` on a side.
    """

    def __init__(self, index_block: int, vocabulary: Vocabulary) -> None:
        self.index_block = index_block
        self.vocabulary = vocabulary
        self.term_ids: dict[str, int] = {}
        self._names_array: pa.Array | None = None  # term_ids' keys in id order, for Arrow's index_in
        self._names_of: dict[str, int] | None = None
        self.slot_of: dict[str, int] = {}
        self.sids: list[str] = []
        self.rects = _Grow(np.float64, 4)
        self.boxes = _Grow(np.int32, 4)
        self.born = _Grow(np.int64)
        self.died = _Grow(np.int64)
        self.trivial = _Grow(np.bool_)
        self.clauses = _Grow(np.int64, 2)  # per slot: first clause, end clause
        self.clause_terms = _Grow(np.int64, 2)  # per clause: first term, end term (in ``terms``)
        self.clause_keys = _Grow(np.int64)  # per clause: its keyword's term id
        self.terms = _Grow(np.int64)
        self.main = (np.empty(0, np.int64), np.empty(0, np.int32))
        self.delta = (np.empty(0, np.int64), np.empty(0, np.int32))
        self.pending = _Pending()
        self.dead = 0
        self.wide = 0  # nonzero when the wide cell may hold entries (some dead): otherwise objects skip its lookup

    def __len__(self) -> int:
        """Return the number of live subscriptions."""
        return len(self.slot_of)

    def __contains__(self, sub_id: str) -> bool:
        """Whether subscription ``sub_id`` is live here."""
        return sub_id in self.slot_of

    # ------------------------------------------------------------------ keys

    def _added_cell_keys(self, old: CellBox, new: CellBox) -> list[int]:
        """Return the keys of the index cells ``new`` meets and ``old`` does not, row by row.

        O(rows of ``new`` + the keys returned).
        """
        b = self.index_block
        ox0, oy0, ox1, oy1 = (c // b for c in old)
        nx0, ny0, nx1, ny1 = (c // b for c in new)
        if max(nx1, ny1) >= SIDE:
            raise ValueError(f"cell box {new} reaches past {SIDE} index cells a side")
        keys = []
        for gy in range(ny0, ny1 + 1):
            if oy0 <= gy <= oy1:
                xs = itertools.chain(range(nx0, min(ox0, nx1 + 1)), range(max(ox1 + 1, nx0), nx1 + 1))
            else:
                xs = range(nx0, nx1 + 1)
            keys.extend(gy * SIDE + gx for gx in xs)
        return keys

    def _names(self) -> pa.Array:
        """Return the terms this index knows, as an Arrow array in term-id order.

        Ids are dense in arrival order (the dict's order), so new terms only
        extend it: O(new terms) to take them from the dict's end, plus a copy
        in C. Rebuilt, O(terms), when the terms were numbered anew (a
        compaction makes a new dict) or cut back.
        """
        names, known = self._names_array, len(self.term_ids)
        if names is None or self._names_of is not self.term_ids or len(names) > known:
            names = pa.array(list(self.term_ids), pa.string())
        elif len(names) < known:
            new = list(itertools.islice(reversed(self.term_ids), known - len(names)))
            names = pa.concat_arrays([names, pa.array(new[::-1], pa.string())])
        self._names_array, self._names_of = names, self.term_ids
        return names

    def _term_id(self, term: str) -> int:
        tid = self.term_ids.get(term)
        if tid is None:
            tid = self.term_ids[term] = len(self.term_ids)
        return tid

    def _is_wide(self, box: CellBox, keywords: frozenset[str]) -> bool:
        b = self.index_block
        return (box[2] // b - box[0] // b + 1) * (box[3] // b - box[1] // b + 1) * len(keywords) > WIDE_ENTRIES

    def _queue(self, slot: int, cells: list[int], keywords: frozenset[str]) -> None:
        """Queue the entries of ``slot`` in the lists of ``keywords`` in index cells ``cells`` (no flush)."""
        tids = [self._term_id(k) for k in keywords]
        keys = np.array([cell << 32 | t for cell in cells for t in tids], dtype=np.int64)
        if not len(keys):
            return
        slots = np.full(len(keys), slot, dtype=np.int32)
        new = self.pending
        new.keys.append(keys)
        try:
            new.slots.append(slots)
        except BaseException:
            new.keys.pop()
            raise
        new.entries += len(keys)

    # ------------------------------------------------------------------ changes

    def insert(self, sub: RangeSubscription, box: CellBox) -> None:
        """Index ``sub`` over the fine-cell box ``box``: :meth:`insert_many` of one."""
        self.insert_many([sub], [box])

    def insert_many(self, subs: Sequence[RangeSubscription], boxes: Sequence[CellBox]) -> None:
        """Index each of ``subs`` over its fine-cell box in ``boxes`` (rectangle ∩ partition), live from its ``pos`` on.

        What :meth:`insert` of each in turn gives, computed for many at once
        (issue 43: a micro-batch's subscribes, a restore's blocks, a move's
        parts): each clause is filed under its least frequent term
        (:meth:`~skpub.kernel.text.Vocabulary.least_frequent`'s order: document
        frequency, then longest, then code point order, ranked once per
        distinct term), the entries of every (index cell, summary keyword)
        pair are laid out with ``repeat``, and the slots' columns join the
        pending state with one ``extend`` (or array ``append``) each. Python work is one pass over
        the subscriptions' clause terms plus one sort of the distinct terms;
        O(entries) in numpy, at most ``WIDE_ENTRIES`` a subscription (a wider
        one costs O(clauses)). The subscriptions go in runs of at most
        :data:`_INSERT_ENTRIES` entries (one subscription at least), the
        pending entries flushed past :data:`_PENDING_MAX` after each, so a
        restore of millions holds no more transient entries than one
        subscription at a time did. All or nothing: what cannot be indexed is
        refused before anything changes, and should a later run fail, the
        earlier runs' subscriptions are removed (:meth:`remove_many`).

        Raises
        ------
        ValueError
            If a box is inverted, negative or reaches index cell :data:`SIDE`
            on a side, a clause has no term, or a subscription is indexed here
            already or named twice (nothing is indexed then).
        """
        n = len(subs)
        if not n:
            return
        box = np.array(boxes, dtype=np.int64).reshape(n, 4)
        g = box // self.index_block
        bad = np.flatnonzero(
            (np.maximum(g[:, 2], g[:, 3]) >= SIDE) | (box[:, 0] < 0) | (box[:, 1] < 0)
            | (box[:, 0] > box[:, 2]) | (box[:, 1] > box[:, 3])
        )  # fmt: skip
        if len(bad):
            raise ValueError(f"cell box {tuple(boxes[bad[0]])} is not a box within {SIDE} index cells a side")
        if not all(clause for sub in subs for clause in sub.dnf):
            raise ValueError("a clause has no term")
        ids = [sub.id for sub in subs]
        if len(set(ids)) < n or any(sid in self.slot_of for sid in ids):
            raise ValueError("a subscription is indexed here already, or named twice")
        counts = np.fromiter((len(sub.dnf) for sub in subs), np.int64, n)
        cells = (g[:, 2] - g[:, 0] + 1) * (g[:, 3] - g[:, 1] + 1)
        most = np.minimum(cells * counts, np.maximum(WIDE_ENTRIES, counts))  # entries a subscription may take
        ends = np.cumsum(most)
        lo = done = 0
        try:
            while lo < n:
                hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] - most[lo] + _INSERT_ENTRIES, side="right")))
                self._insert_run(subs[lo:hi], boxes[lo:hi], g[lo:hi], counts[lo:hi])
                lo = done = hi
                if self.pending.entries > _PENDING_MAX:
                    self._flush()
        except BaseException:
            self.remove_many(ids[:done])
            raise

    def _insert_run(
        self, subs: Sequence[RangeSubscription], boxes: Sequence[CellBox], g: np.ndarray, counts: np.ndarray
    ) -> None:
        """Index one run of :meth:`insert_many` (``g``: their boxes in index cells, ``counts``: their clauses).

        The same filing as :meth:`widen` (:meth:`_is_wide`, :meth:`_queue`), vectorized. Every value is
        computed first; should appending them fail, the pending lists and the new term ids are cut back, so
        the run is all or nothing.
        """
        n = len(subs)
        gx0, gy0, gx1, gy1 = g.T
        clauses = [clause for sub in subs for clause in sub.dnf]
        lengths = np.fromiter(map(len, clauses), np.int64, len(clauses))
        words = [term for clause in clauses for term in clause]
        names = list(dict.fromkeys(words))
        index_of = {t: i for i, t in enumerate(names)}
        occurrence = np.fromiter(map(index_of.__getitem__, words), np.int64, len(words))
        # every distinct term's rank in least_frequent's order: df, then longest, then code points
        df = self.vocabulary.df
        lexical = np.empty(len(names), np.int64)
        lexical[np.fromiter(map(index_of.__getitem__, sorted(names)), np.int64, len(names))] = np.arange(len(names))
        frequency = np.fromiter(map(df.get, names, itertools.repeat(1)), np.int64, len(names))
        size = np.fromiter(map(len, names), np.int64, len(names))
        by_rank = np.lexsort((lexical, -size, frequency))
        rank = np.empty(len(names), np.int64)
        rank[by_rank] = np.arange(len(names))
        clause_starts = np.cumsum(lengths) - lengths
        least = by_rank[np.minimum.reduceat(rank[occurrence], clause_starts)] if len(clauses) else occurrence[:0]
        tid = np.fromiter(map(self.term_ids.get, names, itertools.repeat(-1)), np.int64, len(names))
        new_terms = np.flatnonzero(tid < 0)  # numbered in order of first appearance, after those known
        tid[new_terms] = np.arange(len(self.term_ids), len(self.term_ids) + len(new_terms))
        new_names = [names[i] for i in new_terms.tolist()]
        # summary keywords: each subscription's distinct clause keywords
        owner = np.repeat(np.arange(n), counts)
        pairs = np.unique(owner * max(len(names), 1) + least)
        kw_owner, kw_term = pairs // max(len(names), 1), pairs % max(len(names), 1)
        keywords = np.bincount(kw_owner, minlength=n)
        cells = (gx1 - gx0 + 1) * (gy1 - gy0 + 1)
        wide = cells * keywords > WIDE_ENTRIES
        cells = np.where(wide, 1, cells)
        # every (index cell, keyword) entry, row by row within a subscription
        cell_owner = np.repeat(np.arange(n), cells)
        k = np.arange(int(cells.sum())) - np.repeat(np.cumsum(cells) - cells, cells)
        width = (gx1 - gx0 + 1)[cell_owner]
        cell = (gy0[cell_owner] + k // width) * SIDE + gx0[cell_owner] + k % width
        cell = np.where(wide[cell_owner], _WIDE, cell)
        per_cell = keywords[cell_owner]
        entry_owner = np.repeat(cell_owner, per_cell)
        j = np.arange(int(per_cell.sum())) - np.repeat(np.cumsum(per_cell) - per_cell, per_cell)
        kw_first = np.cumsum(keywords) - keywords
        keys = (np.repeat(cell, per_cell) << 32) | tid[kw_term[kw_first[entry_owner] + j]]
        trivial = (counts == 1) & (lengths[np.cumsum(counts) - 1] == 1) if len(lengths) else np.zeros(n, bool)
        first, new = len(self.sids), self.pending
        lists = [getattr(new, f.name) for f in fields(_Pending) if f.name not in ("first", "entries")]
        before = [len(column) for column in lists]
        try:
            new.rects.extend((r.xmin, r.ymin, r.xmax, r.ymax) for r in (sub.rect for sub in subs))
            new.boxes.extend(map(tuple, boxes))
            new.born.extend(sub.pos for sub in subs)
            new.died.extend([_NEVER] * n)
            new.trivial.extend(trivial.tolist())
            new.clauses.extend(counts.tolist())
            new.clause_lengths.extend(lengths.tolist())
            new.clause_keys.extend(tid[least].tolist())
            new.terms.extend(tid[occurrence].tolist())
            new.keys.append(keys)
            new.slots.append((entry_owner + first).astype(np.int32))
            self.sids.extend(sub.id for sub in subs)
            self.slot_of.update(zip((sub.id for sub in subs), range(first, first + n), strict=True))
            self.term_ids.update(zip(new_names, tid[new_terms].tolist(), strict=True))
        except BaseException:  # memory: cut every list back, so the run is all or nothing
            for column, length in zip(lists, before, strict=True):
                del column[length:]
            for name in new_names:
                self.term_ids.pop(name, None)
            del self.sids[first:]
            for sub in subs:
                self.slot_of.pop(sub.id, None)
            raise
        new.entries += len(keys)
        self.wide += int(np.count_nonzero(wide))

    def widen(self, sub: RangeSubscription, old: CellBox, new: CellBox) -> None:
        """Index ``sub``, indexed here over ``old``, over ``new`` (a box containing ``old``), adding entries only.

        A take-over carrying part of a subscription the evaluator already
        indexes (a move along its border): the entries of the index cells
        ``old`` meets stay, those only ``new`` meets are added, so the lists
        end as :meth:`remove_many` then :meth:`insert` over ``new`` would
        leave them. A subscription that becomes wide is indexed again.
        O(index cells of ``new`` x clauses).
        """
        keywords = self.vocabulary.summary_keywords(sub.dnf)
        if self._is_wide(new, keywords):
            if not self._is_wide(old, keywords):  # a wide one stays wide: ``new`` contains ``old``
                self.remove_many([sub.id])
                self.insert(sub, new)
            else:
                self._set(self.boxes, "boxes", self.slot_of[sub.id], new)
            return
        slot = self.slot_of[sub.id]
        self._queue(slot, self._added_cell_keys(old, new), keywords)
        self._set(self.boxes, "boxes", slot, new)  # before a flush: one that fails leaves box and entries in step
        if self.pending.entries > _PENDING_MAX:
            self._flush()

    def box_of(self, sub_id: str) -> CellBox:
        """Return the cell box live subscription ``sub_id`` is indexed over.

        Raises
        ------
        KeyError
            If ``sub_id`` is not live here.
        """
        slot, first = self.slot_of[sub_id], self.pending.first
        box = self.pending.boxes[slot - first] if slot >= first else self.boxes.view[slot].tolist()
        return tuple(box)

    def held_slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the live subscriptions' slots (ascending), subscribe positions (both int64) and cell boxes.

        Boxes have shape (n, 4), int64. O(slots).
        """
        self._flush()
        live = np.flatnonzero(self.died.view == _NEVER)
        return live, self.born.view[live], self.boxes.view[live].astype(np.int64)

    def row_texts(self, slots: np.ndarray) -> pa.LargeBinaryArray:
        """Return the JSON text of the :func:`~skpub.kernel.records.range_row` of the subscription in each of ``slots``.

        ``slots`` (int64) are slots of :meth:`held_slots`. Every field of a
        row is in the slot arrays (id, subscribe position, rectangle, the
        clauses as term-id runs in the expression's order, cell box), so the
        evaluator keeps no row of its own (issue 43, item 6): rows are
        written when a state block is saved or a cell moves, in Arrow, with
        no Python object per row. Their JSON value is the one ``range_row``
        gives (clause terms sorted by code point: Arrow sorts UTF-8 bytes,
        the same order; strings as orjson writes them,
        :func:`~skpub.kernel.parts.json_strings`; a float as its shortest
        round-trip digits, -0.0 as ``-0.0``). O(rows + clause terms) in C,
        plus O(distinct escaped strings) in Python.
        """
        self._flush()
        slots = np.asarray(slots, dtype=np.int64)
        spans = self.clauses.view[slots]
        _, clause = _expand(spans[:, 0], spans[:, 1])
        runs = self.clause_terms.view[clause]
        owner, term_at = _expand(runs[:, 0], runs[:, 1])
        names = self._names().take(pa.array(self.terms.view[term_at]))
        by_clause = pa.table({"clause": owner, "term": names})
        names = names.take(pc.sort_indices(by_clause, sort_keys=[("clause", "ascending"), ("term", "ascending")]))
        terms = json_runs(json_strings(names), runs[:, 1] - runs[:, 0])
        clauses = json_runs(json_lists(terms), spans[:, 1] - spans[:, 0])
        rects, boxes = self.rects.view[slots], self.boxes.view[slots]
        pieces = [OPEN, json_strings(pa.array([self.sids[i] for i in slots.tolist()], pa.string())), COMMA,
                  json_numbers(self.born.view[slots]), _COMMA_OPEN]  # fmt: skip
        for k in range(4):
            pieces += [json_numbers(rects[:, k]), COMMA if k < 3 else _CLOSE_COMMA]
        pieces += [json_lists(clauses), _COMMA_OPEN]
        for k in range(4):
            pieces += [json_numbers(boxes[:, k]), COMMA if k < 3 else _CLOSE_CLOSE]
        return pc.binary_join_element_wise(*pieces, NOTHING)

    def remove_many(self, ids: Iterable[str]) -> None:
        """Drop subscriptions ``ids`` now (those not live here are skipped): no object matches them from here on.

        For a rebalancing, which may index the same subscription again here
        later (a new slot then). Their slots are dead until the next
        compaction. O(1) each.
        """
        for sid in ids:
            slot = self.slot_of.pop(sid, None)
            if slot is not None:
                self._set(self.died, "died", slot, -1)  # born >= 0: live between born and died, never
                self.dead += 1

    def delete(self, sub_id: str, pos: int) -> None:
        """Unsubscribe ``sub_id`` at stream position ``pos``: :meth:`delete_many` of one."""
        self.delete_many([sub_id], [pos])

    def delete_many(self, sub_ids: Sequence[str], positions: Sequence[int]) -> None:
        """Unsubscribe each of ``sub_ids`` at its stream position in ``positions``: it matches no object after it.

        Their entries go at a compaction (:meth:`end_batch`), after the batch's
        objects before those positions are matched. All or nothing; O(1) each.

        Raises
        ------
        KeyError
            If one of ``sub_ids`` is not indexed here (nothing is deleted then).
        ValueError
            If an id is named twice, or ``positions`` is not as long as ``sub_ids``.
        """
        slots = [self.slot_of[sid] for sid in sub_ids]
        if len(set(slots)) < len(slots) or len(positions) != len(slots):
            raise ValueError("a subscription is named twice, or ids and positions differ in number")
        done = 0
        try:
            for slot, pos in zip(slots, positions, strict=True):
                self._set(self.died, "died", slot, pos)
                done += 1
        except BaseException:
            for slot in slots[:done]:  # live slots: they never died before
                self._set(self.died, "died", slot, _NEVER)
            raise
        for sid in sub_ids:
            del self.slot_of[sid]
        self.dead += len(slots)

    def _set(self, column: _Grow, name: str, slot: int, value: object) -> None:
        """Set ``slot``'s value in ``column`` (the pending list ``name`` while the slot is pending)."""
        first = self.pending.first
        if slot >= first:
            getattr(self.pending, name)[slot - first] = value
        else:
            column.view[slot] = value

    def end_batch(self) -> None:
        """After a batch's objects are matched: compact when dead slots outnumber live ones (and 1,024)."""
        if self.dead > COMPACT_MIN_DELETED and self.dead > len(self.slot_of):
            self.compact()

    def compact(self) -> None:
        """Drop every dead slot and its entries, and renumber slots and terms; O(entries + clause terms).

        All or nothing: the new arrays are built first, then swapped in.
        """
        self._flush()
        live = self.died.view == _NEVER
        remap = np.cumsum(live) - 1
        kept = np.flatnonzero(live)
        owner, clause = _expand(self.clauses.view[kept, 0], self.clauses.view[kept, 1])
        runs = self.clause_terms.view[clause]
        _, term_at = _expand(runs[:, 0], runs[:, 1])
        old_terms = self.terms.view[term_at]
        used = np.unique(old_terms)
        names = list(self.term_ids)
        lengths = runs[:, 1] - runs[:, 0]
        ends = np.cumsum(lengths)
        per_slot = np.bincount(owner, minlength=len(kept))
        slot_ends = np.cumsum(per_slot)
        keys, slots = _merge(self.main, self.delta)
        keep = live[slots]
        keys, slots = keys[keep], remap[slots[keep]].astype(np.int32)
        keys = (keys & ~_LOW) | np.searchsorted(used, keys & _LOW)  # term ids keep their order: keys stay sorted
        columns = [(c, c.view[kept]) for c in (self.rects, self.boxes, self.born, self.died, self.trivial)]
        sids = [self.sids[i] for i in kept.tolist()]
        replaced = [
            (self.clause_terms, np.stack([ends - lengths, ends], axis=1)),
            (self.clause_keys, np.searchsorted(used, self.clause_keys.view[clause])),
            (self.terms, np.searchsorted(used, old_terms)),
            (self.clauses, np.stack([slot_ends - per_slot, slot_ends], axis=1)),
            *columns,
        ]
        term_ids = {names[t]: i for i, t in enumerate(used.tolist())}
        for column, values in replaced:
            column.replace(values)
        self.term_ids, self.sids, self.slot_of = term_ids, sids, {sid: i for i, sid in enumerate(sids)}
        self.main, self.delta = (keys, slots), (keys[:0], slots[:0])
        self.wide = int(np.count_nonzero((keys >> 32) == _WIDE))
        self.dead = 0
        self.pending = _Pending(len(self.sids))

    def _flush(self) -> None:
        """Turn the pending subscriptions into slot arrays and their entries into the sorted arrays.

        All or nothing: should a step fail (memory), every array is set back
        to its length before, and the pending lists stay for the next try.
        """
        new = self.pending
        if not new.keys and not new.born:
            return
        columns = (self.rects, self.boxes, self.born, self.died, self.trivial, self.clause_terms, self.clause_keys,
                   self.terms, self.clauses)  # fmt: skip
        lengths_before, sorted_before = [c.n for c in columns], (self.main, self.delta)
        try:
            self._flush_pending(new)
        except BaseException:
            for column, n in zip(columns, lengths_before, strict=True):
                column.n = n
            self.main, self.delta = sorted_before
            raise
        self.pending = _Pending(len(self.sids))

    def _flush_pending(self, new: _Pending) -> None:
        if new.born:
            self.rects.extend(new.rects)
            self.boxes.extend(new.boxes)
            self.born.extend(new.born)
            self.died.extend(new.died)
            self.trivial.extend(new.trivial)
            lengths = np.array(new.clause_lengths, dtype=np.int64)
            ends = self.terms.n + np.cumsum(lengths)
            self.clause_terms.extend(np.stack([ends - lengths, ends], axis=1))
            self.clause_keys.extend(new.clause_keys)
            self.terms.extend(new.terms)
            counts = np.array(new.clauses, dtype=np.int64)
            slot_ends = self.clause_terms.n - len(lengths) + np.cumsum(counts)
            self.clauses.extend(np.stack([slot_ends - counts, slot_ends], axis=1))
        if new.keys:
            keys = np.concatenate(new.keys)
            order = np.argsort(keys, kind="stable")
            self.delta = _merge(self.delta, (keys[order], np.concatenate(new.slots)[order]))
            if len(self.delta[0]) > max(_DELTA_MIN, len(self.main[0]) // 4):
                self.main = _merge(self.main, self.delta)
                self.delta = (self.delta[0][:0], self.delta[1][:0])

    # ------------------------------------------------------------------ matching

    def _object_terms(self, terms: pa.Array) -> np.ndarray:
        """Return the sorted distinct ``row << 32 | term id`` keys of the rows' terms this index knows."""
        flat = terms.flatten()
        if not len(flat) or not self.term_ids:
            return np.empty(0, np.int64)
        rows = pc.list_parent_indices(terms).to_numpy().astype(np.int64)
        if len(self.term_ids) > 4 * len(flat):  # a few object terms against many known: look the distinct ones up
            encoded = pc.dictionary_encode(flat)
            get = self.term_ids.get
            ids = np.fromiter((get(t, -1) for t in encoded.dictionary.to_pylist()), np.int64, len(encoded.dictionary))
            tids = ids[encoded.indices.to_numpy(zero_copy_only=False)]
        else:  # one Arrow pass, no Python step per distinct term (its hash table costs O(known terms))
            names = self._names()
            names = names if names.type == flat.type else names.cast(flat.type)
            tids = pc.fill_null(pc.index_in(flat, value_set=names), -1).to_numpy().astype(np.int64)
        known = tids >= 0
        return np.unique((rows[known] << 32) | tids[known])

    def match_many(self, objects: ObjectBatch) -> BatchMatches:
        """Return the subscriptions each of ``objects`` matches, and the candidates each examined.

        An object matches a subscription indexed here whose ``born < pos <
        died``, whose rectangle holds it (boundary included) and one of whose
        clauses its terms include. The candidates are the entries in the
        object's index cell (and the wide cell) under its terms, live at its
        position: ``q_l`` of Tornado equation 1.

        An object with ``only`` (PS2Stream IV-C, text-partitioned): only the
        lists of those terms are read, and a subscription is returned only
        when the least keyword (in code-point order) among the clauses the
        object satisfies is one of them: the evaluators an object reaches
        answer for disjoint terms, so exactly one returns each match (DESIGN
        "Text partitions").

        Cost: O(T log E) for T object terms and E entries, plus
        O(candidates x clause terms) numpy work, plus O(distinct terms +
        matches) in Python (the ids).
        """
        n = len(objects)
        examined = np.zeros(n, np.int64)
        if not n or not self.sids:
            return BatchMatches(np.empty(0, np.int64), _NO_IDS, examined)
        self._flush()
        rows, slots = [], []
        for first in range(0, n, CHUNK_OBJECTS):  # bounds the candidate arrays, whatever the batch size
            part = objects.slice(first, min(n, first + CHUNK_OBJECTS))
            row, slot, examined[first : first + len(part)] = self._match_chunk(part)
            rows.append(row + first)
            slots.append(slot)
        row, slot = np.concatenate(rows), np.concatenate(slots)
        distinct, at = np.unique(slot, return_inverse=True)
        names = pa.array([self.sids[s] for s in distinct.tolist()], pa.string())
        return BatchMatches(row, pa.DictionaryArray.from_arrays(pa.array(at, pa.int32()), names), examined)

    def _match_chunk(self, objects: ObjectBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`match_many` over at most :data:`CHUNK_OBJECTS` objects: matched rows and slots, and candidates."""
        n = len(objects)
        empty = np.empty(0, np.int64)
        carried = self._object_terms(objects.terms)  # the (row, term id) codes of the terms the objects carry
        query = carried
        restricted = None
        if objects.only is not None and objects.only.null_count < len(objects.only):
            restricted = ~objects.only.is_null().to_numpy(zero_copy_only=False)
            own = self._object_terms(objects.only)
            query = np.concatenate([carried[~restricted[carried >> 32]], own[_member(own, carried)]])
        rows = query >> 32
        b = self.index_block
        cells = (objects.cy[rows] // b) * SIDE + objects.cx[rows] // b
        keys = (cells << 32) | (query & _LOW)
        if self.wide:
            keys = np.concatenate([keys, (_WIDE << 32) | (query & _LOW)])
            rows = np.concatenate([rows, rows])
        cand_rows, cand_slots = [], []
        for sorted_keys, slots in (self.main, self.delta):
            if not len(sorted_keys):
                continue
            lo = np.searchsorted(sorted_keys, keys, "left")
            hi = np.searchsorted(sorted_keys, keys, "right")
            owner, at = _expand(lo, hi)
            cand_rows.append(rows[owner])
            cand_slots.append(slots[at])
        if not cand_rows:
            return empty, empty, np.zeros(n, np.int64)
        row = np.concatenate(cand_rows)
        slot = np.concatenate(cand_slots).astype(np.int64)
        pos = objects.pos[row]
        live = (self.born.view[slot] < pos) & (pos < self.died.view[slot])
        row, slot = row[live], slot[live]
        examined = np.bincount(row, minlength=n).astype(np.int64)
        rect = self.rects.view[slot]
        x, y = objects.x[row], objects.y[row]
        inside = (rect[:, 0] <= x) & (x <= rect[:, 2]) & (rect[:, 1] <= y) & (y <= rect[:, 3])
        row, slot = row[inside], slot[inside]
        hard = np.flatnonzero(~self.trivial.view[slot])
        if len(hard):
            ok = np.ones(len(row), dtype=bool)
            ok[hard] = self._satisfied(row[hard], slot[hard], carried)
            row, slot = row[ok], slot[ok]
        # by object, then subscribe position: one id per position, the same order after any restore or move
        order = np.lexsort((self.born.view[slot], row))
        row, slot = row[order], slot[order]
        repeated = np.zeros(len(row), dtype=bool)  # a multi-clause subscription met under several keywords
        repeated[1:] = (row[1:] == row[:-1]) & (slot[1:] == slot[:-1])
        if repeated.any():
            row, slot = row[~repeated], slot[~repeated]
        if restricted is not None:
            row, slot = self._answered_here(objects, restricted, row, slot, carried)
        return row, slot, examined

    def _satisfied(self, rows: np.ndarray, slots: np.ndarray, carried: np.ndarray) -> np.ndarray:
        """Return, per candidate ``(rows[i], slots[i])``, whether the object's terms include one of its clauses.

        In pieces of at most :data:`EXPANSION` (candidate, clause term) pairs
        (a subscription may hold 16,384 terms), so memory stays bounded.
        """
        clauses = self.clauses.view[slots]
        terms = self.clause_terms.view[clauses[:, 1] - 1, 1] - self.clause_terms.view[clauses[:, 0], 0]
        ends = np.cumsum(terms)
        if not len(ends) or ends[-1] <= EXPANSION:
            return self._satisfied_piece(rows, slots, carried)
        cuts = [0, *np.searchsorted(ends, np.arange(EXPANSION, ends[-1], EXPANSION), "right").tolist(), len(rows)]
        pieces = [
            self._satisfied_piece(rows[a:b], slots[a:b], carried) for a, b in zip(cuts, cuts[1:], strict=False) if b > a
        ]
        return np.concatenate(pieces)

    def _satisfied_piece(self, rows: np.ndarray, slots: np.ndarray, carried: np.ndarray) -> np.ndarray:
        clauses = self.clauses.view[slots]
        pair, clause = _expand(clauses[:, 0], clauses[:, 1])
        runs = self.clause_terms.view[clause]
        at_clause, term_at = _expand(runs[:, 0], runs[:, 1])
        present = _member((rows[pair[at_clause]] << 32) | self.terms.view[term_at], carried)
        whole = np.bincount(at_clause, weights=present, minlength=len(clause)) == runs[:, 1] - runs[:, 0]
        return np.bincount(pair[whole], minlength=len(rows)) > 0

    def _answered_here(
        self, objects: ObjectBatch, restricted: np.ndarray, row: np.ndarray, slot: np.ndarray, carried: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Keep the matches of restricted rows whose least satisfied clause keyword is one of the row's ``only``.

        A single-clause subscription was found under its one keyword, which
        is then in ``only``; the others are checked here: each clause the
        object satisfies, by term ids, then the least keyword of those in
        code-point order, in Python (text partitions are few).
        """
        check = np.flatnonzero(restricted[row] & (np.diff(self.clauses.view[slot], axis=1)[:, 0] > 1))
        if not len(check):
            return row, slot
        names = list(self.term_ids)
        terms, clause_terms, keys = self.terms.view, self.clause_terms.view, self.clause_keys.view
        keep = np.ones(len(row), dtype=bool)
        only_sets: dict[int, frozenset[str]] = {}
        for i in check.tolist():
            r, (c0, c1) = int(row[i]), self.clauses.view[slot[i]].tolist()
            satisfied = [
                names[keys[c]]
                for c in range(c0, c1)
                if _member((r << 32) | terms[clause_terms[c, 0] : clause_terms[c, 1]], carried).all()
            ]
            only = only_sets.get(r)
            if only is None:
                only = only_sets[r] = frozenset(objects.only[r].as_py())
            keep[i] = min(satisfied) in only
        return row[keep], slot[keep]

    def postings(self) -> dict[tuple[int | None, str], list[str]]:
        """Return the live entries as ``{(index cell key or None for the wide cell, keyword): sorted ids}``.

        For tests and inspection; O(entries).
        """
        self._flush()
        keys, slots = _merge(self.main, self.delta)
        live = self.died.view[slots] == _NEVER
        names = list(self.term_ids)
        out: dict[tuple[int | None, str], list[str]] = {}
        for key, slot in zip(keys[live].tolist(), slots[live].tolist(), strict=True):
            cell = key >> 32
            out.setdefault((None if cell == _WIDE else cell, names[key & _LOW]), []).append(self.sids[slot])
        return {k: sorted(v) for k, v in out.items()}
