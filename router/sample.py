"""The workload sample the initial partitionings read, parsed and located on the fine grid.

:func:`parse_sample` turns the stream's head (Tornado 4.1's sample) into
objects (cells, terms) and subscriptions (cell boxes, rectangles, keys);
:class:`KeyedSample` keeps what PS2Stream's Definition 1 counts
(:mod:`skpub.router.workload`): the range subscriptions and the objects
that hold one of their keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from skpub.kernel.geometry import Rect
from skpub.kernel.grid import CellBox, FineGrid
from skpub.kernel.objects import ObjectColumns, decode_objects
from skpub.kernel.records import KnnSubscription, ObjectRecord, RangeSubscription, TopkSubscription, parse_line
from skpub.kernel.text import Vocabulary


@dataclass(frozen=True)
class Sample:
    """A workload sample, parsed and located on the fine grid (what the initial partitionings read).

    Attributes
    ----------
    cx, cy : ndarray, shape (n,), int64
        The objects' fine cells.
    terms : list of frozenset of str, length n
        The objects' terms.
    ranges : list of (CellBox, Rect, frozenset of str)
        Each range subscription's cell box, rectangle and keys (the least
        frequent keyword of each DNF clause, :meth:`Vocabulary.summary_keywords`).
    ranked : Counter
        Keyword -> number of topk/knn subscriptions that have it.
    """

    cx: np.ndarray
    cy: np.ndarray
    terms: list[frozenset[str]]
    ranges: list[tuple[CellBox, Rect, frozenset[str]]]
    ranked: Counter[str]
    x: np.ndarray
    y: np.ndarray


def parse_sample(lines: Iterable[bytes | str], grid: FineGrid, vocabulary: Vocabulary, max_record_bytes: int) -> Sample:
    """Parse a sample of input lines; invalid lines are ignored (they cost nothing to evaluate).

    Objects are decoded in bulk (:func:`~skpub.kernel.objects.decode_objects`), other lines one by one. O(lines).
    """
    lines = [line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line for line in lines]
    try:
        objects, rest = decode_objects(lines, 0, grid.space, max_record_bytes)
    except Exception:  # noqa: BLE001 - a failing bulk decoder leaves every line to the line-by-line path
        objects, rest = ObjectColumns.from_records([]), list(range(len(lines)))
    parsed = [parse_line(lines[i], i, grid.space, max_record_bytes) for i in rest]
    more = ObjectColumns.from_records([r for r in parsed if type(r) is ObjectRecord])
    objects = ObjectColumns.concat([objects, more])
    ranges = []
    ranked: Counter[str] = Counter()
    for record in parsed:
        if isinstance(record, RangeSubscription):
            ranges.append((grid.cell_box(record.rect), record.rect, vocabulary.summary_keywords(record.dnf)))
        elif isinstance(record, TopkSubscription | KnnSubscription):
            ranked.update(record.keywords)
    terms = [frozenset(t) for t in objects.terms.to_pylist()]
    xs, ys = np.asarray(objects.x), np.asarray(objects.y)
    try:
        cx, cy = grid.cells_of(xs, ys)
    except Exception:  # noqa: BLE001 - locate one by one: an object that cannot be located costs nothing
        kept, cells = [], []
        for i, (x, y) in enumerate(zip(xs.tolist(), ys.tolist(), strict=True)):
            try:
                cells.append(grid.cell_of(x, y))
                kept.append(i)
            except Exception:  # noqa: BLE001, S112 - as above
                continue
        located = np.array(cells, dtype=np.int64).reshape(-1, 2)
        cx, cy, xs, ys, terms = located[:, 0], located[:, 1], xs[kept], ys[kept], [terms[i] for i in kept]
    return Sample(np.asarray(cx), np.asarray(cy), terms, ranges, ranked, xs, ys)


@dataclass(frozen=True)
class KeyedSample:
    """A :class:`~skpub.router.initial.Sample` reduced to what Definition 1 counts.

    Attributes
    ----------
    cx, cy : ndarray, shape (n,), int64
        Cells of the objects that hold at least one key.
    keys : list of tuple of str, length n
        Each such object's keys (its terms that are some subscription's key), sorted.
    boxes : ndarray, shape (q, 4), int64
        The range subscriptions' cell boxes.
    sub_keys : list of frozenset of str, length q
        Their keys (one per DNF clause).
    """

    cx: np.ndarray
    cy: np.ndarray
    keys: list[tuple[str, ...]]
    boxes: np.ndarray
    sub_keys: list[frozenset[str]]

    @classmethod
    def of(cls, sample: Sample) -> KeyedSample:
        """Keep the range subscriptions and the objects holding one of their keys; O(sample terms)."""
        every = set().union(*(keys for _, _, keys in sample.ranges)) if sample.ranges else set()
        kept, keys = [], []
        for i, terms in enumerate(sample.terms):
            mine = terms & every
            if mine:
                kept.append(i)
                keys.append(tuple(sorted(mine)))
        index = np.array(kept, dtype=np.int64)
        boxes = np.array([box for box, _, _ in sample.ranges], dtype=np.int64).reshape(-1, 4)
        return cls(sample.cx[index], sample.cy[index], keys, boxes, [k for _, _, k in sample.ranges])

    def objects_in(self, box: CellBox, among: np.ndarray | None = None) -> np.ndarray:
        """Return the indices (of ``among``, default all) of the objects whose cell is in ``box``."""
        idx = np.arange(len(self.keys)) if among is None else among
        x0, y0, x1, y1 = box
        cx, cy = self.cx[idx], self.cy[idx]
        return idx[(cx >= x0) & (cx <= x1) & (cy >= y0) & (cy <= y1)]

    def subscriptions_over(self, box: CellBox, among: np.ndarray | None = None) -> np.ndarray:
        """Return the indices (of ``among``, default all) of the subscriptions whose box meets ``box``."""
        idx = np.arange(len(self.sub_keys)) if among is None else among
        x0, y0, x1, y1 = box
        b = self.boxes[idx]
        return idx[(b[:, 0] <= x1) & (b[:, 2] >= x0) & (b[:, 1] <= y1) & (b[:, 3] >= y0)]

    def term_counts(self, objects: np.ndarray, subscriptions: np.ndarray) -> tuple[Counter, Counter]:
        """Return ``(|O_t|, |Q_t|)`` per key t over the given objects and subscriptions."""
        o: Counter[str] = Counter()
        for i in objects.tolist():
            o.update(self.keys[i])
        q: Counter[str] = Counter()
        for i in subscriptions.tolist():
            q.update(self.sub_keys[i])
        return o, q
