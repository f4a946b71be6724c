"""The columnar wire format of records between engine stages (parse -> sequencer -> evaluators).

Engines that move records between processes (the Spark engine, through
files its tasks name) send them as Arrow columns. :data:`ROUTED_COLUMNS` is
what an evaluator receives: one row per (record, evaluator),
:func:`to_columns` and :func:`from_columns` convert
:class:`~skpub.kernel.messages.Routed` rows losslessly (plain Python lists, so
the format is testable without Spark). :data:`LOCATED_COLUMNS` adds what the
parallel parse stage tells the serial sequencer: a range subscription's
target evaluators with their cell boxes and its summary keywords.

``kind`` codes are :data:`KIND_CODES` (the registry kinds, and ``mark`` for
the end of a micro-batch). For an object, ``evaluator`` is its owner and
``cx0..cy1`` its cell ``(cx, cy, cx, cy)``; for a range subscription the cell
box of its rectangle (after the sequencer, of rectangle ∩ partition). A topk
or knn subscription travels as ``spec``, the JSON of its fields. ``accepted``
and ``watermark`` are the stream clock after the record (see
:class:`~skpub.kernel.messages.Routed`); ``only`` and ``window`` are null but
for an object in a text-partitioned rectangle: the terms this evaluator
answers for, and false where it does not keep the object for top-k/kNN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from skpub.kernel.geometry import Rect
from skpub.kernel.messages import Mark, Routed
from skpub.kernel.records import (
    KnnSubscription,
    ObjectRecord,
    RangeSubscription,
    Record,
    SnapshotMarker,
    TopkSubscription,
    Unsubscribe,
)
from skpub.kernel.registry import KINDS as REGISTRY_KINDS

KINDS = (*REGISTRY_KINDS, "mark")
"""``KINDS[code]`` is the registry kind of a ``kind`` code; ``mark`` is the end of a micro-batch."""
KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
OBJECT, SUBSCRIBE, UNSUBSCRIBE = KIND_CODES["object"], KIND_CODES["subscribe"], KIND_CODES["unsubscribe"]
SNAPSHOT, MARK = KIND_CODES["snapshot"], KIND_CODES["mark"]

ROUTED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("evaluator", "int"),
    ("pos", "bigint"),
    ("kind", "tinyint"),
    ("id", "string"),
    ("x", "double"),
    ("y", "double"),
    ("terms", "array<string>"),
    ("ts", "double"),
    ("expires_at", "double"),
    ("cx0", "int"),
    ("cy0", "int"),
    ("cx1", "int"),
    ("cy1", "int"),
    ("rect", "array<double>"),
    ("dnf", "string"),
    ("spec", "string"),
    ("accepted", "bigint"),
    ("watermark", "double"),
    ("only", "array<string>"),
    ("window", "boolean"),
)
ROUTED_FILE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("evaluator", "int"),
    ("path", "string"),
    ("rows", "bigint"),
    ("partition", "string"),
)
"""What Spark carries from the sequencer to an evaluator's task: the file of its routed rows, their number, and
(when the balancer is on) the evaluator's partition in the batch's epoch as JSON cell boxes, else ``""``."""
LOCATED_COLUMNS: tuple[tuple[str, str], ...] = (
    *ROUTED_COLUMNS,
    ("targets", "array<int>"),
    ("boxes", "array<int>"),
    ("keywords", "array<string>"),
)
NAMES = tuple(name for name, _ in ROUTED_COLUMNS)
_ARROW_TYPES = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "tinyint": pa.int8(),
    "double": pa.float64(),
    "string": pa.string(),
    "array<string>": pa.list_(pa.string()),
    "array<double>": pa.list_(pa.float64()),
    "array<int>": pa.list_(pa.int32()),
    "boolean": pa.bool_(),
}


def routed_rows_table(rows: Sequence[Routed]) -> pa.Table:
    """Return routed rows as the :data:`ROUTED_SCHEMA` table an evaluator applies (tests and benchmarks build rows)."""
    return pa.table(to_columns(rows), schema=ROUTED_SCHEMA)


def ddl(columns: Sequence[tuple[str, str]]) -> str:
    """Return the Spark DDL schema string of ``columns``."""
    return ", ".join(f"{name} {kind}" for name, kind in columns)


def arrow_schema(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    """Return the Arrow schema of ``columns``."""
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in columns])


ROUTED_SCHEMA = arrow_schema(ROUTED_COLUMNS)
LOCATED_SCHEMA = arrow_schema(LOCATED_COLUMNS)


def table_buffer(table: pa.Table) -> pa.Buffer:
    """Return ``table`` as an Arrow IPC stream in an Arrow buffer (with the buffer protocol; not copied to bytes).

    The stream is measured first (``MockOutputStream``) and written into a
    buffer of that size: a growing buffer copies itself at each doubling,
    several times slower on tens of MB.
    """
    size = pa.MockOutputStream()
    with pa.ipc.new_stream(size, table.schema) as writer:
        writer.write_table(table)
    buffer = pa.allocate_buffer(size.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buffer), table.schema) as writer:
        writer.write_table(table)
    return buffer


def table_bytes(table: pa.Table) -> bytes:
    """Return ``table`` as an Arrow IPC stream (how the Spark engine's tasks hand rows on, through files)."""
    return table_buffer(table).to_pybytes()


def bytes_table(data: bytes) -> pa.Table:
    """Return the table of an Arrow IPC stream (:func:`table_bytes`).

    Raises
    ------
    pyarrow.ArrowInvalid
        If ``data`` is not one.
    """
    return pa.ipc.open_stream(data).read_all()


def read_rows_file(path: str | Path, rows: int, noun: str, owner: str) -> pa.Table:
    """Return the table a task wrote to ``path`` (:func:`table_bytes`), checked to hold ``rows`` rows.

    ``noun`` and ``owner`` name the rows in messages ("located rows", "part 3").

    Raises
    ------
    ValueError
        If the file cannot be read, is not an Arrow IPC stream, or holds another number of rows (cut or foreign).
    """
    try:
        table = bytes_table(Path(path).read_bytes())
    except (OSError, pa.ArrowInvalid) as exc:
        raise ValueError(f"the {noun} of {owner} cannot be read: {exc}") from None
    if table.num_rows != rows:
        raise ValueError(f"{path} holds {table.num_rows} {noun}, not {rows}")
    return table


def to_columns(rows: Sequence[Routed], evaluator_keys: Sequence[int] | None = None) -> dict[str, list]:
    """Convert routed rows to columns; ``evaluator`` holds ``evaluator_keys[row.evaluator]`` (or the index)."""
    cols = record_columns([row.record for row in rows])
    cols["evaluator"] = [row.evaluator if evaluator_keys is None else evaluator_keys[row.evaluator] for row in rows]
    cols["accepted"] = [row.accepted for row in rows]
    cols["watermark"] = [row.watermark for row in rows]
    cols["only"] = [None if row.only is None else sorted(row.only) for row in rows]
    cols["window"] = [None if row.window else False for row in rows]
    boxes = [row.cells or _NO_CELLS for row in rows]
    for c, name in enumerate(("cx0", "cy0", "cx1", "cy1")):
        cols[name] = [box[c] for box in boxes]
    return cols


_NO_CELLS = (None, None, None, None)


def record_columns(records: Sequence[Record | Mark]) -> dict[str, list]:
    """Return the columns of :data:`NAMES` a record fills (its position, id, kind and fields); the others None.

    One writer per record type (:data:`_WRITERS`), found by the record's
    exact type: O(records) plus each record's fields.

    Raises
    ------
    TypeError
        If a record is of no type the wire carries.
    """
    n = len(records)
    cols: dict[str, list] = {name: [None] * n for name in NAMES}
    cols["pos"] = [rec.pos for rec in records]
    cols["id"] = [rec.id for rec in records]
    for i, rec in enumerate(records):
        writer = _WRITERS.get(type(rec))
        if writer is None:
            raise TypeError(f"the routed rows carry no {type(rec).__name__}")
        writer(cols, i, rec)
    return cols


def _object_fields(cols: dict[str, list], i: int, rec: ObjectRecord) -> None:
    cols["kind"][i], cols["x"][i], cols["y"][i] = OBJECT, rec.x, rec.y
    cols["terms"][i], cols["ts"][i], cols["expires_at"][i] = list(rec.terms), rec.ts, rec.expires_at


def _range_fields(cols: dict[str, list], i: int, rec: RangeSubscription) -> None:
    cols["kind"][i], cols["rect"][i] = SUBSCRIBE, rec.rect.as_list()
    cols["dnf"][i] = orjson.dumps([sorted(clause) for clause in rec.dnf]).decode()


def _ranked_fields(cols: dict[str, list], i: int, rec: TopkSubscription | KnnSubscription) -> None:
    cols["kind"][i], cols["spec"][i] = SUBSCRIBE, ranked_spec(rec)


def _kind_writer(code: int) -> Callable[[dict[str, list], int, Record | Mark], None]:
    def write(cols: dict[str, list], i: int, rec: Record | Mark) -> None:
        cols["kind"][i] = code

    return write


_WRITERS: dict[type, Callable[[dict[str, list], int, Any], None]] = {
    ObjectRecord: _object_fields,
    RangeSubscription: _range_fields,
    TopkSubscription: _ranked_fields,
    KnnSubscription: _ranked_fields,
    Unsubscribe: _kind_writer(UNSUBSCRIBE),
    SnapshotMarker: _kind_writer(SNAPSHOT),
    Mark: _kind_writer(MARK),
}
"""How each record type fills its columns (:func:`record_columns`)."""


def ranked_spec(sub: TopkSubscription | KnnSubscription) -> str:
    """Return the ``spec`` column of a topk or knn subscription: its fields as JSON (no position, no id)."""
    if isinstance(sub, TopkSubscription):
        doc = {"kind": "topk", "x": sub.x, "y": sub.y, "weights": sub.weights, "k": sub.k, "alpha": sub.alpha}
    else:
        doc = {
            "kind": "knn",
            "x": sub.x,
            "y": sub.y,
            "keywords": sorted(sub.keywords),
            "k": sub.k,
            "match": sub.match,
            "from": sub.from_,
        }
    return orjson.dumps(doc).decode()


@lru_cache(maxsize=1 << 16)
def ranked_from_spec(pos: int, sid: str, spec: str) -> TopkSubscription | KnnSubscription:
    """Rebuild a topk or knn subscription from its ``spec`` (:func:`ranked_spec`).

    Cached: every evaluator of a process receives the same subscribe row, and
    a record is never changed once built.

    Raises
    ------
    ValueError, KeyError, TypeError
        If ``spec`` is not of that shape.
    """
    doc = orjson.loads(spec)
    x, y, k = float(doc["x"]), float(doc["y"]), int(doc["k"])
    if doc["kind"] == "topk":
        weights = tuple((str(t), float(w)) for t, w in doc["weights"])
        return TopkSubscription(pos, sid, x, y, weights, k, float(doc["alpha"]))
    if doc["kind"] == "knn":
        return KnnSubscription(pos, sid, x, y, frozenset(map(str, doc["keywords"])), k, doc["match"], doc["from"])
    raise ValueError(f"a ranked subscription is topk or knn, not {doc['kind']!r}")


def table_columns(table: pa.Table) -> dict[str, list]:
    """Return ``table``'s columns as lists of Python values, as ``to_pydict`` does, the terms as tuples.

    The terms (most of a batch's values: about nine per object) are
    converted in bulk, as one list of strings cut at the list offsets, not
    one Arrow scalar at a time. A null list (a row that is not an object)
    becomes a tuple too, which :func:`from_columns` never reads. O(values)
    (of a slice, the values of the array it slices).
    """
    cols = {}
    for name in table.column_names:
        column = table.column(name)
        if name == "terms":
            terms = column.combine_chunks()  # one array; its offsets index its values, a slice's included
            flat = terms.values.to_numpy(zero_copy_only=False).tolist()
            offsets = terms.offsets.to_numpy().tolist()
            cols[name] = [tuple(flat[a:b]) for a, b in pairwise(offsets)]
        else:
            cols[name] = column.to_pylist()
    return cols


def from_columns(cols: Mapping[str, Sequence], evaluator: int) -> list[Routed]:
    """Rebuild routed rows for ``evaluator`` from columns of Python values, in stream order.

    ``cols`` maps every :data:`ROUTED_SCHEMA` name to a list of Python
    values, as :func:`table_columns` (or ``pyarrow.Table.to_pydict``, or
    :func:`to_columns`) gives them: nulls None, an object's terms a tuple or
    a list, and a ``ts`` or ``watermark`` the stream clock left unset NaN.
    Columns are zipped (no per-row lookup by name), and reordered only when
    they are not in stream order already: this runs for every row an
    evaluator receives. O(rows), or O(rows log rows) to reorder.

    Raises
    ------
    ValueError
        If a row's ``kind`` is not one of :data:`KINDS`, or a ``spec`` is damaged.
    """
    pos = cols["pos"]
    names = ("kind", "id", "x", "y", "terms", "ts", "expires_at", "cx0", "cy0", "cx1", "cy1", "rect", "dnf", "spec")
    columns = [cols[name] for name in (*names, "accepted", "watermark", "only", "window")]
    if any(a > b for a, b in pairwise(pos)):
        order = sorted(range(len(pos)), key=pos.__getitem__)
        pos = [pos[i] for i in order]
        columns = [[values[i] for i in order] for values in columns]
    rows = []
    append, nan = rows.append, math.nan
    for (
        p,
        kind,
        oid,
        x,
        y,
        words,
        ts,
        expires_at,
        cx0,
        cy0,
        cx1,
        cy1,
        rect,
        dnf,
        spec,
        accepted,
        watermark,
        only,
        window,
    ) in zip(  # noqa: E501
        pos, *columns, strict=True
    ):
        if watermark is None:
            watermark = nan
        if kind == OBJECT:
            words = tuple(words)
            record = ObjectRecord(
                p,
                oid,
                x,
                y,
                words,
                frozenset(words),
                None if ts is None or ts != ts else ts,
                None if expires_at is None or expires_at != expires_at else expires_at,
            )
            if only is None and window is None:
                append(Routed(evaluator, record, (cx0, cy0, cx1, cy1), accepted, watermark))
            else:
                restricted = None if only is None else frozenset(only)
                cells = (cx0, cy0, cx1, cy1)
                append(Routed(evaluator, record, cells, accepted, watermark, restricted, window is not False))
        elif kind == SUBSCRIBE and spec is not None:
            append(Routed(evaluator, ranked_from_spec(p, oid, spec), None, accepted, watermark))
        elif kind == SUBSCRIBE:
            clauses = tuple(frozenset(clause) for clause in orjson.loads(dnf))
            record = RangeSubscription(p, oid, Rect(*rect), clauses)
            append(Routed(evaluator, record, (cx0, cy0, cx1, cy1), accepted, watermark))
        else:
            other = _OTHERS.get(kind)
            if other is None:
                raise ValueError(f"an evaluator receives no rows of kind {kind}")
            append(Routed(evaluator, other(p, oid), None, accepted, watermark))
    return rows


_OTHERS = {UNSUBSCRIBE: Unsubscribe, SNAPSHOT: SnapshotMarker, MARK: Mark}
"""The records rebuilt from ``(pos, id)`` alone."""
