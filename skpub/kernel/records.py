"""Typed input records and their validation (``docs/SEMANTICS.md`` section 1).

:func:`parse_line` turns one input line (bytes, as read) into a typed record
or a :class:`DeadLetter` carrying the original line, a reason code and a
message; :mod:`skpub.kernel.decode` first applies the line-level rules (size, UTF-8,
JSON, nesting, repeated keys, overflowing numbers).
It checks everything that a single line can show; the checks that depend on
the stream so far (``duplicate_id``, ``unknown_id``) live in
:class:`skpub.kernel.registry.IdRegistry`. Nothing past these two sees invalid input.

Records are slotted dataclasses that nothing mutates after parsing; they are
not ``frozen`` because a frozen dataclass costs five times as much to build
(2.6 vs 0.5 us for an object record), and objects are the stream's volume.

``pos`` is the record's stream position: a strictly increasing int64 that is
the logical clock of SEMANTICS section 1. Engines build it as
``batch_id << 32 | index within the batch`` (:func:`stream_position`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from skpub.kernel.config import MAX_RECORD_BYTES
from skpub.kernel.decode import LineRejected, clip, decode_line, line_text
from skpub.kernel.errors import ExpressionError
from skpub.kernel.geometry import Rect
from skpub.kernel.text import DNF, normalize_terms, parse_expression, tokenize

REASONS = (
    "malformed_json",
    "unknown_type",
    "missing_field",
    "wrong_field",
    "non_finite",
    "out_of_space",
    "bad_rect",
    "duplicate_id",
    "unknown_kind",
    "unknown_id",
    "bad_k",
    "bad_alpha",
    "empty_keywords",
    "bad_expr",
    "too_large",
    "internal_error",
)
KINDS = ("range", "topk", "knn")
POSITION_BITS = 32


def stream_position(batch_id: int, index: int) -> int:
    """Return the int64 stream position of the ``index``-th record of micro-batch ``batch_id``."""
    return (batch_id << POSITION_BITS) | index


def position_index(pos: int) -> int:
    """Return the index within its micro-batch of the record at stream position ``pos``."""
    return pos & ((1 << POSITION_BITS) - 1)


@dataclass(slots=True)
class ObjectRecord:
    """A geo-tagged text object.

    ``terms`` keeps every normalized term in input order with repeats (term
    counts feed tf-idf); ``term_set`` is the set used for boolean matching.
    ``ts`` and ``expires_at`` are seconds, None when absent.
    """

    pos: int
    id: str
    x: float
    y: float
    terms: tuple[str, ...]
    term_set: frozenset[str]
    ts: float | None = None
    expires_at: float | None = None


@dataclass(slots=True)
class RangeSubscription:
    """A boolean range subscription (SEMANTICS section 3.1); ``dnf`` is never empty."""

    pos: int
    id: str
    rect: Rect
    dnf: DNF


def range_row(sub: RangeSubscription, box: tuple[int, int, int, int]) -> list:
    """Return range subscription ``sub`` indexed over cell box ``box`` as a JSON row (evaluator state, hand-offs).

    The row is ``[id, pos, [xmin, ymin, xmax, ymax], [[clause terms], ...], [cx0, cy0, cx1, cy1]]``.
    """
    r = sub.rect  # floats always, so a row decoded and encoded again is the same bytes
    return [sub.id, sub.pos, [float(r.xmin), float(r.ymin), float(r.xmax), float(r.ymax)],
            [sorted(clause) for clause in sub.dnf], list(box)]  # fmt: skip


def range_from_row(row: list) -> tuple[RangeSubscription, tuple[int, int, int, int]]:
    """Rebuild ``(subscription, cell box)`` from a :func:`range_row` row.

    Raises
    ------
    TypeError, ValueError
        If ``row`` is not such a row.
    """
    sid, pos, rect, dnf, box = row
    if not isinstance(sid, str) or type(pos) is not int or not 0 <= pos < 2**63:
        raise TypeError("a subscription id is a string and its position an integer from 0 to 2**63 - 1")
    clauses = []
    for clause in dnf:
        if not all(isinstance(term, str) for term in clause):
            raise TypeError("clause terms must be strings")
        clauses.append(frozenset(clause))
    cells = tuple(int(c) for c in box)
    if len(cells) != 4 or not clauses or not all(clauses):
        raise ValueError("a cell box has 4 cells and a subscription at least one clause, each with a term")
    return RangeSubscription(pos, sid, Rect(*(float(v) for v in rect)), tuple(clauses)), cells


@dataclass(slots=True)
class TopkSubscription:
    """A top-k subscription (SEMANTICS section 3.2); ``weights`` maps term -> weight."""

    pos: int
    id: str
    x: float
    y: float
    weights: tuple[tuple[str, float], ...]
    k: int
    alpha: float

    @property
    def keywords(self) -> frozenset[str]:
        """The terms a candidate must share with the subscription (SEMANTICS 3.2)."""
        return frozenset(t for t, _ in self.weights)


@dataclass(slots=True)
class KnnSubscription:
    """A boolean kNN subscription (SEMANTICS section 3.3)."""

    pos: int
    id: str
    x: float
    y: float
    keywords: frozenset[str]
    k: int
    match: str
    from_: str


@dataclass(slots=True)
class Unsubscribe:
    """Ends the subscription ``id`` for every later object."""

    pos: int
    id: str


@dataclass(slots=True)
class SnapshotMarker:
    """Asks for the results of every active topk/knn subscription at this position."""

    pos: int
    id: str


@dataclass(slots=True)
class DeadLetter:
    """A rejected input line: the original text, a reason code of :data:`REASONS`, a message."""

    pos: int
    line: str
    reason: str
    message: str

    @classmethod
    def for_line(cls, pos: int, line: bytes | str, reason: str, message: str) -> DeadLetter:
        r"""Return the dead letter of input ``line`` (bytes as read, written as text with ``\xNN`` escapes)."""
        return cls(pos, line_text(line) if isinstance(line, bytes) else line, reason, message)

    @classmethod
    def internal_error(cls, pos: int, line: bytes | str, exc: Exception) -> DeadLetter:
        """Return the ``internal_error`` dead letter of a record whose processing raised ``exc`` (SEMANTICS 1)."""
        return cls.for_line(pos, line, "internal_error", clip(f"{type(exc).__name__}: {exc}", 500))

    def to_json(self, with_pos: bool = False) -> dict[str, str | int]:
        """Return the dead-letter output line of SEMANTICS section 5 (with its stream position ``pos`` if asked)."""
        doc: dict[str, str | int] = {"pos": self.pos} if with_pos else {}
        return {**doc, "line": self.line, "reason": self.reason, "message": self.message}


Subscription = RangeSubscription | TopkSubscription | KnnSubscription
Record = ObjectRecord | Subscription | Unsubscribe | SnapshotMarker


def parse_line(
    line: bytes | str, pos: int, space: Rect, max_record_bytes: int = MAX_RECORD_BYTES
) -> Record | DeadLetter:
    r"""Parse and validate one input line.

    Parameters
    ----------
    line : bytes or str
        One JSON-lines record as read (bytes, possibly not UTF-8), without its
        line terminator; a str is taken as its UTF-8 encoding.
    pos : int
        The record's stream position (see :func:`stream_position`).
    space : Rect
        The deployment space; points outside it are ``out_of_space``.
    max_record_bytes : int
        Lines longer than this many bytes are ``too_large``.

    Returns
    -------
    Record or DeadLetter
        Never raises on bad input: every problem becomes a dead letter with a
        reason of SEMANTICS section 1. The dead letter's ``line`` is the line
        as text, invalid UTF-8 bytes written as ``\xNN``. O(line length),
        plus the expansion of an ``expr`` (at most 256 clauses, 16,384 terms).
    """
    raw = line if isinstance(line, bytes) else line.encode("utf-8", errors="surrogatepass")
    try:
        value = decode_line(raw, max_record_bytes)
        if not isinstance(value, dict):
            raise LineRejected("malformed_json", f"a record must be a JSON object, got {type(value).__name__}")
        rtype = _required(value, "type")
        parser = _PARSERS.get(rtype) if isinstance(rtype, str) else None
        if parser is None:
            raise LineRejected(
                "unknown_type", f"type {_show(rtype)} is none of object, subscribe, unsubscribe, snapshot"
            )
        return parser(value, pos, space)
    except LineRejected as rej:
        return DeadLetter(pos, line_text(raw), rej.reason, rej.message)


def _show(value: Any) -> str:
    """``repr`` of a field value for a message, shortened (hostile lines may hold megabytes)."""
    return clip(repr(value))


def _required(raw: dict[str, Any], name: str) -> Any:
    if name not in raw:
        raise LineRejected("missing_field", f"required field {name!r} is absent")
    return raw[name]


def _identifier(raw: dict[str, Any]) -> str:
    value = _required(raw, "id")
    if not isinstance(value, str) or not value:
        raise LineRejected("wrong_field", f"'id' must be a non-empty string, got {_show(value)}")
    return value


def _number(raw: dict[str, Any], name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LineRejected("wrong_field", f"{name!r} must be a number, got {_show(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise LineRejected("non_finite", f"{name!r} is {value}")
    return value


def _optional_number(raw: dict[str, Any], name: str) -> float | None:
    return _number(raw, name, raw[name]) if raw.get(name) is not None else None


def _point(raw: dict[str, Any], space: Rect, xname: str, yname: str, x: Any, y: Any) -> tuple[float, float]:
    px, py = _number(raw, xname, x), _number(raw, yname, y)
    if not space.contains_point(px, py):
        raise LineRejected("out_of_space", f"point ({px}, {py}) lies outside space {space.as_list()}")
    return px, py


def _normalized_list(name: str, value: Any) -> list[str]:
    """Validate a JSON list of strings and normalize each element as one term."""
    if not isinstance(value, list):
        raise LineRejected("wrong_field", f"{name!r} must be a list of strings")
    try:
        return normalize_terms(value)
    except TypeError:
        raise LineRejected("wrong_field", f"{name!r} must be a list of strings") from None


def _exactly_one(raw: dict[str, Any], first: str, second: str) -> str:
    if first in raw:
        if second in raw:
            raise LineRejected("wrong_field", f"give either {first!r} or {second!r}, not both")
        return first
    if second not in raw:
        raise LineRejected("missing_field", f"one of {first!r} or {second!r} is required")
    return second


def _parse_object(raw: dict[str, Any], pos: int, space: Rect) -> ObjectRecord:
    """Validate an object record: a fast path for the common well-formed shape, else every check in order."""
    oid, x, y, terms = raw.get("id"), raw.get("x"), raw.get("y"), raw.get("terms")
    ts, expires_at = raw.get("ts"), raw.get("expires_at")
    if (
        type(oid) is str
        and oid
        and type(x) is float
        and type(y) is float
        and space.xmin <= x <= space.xmax
        and space.ymin <= y <= space.ymax
        and type(terms) is list
        and "text" not in raw
        and (ts is None or type(ts) is float)
        and (expires_at is None or type(expires_at) is float)
    ):
        try:
            normalized = normalize_terms(terms)
        except TypeError:
            pass
        else:
            # decode_line never yields a non-finite float (they are non_finite dead letters).
            return ObjectRecord(pos, oid, x, y, tuple(normalized), frozenset(normalized), ts, expires_at)
    return _parse_object_checked(raw, pos, space)


def _parse_object_checked(raw: dict[str, Any], pos: int, space: Rect) -> ObjectRecord:
    oid = _identifier(raw)
    x, y = _required(raw, "x"), _required(raw, "y")
    source = _exactly_one(raw, "terms", "text")
    px, py = _point(raw, space, "x", "y", x, y)
    if source == "terms":
        terms = _normalized_list("terms", raw["terms"])
    else:
        if not isinstance(raw["text"], str):
            raise LineRejected("wrong_field", "'text' must be a string")
        terms = tokenize(raw["text"])
    ts = _optional_number(raw, "ts")
    expires_at = _optional_number(raw, "expires_at")
    return ObjectRecord(pos, oid, px, py, tuple(terms), frozenset(terms), ts, expires_at)


def _parse_subscribe(raw: dict[str, Any], pos: int, space: Rect) -> Subscription:
    sid = _identifier(raw)
    kind = _required(raw, "kind")
    if kind not in KINDS:
        raise LineRejected("unknown_kind", f"kind {_show(kind)} is none of {', '.join(KINDS)}")
    if kind == "range":
        return _parse_range(raw, pos, sid)
    x, y = _point_field(raw, space)
    k = _required(raw, "k")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise LineRejected("bad_k", f"'k' must be an integer >= 1, got {_show(k)}")
    if kind == "topk":
        return _parse_topk(raw, pos, sid, x, y, k)
    return _parse_knn(raw, pos, sid, x, y, k)


def _point_field(raw: dict[str, Any], space: Rect) -> tuple[float, float]:
    point = _required(raw, "point")
    if not isinstance(point, list) or len(point) != 2:
        raise LineRejected("wrong_field", f"'point' must be [x, y], got {_show(point)}")
    return _point(raw, space, "point[0]", "point[1]", point[0], point[1])


def _parse_range(raw: dict[str, Any], pos: int, sid: str) -> RangeSubscription:
    rect = _required(raw, "rect")
    if not isinstance(rect, list) or len(rect) != 4:
        raise LineRejected("wrong_field", f"'rect' must be [xmin, ymin, xmax, ymax], got {_show(rect)}")
    if all(type(v) is float for v in rect):  # the common case: decode_line never yields a non-finite float
        xmin, ymin, xmax, ymax = rect
    else:
        xmin, ymin, xmax, ymax = (_number(raw, f"rect[{i}]", v) for i, v in enumerate(rect))
    if xmin > xmax or ymin > ymax:
        raise LineRejected("bad_rect", f"rect {_show(rect)} has xmin > xmax or ymin > ymax")
    source = _exactly_one(raw, "keywords", "expr")
    if source == "keywords":
        keywords = _normalized_list("keywords", raw["keywords"])
        dnf: DNF = (frozenset(keywords),) if keywords else ()
    else:
        if not isinstance(raw["expr"], str):
            raise LineRejected("wrong_field", "'expr' must be a string")
        try:
            dnf = parse_expression(raw["expr"])
        except ExpressionError as exc:
            raise LineRejected("bad_expr", str(exc)) from None
    if not dnf:
        raise LineRejected("empty_keywords", "no keyword after normalization")
    return RangeSubscription(pos, sid, Rect(xmin, ymin, xmax, ymax), dnf)


def _parse_topk(raw: dict[str, Any], pos: int, sid: str, x: float, y: float, k: int) -> TopkSubscription:
    alpha = raw.get("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise LineRejected("bad_alpha", f"'alpha' must be a number in [0, 1], got {_show(alpha)}")
    source = _exactly_one(raw, "keywords", "weights")
    weights: dict[str, float] = {}
    if source == "keywords":
        for term in _normalized_list("keywords", raw["keywords"]):
            weights[term] = 1.0
    else:
        given = raw["weights"]
        if not isinstance(given, dict):
            raise LineRejected("wrong_field", "'weights' must be an object {term: weight}")
        for term, w in given.items():
            weight = _number(raw, f"weights[{_show(term)}]", w)
            for norm in normalize_terms([term]):
                weights[norm] = weight
    if not weights:
        raise LineRejected("empty_keywords", "no keyword after normalization")
    return TopkSubscription(pos, sid, x, y, tuple(sorted(weights.items())), k, float(alpha))


def _parse_knn(raw: dict[str, Any], pos: int, sid: str, x: float, y: float, k: int) -> KnnSubscription:
    keywords = frozenset(_normalized_list("keywords", _required(raw, "keywords")))
    match = raw.get("match", "any")
    origin = raw.get("from", "window")
    if match not in ("any", "all"):
        raise LineRejected("wrong_field", f"'match' must be 'any' or 'all', got {_show(match)}")
    if origin not in ("window", "registration"):
        raise LineRejected("wrong_field", f"'from' must be 'window' or 'registration', got {_show(origin)}")
    if not keywords:
        raise LineRejected("empty_keywords", "no keyword after normalization")
    return KnnSubscription(pos, sid, x, y, keywords, k, match, origin)


def _parse_unsubscribe(raw: dict[str, Any], pos: int, space: Rect) -> Unsubscribe:
    return Unsubscribe(pos, _identifier(raw))


def _parse_snapshot(raw: dict[str, Any], pos: int, space: Rect) -> SnapshotMarker:
    return SnapshotMarker(pos, _identifier(raw))


_PARSERS = {
    "object": _parse_object,
    "subscribe": _parse_subscribe,
    "unsubscribe": _parse_unsubscribe,
    "snapshot": _parse_snapshot,
}
