r"""Object records as columns, and the bulk decoder that fills them: the fast lane of parsing.

Objects are the stream's volume, and most of them are never forwarded to an
evaluator (their owner's textual summary holds none of their terms, Tornado
section 3.1). Parsing each into a Python record costs far more than the
routing decision it feeds, so the parse stage keeps a micro-batch's objects
as :class:`ObjectColumns` (ids, coordinates, normalized terms, times);
records are built only for the rows that go to an evaluator, from the routed
columns (:func:`skpub.kernel.wire.from_columns`). :meth:`ObjectColumns.records`
is the reference conversion the fuzzers compare with ``parse_line``.

:func:`decode_objects` decodes the common well-formed object line in bulk
and hands every other line back to :func:`~skpub.kernel.records.parse_line`.
It takes a line only when that line cannot be anything but a valid object,
whose record then equals the one :func:`parse_line` builds (tested by
differential fuzzing against it, each lane alone and both together):

- the line is at most ``max_record_bytes`` long, starts with ``{`` and
  holds the bytes ``"object"``;
- it decodes as exactly the fields ``type`` (``"object"``), ``id`` (a
  non-empty string), ``x``, ``y`` (finite numbers), ``terms`` (strings) and
  optionally ``ts``, ``expires_at`` (finite numbers or null), nothing else,
  from valid UTF-8 without lone surrogates;
- it holds exactly one ``:`` per field present, so no key is repeated and
  no string holds a colon (nor a second record on the same line);
- its point lies in the space.

Two lanes decide this. Arrow's JSON reader (``pyarrow.json``, C++) reads
chunks of candidate lines straight into columns, about 4x cheaper than a
decode per line; it reads ``NaN`` and does not check UTF-8, so those
checks are made on the chunk and its columns. A chunk the reader refuses
(one bad line refuses its whole chunk) and the rows it read but cannot
vouch for go to a typed ``msgspec`` decoder, one C call per line, which
rejects invalid UTF-8, lone surrogates, ``NaN``, numbers beyond a 64-bit
float and booleans as numbers itself. So hostile lines cost speed, never
results.

Everything else (other records, and objects with ``text``, repeated keys,
colons in strings, points outside the space, ...) takes the line-by-line path,
which applies every rule of SEMANTICS section 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from skpub.kernel.geometry import Rect
from skpub.kernel.records import ObjectRecord
from skpub.kernel.text import normalize_array


class _ObjectLine(msgspec.Struct, forbid_unknown_fields=True):
    """The one shape of line the fast lane takes (field names as in SEMANTICS section 1)."""

    type: Literal["object"]
    id: Annotated[str, msgspec.Meta(min_length=1)]
    x: float
    y: float
    terms: list[str]
    ts: float | None | msgspec.UnsetType = msgspec.UNSET
    expires_at: float | None | msgspec.UnsetType = msgspec.UNSET


_DECODE = msgspec.json.Decoder(_ObjectLine).decode
_REQUIRED_FIELDS = 5
_UNSET = msgspec.UNSET


@dataclass
class ObjectColumns:
    """Object records as columns, row ``i`` being one object.

    Attributes
    ----------
    pos : ndarray, shape (n,), int64
        Stream positions.
    ids : pyarrow StringArray, length n
    x, y : ndarray, shape (n,), float64
        Coordinates, in space units.
    terms : pyarrow LargeListArray of large_string, length n
        Normalized terms in input order, repeats kept (``ObjectRecord.terms``).
    ts, expires_at : ndarray, shape (n,), float64
        Seconds; NaN where the record has none (a record never holds NaN:
        SEMANTICS section 1 makes it ``non_finite``).
    """

    pos: np.ndarray
    ids: pa.StringArray
    x: np.ndarray
    y: np.ndarray
    terms: pa.LargeListArray
    ts: np.ndarray
    expires_at: np.ndarray

    def __len__(self) -> int:
        return len(self.pos)

    @classmethod
    def from_records(cls, records: Sequence[ObjectRecord]) -> ObjectColumns:
        """Return the columns of ``records`` (in their order)."""
        return cls(
            np.fromiter((r.pos for r in records), np.int64, len(records)),
            pa.array([r.id for r in records], pa.string()),
            np.fromiter((r.x for r in records), np.float64, len(records)),
            np.fromiter((r.y for r in records), np.float64, len(records)),
            _list_array([t for r in records for t in r.terms], np.fromiter((len(r.terms) for r in records), np.int64)),
            _times([r.ts for r in records]),
            _times([r.expires_at for r in records]),
        )

    @classmethod
    def concat(cls, parts: Sequence[ObjectColumns]) -> ObjectColumns:
        """Return the rows of ``parts`` one after the other, ordered by position."""
        joined = cls(
            np.concatenate([p.pos for p in parts]),
            pa.concat_arrays([p.ids for p in parts]),
            np.concatenate([p.x for p in parts]),
            np.concatenate([p.y for p in parts]),
            pa.concat_arrays([p.terms for p in parts]),
            np.concatenate([p.ts for p in parts]),
            np.concatenate([p.expires_at for p in parts]),
        )
        order = np.argsort(joined.pos, kind="stable")
        return joined if (np.diff(order) > 0).all() else joined.take(order)

    def take(self, rows: np.ndarray) -> ObjectColumns:
        """Return rows ``rows`` (an int ndarray), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return ObjectColumns(
            self.pos[rows],
            self.ids.take(pa.array(rows)),
            self.x[rows],
            self.y[rows],
            self.terms.take(pa.array(rows)),
            self.ts[rows],
            self.expires_at[rows],
        )

    def records(self, rows: np.ndarray | Sequence[int]) -> list[ObjectRecord]:
        """Return rows ``rows`` as records, equal to what :func:`~skpub.kernel.records.parse_line` gives."""
        part = self.take(np.asarray(rows, dtype=np.int64))
        out = []
        columns = (
            part.pos.tolist(),
            part.ids.to_pylist(),
            part.x.tolist(),
            part.y.tolist(),
            part.terms.to_pylist(),
            part.ts.tolist(),
            part.expires_at.tolist(),
        )
        for pos, oid, x, y, terms, ts, expires_at in zip(*columns, strict=True):
            out.append(
                ObjectRecord(
                    pos,
                    oid,
                    x,
                    y,
                    tuple(terms),
                    frozenset(terms),
                    None if ts != ts else ts,
                    None if expires_at != expires_at else expires_at,
                )
            )
        return out


