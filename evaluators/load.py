"""Decayed load statistics at an evaluator, and its load summary (Tornado 4.3, Figure 5).

An evaluator keeps, across micro-batches, the cost of each fine cell of its
partition (Tornado Eq. 1: the candidate subscriptions of each object, range
and ranked, plus ``object_cost`` per object, as
:class:`~skpub.evaluators.stats.CellCostStats` counts them),
decayed by ``decay`` per batch so that recent load dominates, and per
rectangle of its partition the row, column and overall aggregates of that
cost, each updated per object in O(rectangles of the partition), a handful:
values are stored multiplied by a running scale (``1 / decay`` per batch)
instead of decaying every value at every batch, and renormalized when the
scale grows large (cells decayed below 1e-9 cost units are then dropped). Query counts are
kept as subscription parts that start and end on each row and column
(:class:`skpub.kernel.load.RectangleLoad`) and per grid^t block: a subscribe
or unsubscribe notes its part in O(1), and the parts noted are counted
together, in numpy, when the counts are next read (the batch's summary or a
new partition).
"""

from __future__ import annotations

import numpy as np
import orjson

from skpub.kernel.grid import CellBox, intersect_boxes, union_boxes
from skpub.kernel.load import BlockLoad, LoadSummary, RectangleLoad

LOAD_FORMAT = 1
"""Format of :meth:`CellLoad.to_document`."""
_RENORMALIZE = 1e100
_FORGOTTEN = 1e-9
"""Cost units below which a cell is dropped at a renormalization (bounds memory by the recent load)."""
_PENDING_MAX = 1 << 16
"""Subscription parts noted before they are counted anyway (bounds the notes between two summaries)."""
_CHUNK_ENTRIES = 1 << 18
"""Part-rectangle pairs clipped at once when counting parts (bounds the numpy arrays of a count)."""


