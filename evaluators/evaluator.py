"""The evaluator core: one evaluator's subscriptions, matching and statistics.

Engine-free: the local engine calls it directly and the Spark stateful
processor hosts it inside an executor. A micro-batch arrives as one Arrow
table of routed rows (:data:`~skpub.kernel.wire.ROUTED_SCHEMA`) in stream
order; objects stay columns (:meth:`Evaluator.apply_many`).

State is kept per *state block* (:data:`~skpub.evaluators.window.STATE_BLOCK` squared fine cells,
keyed by the block of the subscription's first cell in this evaluator), so a
micro-batch rewrites only the blocks it changed (DESIGN "Durable state and
checkpoints"); a move between evaluators carries cell boxes with the
subscriptions clipped to them, not blocks. The GI^2 index is derived from
the blocks and rebuilt from them after a restart.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from skpub.evaluators.durable import state_documents_of, state_rows
from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.gi2 import GI2Index, ObjectBatch
from skpub.evaluators.load import CellLoad
from skpub.evaluators.monitor import RankedMonitor
from skpub.evaluators.stats import CellCostStats
from skpub.evaluators.window import WindowColumns, block_of
from skpub.kernel.config import Deployment
from skpub.kernel.grid import CellBox, meets_any, union_boxes
from skpub.kernel.load import LoadSummary, grid_t_block
from skpub.kernel.messages import Deliveries, Mark, RankedUpdate
from skpub.kernel.records import (
    DeadLetter,
    KnnSubscription,
    RangeSubscription,
    SnapshotMarker,
    TopkSubscription,
    Unsubscribe,
    range_from_row,
)
from skpub.kernel.text import Vocabulary, hashed_evaluator
from skpub.kernel.transfer import Carried, Handoff, Move, TransferPlan
from skpub.kernel.wire import OBJECT, SUBSCRIBE, from_columns, table_columns


@dataclass
class EvaluatorBatch:
    """What one evaluator emitted for one micro-batch."""

    evaluator: int
    deliveries: Deliveries = field(default_factory=Deliveries.empty)
    updates: list[RankedUpdate] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stats: CellCostStats = field(default_factory=CellCostStats)
    cpu_seconds: float = 0.0


BLOCK_KEY = "subscriptions"
"""The key of a state block document's rows."""


def state_block(box: CellBox) -> int:
    """Return the state-block key of a subscription with cell box ``box`` (the block of its first cell)."""
    return block_of(box[0], box[1])


