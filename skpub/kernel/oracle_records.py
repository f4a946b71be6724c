r"""The oracle's own reading of ``docs/SEMANTICS.md`` sections 1 and 2: records, ids, terms, expressions, idf.

The brute-force oracle (:mod:`skpub.kernel.oracle`) must share no parsing,
registry or text code with the engines it checks, or a bug in the shared code
would pass every differential test. This module is that second, independent
reading of the contract, written for clarity, not speed:

- :func:`read_record` turns one input line into a typed record or a
  :class:`Rejection` (section 1: "Reading lines and hostile input", the
  reason codes and the checks in the documented order);
- :class:`IdLedger` applies the id rules that depend on the stream so far
  (section 1, "Ids, per type": ``duplicate_id`` and ``unknown_id``);
- :func:`normalize_term`, :func:`text_terms` and :func:`expression_dnf` are
  the text rules of section 2 and the ``expr`` grammar of section 3.1;
- :func:`load_idf` reads the deployment's vocabulary file (section 3.2).

SEMANTICS orders the checks of a line up to ``type``, then says "the
fields": the order among one record's fields is not written there. Each
reader's docstring gives the order used here (the id first, a field's
presence before its value); it is skpub's, and only decides lines with
several faults.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skpub.kernel.errors import ConfigError
from skpub.kernel.geometry import Rect

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects; the record object is level 1 (SEMANTICS 1, skpub decisions)."""
MAX_EXPR_DEPTH = 32
"""Deepest nesting of parentheses in an ``expr`` (SEMANTICS 1)."""
MAX_CLAUSES = 256
"""Most AND-clauses an ``expr`` may expand to, counted with repetition (SEMANTICS 1)."""
MAX_CLAUSE_TERMS = 16_384
"""Most terms over all AND-clauses of an ``expr`` expansion, counted with repetition (SEMANTICS 1)."""
INTEGER_BITS = 64
"""Integer literals beyond this many bits are read as floats (SEMANTICS 1, skpub decisions)."""
KINDS = ("range", "topk", "knn")
SHOWN = 80
"""Characters of a hostile value shown in a message (a line may hold a megabyte)."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_TOKEN = re.compile(r"\w+")

DNF = tuple[frozenset[str], ...]
"""An expression as AND-clauses: a term set satisfies it iff it holds every term of some clause."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Rejection:
    """Why a line is a dead letter: a reason code of SEMANTICS section 1 and a human message."""

    reason: str
    message: str


@dataclass(frozen=True)
class ObjectRecord:
    """An accepted object: ``terms`` in input order with repeats (tf), ``term_set`` for boolean matching."""

    id: str
    x: float
    y: float
    terms: tuple[str, ...]
    term_set: frozenset[str]
    ts: float | None
    expires_at: float | None


@dataclass(frozen=True)
class RangeSubscription:
    """A boolean range subscription (SEMANTICS 3.1); ``dnf`` has at least one clause."""

    id: str
    rect: Rect
    dnf: DNF

    def matches(self, obj: ObjectRecord) -> bool:
        """Whether ``obj`` lies in the closed rectangle and its term set satisfies the expression."""
        return self.rect.contains_point(obj.x, obj.y) and any(clause <= obj.term_set for clause in self.dnf)


@dataclass(frozen=True)
class TopkSubscription:
    """A top-k subscription (SEMANTICS 3.2); ``weights`` maps each normalized term to its weight (1 for keywords)."""

    id: str
    x: float
    y: float
    weights: dict[str, float]
    k: int
    alpha: float


@dataclass(frozen=True)
class KnnSubscription:
    """A boolean kNN subscription (SEMANTICS 3.3); ``origin`` is the ``from`` field."""

    id: str
    x: float
    y: float
    keywords: frozenset[str]
    k: int
    match: str
    origin: str


@dataclass(frozen=True)
class Unsubscribe:
    """Ends subscription ``id`` for every later record."""

    id: str


@dataclass(frozen=True)
class Snapshot:
    """Asks for the results of every active topk/knn subscription here."""

    id: str


Subscription = RangeSubscription | TopkSubscription | KnnSubscription
Record = ObjectRecord | Subscription | Unsubscribe | Snapshot


