"""Decayed load statistics at an evaluator, and its load summary (Tornado 4.3, Figure 5).

An evaluator keeps, across micro-batches, the cost of each fine cell of its
partition (Tornado Eq. 1: the candidate subscriptions of each object, range
and ranked, plus ``object_cost`` per object, as
:class:`~skpub.evaluators.stats.CellCostStats` counts them),
decayed by ``decay`` per batch so that recent load dominates: values are
stored multiplied by a running scale (``1 / decay`` per batch) instead of
decaying every value at every batch, and renormalized when the scale grows
large (cells decayed below 1e-9 cost units are then dropped). The cells are
two arrays (ids ascending, scaled costs): a batch's costs are added in one
numpy step, a move takes or brings them as slices, and the row, column and
grid^t block aggregates of each rectangle are summed from them when a
summary is read (``bincount`` in cell-id order, so a restored or moved
copy sums exactly as the original). Query counts are kept as subscription
parts that start and end on each row and column
(:class:`skpub.kernel.load.RectangleLoad`) and per grid^t block: a subscribe
or unsubscribe notes its part in O(1), and the parts noted are counted
together, in numpy, when the counts are next read (the batch's summary or a
new partition). The parts themselves are the evaluator's (GI^2's cell
boxes): it hands their boxes over when a new partition or a restore needs
them, so a live subscription costs the statistics nothing but its note
(issue 43, item 6).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np
import orjson

from skpub.kernel.grid import CellBox
from skpub.kernel.load import BlockLoad, LoadSummary, RectangleLoad

LOAD_FORMAT = 2
"""Format of :meth:`CellLoad.to_document` (1, with the aggregates as well, is read too)."""
_RENORMALIZE = 1e100
_FORGOTTEN = 1e-9
"""Cost units below which a cell is dropped at a renormalization (bounds memory by the recent load)."""
_PENDING_MAX = 1 << 16
"""Subscription parts noted before they are counted anyway (bounds the notes between two summaries)."""
_CHUNK_ENTRIES = 1 << 18
"""Part-rectangle pairs clipped at once when counting parts (bounds the numpy arrays of a count)."""
_NO_BOXES = np.empty((0, 4), dtype=np.int64)


class _Rectangle:
    """One rectangle of the partition and its query counts (its cost aggregates are summed when read)."""

    __slots__ = ("box", "block_x0", "block_y0", "queries", "starts_x", "ends_x", "starts_y", "ends_y")

    def __init__(self, box: CellBox, block: int) -> None:
        x0, y0, x1, y1 = box
        self.box = box
        self.block_x0, self.block_y0 = x0 // block, y0 // block
        self.queries = np.zeros((y1 // block - y0 // block + 1, x1 // block - x0 // block + 1), dtype=np.int64)
        """Subscription parts meeting each grid^t block of the rectangle, ``[block row, block column]``."""
        self.starts_x = np.zeros(x1 - x0 + 1, dtype=np.int64)
        self.ends_x = np.zeros(x1 - x0 + 1, dtype=np.int64)
        self.starts_y = np.zeros(y1 - y0 + 1, dtype=np.int64)
        self.ends_y = np.zeros(y1 - y0 + 1, dtype=np.int64)


class CellLoad:
    """One evaluator's decayed per-cell cost and query counts over its partition.

    Parameters
    ----------
    size : int
        Fine-grid cells per side.
    rectangles : list of CellBox
        The evaluator's partition.
    grid_t_block : int
        Cells per side of a grid^t block, the migration unit (the evaluators
        use :func:`skpub.kernel.load.grid_t_block`).
    decay : float
        Weight of the past per batch, in (0, 1]: after ``t`` batches a cost
        counts ``decay**t``.
    kept : bool, optional
        False for an evaluator that does not balance (mode ``off``): nothing
        reads its statistics, so costs and subscriptions are not counted
        (:meth:`add_costs`, :meth:`add_subscription` and
        :meth:`remove_subscription` do nothing). Default True.

    Raises
    ------
    ValueError
        If ``decay`` is outside (0, 1].
    """

    def __init__(
        self, size: int, rectangles: list[CellBox], grid_t_block: int, decay: float, kept: bool = True
    ) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], not {decay}")
        self.kept = kept
        self.size = size
        self.grid_t_block = grid_t_block
        self.decay = decay
        self._scale = 1.0
        self._ids = np.empty(0, dtype=np.int64)
        """Cells with cost, ascending (``cy * size + cx``)."""
        self._raw = np.empty(0, dtype=np.float64)
        """Their costs times the running scale."""
        self._rects: list[_Rectangle] = []
        self._pending = array("q")
        """Parts noted and not counted yet, five integers each: the box's ``x0, y0, x1, y1`` and the step."""
        self.set_partition(rectangles, _NO_BOXES)

    def set_partition(self, rectangles: list[CellBox], held: np.ndarray) -> None:
        """Take a new partition: cells outside it are forgotten; O(cells with cost x rectangles + parts), numpy.

        The parts noted are counted first, in the rectangles held so far. A
        rectangle the partition already had keeps its query counts; the
        others' are counted from ``held``, the cell boxes of every
        subscription part counted here (shape (p, 4), int64).
        """
        self._flush()
        old = {r.box: r for r in self._rects}
        fresh: list[int] = []
        rects: list[_Rectangle] = []
        for j, box in enumerate(tuple(b) for b in rectangles):
            if box not in old:
                fresh.append(j)
            rects.append(old.get(box) or _Rectangle(box, self.grid_t_block))
        self._rects = rects
        kept = self._inside(self._ids)
        if not kept.all():
            self._ids, self._raw = self._ids[kept], self._raw[kept]
        if self.kept:
            self._count_parts(fresh, held, np.ones(len(held), dtype=np.int64))

    def _inside(self, ids: np.ndarray) -> np.ndarray:
        """Return, per cell id, whether a rectangle of the partition holds it; O(cells x rectangles), numpy."""
        ys, xs = np.divmod(ids, self.size)
        inside = np.zeros(len(ids), dtype=bool)
        for r in self._rects:
            x0, y0, x1, y1 = r.box
            inside |= (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
        return inside

    @property
    def rectangles(self) -> list[CellBox]:
        """The rectangles of the partition, in the order :meth:`set_partition` took them."""
        return [r.box for r in self._rects]

    def cell_costs(self) -> dict[int, float]:
        """Return the decayed cost of every cell held (cell id -> cost units); O(cells)."""
        return dict(zip(self._ids.tolist(), (self._raw / self._scale).tolist(), strict=True))

    def to_document(self) -> bytes:
        """Return the decayed costs as a versioned JSON document (the Spark state store's).

        Floats are written exactly (orjson's shortest round-trip form), so a
        restored evaluator's summaries equal the live one's bit for bit and a
        replayed batch decides as its first attempt. Query counts are not
        written: :meth:`restore` counts them again from the subscriptions.
        Size O(cells with cost + rectangles).
        """
        return orjson.dumps({
            "format": LOAD_FORMAT,
            "scale": self._scale,
            "cells": [self._ids.tolist(), self._raw.tolist()],
            "rectangles": [list(r.box) for r in self._rects],
        })  # fmt: skip

    def restore(self, data: bytes, held: np.ndarray) -> None:
        """Take the state of :meth:`to_document` and count the subscription parts over cell boxes ``held``.

        ``held`` has shape (p, 4), int64: one box per part, counted at once.

        A document of format 1 (skpub before 2026-11-29, which also wrote
        the aggregates) is read for its cells and rectangles.

        Raises
        ------
        ValueError
            If ``data`` is not such a document of a format this skpub reads.
        """
        try:
            raw = orjson.loads(data)
            if raw["format"] not in (1, LOAD_FORMAT):
                raise ValueError(f"format {raw['format']!r}, this skpub reads formats 1 and {LOAD_FORMAT}")
            boxes = [entry[0] if raw["format"] == 1 else entry for entry in raw["rectangles"]]
            rects = [_Rectangle(_box(box, self.size), self.grid_t_block) for box in boxes]
            if _overlapping([r.box for r in rects]):
                raise ValueError("rectangles of the partition overlap")
            ids, values = raw["cells"]
            if len(ids) != len(values):
                raise ValueError(f"{len(ids)} cells and {len(values)} costs")
            cell_ids = np.array(ids, dtype=np.int64)
            costs = np.array(values, dtype=np.float64)
            if len(cell_ids) and (np.any(np.diff(cell_ids) <= 0) or cell_ids[0] < 0 or cell_ids[-1] >= self.size**2):
                raise ValueError("cell ids are not ascending fine-grid cells")
            scale = float(raw["scale"])
            if not (np.isfinite(scale) and scale >= 1.0 and np.isfinite(costs).all() and (costs >= 0).all()):
                raise ValueError("the scale is a finite number from 1 and the costs finite and not negative")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            raise ValueError(f"damaged load statistics: {exc}") from None
        self._scale, self._ids, self._raw, self._rects = scale, cell_ids, costs, rects
        self._pending = array("q")
        self._count_parts(list(range(len(rects))), held, np.ones(len(held), dtype=np.int64))

    def add_cost(self, cx: int, cy: int, cost: float) -> None:
        """Account ``cost`` units in cell ``(cx, cy)`` in this batch (nothing outside the partition)."""
        self._account(np.array([cy * self.size + cx], dtype=np.int64), np.array([cost], dtype=np.float64))

    def add_costs(self, cells: dict[int, float]) -> None:
        """Account a batch's per-cell costs (``cell id -> cost``, as ``CellCostStats.cells``), when kept.

        O(cells x rectangles + cells held), numpy.
        """
        if self.kept and cells:
            ids = np.fromiter(cells, dtype=np.int64, count=len(cells))
            self._account(ids, np.fromiter(cells.values(), dtype=np.float64, count=len(cells)))

    def _account(self, ids: np.ndarray, costs: np.ndarray) -> None:
        """Add distinct cells' costs, those the partition holds, scaled."""
        inside = self._inside(ids)
        self._add_raw(ids[inside], costs[inside] * self._scale)

    def _add_raw(self, ids: np.ndarray, raws: np.ndarray) -> None:
        """Add scaled costs to distinct cells ``ids``: in place when every one is held, else by a merge."""
        if not len(ids):
            return
        held = self._ids
        at = np.searchsorted(held, ids)
        found = at < len(held)
        found[found] = held[at[found]] == ids[found]
        if found.all():
            self._raw[at] += raws
            return
        merged = np.concatenate([held, ids])
        cells, where = np.unique(merged, return_inverse=True)
        self._raw = np.bincount(where, weights=np.concatenate([self._raw, raws]), minlength=len(cells))
        self._ids = cells

    def take(self, cells: CellBox) -> dict[int, float]:
        """Remove and return the decayed costs of the cells inside ``cells`` (a move carries them).

        O(cells with cost), in numpy. ``cells`` lies in one rectangle that
        the move cuts or gives away: the next :meth:`set_partition` replaces it.
        """
        x0, y0, x1, y1 = cells
        ys, xs = np.divmod(self._ids, self.size)
        inside = (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
        taken = dict(zip(self._ids[inside].tolist(), (self._raw[inside] / self._scale).tolist(), strict=True))
        self._ids, self._raw = self._ids[~inside], self._raw[~inside]
        return taken

    def put(self, costs: dict[int, float]) -> None:
        """Add decayed cell costs brought by a move; O(cells brought + cells held), numpy.

        A cell of a rectangle held already (a text merge's: the rectangle
        stays, the leaving evaluator's costs join it) counts from the next
        summary; any other from the :meth:`set_partition` that adds its rectangle.
        """
        if costs:
            ids = np.fromiter(costs, dtype=np.int64, count=len(costs))
            self._add_raw(ids, np.fromiter(costs.values(), dtype=np.float64, count=len(costs)) * self._scale)

    def end_batch(self) -> None:
        """Close a micro-batch: everything so far now weighs ``decay`` times less."""
        self._scale /= self.decay
        if self._scale > _RENORMALIZE:
            decayed = self._raw / self._scale
            kept = (decayed >= _FORGOTTEN) & self._inside(self._ids)
            self._scale, self._ids, self._raw = 1.0, self._ids[kept], decayed[kept]

    def _flush(self) -> None:
        """Count the subscription parts noted since the last flush, in every rectangle.

        :meth:`add_subscription` and :meth:`remove_subscription` only note
        the part's box and sign; the counts are read once per batch (the
        summary), so they are brought up to date here, the batch's parts all
        at once (:meth:`_count_parts`, which changes no count before it has
        computed them all).
        """
        if not self._pending:
            return
        notes = np.frombuffer(self._pending, dtype=np.int64).reshape(-1, 5).copy()
        self._count_parts(list(range(len(self._rects))), notes[:, :4], notes[:, 4])
        self._pending = array("q")  # after the count: should it fail (memory), the notes wait for the next

    def _count_parts(self, which: list[int], boxes: np.ndarray, steps: np.ndarray) -> None:
        """Count subscription parts in the rectangles ``which``; O(parts x rectangles + their lines and blocks), numpy.

        Part ``k`` (``boxes[k]``, shape (p, 4), int64) counts ``steps[k]``
        (+1 a subscribe, -1 an unsubscribe; shape (p,), int64) where its box
        clipped to a rectangle starts and ends (one column and one row of it)
        and in every grid^t block the clipped box meets. The rectangles'
        columns, rows and blocks are laid end to end in four histograms and
        one 2-D difference array per rectangle (over the blocks it meets, one
        more row and column for the far edges), filled by ``bincount`` over
        chunks of parts of at most :data:`_CHUNK_ENTRIES` part-rectangle
        pairs, then added to the counts held: all or nothing, every increment
        is computed before any count changes.
        """
        if not which or not len(boxes):
            return
        rects = np.array([self._rects[i].box for i in which], dtype=np.int64).reshape(-1, 4)
        widths, heights = rects[:, 2] - rects[:, 0] + 1, rects[:, 3] - rects[:, 1] + 1
        xbase, ybase = _starts(widths), _starts(heights)
        b = self.grid_t_block
        gx_first, gy_first = rects[:, 0] // b, rects[:, 1] // b
        gw, gh = rects[:, 2] // b - gx_first + 2, rects[:, 3] // b - gy_first + 2
        gbase = _starts(gw * gh)
        columns, rows = int(widths.sum()), int(heights.sum())
        sizes = {"starts_x": columns, "ends_x": columns, "starts_y": rows, "ends_y": rows}
        lines = {name: np.zeros(n, dtype=np.int64) for name, n in sizes.items()}
        diff = np.zeros(int((gw * gh).sum()), dtype=np.int64)
        chunk = max(1, _CHUNK_ENTRIES // len(which))
        touched = np.zeros(len(which), dtype=bool)
        for start in range(0, len(boxes), chunk):
            part_boxes = boxes[start : start + chunk]
            cx0 = np.maximum(part_boxes[:, None, 0], rects[None, :, 0])
            cy0 = np.maximum(part_boxes[:, None, 1], rects[None, :, 1])
            cx1 = np.minimum(part_boxes[:, None, 2], rects[None, :, 2])
            cy1 = np.minimum(part_boxes[:, None, 3], rects[None, :, 3])
            part, rect = np.nonzero((cx0 <= cx1) & (cy0 <= cy1))
            touched[rect] = True
            cx0, cy0, cx1, cy1 = cx0[part, rect], cy0[part, rect], cx1[part, rect], cy1[part, rect]
            up = steps[start : start + chunk][part] > 0
            x0, y0 = rects[rect, 0], rects[rect, 1]
            for name, at in (("starts_x", xbase[rect] + cx0 - x0), ("ends_x", xbase[rect] + cx1 - x0),
                             ("starts_y", ybase[rect] + cy0 - y0), ("ends_y", ybase[rect] + cy1 - y0)):  # fmt: skip
                lines[name] += _signed_count(at, up, len(lines[name]))
            origin, width = gbase[rect], gw[rect]
            gx0, gy0 = cx0 // b - gx_first[rect], cy0 // b - gy_first[rect]
            gx1, gy1 = cx1 // b - gx_first[rect] + 1, cy1 // b - gy_first[rect] + 1
            for at, sign in (((gy0 * width + gx0), up), ((gy0 * width + gx1), ~up),
                             ((gy1 * width + gx0), ~up), ((gy1 * width + gx1), up)):  # fmt: skip
                diff += _signed_count(origin + at, sign, len(diff))
        touched_rects = np.flatnonzero(touched).tolist()  # the others' counts stay as they are
        queries = [diff[gbase[j] : gbase[j] + gw[j] * gh[j]].reshape(gh[j], gw[j]) for j in touched_rects]
        queries = [q.cumsum(axis=0).cumsum(axis=1)[:-1, :-1] for q in queries]  # every allocation before any change
        for j, counted in zip(touched_rects, queries, strict=True):
            r = self._rects[which[j]]
            r.starts_x += lines["starts_x"][xbase[j] : xbase[j] + widths[j]]
            r.ends_x += lines["ends_x"][xbase[j] : xbase[j] + widths[j]]
            r.starts_y += lines["starts_y"][ybase[j] : ybase[j] + heights[j]]
            r.ends_y += lines["ends_y"][ybase[j] : ybase[j] + heights[j]]
            r.queries += counted

    def add_subscription(self, box: CellBox) -> None:
        """Count a range subscription part over cell box ``box``: :meth:`add_subscriptions` of one."""
        self.add_subscriptions([box])

    def add_subscriptions(self, boxes: Sequence[CellBox]) -> None:
        """Count range subscription parts over cell boxes ``boxes`` (``queryCount`` +1 where each lies); O(len).

        The caller counts each subscription once, over the box it indexes
        it over (a part carried to an evaluator that holds one already:
        :meth:`remove_subscription` of the old box, then this of the
        union). All or nothing; nothing when not kept.
        """
        if self.kept:
            self._note(boxes, 1)

    def remove_subscription(self, box: CellBox) -> None:
        """Stop counting a part over cell box ``box``: :meth:`remove_subscriptions` of one."""
        self.remove_subscriptions([box])

    def remove_subscriptions(self, boxes: Sequence[CellBox]) -> None:
        """Stop counting parts over cell boxes ``boxes``, counted before (unsubscribes or drops); O(len).

        All or nothing; nothing when not kept.
        """
        if self.kept:
            self._note(boxes, -1)

    def _note(self, boxes: Sequence[CellBox], step: int) -> None:
        """Note parts' boxes and sign for :meth:`_flush`, all or nothing; O(len(boxes)) amortized.

        The notes held are counted first when these would take them past
        :data:`_PENDING_MAX` parts, so a count that fails leaves these unnoted.
        """
        notes = array("q", [value for box in boxes for value in (*box, step)])
        if len(self._pending) + len(notes) > 5 * _PENDING_MAX:
            self._flush()
        self._pending.extend(notes)

    def summary(self, evaluator: int, batch: int) -> LoadSummary:
        """Return the load summary sent to the balancer.

        O(cells with cost x rectangles + rows, columns and blocks) in numpy,
        plus O(blocks with load) in Python. The parts noted since the last
        count are counted first (:meth:`_flush`, O(parts noted x
        rectangles)). Costs are decayed cost units (divided by the running
        scale), summed per row, column and grid^t block in cell-id order.
        Blocks come by rectangle, then block column, then block row; a block
        is left out when no cell of it has cost and no part meets it.
        """
        self._flush()
        if not self._rects:
            return LoadSummary(evaluator, batch, (), ())
        s, b = self._scale, self.grid_t_block
        ys, xs = np.divmod(self._ids, self.size)
        boxes = np.array([r.box for r in self._rects], dtype=np.int64).reshape(-1, 4)
        x0, y0, x1, y1 = boxes.T
        rect = self._rectangle_of(boxes)
        mine = rect >= 0
        cx, cy, raw, rect = xs[mine], ys[mine], self._raw[mine], rect[mine]
        # every rectangle's columns, rows and grid^t blocks laid end to end: one bincount each, in cell-id order
        widths, heights = x1 - x0 + 1, y1 - y0 + 1
        bx0, by0 = x0 // b, y0 // b
        wide, high = x1 // b - bx0 + 1, y1 // b - by0 + 1
        xbase, ybase, gbase = _starts(widths), _starts(heights), _starts(wide * high)
        columns = np.bincount(xbase[rect] + cx - x0[rect], weights=raw, minlength=int(widths.sum())) / s
        rows = np.bincount(ybase[rect] + cy - y0[rect], weights=raw, minlength=int(heights.sum())) / s
        keys = gbase[rect] + (cy // b - by0[rect]) * wide[rect] + (cx // b - bx0[rect])
        size = int((wide * high).sum())
        costs = np.bincount(keys, weights=raw, minlength=size) / s
        queries = np.concatenate([r.queries.ravel() for r in self._rects])
        listed = np.flatnonzero((np.bincount(keys, minlength=size) > 0) | (queries != 0))
        j = np.searchsorted(gbase, listed, side="right") - 1
        gy, gx = np.divmod(listed - gbase[j], wide[j])
        order = np.lexsort((gy, gx, j))  # by rectangle, then block column, then block row
        listed, j, gx, gy = listed[order], j[order], gx[order] + bx0[j[order]], gy[order] + by0[j[order]]
        gx0, gy0 = gx * b, gy * b
        block_boxes = zip(
            np.maximum(gx0, x0[j]).tolist(), np.maximum(gy0, y0[j]).tolist(),
            np.minimum(gx0 + b - 1, x1[j]).tolist(), np.minimum(gy0 + b - 1, y1[j]).tolist(), strict=True,
        )  # fmt: skip
        blocks = tuple(
            BlockLoad(box, cost, count)
            for box, cost, count in zip(block_boxes, costs[listed].tolist(), queries[listed].tolist(), strict=True)
        )
        rects = tuple(
            RectangleLoad(r.box, columns[xb : xb + w], rows[yb : yb + h], r.starts_x.copy(), r.ends_x.copy(),
                          r.starts_y.copy(), r.ends_y.copy())
            for r, xb, w, yb, h in zip(self._rects, xbase.tolist(), widths.tolist(), ybase.tolist(), heights.tolist(),
                                       strict=True)
        )  # fmt: skip
        return LoadSummary(evaluator, batch, rects, blocks)

    def _rectangle_of(self, boxes: np.ndarray) -> np.ndarray:
        """Return, per cell with cost (:attr:`_ids`), the index of the rectangle of ``boxes`` holding it, or -1.

        The partition's rectangles are disjoint and the cell ids ascend, so
        each row of a rectangle holds one run of them: two ``searchsorted``
        over the rows of every rectangle, O(rows x log cells), never
        O(cells x rectangles).
        """
        x0, y0, x1, y1 = boxes.T
        heights = y1 - y0 + 1
        rect = np.repeat(np.arange(len(boxes)), heights)
        y = y0[rect] + np.arange(int(heights.sum())) - np.repeat(_starts(heights), heights)
        first = np.searchsorted(self._ids, y * self.size + x0[rect], side="left")
        end = np.searchsorted(self._ids, y * self.size + x1[rect], side="right")
        counts = end - first
        out = np.full(len(self._ids), -1, dtype=np.int64)
        out[np.repeat(first - _starts(counts), counts) + np.arange(int(counts.sum()))] = np.repeat(rect, counts)
        return out

    def centralized_nbytes(self) -> int:
        """Bytes the centralized alternative would send: every cell with cost, as (cell id, cost)."""
        return 12 * len(self._ids)


def _overlapping(boxes: list[CellBox]) -> bool:
    """Whether two of ``boxes`` share a cell (a partition's rectangles never do); O(boxes^2) in numpy."""
    b = np.array(boxes, dtype=np.int64).reshape(-1, 4)
    meet = (b[:, None, 0] <= b[None, :, 2]) & (b[None, :, 0] <= b[:, None, 2])
    meet &= (b[:, None, 1] <= b[None, :, 3]) & (b[None, :, 1] <= b[:, None, 3])
    return bool(np.triu(meet, k=1).any())


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Return where each of runs of ``lengths`` starts when laid end to end (int64, same length)."""
    return np.cumsum(lengths) - lengths


def _signed_count(at: np.ndarray, up: np.ndarray, size: int) -> np.ndarray:
    """Return, per index below ``size``, how many of ``at`` with ``up`` name it minus how many without; int64."""
    return np.bincount(at[up], minlength=size) - np.bincount(at[~up], minlength=size)


def _box(raw: list, size: int) -> CellBox:
    """Return a rectangle read from a document as a cell box of a ``size``-sided grid.

    Raises
    ------
    ValueError
        If it is not four integers ``x0 <= x1``, ``y0 <= y1`` inside the grid.
    """
    if len(raw) != 4 or not all(isinstance(c, int) and not isinstance(c, bool) for c in raw):
        raise ValueError(f"rectangle {raw!r} is not four cell coordinates")
    x0, y0, x1, y1 = raw
    if not (0 <= x0 <= x1 < size and 0 <= y0 <= y1 < size):
        raise ValueError(f"rectangle {raw!r} is not inside a grid of {size} cells a side")
    return (x0, y0, x1, y1)