class Evaluator:
    """One evaluator: range subscriptions in GI^2, ranked ones in its monitor, per-cell costs, deliveries.

    The ranked buffers follow ``deployment.skyband``. ``durable`` keeps the
    ranked changes the Spark engine saves (:meth:`RankedMonitor.take_changes`).
    The load statistics (:class:`~skpub.evaluators.load.CellLoad`: cell costs
    and query counts) are kept only when the deployment balances (balancer
    mode not ``off``, ``CellLoad.kept``): nothing else reads them.
    """

    def __init__(
        self, evaluator_id: int, deployment: Deployment, vocabulary: Vocabulary, durable: bool = False
    ) -> None:
        self.evaluator_id = evaluator_id
        self.grid_size = deployment.grid_size
        self.monitor = RankedMonitor(evaluator_id, deployment, vocabulary, durable)
        self.index = GI2Index(deployment.index_block, vocabulary)
        self.dirty: set[int] = set()  # state blocks changed since the state store last took them
        self.load = CellLoad(
            deployment.grid_size, [], grid_t_block(deployment.grid_size), deployment.balancer.decay,
            kept=deployment.balancer.mode != "off",
        )  # fmt: skip
        self.object_cost = deployment.balancer.object_cost

    @property
    def subscriptions(self) -> int:
        """Number of live subscriptions held (range and ranked)."""
        return len(self.index) + len(self.monitor)

    def range_ids(self) -> list[str]:
        """Return the ids of the range subscriptions held (one per subscription, whatever its parts).

        O(subscriptions): a copy, which a compaction leaves as it is.
        """
        return list(self.index.slot_of)

    def apply_many(self, rows: pa.Table, batch_id: int) -> EvaluatorBatch:
        """Apply one micro-batch's routed rows (:data:`~skpub.kernel.wire.ROUTED_SCHEMA`, stream order).

        ``rows`` are this evaluator's by how the engine split them (its table,
        its file); their ``evaluator`` column (an index, or a Spark grouping
        key) is not read.

        Objects stay columns (issue 43, "Evaluators take columns"): the batch's
        objects are range-matched in one :meth:`GI2Index.match_many` pass,
        each against the subscriptions live at its position; the ranked
        monitor keeps them in its window as columns and scores, one by one,
        only those sharing a term with a top-k/kNN subscription
        (:meth:`_apply_ranked`). The other rows (subscription changes, marks:
        few) become records (:func:`~skpub.kernel.wire.from_columns`); the
        range subscribes are indexed all at once (:meth:`GI2Index.insert_many`:
        liveness by position keeps them in stream order with the objects), the
        rest applied in stream order, with those objects.

        Returns
        -------
        EvaluatorBatch
            Deliveries ``(pos, sub, obj)`` in stream order, the batch's cell
            costs and this evaluator's thread CPU time, seconds (the
            conversion from columns included).

            A row that fails (a bug: an unknown record type, an unexpected
            exception) becomes an ``internal_error`` dead
            letter whose ``line`` names the record (evaluators never see the
            raw line), and the batch goes on; should matching the objects in
            bulk fail, each is matched alone, so only those that fail are lost.
        """
        start = time.thread_time()
        out = EvaluatorBatch(self.evaluator_id)
        monitor = self.monitor
        refills, refill_scored, fills = monitor.stats.refills, monitor.stats.refill_scored, monitor.stats.fills
        refill_cpu_seconds = monitor.stats.refill_cpu_seconds
        rows = rows.combine_chunks()
        kind = rows.column("kind").to_numpy()
        is_object = kind == OBJECT
        objects = rows.filter(pa.array(is_object))
        routed = from_columns(table_columns(rows.filter(pa.array(~is_object))), self.evaluator_id)
        # 1. range subscription changes: they only set the positions their subscriptions are live between; the
        # subscribes first, all at once (ids are never reused, so no unsubscribe here names a later subscribe)
        subscribes = [row for row in routed if type(row.record) is RangeSubscription]
        try:
            self._insert_many([row.record for row in subscribes], [row.cells for row in subscribes])
            rest = [row for row in routed if type(row.record) is not RangeSubscription]
        except Exception:  # noqa: BLE001 - nothing was indexed: each is applied alone below, so only those that fail are lost
            rest = routed
        # then the unsubscribes of range subscriptions held here, all at once too
        held, others = [], []
        for row in rest:
            (held if type(row.record) is Unsubscribe and row.record.id in self.index else others).append(row)
        if held:
            try:
                self._delete_many([row.record.id for row in held], [row.record.pos for row in held])
                rest = others
            except Exception:  # noqa: BLE001 - nothing was deleted: each is applied alone below
                pass
        ranked_rows = [row for row in rest if not self._apply_range(row.record, row.cells, out)]
        # 2. every object against the subscriptions live at its position (in bulk; should that fail, one by one)
        deliveries, examined, lost = self._match(objects, out)
        # 3. the ranked monitor, in stream order, without the objects that failed above or fail here
        scored = np.zeros(objects.num_rows, np.int64)
        monitored = np.zeros(objects.num_rows, bool)
        if self._monitor_sees_objects(rows, kind):
            monitored = pc.fill_null(objects.column("window"), True).to_numpy(zero_copy_only=False)
            if lost:
                monitored &= ~np.isin(objects.column("pos").to_numpy(), list(lost))
        self._apply_ranked(objects, np.flatnonzero(monitored), ranked_rows, scored, lost, out)
        if rows.num_rows:
            self._advance_to_end(rows, out)
        kept = ~np.isin(objects.column("pos").to_numpy(), list(lost)) if lost else slice(None)
        out.deliveries = deliveries.without(lost) if lost else deliveries
        try:
            self.index.end_batch()
        except Exception as exc:  # noqa: BLE001 - a compaction is all or nothing: the next batch tries it again
            print(f"skpub: evaluator {self.evaluator_id} postponed GI^2's compaction: {exc!r}", file=sys.stderr)
        cx, cy = (objects.column(name).to_numpy().astype(np.int64)[kept] for name in ("cx0", "cy0"))
        out.stats.add_many(cx, cy, self.object_cost + (examined + scored)[kept], self.grid_size)
        out.stats.reevaluations = monitor.stats.refills - refills
        out.stats.reevaluated = monitor.stats.refill_scored - refill_scored
        out.stats.reevaluation_cpu_seconds = monitor.stats.refill_cpu_seconds - refill_cpu_seconds
        out.stats.fills = monitor.stats.fills - fills
        self.load.add_costs(out.stats.cells)
        out.cpu_seconds = time.thread_time() - start
        return out

    def _apply_ranked(
        self, objects: pa.Table, rows: np.ndarray, ranked_rows: list, scored: np.ndarray, lost: set[int],
        out: EvaluatorBatch,
    ) -> None:  # fmt: skip
        """Apply the ranked rows and the objects ``rows`` of ``objects`` to the monitor, in stream order.

        The objects are kept in bulk (:meth:`RankedMonitor.receive`); those a
        subscription may score arrive one by one between the other rows, and
        their work goes to ``scored`` (by row of ``objects``). Should keeping
        them in bulk fail, each is kept and scored alone; an object that
        fails becomes an ``internal_error`` dead letter, its position joins
        ``lost`` and the window forgets it.
        """
        monitor = self.monitor
        every = len(rows) == objects.num_rows  # the common case: no copy
        cols, accepted, watermark = window_columns(objects if every else objects.take(pa.array(rows, pa.int64())))
        subscribing = (row.record for row in ranked_rows)
        keywords = {t for r in subscribing if isinstance(r, TopkSubscription | KnnSubscription) for t in r.keywords}
        try:
            picked = monitor.receive(cols, accepted, watermark, keywords)
            alone = False
        except Exception:  # noqa: BLE001 - kept one by one below, so only the objects that fail are lost
            picked, alone = np.arange(len(cols), dtype=np.int64), True
        candidates = cols.take(picked).objects() if not alone else []
        positions = cols.pos[picked].tolist()
        i, n = 0, len(positions)
        for row in [*ranked_rows, None]:
            while i < n and (row is None or positions[i] < row.record.pos):
                r = int(picked[i])
                try:
                    if alone:
                        one = cols.take(np.array([r], np.int64))
                        if not len(monitor.receive(one, accepted[r : r + 1], watermark[r : r + 1], keywords)):
                            i += 1
                            continue
                        obj = one.objects()[0]
                    else:
                        obj = candidates[i]
                    scored[rows[r]] = monitor.arrive(obj, int(accepted[r]), float(watermark[r]))
                except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                    pos = positions[i]
                    oid = objects.column("id")[int(rows[r])].as_py()
                    out.dead_letters.append(DeadLetter.internal_error(pos, _describe_object(oid), exc))
                    lost.add(pos)
                    monitor.withdraw([pos])  # should the window have kept it before the failure
                i += 1
            if row is None:
                break
            record = row.record
            try:
                monitor.advance(row.accepted, row.watermark)
                if isinstance(record, TopkSubscription | KnnSubscription):
                    monitor.subscribe(record)
                elif isinstance(record, Unsubscribe):
                    if not monitor.unsubscribe(record.id, record.pos):
                        raise EvaluatorError(f"unsubscribe of {record.id!r}, which evaluator {self.evaluator_id} "
                                             "does not hold")  # fmt: skip
                elif isinstance(record, SnapshotMarker | Mark):
                    updates, failed = monitor.mark(record.pos)
                    out.updates.extend(updates)
                    if failed:
                        raise EvaluatorError(f"top-k/kNN reports failed: {'; '.join(failed[:3])}")
                else:
                    raise EvaluatorError(f"evaluator cannot apply {type(record).__name__}")
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                out.dead_letters.append(DeadLetter.internal_error(record.pos, _describe(record), exc))
        monitor.store.arrive_until(math.inf)

    def _apply_range(self, record: object, cells: CellBox | None, out: EvaluatorBatch) -> bool:
        """Apply ``record`` if it is a range subscribe or an unsubscribe of one held here; return whether it was.

        One that fails becomes an ``internal_error`` dead letter (and counts as applied).
        """
        if type(record) is RangeSubscription:
            change = functools.partial(self._insert, record, cells)
        elif type(record) is Unsubscribe and record.id in self.index:
            change = functools.partial(self._delete, record.id, record.pos)
        else:
            return False
        try:
            change()
        except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
            out.dead_letters.append(DeadLetter.internal_error(record.pos, _describe(record), exc))
        return True

    def _advance_to_end(self, rows: pa.Table, out: EvaluatorBatch) -> None:
        """Move the monitor's clock to the batch's last row (objects skipped above move it too, SEMANTICS 4).

        Should that fail, the last row becomes an ``internal_error`` dead
        letter (the next batch's first row moves the clock again).
        """
        last = rows.slice(rows.num_rows - 1)
        try:
            self.monitor.advance(last.column("accepted")[0].as_py(), _clock(last.column("watermark")[0].as_py()))
        except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
            (routed,) = from_columns(table_columns(last), self.evaluator_id)
            out.dead_letters.append(DeadLetter.internal_error(routed.record.pos, _describe(routed.record), exc))

    def _monitor_sees_objects(self, rows: pa.Table, kind: np.ndarray) -> bool:
        """Whether this batch's objects may change the ranked monitor: a window kept, or a ranked subscription.

        With window none an object is kept only when a top-k/kNN subscription
        shares a term with it (:meth:`RankedMonitor.receive`), so none needs
        to reach the monitor while it holds none and the batch brings none.
        """
        if not self.monitor.window_none or len(self.monitor):
            return True
        subscribes = kind == SUBSCRIBE
        specs = rows.filter(pa.array(subscribes)).column("spec")
        return specs.null_count < np.count_nonzero(subscribes)  # a topk or knn subscribe travels with its spec

    def _match(self, objects: pa.Table, out: EvaluatorBatch) -> tuple[Deliveries, np.ndarray, set[int]]:
        """Range-match ``objects`` (routed object rows); return their matches, candidates per row, and lost positions.

        In bulk, or, should that fail, one object at a time: one that fails
        becomes an ``internal_error`` dead letter in ``out`` and its position
        is returned, so it is kept nowhere else (SEMANTICS 1).
        """
        n = objects.num_rows
        if not n:
            return Deliveries.empty(), np.zeros(0, np.int64), set()
        try:
            found = self.index.match_many(object_batch(objects))
        except Exception:  # noqa: BLE001 - matched one by one below
            return self._match_one_by_one(objects, out)
        ids = objects.column("id").combine_chunks()  # each match names its object by row: no id is copied
        obj = pa.DictionaryArray.from_arrays(pa.array(found.rows, pa.int32()), ids)
        deliveries = Deliveries(objects.column("pos").to_numpy()[found.rows], found.sids, obj)
        return deliveries, found.examined, set()

    def _match_one_by_one(self, objects: pa.Table, out: EvaluatorBatch) -> tuple[Deliveries, np.ndarray, set[int]]:
        examined = np.zeros(objects.num_rows, np.int64)
        parts, lost = [], set()
        for r in range(objects.num_rows):
            one = objects.slice(r, 1)
            try:
                found = self.index.match_many(object_batch(one))
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                (routed,) = from_columns(table_columns(one), self.evaluator_id)
                out.dead_letters.append(DeadLetter.internal_error(routed.record.pos, _describe(routed.record), exc))
                lost.add(routed.record.pos)
                continue
            oid, pos = one.column("id")[0].as_py(), one.column("pos")[0].as_py()
            parts.append(Deliveries.of([(pos, sid, oid) for sid in found.sids.to_pylist()]))
            examined[r] = found.examined[0]
        return Deliveries.concat(parts), examined, lost

    def _insert(self, sub: RangeSubscription, box: CellBox) -> None:
        """:meth:`_insert_many` of one."""
        self._insert_many([sub], [box])

    def _insert_many(self, subs: list[RangeSubscription], boxes: list[CellBox]) -> None:
        """Index ``subs`` over ``boxes`` (:meth:`GI2Index.insert_many`), mark their state blocks changed, count them.

        All or nothing: should a step fail, what was indexed is removed and the error raised.
        """
        self.index.insert_many(subs, boxes)  # first: what it refuses is counted nowhere
        try:
            self.dirty.update(state_block(box) for box in boxes)
            self.load.add_subscriptions(boxes)
        except BaseException:
            self.index.remove_many([sub.id for sub in subs])
            raise

    def _box_of(self, sub_id: str) -> CellBox:
        """Return the cell box held subscription ``sub_id`` is indexed over here."""
        return self.index.box_of(sub_id)

    def _changed(self, box: CellBox) -> None:
        """Mark the state block of a subscription indexed over ``box`` changed, for the state store."""
        self.dirty.add(state_block(box))

    def _drop_many(self, ids: Iterable[str]) -> None:
        """Remove range subscriptions ``ids`` now (an id named twice once), their index entries in one pass.

        Raises
        ------
        KeyError
            If one of ``ids`` is not held here; nothing is removed then.
        """
        ids = list(dict.fromkeys(ids))
        missing = [sid for sid in ids if sid not in self.index]
        if missing:
            raise KeyError(missing[0])
        boxes = [self._box_of(sid) for sid in ids]
        self.dirty.update({state_block(box) for box in boxes})
        self.load.remove_subscriptions(boxes)
        self.index.remove_many(ids)

    def set_partition(self, rectangles: list[CellBox]) -> None:
        """Take the rectangles of this evaluator's partition (for its load statistics; routing decides the rest)."""
        held = self.index.held_slots()[2] if self.load.kept else np.empty((0, 4), dtype=np.int64)
        self.load.set_partition(rectangles, held)

    def ensure_partition(self, rectangles: list[CellBox]) -> None:
        """Take ``rectangles`` unless they are the partition already (a new evaluator's first batch)."""
        if self.load.rectangles != [tuple(r) for r in rectangles]:
            self.set_partition(rectangles)

    def load_summary(self, batch_id: int) -> LoadSummary:
        """Return the load summary at the end of micro-batch ``batch_id``, then age the statistics by one batch."""
        summary = self.load.summary(self.evaluator_id, batch_id)
        self.load.end_batch()
        return summary

    def age_load(self) -> None:
        """Age the statistics by one batch without a summary: after a plan's transfer batch, which decides nothing.

        The parts noted stay pending until the next summary counts them
        (counts are sums: when they are counted changes no summary).
        """
        self.load.end_batch()

    def export_cells(self, moved: list[CellBox]) -> list[list[tuple[RangeSubscription, CellBox]]]:
        """Return, for each box of ``moved`` in turn, the range subscriptions indexed over it, each clipped to it.

        What a move of cells carries to its target (Tornado 4.4's cell
        transfer), in subscription order. The subscriptions stay here:
        :meth:`take_over` drops those left with no cell of this evaluator.
        One sort of the ``s`` subscriptions held (GI^2's boxes, by
        subscribe position), O(s log s), then O(s) numpy work per box, and
        one decode of each subscription carried, from the rows GI^2 writes
        from its arrays for all the boxes at once.
        """
        slots, positions, boxes = self.index.held_slots()
        order = np.argsort(positions, kind="stable")
        slots, boxes = slots[order], boxes[order]
        overs = [
            np.flatnonzero((boxes[:, 0] <= x1) & (boxes[:, 2] >= x0) & (boxes[:, 1] <= y1) & (boxes[:, 3] >= y0))
            for x0, y0, x1, y1 in moved
        ]
        carried = np.unique(np.concatenate([np.empty(0, np.int64), *overs]))
        rows = self.index.row_texts(slots[carried]).to_pylist()
        subs = dict(zip(carried.tolist(), (range_from_row(orjson.loads(row))[0] for row in rows), strict=True))
        out = []
        for (x0, y0, x1, y1), over in zip(moved, overs, strict=True):
            b = boxes[over]
            clipped = np.stack(
                [np.maximum(b[:, 0], x0), np.maximum(b[:, 1], y0), np.minimum(b[:, 2], x1), np.minimum(b[:, 3], y1)],
                axis=1,
            ).tolist()
            out.append([(subs[k], tuple(box)) for k, box in zip(over.tolist(), clipped, strict=True)])
        return out

    def hand_off(self, plan: TransferPlan) -> Handoff | None:
        """Hand off what this evaluator's moved cells hold, at the end of ``plan``'s transfer batch; None if no source.

        For each of its moves, in order: the range subscriptions over the
        cells, clipped to them (:meth:`export_cells`), and the cells' decayed
        costs, which leave its statistics now (a text split carries only some
        of the subscriptions and no cost: :meth:`_moved`); and the
        subscriptions that meet none of its new rectangles, which it drops at
        :meth:`take_over`.
        Call after :meth:`age_load` of the transfer batch. O(s log s +
        parts + moves x cells with cost) in Python for ``s`` subscriptions
        held, O(moves x s) in numpy.
        """
        mine = [(i, m) for i, m in enumerate(plan.moves) if m.source == self.evaluator_id]
        if not mine:
            return None
        exported = self.export_cells([m.cells for _, m in mine])
        carried = tuple(
            Carried(i, m.target, *self._moved(m, parts)) for (i, m), parts in zip(mine, exported, strict=True)
        )
        keep = plan.rectangles[self.evaluator_id]
        # every subscription held meets the partition, so only one over moved cells can be left with none
        moved = {sub.id for c in carried for sub, _ in c.subscriptions}
        return Handoff(plan.transfer_batch, self.evaluator_id, carried, tuple(sorted(self._outside(moved, keep))))

    def _moved(self, move: Move, parts: list[tuple[RangeSubscription, CellBox]]) -> tuple[tuple, tuple]:
        """Return what ``move`` carries from here: the subscription parts ``parts`` over its cells, and cell costs.

        A text split (PS2Stream V-A phase I) carries the subscriptions with a
        key the target answers for in the split rectangle (the stable hash
        over the two, :func:`~skpub.kernel.text.hashed_evaluator`, as its
        term table routes) and no cost: both evaluators go on working there.
        """
        if move.text == "split":
            ring, keys = sorted((move.source, move.target)), self.index.vocabulary.summary_keywords
            parts = [p for p in parts if any(hashed_evaluator(k, ring) == move.target for k in keys(p[0].dnf))]
            return tuple(parts), ()
        return tuple(parts), tuple(sorted(self.load.take(move.cells).items()))

    def take_over(self, plan: TransferPlan, handoffs: Iterable[Handoff]) -> None:
        """Complete ``plan`` here at the start of its first batch: import what is carried to us, keep the new partition.

        Subscription parts carried here are indexed (over the union box when
        one is held already) and their cell costs join the statistics, in
        the plan's move order; then an evaluator the plan touches drops the
        subscriptions its own hand-off listed as dropped, unless one was
        carried back here since, and takes its new rectangles. O(parts
        carried and dropped, plus :meth:`set_partition`).

        Raises
        ------
        EvaluatorError
            If a move to this evaluator has no carried entry in ``handoffs``.
        """
        e = self.evaluator_id
        carried = {c.move: c for h in handoffs for c in h.carried if c.target == e}
        for i, move in enumerate(plan.moves):
            if move.target != e:
                continue
            if i not in carried:
                raise EvaluatorError(f"move {i} of plan {plan.batch} to evaluator {e} was not handed off")
            self.import_subscriptions(carried[i].subscriptions)
            self.load.put(dict(carried[i].costs))
        if e in plan.rectangles:
            rectangles = plan.rectangles[e]
            own = [sid for h in handoffs if h.source == e for sid in h.dropped]
            self._drop_many(self._outside(own, rectangles))  # unless carried back here since (a wider box now)
            self.set_partition(list(rectangles))

    def import_subscriptions(self, parts: Iterable[tuple[RangeSubscription, CellBox]]) -> None:
        """Index range subscriptions brought by a move; one already held is indexed over the union box.

        One held already is widened in place (:meth:`GI2Index.widen`: only
        the index cells the union adds get entries), so a move along a
        border, whose subscriptions the target mostly holds, costs
        O(the index cells of each held part's union box) in Python, never a
        rebuild of the lists they are in. ``parts`` may name a subscription
        more than once (its boxes are joined; a new one is indexed where its
        id first appears).
        A failure here is not a record's: it propagates and fails the
        batch, as any failure of a take-over does.
        """
        boxes: dict[str, tuple[RangeSubscription, CellBox]] = {}
        for sub, box in parts:
            if sub.id in boxes:
                box = union_boxes(boxes[sub.id][1], box)
            boxes[sub.id] = (sub, box)
        fresh = {sid: part for sid, part in boxes.items() if sid not in self.index}
        self._insert_many([sub for sub, _ in fresh.values()], [box for _, box in fresh.values()])
        for sid, (sub, box) in boxes.items():
            if sid in fresh:
                continue
            old = self._box_of(sid)
            union = union_boxes(old, box)
            if union != old:
                self._changed(old)
                self._changed(union)
                self.index.widen(sub, old, union)
                self.load.remove_subscription(old)  # counted once, over the box it is indexed over
                self.load.add_subscription(union)

    def _outside(self, ids: Iterable[str], rectangles: Iterable[CellBox]) -> list[str]:
        """Those of range subscriptions ``ids`` held here whose box meets none of ``rectangles`` (in ``ids``' order).

        O(ids x rectangles) box tests in numpy (:func:`~skpub.kernel.grid.meets_any`).
        """
        held = [sid for sid in ids if sid in self.index]
        boxes = np.array([self._box_of(sid) for sid in held], dtype=np.int64).reshape(-1, 4)
        meets = meets_any(boxes, np.array(list(rectangles), dtype=np.int64).reshape(-1, 4))
        return [sid for sid, met in zip(held, meets.tolist(), strict=True) if not met]

    def _delete(self, sub_id: str, pos: int) -> None:
        """:meth:`_delete_many` of one."""
        self._delete_many([sub_id], [pos])

    def _delete_many(self, sub_ids: list[str], positions: list[int]) -> None:
        """Unsubscribe range subscriptions ``sub_ids`` held here, each at its stream position in ``positions``.

        All or nothing: their state blocks are marked changed first (a block
        marked for nothing is only written again as it is), then the load
        statistics stop counting them, and count them again should GI^2
        refuse (:meth:`GI2Index.delete_many`).

        Raises
        ------
        EvaluatorError
            If one of ``sub_ids`` is not held here (nothing changes then).
        """
        missing = [sid for sid in sub_ids if sid not in self.index]
        if missing:
            raise EvaluatorError(f"unsubscribe of {missing[0]!r}, which evaluator {self.evaluator_id} does not hold")
        boxes = [self._box_of(sid) for sid in sub_ids]
        self.dirty.update({state_block(box) for box in boxes})
        self.load.remove_subscriptions(boxes)
        try:
            self.index.delete_many(sub_ids, positions)
        except BaseException:
            self.load.add_subscriptions(boxes)
            raise

    def take_dirty_blocks(self) -> dict[int, bytes | None]:
        """Return the blocks changed since the last call, serialized; None for a block left empty."""
        out = self.encode_blocks(self.dirty)
        self.dirty = set()
        return out

    def encode_blocks(self, keys: Iterable[int] | None = None) -> dict[int, bytes | None]:
        """Serialize state blocks ``keys`` (None: every block holding a subscription); None for an empty one.

        A block is the versioned JSON document (:data:`~skpub.evaluators.durable.FORMAT`) of the
        :func:`~skpub.kernel.records.range_row` rows of the subscriptions
        whose cell box starts in it, in GI^2 slot order. The rows are written
        from GI^2's arrays in Arrow (:meth:`GI2Index.row_texts`), not kept
        apart: a live subscription costs no row of its own (issue 43, item
        6). O(s) numpy over the ``s`` subscriptions held (none when ``keys``
        is empty), plus O(rows of the blocks) in C.
        """
        wanted = None if keys is None else np.fromiter(keys, np.int64)
        if wanted is not None and not len(wanted):
            return {}
        slots, _, boxes = self.index.held_slots()
        block = block_of(boxes[:, 0], boxes[:, 1])
        if wanted is not None:
            pick = np.isin(block, wanted)
            slots, block = slots[pick], block[pick]
        order = np.argsort(block, kind="stable")
        slots, block = slots[order], block[order]
        keys_found, starts = np.unique(block, return_index=True)
        rows = pa.LargeListArray.from_arrays(pa.array(np.append(starts, len(block))), self.index.row_texts(slots))
        out: dict[int, bytes | None] = dict.fromkeys(wanted.tolist()) if wanted is not None else {}
        out.update(zip(keys_found.tolist(), state_documents_of(rows, BLOCK_KEY).to_pylist(), strict=True))
        return out

    @classmethod
    def restore(
        cls,
        evaluator_id: int,
        deployment: Deployment,
        vocabulary: Vocabulary,
        blocks: Mapping[int, bytes],
        load: bytes | None = None,
        durable: bool = True,
    ) -> Evaluator:
        """Rebuild an evaluator (and its GI^2 index) from serialized state blocks and load statistics.

        ``load`` is :meth:`~skpub.evaluators.load.CellLoad.to_document` output (None: none kept;
        ignored when the deployment does not balance); ``durable`` as for a new evaluator.

        Raises
        ------
        EvaluatorError
            If a block is not a state block of :data:`skpub.evaluators.durable.FORMAT`, a cell box
            in it is not within the fine grid (narrow or wide alike), a subscription is in two blocks,
            or ``load`` is damaged.
        """
        ev = cls(evaluator_id, deployment, vocabulary, durable)
        side = deployment.grid_size
        for data in blocks.values():  # a block at a time: the decoded records of one block are held at once
            parts = list(decode_block(data).values())
            for _, box in parts:
                x0, y0, x1, y1 = box
                if not (0 <= x0 <= x1 < side and 0 <= y0 <= y1 < side):
                    raise EvaluatorError(f"damaged evaluator state block: cell box {box} is not within the fine grid")
            try:  # a box within the grid is within GI^2's index cells (Deployment checks)
                ev.index.insert_many([sub for sub, _ in parts], [box for _, box in parts])
            except ValueError as exc:  # a subscription in two blocks
                raise EvaluatorError(f"damaged evaluator state block: {exc}") from None
        ev.dirty = set()
        if not ev.load.kept or load is None:  # none kept: the partition set next counts the parts held
            return ev
        try:
            ev.load.restore(load, ev.index.held_slots()[2])
        except ValueError as exc:
            raise EvaluatorError(str(exc)) from None
        return ev


