r"""Decoding one input line into a JSON value under the hostile-input rules.

``docs/SEMANTICS.md`` section 1 ("Reading lines and hostile input") decides
what a line may hold before any field is looked at:

- longer than ``max_record_bytes`` bytes: ``too_large``;
- not valid UTF-8, not JSON, a repeated key in an object, a value nested
  deeper than :data:`MAX_DEPTH` levels, or a string holding an unpaired
  surrogate (``"\ud800"``): ``malformed_json``;
- a number too large for a 64-bit float (``1e400``, an integer literal of 400
  digits), or the non-JSON constants ``NaN`` and ``Infinity`` anywhere in the
  line: ``non_finite``.

orjson parses almost every real line; it rejects exactly the inputs that need
a closer look (invalid UTF-8, lone surrogates, overflowing numbers, ``NaN``),
and those go through :func:`json.loads` with hooks that flag what orjson would
have hidden. Repeated keys (which both libraries accept silently) and nesting
are checked on the parsed value, for free when a line cannot hold them.
Cost is O(line length) in every case; no input makes it super-linear.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

MAX_DEPTH = 64
"""Deepest nesting of JSON arrays and objects a record may have (the record object is level 1)."""

_U64 = 1 << 64
_I64_MIN = -(1 << 63)


class LineRejected(Exception):
    """A line that cannot become a record: ``reason`` is a code of SEMANTICS section 1."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def line_text(raw: bytes) -> str:
    r"""Return the line as text for a dead letter: UTF-8, every invalid byte written as ``\xNN``."""
    return raw.decode("utf-8", errors="backslashreplace")


def decode_line(raw: bytes, max_record_bytes: int) -> Any:
    """Decode one line (without its terminator) into a JSON value.

    Parameters
    ----------
    raw : bytes
        The line as read, at most any length.
    max_record_bytes : int
        Longer lines are rejected as ``too_large`` before any parsing.

    Returns
    -------
    Any
        The JSON value (dict, list, str, int, float, bool or None). Integers
        within 64 bits stay ``int``; larger ones become ``float``, as orjson
        gives them (so a ``k`` of 2**64 or more is not an integer).

    Raises
    ------
    LineRejected
        With reason ``too_large``, ``malformed_json`` or ``non_finite``.
    """
    if len(raw) > max_record_bytes:
        raise LineRejected("too_large", f"the line has {len(raw)} bytes, more than max_record_bytes={max_record_bytes}")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _decode_strict(raw)
    opens = raw.count(b"{")
    if opens <= 1 and opens + raw.count(b"[") <= MAX_DEPTH:
        pairs = len(value) if type(value) is dict else 0
    else:
        depth, pairs = _depth_and_pairs(value)
        if depth > MAX_DEPTH:
            raise LineRejected("malformed_json", f"JSON nested deeper than {MAX_DEPTH} levels")
    if pairs != raw.count(b":"):
        # A colon inside a string, or a repeated key: let the standard parser tell.
        return _decode_strict(raw)
    return value


class _Flags:
    """What the standard parser's hooks saw while decoding one line."""

    def __init__(self) -> None:
        self.overflow: str | None = None

    def parse_float(self, text: str) -> float:
        value = float(text)
        if math.isinf(value) and self.overflow is None:
            self.overflow = text
        return value

    def parse_constant(self, text: str) -> float:
        # NaN and +-Infinity are not JSON; json.loads accepts them, SEMANTICS files them as non_finite.
        if self.overflow is None:
            self.overflow = text
        return float(text)

    def parse_int(self, text: str) -> int | float:
        if len(text) <= 20:
            value = int(text)
            if _I64_MIN <= value < _U64:
                return value
        return self.parse_float(text)

    @staticmethod
    def pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            repeated = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise LineRejected("malformed_json", f"key {clip(repeated)!r} is repeated in one object")
        return out


def _decode_strict(raw: bytes) -> Any:
    """Decode with the standard library, flagging what orjson rejects or hides."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineRejected("malformed_json", f"not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    flags = _Flags()
    try:
        value = json.loads(
            text,
            object_pairs_hook=flags.pairs,
            parse_float=flags.parse_float,
            parse_int=flags.parse_int,
            parse_constant=flags.parse_constant,
        )
    except RecursionError:
        raise LineRejected("malformed_json", f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise LineRejected("malformed_json", f"not JSON: {exc}") from None
    depth, _ = _depth_and_pairs(value)
    if depth > MAX_DEPTH:
        raise LineRejected("malformed_json", f"JSON nested deeper than {MAX_DEPTH} levels")
    if "\\u" in text or "\\U" in text:
        _reject_lone_surrogates(value)
    if flags.overflow is not None:
        raise LineRejected("non_finite", f"number {clip(flags.overflow)} is not a finite 64-bit float")
    return value


def _depth_and_pairs(value: Any) -> tuple[int, int]:
    """Return the nesting depth of ``value`` and the key-value pairs of all its objects; iterative, O(size)."""
    depth = pairs = 0
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if type(node) is dict:
            pairs += len(node)
            children = node.values()
        elif type(node) is list:
            children = node
        else:
            continue
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in children if type(child) in (dict, list))
    return depth, pairs


def _reject_lone_surrogates(value: Any) -> None:
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            strings = list(node.keys())
            stack.extend(node.values())
        elif type(node) is list:
            strings = []
            stack.extend(node)
        elif type(node) is str:
            strings = [node]
        else:
            continue
        for s in strings:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise LineRejected("malformed_json", "a string holds an unpaired surrogate escape") from None


def clip(text: str, limit: int = 80) -> str:
    """Shorten ``text`` for a message (hostile lines may hold megabytes)."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"


def exact_int(value: object) -> int:
    """Return ``value`` if it is an int, for skpub's own JSON documents (plans, hand-offs, term tables).

    Raises
    ------
    TypeError
        If ``value`` is anything else: a bool, a float, a string.
    """
    if type(value) is not int:
        raise TypeError(f"expected an integer, not {value!r}")
    return value
