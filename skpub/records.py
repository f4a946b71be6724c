"""Typed input records and their validation (``docs/SEMANTICS.md`` section 1).

:func:`parse_line` turns one JSON line into a typed record or a
:class:`DeadLetter` carrying the original line, a reason code and a message.
It checks everything that a single line can show; the checks that depend on
the stream so far (``duplicate_id``, ``unknown_id``) live in
:class:`skpub.registry.IdRegistry`. Nothing past these two sees invalid input.

``pos`` is the record's stream position: a strictly increasing int64 that is
the logical clock of SEMANTICS section 1. Engines build it as
``batch_id << 32 | index within the batch`` (:func:`stream_position`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson

from skpub.errors import ExpressionError
from skpub.geometry import Rect
from skpub.text import DNF, normalize_terms, parse_expression, tokenize

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
    "unsupported_kind",
)
KINDS = ("range", "topk", "knn")
POSITION_BITS = 32


def stream_position(batch_id: int, index: int) -> int:
    """Return the int64 stream position of the ``index``-th record of micro-batch ``batch_id``."""
    return (batch_id << POSITION_BITS) | index


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class RangeSubscription:
    """A boolean range subscription (SEMANTICS section 3.1); ``dnf`` is never empty."""

    pos: int
    id: str
    rect: Rect
    dnf: DNF


@dataclass(frozen=True, slots=True)
class TopkSubscription:
    """A top-k subscription (SEMANTICS section 3.2); ``weights`` maps term -> weight."""

    pos: int
    id: str
    x: float
    y: float
    weights: tuple[tuple[str, float], ...]
    k: int
    alpha: float


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Ends the subscription ``id`` for every later object."""

    pos: int
    id: str