def _times(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _list_array(values: list[str], counts: np.ndarray) -> pa.LargeListArray:
    """Return the list array whose row ``i`` holds the next ``counts[i]`` strings of ``values``."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, pa.large_string()))


@dataclass
class _Taken:
    """The objects one lane of the decoder took, before the space test and normalization.

    ``lines`` are indexes into the decoder's input, ascending; ``terms`` holds
    every object's raw terms one after the other, ``counts`` how many each
    has; ``ts`` and ``expires_at`` are NaN where the line has none.
    """

    lines: np.ndarray
    ids: pa.StringArray
    x: np.ndarray
    y: np.ndarray
    terms: pa.Array
    counts: np.ndarray
    ts: np.ndarray
    expires_at: np.ndarray

    @classmethod
    def none(cls) -> _Taken:
        empty = np.empty(0, dtype=np.float64)
        return cls(np.empty(0, dtype=np.int64), pa.array([], pa.string()), empty, empty,
                   pa.array([], pa.large_string()), np.empty(0, dtype=np.int64), empty, empty)  # fmt: skip

    def columns(self, first_pos: int, space: Rect) -> tuple[ObjectColumns, list[int]]:
        """Return the objects whose point lies in ``space`` as columns, and the other lines' indexes."""
        x, y = self.x, self.y
        inside = (space.xmin <= x) & (x <= space.xmax) & (space.ymin <= y) & (y <= space.ymax)
        terms, counts, ids, lines = self.terms, self.counts, self.ids, self.lines
        outside = self.lines[~inside].tolist()
        if outside:
            keep = np.flatnonzero(inside)
            owner = np.repeat(np.arange(len(counts)), counts)
            terms = terms.filter(pa.array(inside[owner]))
            counts, lines, x, y = counts[keep], lines[keep], x[keep], y[keep]
            ids = ids.filter(pa.array(inside))
        columns = ObjectColumns(
            first_pos + lines,
            ids,
            x,
            y,
            _normalized_terms(terms, counts),
            self.ts[inside],
            self.expires_at[inside],
        )
        return columns, outside


def decode_objects(
    lines: Sequence[bytes], first_pos: int, space: Rect, max_record_bytes: int
) -> tuple[ObjectColumns, list[int]]:
    """Decode the well-formed object lines of ``lines`` in bulk.

    Parameters
    ----------
    lines : sequence of bytes
        Lines as read, without terminators; line ``i`` has stream position
        ``first_pos + i``.
    first_pos : int
        Stream position of ``lines[0]``.
    space : Rect
        The deployment space.
    max_record_bytes : int
        Longer lines are left to the line-by-line path (``too_large``).

    Returns
    -------
    (ObjectColumns, list of int)
        The objects of the lines taken, in stream order, and the indexes of
        the lines not taken (ascending), which the caller parses one by one.
        Never raises for a line's content. O(total bytes): Arrow's JSON
        reader takes chunks of ``ARROW_CHUNK_LINES`` candidate lines (about
        1.7 us a line on one core); the lines of a chunk it cannot read
        whole, and the rows it reads but cannot vouch for, go through one
        ``msgspec`` decode each (about 4 us).
    """
    candidates = [
        i for i, line in enumerate(lines) if len(line) <= max_record_bytes and line[:1] == b"{" and b'"object"' in line
    ]
    others = np.ones(len(lines), bool)
    others[candidates] = False
    rest: list[int] = np.flatnonzero(others).tolist()
    taken: list[_Taken] = []
    slow: list[int] = []
    for at in range(0, len(candidates), ARROW_CHUNK_LINES):
        arrow, left = _arrow_lane(lines, candidates[at : at + ARROW_CHUNK_LINES])
        taken.append(arrow)
        slow += left
    decoded, left = _msgspec_lane(lines, slow)
    taken.append(decoded)
    rest += left
    parts = []
    for lane in taken:
        if len(lane.lines):
            columns, outside = lane.columns(first_pos, space)
            parts.append(columns)
            rest += outside
    objects = ObjectColumns.concat(parts) if parts else ObjectColumns.from_records([])
    return objects, sorted(rest)


def _msgspec_lane(lines: Sequence[bytes], indexes: list[int]) -> tuple[_Taken, list[int]]:
    """Decode ``lines[i]`` for ``i`` in ``indexes`` one at a time; return what was taken and the other indexes."""
    taken: list[int] = []
    rest: list[int] = []
    decoded: list[_ObjectLine] = []
    for i in indexes:
        line = lines[i]
        try:
            obj = _DECODE(line)
        except (msgspec.MsgspecError, ValueError):
            rest.append(i)
            continue
        if line.count(b":") != _REQUIRED_FIELDS + (obj.ts is not _UNSET) + (obj.expires_at is not _UNSET):
            rest.append(i)
            continue
        taken.append(i)
        decoded.append(obj)
    n = len(decoded)
    lane = _Taken(
        np.asarray(taken, dtype=np.int64),
        pa.array([o.id for o in decoded], pa.string()),
        np.fromiter((o.x for o in decoded), np.float64, n),
        np.fromiter((o.y for o in decoded), np.float64, n),
        pa.array([t for o in decoded for t in o.terms], pa.large_string()),
        np.fromiter((len(o.terms) for o in decoded), np.int64, n),
        _times([None if o.ts is _UNSET else o.ts for o in decoded]),
        _times([None if o.expires_at is _UNSET else o.expires_at for o in decoded]),
    )
    return lane, rest


ARROW_CHUNK_LINES = 16_384
"""Candidate lines per call of Arrow's JSON reader; a chunk it cannot read whole goes to the msgspec lane."""

_ARROW_SCHEMA = pa.schema(
    [("type", pa.string()), ("id", pa.string()), ("x", pa.float64()), ("y", pa.float64()),
     ("terms", pa.list_(pa.string())), ("ts", pa.float64()), ("expires_at", pa.float64())]
)  # fmt: skip
_ARROW_PARSE = pa_json.ParseOptions(explicit_schema=_ARROW_SCHEMA, unexpected_field_behavior="ignore")
_ARROW_BLOCK_BYTES = 1 << 20
_COLON = ord(":")


def _arrow_lane(lines: Sequence[bytes], indexes: list[int]) -> tuple[_Taken, list[int]]:
    """Read ``lines[i]`` for ``i`` in ``indexes`` with Arrow's JSON reader; return what was taken and the other indexes.

    The reader checks JSON syntax, repeated fields and the JSON types of the
    fields it knows (it ignores others); it does not check UTF-8, it reads
    ``NaN`` and ``Infinity`` as numbers, and the integer ``-0`` as -0.0
    (JSON parsers give 0). So a chunk is taken only if it is valid UTF-8
    and reads whole, one row per line; then a row is taken only if its
    ``type`` is ``"object"``, its ``id`` is not empty, its numbers are finite
    and not -0.0, its terms are a list with no null, and its line holds
    exactly one ``:`` per field it knows (so no other field, and no string
    holds a colon: none can hide a second record). Every other line goes to
    the msgspec lane, which decides on its own.
    """
    if not indexes:
        return _Taken.none(), []
    chunk = [lines[i] for i in indexes]
    buffer = b"\n".join(chunk)
    lengths = np.fromiter(map(len, chunk), np.int64, len(chunk))
    try:
        buffer.decode("utf-8")
        table = pa_json.read_json(
            pa.py_buffer(buffer),
            read_options=pa_json.ReadOptions(block_size=max(_ARROW_BLOCK_BYTES, int(lengths.max()) + 1)),
            parse_options=_ARROW_PARSE,
        )
    except (pa.ArrowException, UnicodeDecodeError):
        return _Taken.none(), indexes
    if table.num_rows != len(chunk):
        return _Taken.none(), indexes
    table = table.combine_chunks()
    x = table["x"].to_numpy()
    y = table["y"].to_numpy()
    ts, expires_at = table["ts"], table["expires_at"]
    has_ts = pc.is_valid(ts).to_numpy()
    has_expiry = pc.is_valid(expires_at).to_numpy()
    ts, expires_at = ts.to_numpy(), expires_at.to_numpy()
    terms = table["terms"].chunk(0)
    starts = np.zeros(len(chunk), dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    at = np.flatnonzero(np.frombuffer(buffer, np.uint8) == _COLON)  # a few per line: cheaper than a count per byte
    colons = np.searchsorted(at, starts + lengths) - np.searchsorted(at, starts)
    ok = (
        pc.equal(table["type"], "object").fill_null(False).to_numpy()  # noqa: FBT003 - pyarrow's API
        & pc.greater(pc.binary_length(table["id"]), 0).fill_null(False).to_numpy()  # noqa: FBT003
        & np.isfinite(x)
        & np.isfinite(y)
        & (~has_ts | np.isfinite(ts))
        & (~has_expiry | np.isfinite(expires_at))
        & pc.is_valid(terms).to_numpy(zero_copy_only=False)
        & (colons == _REQUIRED_FIELDS + has_ts + has_expiry)
        & ~(_negative_zero(x) | _negative_zero(y) | _negative_zero(ts) | _negative_zero(expires_at))
    )
    flat = pc.list_flatten(terms)
    if flat.null_count:
        ok[pc.list_parent_indices(terms).to_numpy()[flat.is_null().to_numpy(zero_copy_only=False)]] = False
    keep = np.flatnonzero(ok)
    rest = [indexes[k] for k in np.flatnonzero(~ok).tolist()]
    kept = terms.filter(pa.array(ok))
    lane = _Taken(
        np.asarray(indexes, dtype=np.int64)[keep],
        table["id"].chunk(0).filter(pa.array(ok)),
        x[keep],
        y[keep],
        pc.list_flatten(kept).cast(pa.large_string()),
        pc.list_value_length(kept).to_numpy(zero_copy_only=False).astype(np.int64),
        np.where(has_ts, ts, np.nan)[keep],
        np.where(has_expiry, expires_at, np.nan)[keep],
    )
    return lane, rest


def _negative_zero(values: np.ndarray) -> np.ndarray:
    """Rows holding -0.0: Arrow reads the integer ``-0`` so, where JSON parsers give 0; the msgspec lane decides."""
    return (values == 0) & np.signbit(values)


def _normalized_terms(flat: pa.Array, counts: np.ndarray) -> pa.LargeListArray:
    """Normalize every object's terms in one pass (:func:`normalize_array`), dropping empty ones per object.

    ``flat`` holds the objects' raw terms one after the other, ``counts[i]`` of them object ``i``'s.
    """
    flat = normalize_array(flat)
    empty = pc.equal(pc.binary_length(flat), 0)
    if empty.true_count:
        keep = ~empty.to_numpy(zero_copy_only=False)
        flat = flat.filter(pa.array(keep))
        counts = np.bincount(np.repeat(np.arange(len(counts)), counts)[keep], minlength=len(counts))
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), flat)