class _Rectangle:
    """The raw (scaled) aggregates of one rectangle."""

    __slots__ = ("box", "columns", "rows", "starts_x", "ends_x", "starts_y", "ends_y")

    def __init__(self, box: CellBox) -> None:
        x0, y0, x1, y1 = box
        self.box = box
        self.columns = [0.0] * (x1 - x0 + 1)
        self.rows = [0.0] * (y1 - y0 + 1)
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
        self._cells: dict[int, float] = {}
        self._parts: dict[str, CellBox] = {}
        self._rects: list[_Rectangle] = []
        self._block_queries: dict[tuple[int, int, int], int] = {}
        self._block_costs: dict[tuple[int, int, int], float] = {}
        self._pending: list[tuple[CellBox, int]] = []
        self.set_partition(rectangles)

    def set_partition(self, rectangles: list[CellBox]) -> None:
        """Take a new partition: cells outside it are forgotten; O(cells with cost + parts x rectangles).

        The parts noted are counted first, in the rectangles held so far.

        A rectangle the partition already had keeps its aggregates (a move
        takes cells only from rectangles it cuts, :meth:`take`, and costs put
        into a held one joined them, :meth:`put`); the others' are computed
        from the cells and subscription parts held.
        """
        self._flush()
        old = {r.box: (i, r) for i, r in enumerate(self._rects)}
        rects: list[_Rectangle] = []
        remap: dict[int, int] = {}
        fresh: list[int] = []
        for j, box in enumerate(tuple(b) for b in rectangles):
            if box in old:
                remap[old[box][0]] = j
                rects.append(old[box][1])
            else:
                fresh.append(j)
                rects.append(_Rectangle(box))
        self._rects, self._rect_memo = rects, {}
        self._block_costs = {(remap[i], gx, gy): v for (i, gx, gy), v in self._block_costs.items() if i in remap}
        self._block_queries = {(remap[i], gx, gy): v for (i, gx, gy), v in self._block_queries.items() if i in remap}
        cells = self._cells
        ids = np.fromiter(cells, dtype=np.int64, count=len(cells))
        raws = np.fromiter(cells.values(), dtype=np.float64, count=len(cells))
        ys, xs = np.divmod(ids, self.size)
        where = np.full(len(ids), -1, dtype=np.int64)
        for j, r in enumerate(rects):  # the rectangle of every cell with cost, O(cells x rectangles) in numpy
            x0, y0, x1, y1 = r.box
            where[(xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)] = j
        kept = where >= 0
        self._rect_memo = dict(zip(ids[kept].tolist(), where[kept].tolist(), strict=True))
        if not kept.all():  # most take-overs keep every cell: the dict stays as it is then
            self._cells = dict(zip(ids[kept].tolist(), raws[kept].tolist(), strict=True))
        for j in fresh:
            mine = where == j
            self._sum_cells(j, xs[mine], ys[mine], raws[mine])
        if fresh and self._parts:
            boxes = np.array(list(self._parts.values()), dtype=np.int64).reshape(-1, 4)
            self._count_parts(fresh, boxes, np.ones(len(boxes), dtype=np.int64))

    def _sum_cells(self, i: int, xs: np.ndarray, ys: np.ndarray, raws: np.ndarray) -> None:
        """Set new rectangle ``i``'s aggregates from its cells with cost (columns ``xs``, rows ``ys``, raw costs).

        The sums :meth:`_add_raw` would make cell by cell, in the same order
        (``bincount`` adds its weights in input order): O(cells + lines), numpy.
        """
        r = self._rects[i]
        x0, y0, x1, y1 = r.box
        # float64 even with no cell (bincount of nothing gives integers): the document writes 0.0, as before
        r.columns = np.bincount(xs - x0, weights=raws, minlength=x1 - x0 + 1).astype(np.float64).tolist()
        r.rows = np.bincount(ys - y0, weights=raws, minlength=y1 - y0 + 1).astype(np.float64).tolist()
        b = self.grid_t_block
        gx0, gy0, width = x0 // b, y0 // b, x1 // b - x0 // b + 1
        keys = (ys // b - gy0) * width + (xs // b - gx0)
        sums, held = np.bincount(keys, weights=raws), np.bincount(keys)
        for k in np.flatnonzero(held).tolist():
            self._block_costs[(i, gx0 + k % width, gy0 + k // width)] = float(sums[k])

    @property
    def rectangles(self) -> list[CellBox]:
        """The rectangles of the partition, in the order :meth:`set_partition` took them."""
        return [r.box for r in self._rects]

    def to_document(self) -> bytes:
        """Return the decayed costs and their aggregates as a versioned JSON document (the Spark state store's).

        Floats are written exactly (orjson's shortest round-trip form), so a
        restored evaluator's summaries equal the live one's bit for bit and a
        replayed batch decides as its first attempt. Query counts are not
        written: :meth:`restore` counts them again from the subscriptions.
        Size O(cells with cost + rows and columns of the rectangles + blocks).
        """
        cells = sorted(self._cells.items())
        return orjson.dumps({
            "format": LOAD_FORMAT,
            "scale": self._scale,
            "cells": [[c for c, _ in cells], [v for _, v in cells]],
            "rectangles": [[list(r.box), r.columns, r.rows] for r in self._rects],
            "blocks": [[*key, v] for key, v in sorted(self._block_costs.items())],
        })  # fmt: skip

    def restore(self, data: bytes, parts: dict[str, CellBox]) -> None:
        """Take the state of :meth:`to_document` and count the subscription parts ``parts`` (id -> cell box).

        Raises
        ------
        ValueError
            If ``data`` is not such a document of this format.
        """
        try:
            raw = orjson.loads(data)
            if raw["format"] != LOAD_FORMAT:
                raise ValueError(f"format {raw['format']!r}, this skpub reads format {LOAD_FORMAT}")
            rects = []
            for box, columns, rows in raw["rectangles"]:
                r = _Rectangle(tuple(int(c) for c in box))
                if len(columns) != len(r.columns) or len(rows) != len(r.rows):
                    raise ValueError(f"rectangle {box} has {len(columns)} columns and {len(rows)} rows")
                r.columns, r.rows = [float(v) for v in columns], [float(v) for v in rows]
                rects.append(r)
            ids, values = raw["cells"]
            cells = {int(c): float(v) for c, v in zip(ids, values, strict=True)}
            blocks = {(int(i), int(gx), int(gy)): float(v) for i, gx, gy, v in raw["blocks"]}
            scale = float(raw["scale"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"damaged load statistics: {exc}") from None
        self._scale, self._cells, self._rects, self._rect_memo = scale, cells, rects, {}
        self._block_costs, self._block_queries, self._parts, self._pending = blocks, {}, {}, []
        for sid, box in parts.items():
            self.add_subscription(sid, box)

    def _rect_index(self, cx: int, cy: int) -> int:
        """Return the index of the rectangle holding cell ``(cx, cy)``, or -1; memoized per cell."""
        cell = cy * self.size + cx
        i = self._rect_memo.get(cell)
        if i is None:
            i = next(
                (i for i, r in enumerate(self._rects) if r.box[0] <= cx <= r.box[2] and r.box[1] <= cy <= r.box[3]), -1
            )
            self._rect_memo[cell] = i
        return i

    def _add_raw(self, cell: int, cx: int, cy: int, raw: float) -> None:
        i = self._rect_index(cx, cy)
        if i < 0:
            return
        r = self._rects[i]
        self._cells[cell] = self._cells.get(cell, 0.0) + raw
        r.columns[cx - r.box[0]] += raw
        r.rows[cy - r.box[1]] += raw
        key = (i, cx // self.grid_t_block, cy // self.grid_t_block)
        self._block_costs[key] = self._block_costs.get(key, 0.0) + raw

    def add_cost(self, cx: int, cy: int, cost: float) -> None:
        """Account ``cost`` units in cell ``(cx, cy)`` in this batch; O(rectangles of the partition)."""
        self._add_raw(cy * self.size + cx, cx, cy, cost * self._scale)

    def add_costs(self, cells: dict[int, float]) -> None:
        """Account a batch's per-cell costs (``cell id -> cost``, as ``CellCostStats.cells``), when kept."""
        if not self.kept:
            return
        for cell, cost in cells.items():
            cy, cx = divmod(cell, self.size)
            self.add_cost(cx, cy, cost)

    def take(self, cells: CellBox) -> dict[int, float]:
        """Remove and return the decayed costs of the cells inside ``cells`` (a move carries them).

        O(cells with cost), in numpy.

        ``cells`` lies in one rectangle that the move cuts or gives away:
        the next :meth:`set_partition` computes the aggregates of what
        replaces it.
        """
        x0, y0, x1, y1 = cells
        ids = np.fromiter(self._cells, dtype=np.int64, count=len(self._cells))
        ys, xs = np.divmod(ids, self.size)
        inside = ids[(xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)].tolist()
        return {cell: self._cells.pop(cell) / self._scale for cell in inside}

    def put(self, costs: dict[int, float]) -> None:
        """Add decayed cell costs brought by a move; O(cells x rectangles) at worst.

        A cell of a rectangle held already (a text merge's: the rectangle
        stays, the leaving evaluator's costs join it) joins its aggregates now;
        any other waits for the next :meth:`set_partition`, which adds its rectangle.
        """
        for cell, cost in costs.items():
            cy, cx = divmod(cell, self.size)
            if self._rect_index(cx, cy) >= 0:
                self._add_raw(cell, cx, cy, cost * self._scale)
            else:
                self._cells[cell] = self._cells.get(cell, 0.0) + cost * self._scale

    def end_batch(self) -> None:
        """Close a micro-batch: everything so far now weighs ``decay`` times less."""
        self._scale /= self.decay
        if self._scale > _RENORMALIZE:
            s, cells = self._scale, self._cells
            self._scale, self._cells, self._block_costs = 1.0, {}, {}
            for r in self._rects:
                r.columns = [0.0] * len(r.columns)
                r.rows = [0.0] * len(r.rows)
            for cell, raw in cells.items():
                if raw / s >= _FORGOTTEN:
                    cy, cx = divmod(cell, self.size)
                    self._add_raw(cell, cx, cy, raw / s)

    def _flush(self) -> None:
        """Count the subscription parts noted since the last flush, in every rectangle.

        :meth:`add_subscription` and :meth:`remove_subscription` only note
        the part's box and sign; the counts are read once per batch (the
        summary), so they are brought up to date here, the batch's parts all
        at once (:meth:`_count_parts`).
        """
        if not self._pending:
            return
        boxes = np.array([box for box, _ in self._pending], dtype=np.int64)
        steps = np.array([step for _, step in self._pending], dtype=np.int64)
        self._pending = []
        self._count_parts(list(range(len(self._rects))), boxes, steps)

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
        pairs, then added to the counts held.
        """
        if not which or not len(boxes):
            return
        rects = np.array([self._rects[i].box for i in which], dtype=np.int64).reshape(-1, 4)
        widths, heights = rects[:, 2] - rects[:, 0] + 1, rects[:, 3] - rects[:, 1] + 1
        xbase = np.concatenate(([0], np.cumsum(widths)[:-1]))
        ybase = np.concatenate(([0], np.cumsum(heights)[:-1]))
        b = self.grid_t_block
        gx_first, gy_first = rects[:, 0] // b, rects[:, 1] // b
        gw, gh = rects[:, 2] // b - gx_first + 2, rects[:, 3] // b - gy_first + 2
        gbase = np.concatenate(([0], np.cumsum(gw * gh)[:-1]))
        columns, rows = int(widths.sum()), int(heights.sum())
        sizes = {"starts_x": columns, "ends_x": columns, "starts_y": rows, "ends_y": rows}
        lines = {name: np.zeros(n, dtype=np.int64) for name, n in sizes.items()}
        diff = np.zeros(int((gw * gh).sum()), dtype=np.int64)
        chunk = max(1, _CHUNK_ENTRIES // len(which))
        for start in range(0, len(boxes), chunk):
            part_boxes = boxes[start : start + chunk]
            cx0 = np.maximum(part_boxes[:, None, 0], rects[None, :, 0])
            cy0 = np.maximum(part_boxes[:, None, 1], rects[None, :, 1])
            cx1 = np.minimum(part_boxes[:, None, 2], rects[None, :, 2])
            cy1 = np.minimum(part_boxes[:, None, 3], rects[None, :, 3])
            part, rect = np.nonzero((cx0 <= cx1) & (cy0 <= cy1))
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
        queries = self._block_queries
        for j, i in enumerate(which):
            r = self._rects[i]
            r.starts_x += lines["starts_x"][xbase[j] : xbase[j] + widths[j]]
            r.ends_x += lines["ends_x"][xbase[j] : xbase[j] + widths[j]]
            r.starts_y += lines["starts_y"][ybase[j] : ybase[j] + heights[j]]
            r.ends_y += lines["ends_y"][ybase[j] : ybase[j] + heights[j]]
            mine = diff[gbase[j] : gbase[j] + gw[j] * gh[j]]
            if not mine.any():
                continue
            blocks = mine.reshape(gh[j], gw[j]).cumsum(axis=0).cumsum(axis=1)
            gys, gxs = np.nonzero(blocks)
            for gy, gx, n in zip(gys.tolist(), gxs.tolist(), blocks[gys, gxs].tolist(), strict=True):
                key = (i, int(gx_first[j]) + gx, int(gy_first[j]) + gy)
                queries[key] = queries.get(key, 0) + n

    def add_subscription(self, sid: str, box: CellBox) -> None:
        """Count range subscription ``sid`` indexed over cell box ``box`` (``queryCount`` +1 where it lies).

        A subscription already counted here (a transfer bringing a part of
        one this evaluator indexes) is counted once, over the bounding box of
        both parts, as the evaluator indexes it. Nothing when not kept.
        """
        if not self.kept:
            return
        old = self._parts.get(sid)
        if old is not None:
            self.remove_subscription(sid)
            box = union_boxes(old, box)
        self._parts[sid] = box
        self._note(box, 1)

    def remove_subscription(self, sid: str) -> None:
        """Forget subscription ``sid`` (an unsubscribe); unknown ids are ignored."""
        box = self._parts.pop(sid, None)
        if box is not None:
            self._note(box, -1)

    def _note(self, box: CellBox, step: int) -> None:
        """Note a part's box and sign for :meth:`_flush`; O(1) amortized (a flush every :data:`_PENDING_MAX`)."""
        self._pending.append((box, step))
        if len(self._pending) >= _PENDING_MAX:
            self._flush()

    def summary(self, evaluator: int, batch: int) -> LoadSummary:
        """Return the load summary sent to the balancer; O(rows + columns + blocks with load).

        The parts noted since the last count are counted first
        (:meth:`_flush`, O(parts noted x rectangles)). Costs are decayed cost units (divided by the running scale).
        """
        self._flush()
        s = self._scale
        rects = tuple(
            RectangleLoad(
                r.box,
                np.array(r.columns) / s,
                np.array(r.rows) / s,
                r.starts_x.copy(),
                r.ends_x.copy(),
                r.starts_y.copy(),
                r.ends_y.copy(),
            )
            for r in self._rects
        )
        b, costs = self.grid_t_block, self._block_costs
        blocks = []
        for key in sorted(set(costs) | {k for k, v in self._block_queries.items() if v}):
            i, gx, gy = key
            cells = intersect_boxes(self._rects[i].box, (gx * b, gy * b, gx * b + b - 1, gy * b + b - 1))
            assert cells is not None
            blocks.append(BlockLoad(cells, costs.get(key, 0.0) / s, self._block_queries.get(key, 0)))
        return LoadSummary(evaluator, batch, rects, tuple(blocks))

    def centralized_nbytes(self) -> int:
        """Bytes the centralized alternative would send: every cell with cost, as (cell id, cost)."""
        return 12 * len(self._cells)


def _signed_count(at: np.ndarray, up: np.ndarray, size: int) -> np.ndarray:
    """Return, per index below ``size``, how many of ``at`` with ``up`` name it minus how many without; int64."""
    return np.bincount(at[up], minlength=size) - np.bincount(at[~up], minlength=size)