class _Rejected(Exception):
    """Raised by the checks below; :func:`read_record` turns it into a :class:`Rejection`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.rejection = Rejection(reason, message)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


# --------------------------------------------------------------------------- lines


def line_bytes(line: bytes | str) -> bytes:
    """Return an input line as bytes: a str is taken as its UTF-8 encoding (lone surrogates kept, so invalid)."""
    return line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")


def line_text(line: bytes) -> str:
    r"""Return a line as a dead letter shows it: UTF-8, each invalid byte written ``\xNN`` (SEMANTICS 1)."""
    return line.decode("utf-8", "backslashreplace")


def dead_letter(line: bytes, rejection: Rejection) -> dict[str, str]:
    """Return the dead-letter output line of SEMANTICS section 5."""
    return {"line": line_text(line), "reason": rejection.reason, "message": rejection.message}


def read_record(line: bytes, space: Rect, max_record_bytes: int) -> Record | Rejection:
    """Read one input line (bytes, without its terminator) into a record, or say why it is rejected.

    Checks in the order of SEMANTICS section 1 (skpub decisions): size, UTF-8,
    JSON syntax, repeated keys / nesting / unpaired surrogates, numbers that
    are not finite floats, then ``type`` (a JSON object with a string
    ``type``), then the fields. Never raises on any input. The checks
    against the stream so far are :class:`IdLedger`'s.
    """
    try:
        value = _read_json(line, max_record_bytes)
        if not isinstance(value, dict):
            raise _Rejected("malformed_json", f"a record is a JSON object, not {type(value).__name__}")
        if "type" not in value:
            raise _Rejected("missing_field", "the record has no 'type'")
        reader = _READERS.get(value["type"]) if isinstance(value["type"], str) else None
        if reader is None:
            raise _Rejected("unknown_type", f"type {_show(value['type'])} is none of {', '.join(_READERS)}")
        return reader(value, space)
    except _Rejected as rejected:
        return rejected.rejection


# --------------------------------------------------------------------------- JSON


@dataclass
class _Numbers:
    """``json.loads`` hooks for numbers: integers in [-2^63, 2^64) stay ``int``; the first non-finite one is noted.

    An integer literal beyond 64 bits is read as a float, so ``k`` of 2**64
    is not an integer (SEMANTICS 1, skpub decisions). ``NaN``, ``Infinity`` and a literal that
    overflows a 64-bit float are ``non_finite`` wherever they stand; the note
    is only acted on once the line is known to be well-formed JSON.
    """

    non_finite: str | None = None

    def real(self, text: str) -> float:
        value = float(text)
        if not math.isfinite(value) and self.non_finite is None:
            self.non_finite = text
        return value

    def integer(self, text: str) -> int | float:
        # At most 20 digits can hold 64 bits; longer literals never go through int() (its 4,300-digit limit).
        if len(text.lstrip("-")) <= 20 and -(2 ** (INTEGER_BITS - 1)) <= int(text) < 2**INTEGER_BITS:
            return int(text)
        return self.real(text)


def _object_without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a JSON object with a repeated key (after unescaping) is ``malformed_json``."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Rejected("malformed_json", f"key {_show(key)} is repeated in one object")
        out[key] = value
    return out


def _read_json(line: bytes, max_record_bytes: int) -> Any:
    """Decode one line under the hostile-input rules of SEMANTICS section 1; raise :class:`_Rejected`."""
    if len(line) > max_record_bytes:
        raise _Rejected("too_large", f"the line has {len(line)} bytes, more than max_record_bytes={max_record_bytes}")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Rejected("malformed_json", f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    numbers = _Numbers()
    try:
        # strict=True (the default): a raw control character inside a string is not JSON.
        value = json.loads(
            text,
            object_pairs_hook=_object_without_repeated_keys,
            parse_float=numbers.real,
            parse_int=numbers.integer,
            parse_constant=numbers.real,
        )
    except RecursionError:
        raise _Rejected("malformed_json", f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise _Rejected("malformed_json", f"not JSON: {_show(str(exc))}") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise _Rejected("malformed_json", f"nested deeper than {MAX_JSON_DEPTH} levels")
    if _holds_unpaired_surrogate(value):
        raise _Rejected("malformed_json", "a string holds an unpaired surrogate")
    if numbers.non_finite is not None:
        raise _Rejected("non_finite", f"number {_show(numbers.non_finite)} is not a finite 64-bit float")
    return value


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    return value if isinstance(value, list) else []


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value: a scalar is 0, an array or object is 1 + its deepest child."""
    depth, level = 0, [value]
    while level:
        containers = [v for v in level if isinstance(v, dict | list)]
        depth += bool(containers)
        level = [child for v in containers for child in _children(v)]
    return depth


