"""GI^2, the Grid-Inverted-Index for boolean range subscriptions (PS2Stream section IV-C).

The evaluator's cells (blocks of ``index_block x index_block`` fine cells) each hold an
inverted index ``keyword -> [entries]``. A subscription is appended, in every
index cell its rectangle ∩ partition overlaps, to the list of the least
frequent keyword of each of its DNF clauses (so an OR expression has one
entry per clause). An object looks up only its own index cell and only the
lists of its own terms, then checks the exact rectangle and expression.

Deletion is lazy (PS2Stream IV-C): an unsubscribed id goes into a set and its
entries are dropped when a scan meets them; when deleted ids exceed half the
live ones, the whole index is compacted so memory stays O(live entries).

A *wide* subscription, one that would need more than ``WIDE_ENTRIES``
entries (index cells covered x clause keywords), is not copied into each
cell: it goes to one evaluator-wide inverted list that every object of the
evaluator consults, so no subscription costs more than ``WIDE_ENTRIES``
entries however large its rectangle (a whole-space rectangle with 256
clauses would otherwise write 62,500 x 256). The bound is on entries, not
cells, so ordinary rectangles with a few keywords stay in their cells and
objects far from them never examine them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from skpub.kernel.grid import CellBox
from skpub.kernel.records import ObjectRecord, RangeSubscription
from skpub.kernel.text import Vocabulary

_ROW = 1 << 20
COMPACT_MIN_DELETED = 1024
WIDE_ENTRIES = 65_536

Entry = tuple
"""``(sub_id, xmin, ymin, xmax, ymax, dnf, multi_clause)``."""


def _entry(sub: RangeSubscription) -> Entry:
    """Return ``sub``'s index entry (:data:`Entry`)."""
    r = sub.rect
    return (sub.id, r.xmin, r.ymin, r.xmax, r.ymax, sub.dnf, len(sub.dnf) > 1)


