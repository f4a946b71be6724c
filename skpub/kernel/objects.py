r"""Object records as columns, and the bulk decoder that fills them: the fast lane of parsing.

Objects are the stream's volume, and most of them are never forwarded to an
evaluator (their owner's textual summary holds none of their terms, Tornado
section 3.1). Parsing each into a Python record costs far more than the
routing decision it feeds, so the parse stage keeps a micro-batch's objects
as :class:`ObjectColumns` (ids, coordinates, normalized terms, times);
records are built only for the rows that go to an evaluator, from the routed
columns (:func:`skpub.kernel.wire.from_columns`). :meth:`ObjectColumns.records`
is the reference conversion the fuzzers compare with ``parse_line``.

:func:`decode_objects` decodes the common well-formed object line with a
typed ``msgspec`` decoder (one C call per line, no intermediate dict) and
hands every other line back to :func:`~skpub.kernel.records.parse_line`. It
takes a line only when that line cannot be anything but a valid object,
whose record then equals the one :func:`parse_line` builds (tested by
differential fuzzing against it):

- the line is at most ``max_record_bytes`` long, starts with ``{`` and
  holds the bytes ``"object"``;
- it decodes as exactly the fields ``type`` (``"object"``), ``id`` (a
  non-empty string), ``x``, ``y`` (numbers), ``terms`` (strings) and
  optionally ``ts``, ``expires_at`` (numbers or null), nothing else. The
  decoder rejects invalid UTF-8, lone surrogates, ``NaN``, numbers beyond
  a 64-bit float and booleans as numbers;
- it holds exactly one ``:`` per field present, so no key is repeated (the
  decoder would keep the last) and no string holds a colon;
- its point lies in the space.

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
    ids : list of str, length n
    x, y : ndarray, shape (n,), float64
        Coordinates, in space units.
    terms : pyarrow LargeListArray of large_string, length n
        Normalized terms in input order, repeats kept (``ObjectRecord.terms``).
    ts, expires_at : ndarray, shape (n,), float64
        Seconds; NaN where the record has none (a record never holds NaN:
        SEMANTICS section 1 makes it ``non_finite``).
    """

    pos: np.ndarray
    ids: list[str]
    x: np.ndarray
    y: np.ndarray
    terms: pa.LargeListArray
    ts: np.ndarray
    expires_at: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_records(cls, records: Sequence[ObjectRecord]) -> ObjectColumns:
        """Return the columns of ``records`` (in their order)."""
        return cls(
            np.fromiter((r.pos for r in records), np.int64, len(records)),
            [r.id for r in records],
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
            [i for p in parts for i in p.ids],
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
            [self.ids[r] for r in rows.tolist()],
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
            part.ids,
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
        Never raises for a line's content. O(total bytes); about one C
        decode per line plus one normalization check per call.
    """
    taken: list[int] = []
    rest: list[int] = []
    decoded: list[_ObjectLine] = []
    for i, line in enumerate(lines):
        if len(line) > max_record_bytes or line[:1] != b"{" or b'"object"' not in line:
            rest.append(i)
            continue
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
    x = np.fromiter((o.x for o in decoded), np.float64, n)
    y = np.fromiter((o.y for o in decoded), np.float64, n)
    inside = (space.xmin <= x) & (x <= space.xmax) & (space.ymin <= y) & (y <= space.ymax)
    if not inside.all():
        rest = sorted(rest + [taken[k] for k in np.flatnonzero(~inside).tolist()])
        keep = np.flatnonzero(inside)
        taken = [taken[k] for k in keep.tolist()]
        decoded = [decoded[k] for k in keep.tolist()]
        x, y = x[keep], y[keep]
    columns = ObjectColumns(
        first_pos + np.asarray(taken, dtype=np.int64),
        [o.id for o in decoded],
        x,
        y,
        _normalized_terms([o.terms for o in decoded]),
        _times([None if o.ts is _UNSET else o.ts for o in decoded]),
        _times([None if o.expires_at is _UNSET else o.expires_at for o in decoded]),
    )
    return columns, rest


def _normalized_terms(lists: list[list[str]]) -> pa.LargeListArray:
    """Normalize every object's terms in one pass (:func:`normalize_array`), dropping empty ones per object."""
    flat = normalize_array([t for terms in lists for t in terms])
    counts = np.fromiter(map(len, lists), np.int64, len(lists))
    empty = pc.equal(pc.binary_length(flat), 0)
    if empty.true_count:
        keep = ~empty.to_numpy(zero_copy_only=False)
        flat = flat.filter(pa.array(keep))
        counts = np.bincount(np.repeat(np.arange(len(lists)), counts)[keep], minlength=len(lists))
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), flat)
