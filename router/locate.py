"""The parallel stage of routing: parse, validate, normalize and locate each line.

Everything here depends on one line and the routing epoch alone, never on the
stream before it, so engines run it in parallel: the Spark engine in one task
per input split, the local engine inline. For every line it yields either a
dead letter (SEMANTICS section 1, written straight to the sink) or a located
record:

- objects as columns (:class:`~skpub.kernel.objects.ObjectColumns`: most are
  decoded in bulk and never become Python records unless forwarded), with
  the fine cell of each and the evaluator that owns it (Tornado section 3.1:
  the partition holding the point), computed for the whole batch at once;
- a range subscription with every partition its rectangle overlaps (A-Grid
  neighbor search over rectangles, O(N_r)), the cell box of rectangle ∩ partition for each
  (its bounding box when the partition has several rectangles),
  and the textual-summary keywords (one per clause, its least frequent);
- any other record as it is.

:func:`located_table` puts a batch's records in stream order in the columns
the serial stage reads (:data:`~skpub.kernel.wire.LOCATED_COLUMNS`). What
depends on stream order (the id registry, placements, textual summaries) is
the sequencer's (:mod:`skpub.router.sequencer`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from skpub.kernel.config import Deployment
from skpub.kernel.grid import CellBox
from skpub.kernel.objects import ObjectColumns, decode_objects
from skpub.kernel.records import (
    DeadLetter,
    KnnSubscription,
    ObjectRecord,
    RangeSubscription,
    Record,
    TopkSubscription,
    parse_line,
    stream_position,
)
from skpub.kernel.registry import kind_of
from skpub.kernel.text import Vocabulary
from skpub.kernel.wire import LOCATED_SCHEMA, OBJECT, record_columns
from skpub.router.table import RoutingTable


@dataclass(slots=True)
class Located:
    """One valid record other than an object, and where it goes as far as one line can tell.

    ``targets`` are a range subscription's ``(partition, rectangle ∩
    partition cell box)`` pairs and ``keywords`` its summary keywords (of a
    topk or knn subscription, which every evaluator holds: its terms);
    ``kind`` is the registry kind (:data:`skpub.kernel.registry.KINDS`).
    """

    record: Record
    kind: str
    targets: tuple[tuple[int, CellBox], ...] = ()
    keywords: frozenset[str] = frozenset()


@dataclass
class LocatedBatch:
    """The parallel stage's output for a run of lines.

    ``objects`` are the run's objects in stream order, ``owners``, ``cx`` and
    ``cy`` (ndarray, shape (len(objects),), int64) their owner evaluator and
    fine cell; ``others`` the other records in stream order; then the dead
    letters and the number of lines.
    """

    objects: ObjectColumns
    owners: np.ndarray
    cx: np.ndarray
    cy: np.ndarray
    others: list[Located] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    lines: int = 0


@dataclass
class LocatedItems:
    """The parse stage's output for a run of a micro-batch's lines, as the serial stage reads it.

    ``items`` are :func:`located_table`'s rows (:data:`~skpub.kernel.wire.LOCATED_SCHEMA`,
    stream order) of lines ``first`` .. ``first + lines - 1`` of micro-batch
    ``batch_id``, located under routing epoch ``epoch`` (its number);
    ``dead_letters`` the lines rejected while parsing; ``cpu_seconds`` the
    thread CPU seconds the stage took, wherever it ran.
    """

    batch_id: int
    epoch: int
    first: int
    lines: int
    items: pa.Table
    dead_letters: list[DeadLetter]
    cpu_seconds: float

    @classmethod
    def concat(cls, parts: Sequence[LocatedItems]) -> LocatedItems:
        """Return consecutive runs of one batch's lines, parsed under one epoch, as one run.

        The rows are the runs' in order (each run's positions follow the
        previous run's), so they are what one parse of all the lines gives.

        Raises
        ------
        ValueError
            If ``parts`` is empty, or its runs are of different batches or
            epochs, or do not follow each other.
        """
        if not parts:
            raise ValueError("no runs to concatenate")
        head = parts[0]
        for before, after in itertools.pairwise(parts):
            if (after.batch_id, after.epoch, after.first) != (head.batch_id, head.epoch, before.first + before.lines):
                raise ValueError("the runs are not consecutive runs of one batch under one epoch")
        return cls(
            head.batch_id,
            head.epoch,
            head.first,
            sum(p.lines for p in parts),
            pa.concat_tables([p.items for p in parts]),
            [d for p in parts for d in p.dead_letters],
            sum(p.cpu_seconds for p in parts),
        )

    def since(self, first: int) -> LocatedItems:
        """Return the run of this run's lines from line ``first`` on (its rows and dead letters from there).

        O(rows) in Arrow, O(dead letters) in Python.

        Raises
        ------
        ValueError
            If line ``first`` is not in this run nor just after it.
        """
        if not self.first <= first <= self.first + self.lines:
            raise ValueError(f"line {first} is not in lines {self.first}..{self.first + self.lines - 1}")
        if first == self.first:
            return self
        start = stream_position(self.batch_id, first)
        pos = self.items.column("pos").to_numpy()
        items = self.items.slice(int(np.searchsorted(pos, start)))  # rows are in position order
        letters = [d for d in self.dead_letters if d.pos >= start]
        rest = self.first + self.lines - first
        return LocatedItems(self.batch_id, self.epoch, first, rest, items, letters, self.cpu_seconds)


class Locator:
    """Parses and locates lines for one routing epoch (stateless between calls)."""

    def __init__(self, deployment: Deployment, vocabulary: Vocabulary, table: RoutingTable) -> None:
        self.deployment = deployment
        self.vocabulary = vocabulary
        self.table = table

    def locate_lines(self, lines: Sequence[bytes], batch_id: int, first: int = 0) -> LocatedBatch:
        """Parse and locate ``lines``, the batch's lines ``first``, ``first + 1``, ... in stream order.

        Parameters
        ----------
        lines : sequence of bytes
            Lines as read, without terminators.
        batch_id : int
            Micro-batch id; line ``first + i`` gets position
            ``stream_position(batch_id, first + i)``.

        Returns
        -------
        LocatedBatch
            Never raises for a line: one that fails unexpectedly becomes an
            ``internal_error`` dead letter. Well-formed objects are decoded
            in bulk (:func:`~skpub.kernel.objects.decode_objects`), every
            other line one by one (:func:`~skpub.kernel.records.parse_line`);
            should the bulk decoder itself fail, every line goes one by one,
            and should locating the objects in bulk fail, each is located
            alone.
            O(len(lines)) plus O(N_p) per range subscription and the
            expansion of its ``expr``.
        """
        space, max_bytes = self.deployment.space, self.deployment.max_record_bytes
        first_pos = stream_position(batch_id, first)
        try:
            objects, rest = decode_objects(lines, first_pos, space, max_bytes)
        except Exception:  # noqa: BLE001 - the line-by-line path below handles every line
            objects, rest = ObjectColumns.from_records([]), list(range(len(lines)))
        others: list[Located | None] = []
        dead: list[DeadLetter] = []
        parsed: list[ObjectRecord] = []
        ranges: list[tuple[int, int, RangeSubscription]] = []  # (slot in others, line, subscription)
        for i in rest:
            line, pos = lines[i], first_pos + i
            try:
                record = parse_line(line, pos, space, max_bytes)
                if type(record) is ObjectRecord:
                    parsed.append(record)
                elif type(record) is DeadLetter:
                    dead.append(record)
                elif type(record) is RangeSubscription:
                    ranges.append((len(others), i, record))
                    others.append(None)  # located below, with the batch's other range subscriptions
                else:
                    others.append(self._locate(record))
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                dead.append(DeadLetter.internal_error(pos, line, exc))
        if ranges:
            others = self._locate_ranges(ranges, others, lines, first_pos, dead)
        if parsed:
            objects = ObjectColumns.concat([objects, ObjectColumns.from_records(parsed)])
        try:
            cx, cy = self.table.grid.cells_of(objects.x, objects.y)
            owners = self.table.owners_of_cells(cx, cy)
        except Exception:  # noqa: BLE001 - locate one by one, so only the objects that fail are lost
            objects, cx, cy, owners = self._locate_objects_one_by_one(objects, lines, first_pos, dead)
        return LocatedBatch(objects, owners, cx, cy, others, dead, len(lines))

    def locate_items(self, lines: Sequence[bytes], batch_id: int, epoch: int, first: int = 0) -> LocatedItems:
        """Return the :class:`LocatedItems` of ``lines``, lines ``first``, ... of micro-batch ``batch_id``.

        :meth:`locate_lines` then :func:`located_table`. ``epoch`` is the
        number of the routing epoch whose table this locator holds; the
        serial stage checks it. Never raises for a line.
        """
        start = time.thread_time()
        located = self.locate_lines(lines, batch_id, first)
        items = located_table(located)
        return LocatedItems(batch_id, epoch, first, len(lines), items, located.dead_letters, time.thread_time() - start)

    def _locate_objects_one_by_one(
        self, objects: ObjectColumns, lines: Sequence[bytes], first_pos: int, dead: list[DeadLetter]
    ) -> tuple[ObjectColumns, np.ndarray, np.ndarray, np.ndarray]:
        """Locate each object alone; one that fails becomes an ``internal_error`` dead letter (SEMANTICS 1)."""
        grid, table = self.table.grid, self.table
        kept, cells = [], []
        for row, (pos, x, y) in enumerate(
            zip(objects.pos.tolist(), objects.x.tolist(), objects.y.tolist(), strict=True)
        ):
            try:
                cx, cy = grid.cell_of(x, y)
                cells.append((cx, cy, table.owner_of_cell(cx, cy)))
                kept.append(row)
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                dead.append(DeadLetter.internal_error(pos, lines[pos - first_pos], exc))
        dead.sort(key=lambda d: d.pos)
        located = np.array(cells, dtype=np.int64).reshape(-1, 3)
        return objects.take(np.array(kept, dtype=np.int64)), located[:, 0], located[:, 1], located[:, 2]

    def _locate_ranges(
        self,
        ranges: list[tuple[int, int, RangeSubscription]],
        others: list[Located | None],
        lines: Sequence[bytes],
        first_pos: int,
        dead: list[DeadLetter],
    ) -> list[Located]:
        """Locate range subscriptions ``ranges`` into their slots of ``others``; return ``others`` without gaps.

        In bulk (:meth:`_locate_range_batch`); should that fail, each alone
        (:meth:`_locate`), one that fails becoming an ``internal_error`` dead
        letter of its line (SEMANTICS 1).
        """
        try:
            located: list[Located | None] = list(self._locate_range_batch([sub for _, _, sub in ranges]))
        except Exception:  # noqa: BLE001 - located one by one below, so only those that fail are lost
            located = []
            for _, i, sub in ranges:
                try:
                    located.append(self._locate(sub))
                except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                    located.append(None)
                    dead.append(DeadLetter.internal_error(first_pos + i, lines[i], exc))
            dead.sort(key=lambda d: d.pos)
        for (slot, _, _), item in zip(ranges, located, strict=True):
            others[slot] = item
        return [item for item in others if item is not None]

    def _locate_range_batch(self, subs: list[RangeSubscription]) -> list[Located]:
        """Return what :meth:`_locate` gives each of ``subs``, their cell boxes computed at once.

        A box inside one rectangle that is not text-partitioned goes to its
        owner alone (:meth:`RoutingTable.sole_owners`, numpy); the others
        through :meth:`RoutingTable.route_parts`. O(len(subs)) numpy, plus the
        summary keywords and the routes that span rectangles in Python.
        """
        table, summary_keywords = self.table, self.vocabulary.summary_keywords
        boxes = table.grid.cell_boxes([sub.rect.as_list() for sub in subs])
        owners = table.sole_owners(boxes).tolist()
        out = []
        for sub, box, owner in zip(subs, map(tuple, boxes.tolist()), owners, strict=True):
            keywords = summary_keywords(sub.dnf)
            targets = ((owner, box),) if owner >= 0 else tuple(table.route_parts(box, keywords))
            out.append(Located(sub, "subscribe", targets, keywords))
        return out

    def _locate(self, record: Record) -> Located:
        """Locate a record other than an object.

        A range subscription goes its own way here, not through
        :meth:`_locate_range_batch`, of which it is the fallback: should the
        bulk path fail, this one must not fail with it.
        """
        kind = kind_of(record)
        if isinstance(record, TopkSubscription | KnnSubscription):
            return Located(record, kind, keywords=record.keywords)
        if kind != "subscribe":
            return Located(record, kind)
        assert isinstance(record, RangeSubscription)
        table = self.table
        box = table.grid.cell_box(record.rect)
        keywords = self.vocabulary.summary_keywords(record.dnf)
        return Located(record, kind, targets=tuple(table.route_parts(box, keywords)), keywords=keywords)


def located_table(batch: LocatedBatch) -> pa.Table:
    """Return the batch's records in stream order as :data:`~skpub.kernel.wire.LOCATED_SCHEMA` rows.

    An object's ``evaluator`` is its owner and ``cx0..cy1`` its cell
    ``(cx, cy, cx, cy)``; other records have evaluator -1 and, for a range
    subscription, ``targets``, ``boxes`` (four ints per target) and
    ``keywords``. Objects are converted column by column, without a
    per-object Python step.
    """
    objects = batch.objects
    n = len(objects)
    cx, cy = pa.array(batch.cx, pa.int32()), pa.array(batch.cy, pa.int32())
    columns = {
        "evaluator": pa.array(batch.owners, pa.int32()),
        "pos": pa.array(objects.pos, pa.int64()),
        "kind": pa.array(np.full(n, OBJECT, dtype=np.int8)),
        "id": objects.ids,
        "x": pa.array(objects.x),
        "y": pa.array(objects.y),
        "terms": objects.terms.cast(LOCATED_SCHEMA.field("terms").type),
        "ts": pa.array(objects.ts, from_pandas=True),
        "expires_at": pa.array(objects.expires_at, from_pandas=True),
        "cx0": cx,
        "cy0": cy,
        "cx1": cx,
        "cy1": cy,
    }
    nulls = {name: pa.nulls(n, LOCATED_SCHEMA.field(name).type) for name in LOCATED_SCHEMA.names if name not in columns}
    table = pa.table({**columns, **nulls}, schema=LOCATED_SCHEMA)
    if not batch.others:
        return table
    return _interleave(table, _others_table(batch.others))


def _interleave(first: pa.Table, second: pa.Table) -> pa.Table:
    """Return the rows of two tables, each in position order and with distinct positions, in position order.

    A column only ``first`` fills with lists (the objects' terms: most of a
    batch's bytes) keeps its values buffer: only its offsets are spread over
    the rows (:func:`_spread_lists`). Every other column is gathered (Arrow
    ``take``). O(rows) numpy plus the gathered columns' bytes.
    """
    n, m = first.num_rows, second.num_rows
    into = np.searchsorted(first.column("pos").to_numpy(), second.column("pos").to_numpy()) + np.arange(m)
    from_first = np.ones(n + m, bool)
    from_first[into] = False
    order = np.empty(n + m, np.int64)
    order[from_first] = np.arange(n)
    order[into] = n + np.arange(m)
    indices = pa.array(order)
    columns = []
    for name in first.column_names:
        a, b = first.column(name).combine_chunks(), second.column(name).combine_chunks()
        if pa.types.is_list(a.type) and b.null_count == m:
            columns.append(_spread_lists(a, from_first))
        else:
            columns.append(pa.concat_arrays([a, b]).take(indices))
    return pa.Table.from_arrays(columns, schema=first.schema)


def _spread_lists(lists: pa.ListArray, rows: np.ndarray) -> pa.ListArray:
    """Return ``lists`` at the rows where ``rows`` (bool, shape (n,)) is true, in order, and nulls at the others.

    The values buffer is shared, not copied: only the int32 offsets are
    rebuilt. O(n).
    """
    before = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(rows, out=before[1:])  # rows of ``lists`` before each row
    valid = rows.copy()
    if lists.null_count:
        valid[rows] = lists.is_valid().to_numpy(zero_copy_only=False)
    offsets = pa.array(lists.offsets.to_numpy()[before], pa.int32())
    return pa.ListArray.from_arrays(offsets, lists.values, type=lists.type, mask=pa.array(~valid))


def _others_table(others: list[Located]) -> pa.Table:
    """Return the :data:`LOCATED_SCHEMA` rows of records other than objects (subscriptions with their targets)."""
    cols = record_columns([item.record for item in others])
    n = len(others)
    cols["evaluator"] = [-1] * n
    targets: list = [None] * n
    boxes: list = [None] * n
    keywords: list = [None] * n
    for i, item in enumerate(others):
        if item.targets:
            targets[i] = [e for e, _ in item.targets]
            boxes[i] = [c for _, box in item.targets for c in box]
        if item.keywords:
            keywords[i] = sorted(item.keywords)
    cols.update(targets=targets, boxes=boxes, keywords=keywords)
    return pa.table(cols, schema=LOCATED_SCHEMA)