def object_batch(objects: pa.Table) -> ObjectBatch:
    """Return routed object rows as the :class:`~skpub.evaluators.gi2.ObjectBatch` GI^2 reads."""
    only = objects.column("only").combine_chunks()
    return ObjectBatch(
        objects.column("pos").to_numpy(),
        objects.column("x").to_numpy(),
        objects.column("y").to_numpy(),
        objects.column("cx0").to_numpy().astype(np.int64),
        objects.column("cy0").to_numpy().astype(np.int64),
        objects.column("terms").combine_chunks(),
        None if only.null_count == len(only) else only,
    )


def window_columns(objects: pa.Table) -> tuple[WindowColumns, np.ndarray, np.ndarray]:
    """Return routed object rows as the window store's columns, with each row's ``accepted`` and ``watermark``.

    ``accepted`` is int64, ``watermark`` float64 (NaN when unset); an object's
    number is ``accepted - 1``, a missing ``expires_at`` is +inf.
    """
    accepted = objects.column("accepted").to_numpy().astype(np.int64)
    expires = pc.fill_null(objects.column("expires_at"), math.inf).to_numpy()
    cx, cy = (objects.column(name).to_numpy().astype(np.int64) for name in ("cx0", "cy0"))
    cols = WindowColumns(
        objects.column("pos").to_numpy(),
        objects.column("id").combine_chunks(),
        objects.column("x").to_numpy(),
        objects.column("y").to_numpy(),
        objects.column("terms").combine_chunks(),
        pc.fill_null(objects.column("ts"), math.nan).to_numpy(),
        np.where(np.isnan(expires), math.inf, expires),
        accepted - 1,
        block_of(cx, cy),
    )
    return cols, accepted, pc.fill_null(objects.column("watermark"), math.nan).to_numpy()


def _clock(watermark: float | None) -> float:
    """Return the watermark of a row as the monitor takes it: NaN when unset."""
    return math.nan if watermark is None else watermark


def _describe(record: object) -> str:
    """Return the ``line`` of an evaluator's internal-error dead letter: the record's type and id as JSON."""
    return orjson.dumps({"record": type(record).__name__, "id": getattr(record, "id", None)}).decode()


def _describe_object(oid: str) -> str:
    """Return the ``line`` of an internal-error dead letter of object ``oid`` (as :func:`_describe` of its record)."""
    return orjson.dumps({"record": "ObjectRecord", "id": oid}).decode()


def decode_block(data: bytes) -> dict[str, tuple[RangeSubscription, CellBox]]:
    """Rebuild a state block (a document of :meth:`Evaluator.encode_blocks`): id -> (subscription, cell box).

    Raises
    ------
    EvaluatorError
        If ``data`` is not such a document of this format version.
    """
    try:
        block = {}
        for row in state_rows(data, "subscriptions"):
            sub, box = range_from_row(row)
            block[sub.id] = (sub, box)
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise EvaluatorError(f"damaged evaluator state block: {exc}") from None
    return block