def _holds_unpaired_surrogate(value: Any) -> bool:
    """Whether a string (key or value) holds a surrogate: valid UTF-8 has none, so it came from an escape alone."""
    stack = [value]
    while stack:
        node = stack.pop()
        strings = list(node) if isinstance(node, dict) else [node] if isinstance(node, str) else []
        if any(_SURROGATE.search(s) for s in strings):
            return True
        stack.extend(_children(node))
    return False


# --------------------------------------------------------------------------- fields


def _required(record: dict[str, Any], name: str) -> Any:
    if name not in record:
        raise _Rejected("missing_field", f"required field {name!r} is absent")
    return record[name]


def _identifier(record: dict[str, Any]) -> str:
    """``id``: required, a non-empty string (skpub decision)."""
    value = _required(record, "id")
    if not isinstance(value, str) or not value:
        raise _Rejected("wrong_field", f"'id' must be a non-empty string, got {_show(value)}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(name: str, value: Any) -> float:
    """Return a JSON number as a float (``wrong_field`` otherwise); non-finite ones were rejected with the line."""
    if not _is_number(value):
        raise _Rejected("wrong_field", f"{name!r} must be a number, got {_show(value)}")
    return float(value)


def _optional_number(record: dict[str, Any], name: str) -> float | None:
    return _number(name, record[name]) if record.get(name) is not None else None


def _one_of(record: dict[str, Any], first: str, second: str) -> str:
    """Which of two alternative fields is given: both is ``wrong_field``, neither ``missing_field`` (skpub)."""
    if first in record and second in record:
        raise _Rejected("wrong_field", f"give either {first!r} or {second!r}, not both")
    if first not in record and second not in record:
        raise _Rejected("missing_field", f"one of {first!r} or {second!r} is required")
    return first if first in record else second


def _in_space(space: Rect, x: float, y: float) -> tuple[float, float]:
    if not space.contains_point(x, y):
        raise _Rejected("out_of_space", f"point ({x}, {y}) lies outside space {space.as_list()}")
    return x, y


def _term_list(name: str, value: Any) -> list[str]:
    """Return a JSON list of strings, each normalized as one term, empty terms dropped (SEMANTICS 2)."""
    if not isinstance(value, list) or not all(isinstance(term, str) for term in value):
        raise _Rejected("wrong_field", f"{name!r} must be a list of strings")
    return [t for t in map(normalize_term, value) if t]


def _read_object(record: dict[str, Any], space: Rect) -> ObjectRecord:
    """Read an ``object`` record (SEMANTICS 1).

    Order: the id; x, y and one of terms / text present; x and y numbers,
    inside space; the terms or text; ts, then expires_at. ``ts`` or
    ``expires_at`` given as ``null`` is absent (skpub's decision, SEMANTICS
    section 1); any other value that is not a number is ``wrong_field``.
    """
    oid = _identifier(record)
    _required(record, "x")
    _required(record, "y")
    source = _one_of(record, "terms", "text")
    x, y = _in_space(space, _number("x", record["x"]), _number("y", record["y"]))
    if source == "terms":
        terms = _term_list("terms", record["terms"])
    elif isinstance(record["text"], str):
        terms = text_terms(record["text"])
    else:
        raise _Rejected("wrong_field", f"'text' must be a string, got {_show(record['text'])}")
    ts, expires_at = _optional_number(record, "ts"), _optional_number(record, "expires_at")
    return ObjectRecord(oid, x, y, tuple(terms), frozenset(terms), ts, expires_at)


def _read_subscribe(record: dict[str, Any], space: Rect) -> Subscription:
    """Read a ``subscribe`` record: the id, kind, then the kind's fields (range: rect first; topk, knn: point, k)."""
    sid = _identifier(record)
    kind = _required(record, "kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise _Rejected("unknown_kind", f"kind {_show(kind)} is none of {', '.join(KINDS)}")
    if kind == "range":
        return _read_range(record, sid)
    point = _required(record, "point")
    if not isinstance(point, list) or len(point) != 2:
        raise _Rejected("wrong_field", f"'point' must be [x, y], got {_show(point)}")
    x, y = _in_space(space, _number("point[0]", point[0]), _number("point[1]", point[1]))
    k = _required(record, "k")
    if type(k) is not int or k < 1:
        raise _Rejected("bad_k", f"'k' must be an integer >= 1, got {_show(k)}")
    if kind == "topk":
        return _read_topk(record, sid, x, y, k)
    return _read_knn(record, sid, x, y, k)


def _read_range(record: dict[str, Any], sid: str) -> RangeSubscription:
    """Read a range subscription: ``rect`` (4 numbers, not inverted), then one of ``keywords`` / ``expr`` (3.1)."""
    rect = _required(record, "rect")
    if not isinstance(rect, list) or len(rect) != 4:
        raise _Rejected("wrong_field", f"'rect' must be [xmin, ymin, xmax, ymax], got {_show(rect)}")
    xmin, ymin, xmax, ymax = (_number(f"rect[{i}]", v) for i, v in enumerate(rect))
    if xmin > xmax or ymin > ymax:
        raise _Rejected("bad_rect", f"rect {_show(rect)} has xmin > xmax or ymin > ymax")
    if _one_of(record, "keywords", "expr") == "keywords":
        keywords = _term_list("keywords", record["keywords"])
        dnf: DNF = (frozenset(keywords),) if keywords else ()
    elif isinstance(record["expr"], str):
        dnf = expression_dnf(record["expr"])
    else:
        raise _Rejected("wrong_field", f"'expr' must be a string, got {_show(record['expr'])}")
    if not dnf:
        raise _Rejected("empty_keywords", "no keyword after normalization")
    return RangeSubscription(sid, Rect(xmin, ymin, xmax, ymax), dnf)


def _read_topk(record: dict[str, Any], sid: str, x: float, y: float, k: int) -> TopkSubscription:
    """``alpha`` (required, in [0, 1]: ``bad_alpha`` otherwise), then one of ``keywords`` / ``weights`` (SEMANTICS 3.2).

    Weights are any finite numbers; keys that normalize to one term count
    once, with the weight of the last of them (SEMANTICS 4, skpub decisions).
    """
    alpha = record.get("alpha")
    if not _is_number(alpha) or not 0 <= alpha <= 1:
        raise _Rejected("bad_alpha", f"'alpha' must be a number in [0, 1], got {_show(alpha)}")
    weights: dict[str, float] = {}
    if _one_of(record, "keywords", "weights") == "keywords":
        weights = dict.fromkeys(_term_list("keywords", record["keywords"]), 1.0)
    elif isinstance(record["weights"], dict):
        for key, value in record["weights"].items():
            weight = _number(f"weights[{_show(key)}]", value)
            if term := normalize_term(key):
                weights[term] = weight
    else:
        raise _Rejected("wrong_field", f"'weights' must be an object {{term: weight}}, got {_show(record['weights'])}")
    if not weights:
        raise _Rejected("empty_keywords", "no keyword after normalization")
    return TopkSubscription(sid, x, y, weights, k, float(alpha))


def _read_knn(record: dict[str, Any], sid: str, x: float, y: float, k: int) -> KnnSubscription:
    """``keywords`` (required), ``match`` (any | all, default any), ``from`` (window | registration) (SEMANTICS 3.3)."""
    keywords = _term_list("keywords", _required(record, "keywords"))
    match, origin = record.get("match", "any"), record.get("from", "window")
    if match not in ("any", "all"):
        raise _Rejected("wrong_field", f"'match' must be 'any' or 'all', got {_show(match)}")
    if origin not in ("window", "registration"):
        raise _Rejected("wrong_field", f"'from' must be 'window' or 'registration', got {_show(origin)}")
    if not keywords:
        raise _Rejected("empty_keywords", "no keyword after normalization")
    return KnnSubscription(sid, x, y, frozenset(keywords), k, match, origin)


def _read_unsubscribe(record: dict[str, Any], space: Rect) -> Unsubscribe:
    return Unsubscribe(_identifier(record))


def _read_snapshot(record: dict[str, Any], space: Rect) -> Snapshot:
    return Snapshot(_identifier(record))


_READERS = {
    "object": _read_object,
    "subscribe": _read_subscribe,
    "unsubscribe": _read_unsubscribe,
    "snapshot": _read_snapshot,
}


# --------------------------------------------------------------------------- ids


@dataclass
class IdLedger:
    """The ids accepted so far, per type (SEMANTICS 1, "Ids, per type").

    - An object id is a duplicate iff it was accepted among the last
      ``object_id_horizon`` accepted objects (``last_object`` maps an id to
      the number of its latest accepted object, counting from 0).
    - A subscription id is a duplicate iff it was ever accepted;
      ``unsubscribe`` needs an active one (``unknown_id`` otherwise).
    - A snapshot id is a duplicate iff it was ever accepted.

    Only accepted records change it (a rejected one reserves no id).
    """

    object_id_horizon: int
    objects_accepted: int = 0
    last_object: dict[str, int] = field(default_factory=dict)
    subscriptions: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    snapshots: set[str] = field(default_factory=set)

    def rejection(self, record: Record) -> Rejection | None:
        """Return why the stream so far rejects ``record``, or None."""
        rid = record.id
        if isinstance(record, ObjectRecord):
            last = self.last_object.get(rid)
            if last is not None and last >= self.objects_accepted - self.object_id_horizon:
                return Rejection("duplicate_id", f"object id {_show(rid)} is among the last accepted objects")
        elif isinstance(record, Unsubscribe):
            if rid not in self.active:
                return Rejection("unknown_id", f"no active subscription {_show(rid)}")
        elif isinstance(record, Snapshot):
            if rid in self.snapshots:
                return Rejection("duplicate_id", f"snapshot id {_show(rid)} was already accepted")
        elif rid in self.subscriptions:
            return Rejection("duplicate_id", f"subscription id {_show(rid)} was already accepted")
        return None

    def accept(self, record: Record) -> None:
        """Record an accepted record (one :meth:`rejection` returned None for)."""
        rid = record.id
        if isinstance(record, ObjectRecord):
            self.last_object[rid] = self.objects_accepted
            self.objects_accepted += 1
        elif isinstance(record, Unsubscribe):
            self.active.remove(rid)
        elif isinstance(record, Snapshot):
            self.snapshots.add(rid)
        else:
            self.subscriptions.add(rid)
            self.active.add(rid)


# --------------------------------------------------------------------------- text


def normalize_term(term: str) -> str:
    """NFKC, then casefold, then NFKC again (SEMANTICS 2)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", term).casefold())


def text_terms(text: str) -> list[str]:
    r"""Return the terms of a ``text`` field: its ``\w+`` tokens (Python ``re``), normalized, empty ones dropped."""
    return [t for t in map(normalize_term, _TOKEN.findall(text)) if t]


def _expression_tokens(expr: str) -> list[str]:
    """Split an ``expr`` into ``(``, ``)`` and the runs of other non-whitespace characters (the operands)."""
    return expr.replace("(", " ( ").replace(")", " ) ").split()


def _is_operator(token: str | None, word: str) -> bool:
    """Whether ``token`` is the operator ``word`` (AND or OR) in any letter case."""
    return token is not None and token.isascii() and token.upper() == word


@dataclass(frozen=True)
class _Node:
    """An AND or OR of sub-expressions; a leaf is a normalized term (a ``str``)."""

    op: str
    children: tuple[_Node | str, ...]


def _node(op: str, children: list[_Node | str]) -> _Node | str:
    return children[0] if len(children) == 1 else _Node(op, tuple(children))


@dataclass
class _ExpressionParser:
    """Recursive descent: ``expr := conj (OR conj)*``, ``conj := atom (AND atom)*``, ``atom := TERM | ( expr )``.

    ``depth`` is the number of parentheses open around the current atom.
    """

    tokens: list[str]
    at: int = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def disjunction(self, depth: int) -> _Node | str:
        children = [self.conjunction(depth)]
        while _is_operator(self.peek(), "OR"):
            self.at += 1
            children.append(self.conjunction(depth))
        return _node("OR", children)

    def conjunction(self, depth: int) -> _Node | str:
        children = [self.atom(depth)]
        while _is_operator(self.peek(), "AND"):
            self.at += 1
            children.append(self.atom(depth))
        return _node("AND", children)

    def atom(self, depth: int) -> _Node | str:
        token = self.peek()
        if token is None:
            raise _Rejected("bad_expr", "the expression ends where an operand was expected")
        self.at += 1
        if token == "(":
            if depth == MAX_EXPR_DEPTH:
                raise _Rejected("bad_expr", f"parentheses nested deeper than {MAX_EXPR_DEPTH}")
            inner = self.disjunction(depth + 1)
            if self.peek() != ")":
                raise _Rejected("bad_expr", "a parenthesis is not closed")
            self.at += 1
            return inner
        if token == ")" or _is_operator(token, "AND") or _is_operator(token, "OR"):
            raise _Rejected("bad_expr", f"unexpected {_show(token)} where an operand was expected")
        return normalize_term(token)


def _expansion_size(tree: _Node | str) -> tuple[int, int]:
    """Return (AND-clauses, terms over all clauses) of the expansion of ``tree``, counted with repetition.

    OR adds both counts; AND of (C, T) with a child (c, t) gives C x c
    clauses and T x c + t x C terms. A part never counts more than the
    whole, so the first part past a limit decides ``bad_expr`` without
    building anything (SEMANTICS 1, skpub decisions).
    """
    if isinstance(tree, str):
        return 1, 1
    clauses, terms = (0, 0) if tree.op == "OR" else (1, 0)
    for child in tree.children:
        c, t = _expansion_size(child)
        clauses, terms = (clauses + c, terms + t) if tree.op == "OR" else (clauses * c, terms * c + t * clauses)
        if clauses > MAX_CLAUSES:
            raise _Rejected("bad_expr", f"the expression expands past {MAX_CLAUSES} AND-clauses")
        if terms > MAX_CLAUSE_TERMS:
            raise _Rejected("bad_expr", f"the expression expands past {MAX_CLAUSE_TERMS} terms over its AND-clauses")
    return clauses, terms


def _expand(tree: _Node | str) -> list[frozenset[str]]:
    """Return the AND-clauses of ``tree`` (only called within the limits)."""
    if isinstance(tree, str):
        return [frozenset([tree])]
    parts = [_expand(child) for child in tree.children]
    if tree.op == "OR":
        return [clause for part in parts for clause in part]
    return [frozenset().union(*combination) for combination in itertools.product(*parts)]


def expression_dnf(expr: str) -> DNF:
    """Return the AND-clauses of an ``expr`` (SEMANTICS 3.1); none when it has no operand (``empty_keywords``).

    Operators are AND and OR in any letter case, AND binds tighter,
    parentheses group; every other run of non-space, non-parenthesis
    characters is one operand, normalized as a term. Raises
    :class:`_Rejected` (``bad_expr``) when it does not parse, nests more than
    32 parentheses or expands past 256 clauses or 16,384 terms (SEMANTICS 1).
    """
    tokens = _expression_tokens(expr)
    if not tokens:
        return ()
    parser = _ExpressionParser(tokens)
    tree = parser.disjunction(0)
    if parser.peek() is not None:
        raise _Rejected("bad_expr", f"unexpected {_show(parser.peek())} after a complete expression")
    _expansion_size(tree)
    return tuple(_expand(tree))


# --------------------------------------------------------------------------- idf


@dataclass(frozen=True)
class Idf:
    """``idf(t) = ln(N / df(t))``, ``df = 1`` for a term missing from the file; 1 for every term without one.

    SEMANTICS 3.2; terms are looked up as written in the file, and a ``df``
    above ``N`` gives a negative idf, used as it is (SEMANTICS 4, decisions).
    """

    n: int | None = None
    df: dict[str, int] = field(default_factory=dict)

    def __call__(self, term: str) -> float:
        """Return the idf of a normalized term."""
        return 1.0 if self.n is None else math.log(self.n / self.df.get(term, 1))


def _positive_integer(value: Any) -> bool:
    return type(value) is int and value >= 1


def load_idf(path: str | None) -> Idf:
    """Read the deployment's vocabulary file ``{"N": n, "df": {term: df}}`` (None: no file).

    Raises
    ------
    ConfigError
        If the file cannot be read or ``N`` and the ``df`` values are not positive integers.
    """
    if path is None:
        return Idf()
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        n, df = raw["N"], raw["df"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"vocabulary file {path}: {exc}") from exc
    if not _positive_integer(n) or not isinstance(df, dict) or not all(map(_positive_integer, df.values())):
        raise ConfigError(f"vocabulary file {path}: 'N' and every df must be integers >= 1")
    return Idf(n, df)