@dataclass(frozen=True, slots=True)
class SnapshotMarker:
    """Asks for the results of every active topk/knn subscription at this position."""

    pos: int
    id: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A rejected input line: the original text, a reason code of :data:`REASONS`, a message."""

    pos: int
    line: str
    reason: str
    message: str

    def to_json(self) -> dict[str, str]:
        """Return the dead-letter output line of SEMANTICS section 5."""
        return {"line": self.line, "reason": self.reason, "message": self.message}


Subscription = RangeSubscription | TopkSubscription | KnnSubscription
Record = ObjectRecord | Subscription | Unsubscribe | SnapshotMarker


class _Reject(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def parse_line(line: str, pos: int, space: Rect) -> Record | DeadLetter:
    """Parse and validate one input line.

    Parameters
    ----------
    line : str
        One JSON-lines record, without its line terminator.
    pos : int
        The record's stream position (see :func:`stream_position`).
    space : Rect
        The deployment space; points outside it are ``out_of_space``.

    Returns
    -------
    Record or DeadLetter
        Never raises on bad input: every problem becomes a dead letter with a
        reason of SEMANTICS section 1.
    """
    try:
        raw = _loads(line)
        if not isinstance(raw, dict):
            raise _Reject("malformed_json", f"a record must be a JSON object, got {type(raw).__name__}")
        rtype = _required(raw, "type")
        parser = _PARSERS.get(rtype) if isinstance(rtype, str) else None
        if parser is None:
            raise _Reject("unknown_type", f"type {rtype!r} is none of object, subscribe, unsubscribe, snapshot")
        return parser(raw, pos, space)
    except _Reject as rej:
        return DeadLetter(pos, line, rej.reason, rej.message)


def _loads(line: str) -> Any:
    """Parse JSON as :func:`json.loads` does, with orjson as the fast path.

    orjson rejects a few inputs that the standard library accepts (``NaN``,
    integers beyond 64 bits, lone surrogate escapes); those retry with
    :func:`json.loads`, so the accepted set is exactly the standard one.
    """
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            return json.loads(line)
        except ValueError as exc:
            raise _Reject("malformed_json", f"not JSON: {exc}") from None


def _required(raw: dict[str, Any], name: str) -> Any:
    if name not in raw:
        raise _Reject("missing_field", f"required field {name!r} is absent")
    return raw[name]


def _identifier(raw: dict[str, Any]) -> str:
    value = _required(raw, "id")
    if not isinstance(value, str) or not value:
        raise _Reject("wrong_field", f"'id' must be a non-empty string, got {value!r}")
    return value


def _number(raw: dict[str, Any], name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Reject("wrong_field", f"{name!r} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise _Reject("non_finite", f"{name!r} is {value}")
    return value


def _optional_number(raw: dict[str, Any], name: str) -> float | None:
    return _number(raw, name, raw[name]) if raw.get(name) is not None else None


def _point(raw: dict[str, Any], space: Rect, xname: str, yname: str, x: Any, y: Any) -> tuple[float, float]:
    px, py = _number(raw, xname, x), _number(raw, yname, y)
    if not space.contains_point(px, py):
        raise _Reject("out_of_space", f"point ({px}, {py}) lies outside space {space.as_list()}")
    return px, py


def _normalized_list(name: str, value: Any) -> list[str]:
    """Validate a JSON list of strings and normalize each element as one term."""
    if not isinstance(value, list):
        raise _Reject("wrong_field", f"{name!r} must be a list of strings")
    try:
        return normalize_terms(value)
    except TypeError:
        raise _Reject("wrong_field", f"{name!r} must be a list of strings") from None


def _exactly_one(raw: dict[str, Any], first: str, second: str) -> str:
    if first in raw:
        if second in raw:
            raise _Reject("wrong_field", f"give either {first!r} or {second!r}, not both")
        return first
    if second not in raw:
        raise _Reject("missing_field", f"one of {first!r} or {second!r} is required")
    return second


def _parse_object(raw: dict[str, Any], pos: int, space: Rect) -> ObjectRecord:
    oid = _identifier(raw)
    x, y = _required(raw, "x"), _required(raw, "y")
    source = _exactly_one(raw, "terms", "text")
    if type(x) is float and type(y) is float and space.xmin <= x <= space.xmax and space.ymin <= y <= space.ymax:
        px, py = x, y
    else:
        px, py = _point(raw, space, "x", "y", x, y)
    if source == "terms":
        terms = _normalized_list("terms", raw["terms"])
    else:
        if not isinstance(raw["text"], str):
            raise _Reject("wrong_field", "'text' must be a string")
        terms = tokenize(raw["text"])
    ts = _optional_number(raw, "ts")
    expires_at = _optional_number(raw, "expires_at")
    return ObjectRecord(pos, oid, px, py, tuple(terms), frozenset(terms), ts, expires_at)


def _parse_subscribe(raw: dict[str, Any], pos: int, space: Rect) -> Subscription:
    sid = _identifier(raw)
    kind = _required(raw, "kind")
    if kind not in KINDS:
        raise _Reject("unknown_kind", f"kind {kind!r} is none of {', '.join(KINDS)}")
    if kind == "range":
        return _parse_range(raw, pos, sid)
    x, y = _point_field(raw, space)
    k = _required(raw, "k")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise _Reject("bad_k", f"'k' must be an integer >= 1, got {k!r}")
    if kind == "topk":
        return _parse_topk(raw, pos, sid, x, y, k)
    return _parse_knn(raw, pos, sid, x, y, k)


def _point_field(raw: dict[str, Any], space: Rect) -> tuple[float, float]:
    point = _required(raw, "point")
    if not isinstance(point, list) or len(point) != 2:
        raise _Reject("wrong_field", f"'point' must be [x, y], got {point!r}")
    return _point(raw, space, "point[0]", "point[1]", point[0], point[1])


def _parse_range(raw: dict[str, Any], pos: int, sid: str) -> RangeSubscription:
    rect = _required(raw, "rect")
    if not isinstance(rect, list) or len(rect) != 4:
        raise _Reject("wrong_field", f"'rect' must be [xmin, ymin, xmax, ymax], got {rect!r}")
    xmin, ymin, xmax, ymax = (_number(raw, f"rect[{i}]", v) for i, v in enumerate(rect))
    if xmin > xmax or ymin > ymax:
        raise _Reject("bad_rect", f"rect {rect} has xmin > xmax or ymin > ymax")
    source = _exactly_one(raw, "keywords", "expr")
    if source == "keywords":
        keywords = _normalized_list("keywords", raw["keywords"])
        dnf: DNF = (frozenset(keywords),) if keywords else ()
    else:
        if not isinstance(raw["expr"], str):
            raise _Reject("wrong_field", "'expr' must be a string")
        try:
            dnf = parse_expression(raw["expr"])
        except ExpressionError as exc:
            raise _Reject("bad_expr", str(exc)) from None
    if not dnf:
        raise _Reject("empty_keywords", "no keyword after normalization")
    return RangeSubscription(pos, sid, Rect(xmin, ymin, xmax, ymax), dnf)


def _parse_topk(raw: dict[str, Any], pos: int, sid: str, x: float, y: float, k: int) -> TopkSubscription:
    alpha = raw.get("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise _Reject("bad_alpha", f"'alpha' must be a number in [0, 1], got {alpha!r}")
    source = _exactly_one(raw, "keywords", "weights")
    weights: dict[str, float] = {}
    if source == "keywords":
        for term in _normalized_list("keywords", raw["keywords"]):
            weights[term] = 1.0
    else:
        given = raw["weights"]
        if not isinstance(given, dict):
            raise _Reject("wrong_field", "'weights' must be an object {term: weight}")
        for term, w in given.items():
            weight = _number(raw, f"weights[{term!r}]", w)
            for norm in normalize_terms([term]):
                weights[norm] = weight
    if not weights:
        raise _Reject("empty_keywords", "no keyword after normalization")
    return TopkSubscription(pos, sid, x, y, tuple(sorted(weights.items())), k, float(alpha))


def _parse_knn(raw: dict[str, Any], pos: int, sid: str, x: float, y: float, k: int) -> KnnSubscription:
    keywords = frozenset(_normalized_list("keywords", _required(raw, "keywords")))
    match = raw.get("match", "any")
    origin = raw.get("from", "window")
    if match not in ("any", "all"):
        raise _Reject("wrong_field", f"'match' must be 'any' or 'all', got {match!r}")
    if origin not in ("window", "registration"):
        raise _Reject("wrong_field", f"'from' must be 'window' or 'registration', got {origin!r}")
    if not keywords:
        raise _Reject("empty_keywords", "no keyword after normalization")
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