class GI2Index:
    """The GI^2 index of one evaluator.

    Parameters
    ----------
    index_block : int
        Fine cells per side of one index cell.
    vocabulary : Vocabulary
        Picks each clause's least frequent keyword.
    """

    def __init__(self, index_block: int, vocabulary: Vocabulary) -> None:
        self.index_block = index_block
        self.vocabulary = vocabulary
        self.cells: dict[int, dict[str, list[Entry]]] = {}
        self.wide: dict[str, list[Entry]] = {}
        self.entry_counts: dict[str, int] = {}
        self.deleted: set[str] = set()

    def __len__(self) -> int:
        """Return the number of live subscriptions."""
        return len(self.entry_counts) - len(self.deleted)

    def _cell_keys(self, box: CellBox) -> list[int]:
        """Return the keys of the index cells ``box`` (fine cells) meets, row by row."""
        b = self.index_block
        xs = range(box[0] // b, box[2] // b + 1)
        return [gy * _ROW + gx for gy in range(box[1] // b, box[3] // b + 1) for gx in xs]

    def _added_cell_keys(self, old: CellBox, new: CellBox) -> list[int]:
        """Return the keys of the index cells ``new`` meets and ``old`` does not, row by row.

        O(rows of ``new`` + the keys returned).
        """
        b = self.index_block
        ox0, oy0, ox1, oy1 = (c // b for c in old)
        nx0, ny0, nx1, ny1 = (c // b for c in new)
        keys = []
        for gy in range(ny0, ny1 + 1):
            if oy0 <= gy <= oy1:
                xs = itertools.chain(range(nx0, min(ox0, nx1 + 1)), range(max(ox1 + 1, nx0), nx1 + 1))
            else:
                xs = range(nx0, nx1 + 1)
            keys.extend(gy * _ROW + gx for gx in xs)
        return keys

    def insert(self, sub: RangeSubscription, box: CellBox) -> None:
        """Index ``sub`` over the fine-cell box ``box`` (rectangle ∩ partition).

        Cost O(index cells in box x clauses), at most ``WIDE_ENTRIES``; a
        wider subscription costs O(clauses).
        """
        entry = _entry(sub)
        keywords = self.vocabulary.summary_keywords(sub.dnf)
        if self._is_wide(box, keywords):
            for kw in keywords:
                self.wide.setdefault(kw, []).append(entry)
            self.entry_counts[sub.id] = len(keywords)
            return
        keys = self._cell_keys(box)
        self._append(entry, keywords, keys)
        self.entry_counts[sub.id] = len(keys) * len(keywords)

    def _append(self, entry: Entry, keywords: list[str] | frozenset[str], keys: list[int]) -> None:
        """Append ``entry`` to the list of every keyword of ``keywords`` in every index cell of ``keys``."""
        cells = self.cells
        for key in keys:
            lists = cells.get(key)
            if lists is None:
                lists = cells[key] = {}
            for kw in keywords:
                lst = lists.get(kw)
                if lst is None:
                    lists[kw] = [entry]
                else:
                    lst.append(entry)

    def _is_wide(self, box: CellBox, keywords: list[str] | frozenset[str]) -> bool:
        b = self.index_block
        return (box[2] // b - box[0] // b + 1) * (box[3] // b - box[1] // b + 1) * len(keywords) > WIDE_ENTRIES

    def widen(self, sub: RangeSubscription, old: CellBox, new: CellBox) -> None:
        """Index ``sub``, indexed here over ``old``, over ``new`` (a box containing ``old``), adding entries only.

        A take-over carrying part of a subscription the evaluator already
        indexes (a move along its border): the entries of the index cells
        ``old`` meets stay, those only ``new`` meets are appended, so the
        lists end as :meth:`remove_many` then :meth:`insert` over ``new``
        would leave them (in another order). A subscription that becomes
        wide is indexed again. O(rows of ``new`` + index cells added x
        clauses).
        """
        keywords = self.vocabulary.summary_keywords(sub.dnf)
        if self._is_wide(new, keywords):
            if not self._is_wide(old, keywords):  # a wide one stays wide: ``new`` contains ``old``
                self.remove_many([(sub, old)])
                self.insert(sub, new)
            return
        added = self._added_cell_keys(old, new)
        self._append(_entry(sub), keywords, added)
        self.entry_counts[sub.id] += len(added) * len(keywords)

    def remove_many(self, items: Iterable[tuple[RangeSubscription, CellBox]]) -> None:
        """Drop the entries of subscriptions ``items``, each indexed over its box, now.

        For a rebalancing, which may index the same subscription again here
        later (:meth:`delete` marks an id dead for good, which only an
        unsubscribe may do). Each inverted list that holds one of them is
        rebuilt once: O(their entries + the lengths of those lists), where
        removing them one by one costs each list's length once per
        subscription in it.
        """
        ids: set[str] = set()
        doomed: set[tuple[int | None, str]] = set()  # (index cell or None for the wide lists, keyword)
        for sub, box in items:
            keywords = self.vocabulary.summary_keywords(sub.dnf)
            keys = (None,) if self._is_wide(box, keywords) else self._cell_keys(box)
            doomed.update((key, kw) for key in keys for kw in keywords)
            ids.add(sub.id)
            self.entry_counts.pop(sub.id, None)
            self.deleted.discard(sub.id)
        for key, kw in doomed:
            lists = self.wide if key is None else self.cells.get(key)
            lst = lists.get(kw) if lists is not None else None
            if lst is None:
                continue
            kept = [e for e in lst if e[0] not in ids]
            if kept:
                lists[kw] = kept
            else:
                del lists[kw]

    def delete(self, sub_id: str) -> None:
        """Mark ``sub_id`` deleted; its entries go at the next scan or compaction."""
        if sub_id in self.entry_counts:
            self.deleted.add(sub_id)
            if len(self.deleted) > COMPACT_MIN_DELETED and 2 * len(self.deleted) > len(self.entry_counts):
                self.compact()

    def compact(self) -> None:
        """Drop every deleted entry now; O(total entries)."""
        dead = self.deleted
        for lists in (*self.cells.values(), self.wide):
            for kw in list(lists):
                kept = [e for e in lists[kw] if e[0] not in dead]
                if kept:
                    lists[kw] = kept
                else:
                    del lists[kw]
        self.cells = {key: lists for key, lists in self.cells.items() if lists}
        for sub_id in dead:
            del self.entry_counts[sub_id]
        self.deleted = set()

    def _purge(self, lists: dict[str, list[Entry]], kw: str) -> None:
        kept = []
        counts, dead = self.entry_counts, self.deleted
        for e in lists[kw]:
            sid = e[0]
            if sid in dead:
                left = counts[sid] - 1
                if left:
                    counts[sid] = left
                else:
                    del counts[sid]
                    dead.discard(sid)
            else:
                kept.append(e)
        if kept:
            lists[kw] = kept
        else:
            del lists[kw]

    def match_one(
        self, obj: ObjectRecord, cx: int, cy: int, only: frozenset[str] | None = None
    ) -> tuple[list[str], int]:
        """Return the ids of the subscriptions ``obj`` matches (sorted), and the candidates examined.

        ``(cx, cy)`` is the object's fine cell. The candidate count is ``q_l``
        of Tornado equation 1: the subscriptions there (and the wide ones)
        that share a keyword with the object. Cost O(min(terms, cell keywords)
        + candidates): the object's terms and the lists' keywords are
        intersected in C first.

        ``only`` (an object of a text-partitioned rectangle, PS2Stream IV-C):
        the terms this evaluator answers for. Only their lists are read, and
        a subscription is returned only when the least key (in code-point
        order) among the clauses the object satisfies is one of them: the
        evaluators an object reaches answer for disjoint terms, so exactly
        one returns each match (DESIGN "Text partitions").
        """
        b = self.index_block
        matched: list[str] = []
        lists = self.cells.get((cy // b) * _ROW + cx // b)
        examined = self._scan(lists, obj, matched, only) if lists else 0
        if self.wide:
            examined += self._scan(self.wide, obj, matched, only)
        if len(matched) > 1:
            matched.sort()  # keyword lists come in hash order; a replay must write the same bytes
        return matched, examined

    def _scan(
        self, lists: dict[str, list[Entry]], obj: ObjectRecord, matched: list[str], only: frozenset[str] | None
    ) -> int:
        """Append to ``matched`` the subscriptions of ``lists`` that ``obj`` matches; return candidates examined."""
        x, y, terms = obj.x, obj.y, obj.term_set
        dead = self.deleted
        seen: set[str] | None = None
        examined = 0
        stale: list[str] = []
        least = self.vocabulary.least_frequent
        for t in lists.keys() & (terms if only is None else only & terms):
            lst = lists[t]
            examined += len(lst)
            for sid, xmin, ymin, xmax, ymax, dnf, multi in lst:
                if dead and sid in dead:
                    stale.append(t)
                    examined -= 1
                    continue
                if not (xmin <= x <= xmax and ymin <= y <= ymax):
                    continue
                if multi:
                    if seen is None:
                        seen = set()
                    if sid in seen or not any(c <= terms for c in dnf):
                        continue
                    seen.add(sid)
                    if only is not None and min(least(c) for c in dnf if c <= terms) not in only:
                        continue
                elif not dnf[0] <= terms:
                    continue
                matched.append(sid)
        for t in set(stale):
            self._purge(lists, t)
        return examined
