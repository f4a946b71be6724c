"""A corpus of hostile input lines and the reason SEMANTICS section 1 gives each.

Every entry is ``(line, reason)``: the raw bytes of one line (no terminator,
never a ``\\n``, never ending in ``\\r``) and the ``reason`` of the dead letter
:func:`skpub.kernel.records.parse_line` must produce, or :data:`ACCEPTED` when the
line is a valid record. Ids are unique and prefixed ``h-``, so the corpus can
be mixed into :func:`tests.workloads.random_workload` without any line
becoming a ``duplicate_id``.

"""

from __future__ import annotations

ACCEPTED = "accepted"
"""The "reason" of a line that must parse into a record."""

MAX_RECORD_BYTES = 1 << 20
"""The default ``max_record_bytes`` of a deployment."""


def obj(oid: str, body: bytes = b'"terms":["sushi"]', x: bytes = b"10", y: bytes = b"10") -> bytes:
    """An object line with id ``h-<oid>``; ``body`` holds the terms/text part and any extra field."""
    return b'{"type":"object","id":"h-' + oid.encode() + b'","x":' + x + b',"y":' + y + b"," + body + b"}"


def rng(sid: str, body: bytes, rect: bytes = b"[0,0,100,100]") -> bytes:
    """A range subscription line with id ``h-<sid>``; ``body`` holds its keywords or expr."""
    return b'{"type":"subscribe","id":"h-' + sid.encode() + b'","kind":"range","rect":' + rect + b"," + body + b"}"


def expr(sid: str, expression: str) -> bytes:
    """A range subscription with an ``expr``."""
    return rng(sid, b'"expr":"' + expression.encode() + b'"')


def nested_arrays(levels: int) -> bytes:
    """``levels`` nested JSON arrays around an empty one: ``[[...]]``, depth ``levels``."""
    return b"[" * levels + b"]" * levels


def nested_objects(levels: int) -> bytes:
    """``levels`` nested JSON objects: ``{"a":{"a":...{}}}``, depth ``levels``."""
    return b'{"a":' * (levels - 1) + b"{}" + b"}" * (levels - 1)


def sized_object(oid: str, size: int) -> bytes:
    """An object line of exactly ``size`` bytes (a long ``text`` field of ``a``)."""
    head = b'{"type":"object","id":"h-' + oid.encode() + b'","x":10,"y":10,"text":"'
    return head + b"a" * (size - len(head) - 2) + b'"}'


# The record object is level 1, so an extra field holding N nested arrays makes depth N + 1.
DEPTH_64 = obj("depth-64", b'"terms":["jazz"],"extra":' + nested_arrays(63))
DEPTH_65 = obj("depth-65", b'"terms":["jazz"],"extra":' + nested_arrays(64))

WIDE_EXPR = " AND ".join(f"(w{i} OR v{i})" for i in range(650))  # ~12 KB, 2**650 clauses
assert 11_000 < len(WIDE_EXPR) < 14_000

HOSTILE_LINES: list[tuple[bytes, str]] = [
    # --- not UTF-8: malformed_json, the dead letter keeps the bytes as \xNN
    (obj("utf8-in-string", b'"text":"sushi \xff ramen"'), "malformed_json"),
    (obj("utf8-outside") + b"\xfe", "malformed_json"),
    (b'{"type":"object",\x80"id":"h-utf8-between","x":10,"y":10,"text":"a"}', "malformed_json"),
    (obj("utf8-truncated", b'"text":"caf\xc3"'), "malformed_json"),
    (obj("overlong-2", b'"text":"\xc0\xaf"'), "malformed_json"),
    (obj("overlong-3", b'"text":"\xe0\x80\xaf"'), "malformed_json"),
    (obj("surrogate-bytes", b'"text":"\xed\xa0\x80"'), "malformed_json"),
    (obj("beyond-10ffff", b'"text":"\xf4\x90\x80\x80"'), "malformed_json"),
    (b"\xff\xfe{\x00}\x00", "malformed_json"),  # UTF-16 with its BOM
    # --- unpaired surrogate escapes: malformed_json; a proper pair is data
    (b'{"type":"object","id":"h-\\ud800","x":10,"y":10,"text":"a"}', "malformed_json"),
    (obj("surrogate-key", b'"terms":["sushi"],"\\ud800":1'), "malformed_json"),
    (obj("surrogate-term", b'"terms":["sushi","\\ud800"]'), "malformed_json"),
    (obj("low-surrogate", b'"terms":["\\udc00"]'), "malformed_json"),
    (obj("reversed-pair", b'"terms":["\\udc00\\ud800"]'), "malformed_json"),
    (obj("surrogate-extra", b'"terms":["sushi"],"extra":["\\uDBFF"]'), "malformed_json"),
    (obj("surrogate-pair", b'"terms":["\\ud83c\\udf63","sushi"]'), ACCEPTED),
    # --- repeated keys, at any level: malformed_json
    (b'{"type":"object","id":"h-dup-1","id":"h-dup-2","x":10,"y":10,"text":"a"}', "malformed_json"),
    (obj("dup-same-value", b'"terms":["sushi"],"x":10'), "malformed_json"),
    (obj("dup-escaped", b'"terms":["sushi"],"\\u0078":10'), "malformed_json"),  # "\u0078" is "x"
    (obj("dup-colon", b'"text":"a:b","text":"c"'), "malformed_json"),
    (
        b'{"type":"subscribe","id":"h-dup-weights","kind":"topk","point":[1,1],'
        b'"weights":{"sushi":1,"sushi":2},"k":1,"alpha":0.5}',
        "malformed_json",
    ),
    (obj("dup-in-extra", b'"terms":["sushi"],"extra":[{"q":1,"q":1}]'), "malformed_json"),
    # --- nesting: the record is level 1; 64 levels are fine, 65 are malformed_json
    (DEPTH_64, ACCEPTED),
    (DEPTH_65, "malformed_json"),
    (obj("depth-64-objects", b'"terms":["jazz"],"extra":' + nested_objects(63)), ACCEPTED),
    (obj("depth-65-objects", b'"terms":["jazz"],"extra":' + nested_objects(64)), "malformed_json"),
    (obj("depth-1000", b'"terms":["jazz"],"extra":' + nested_arrays(999)), "malformed_json"),
    (obj("depth-100000", b'"terms":["jazz"],"extra":' + nested_arrays(99_999)), "malformed_json"),
    (nested_arrays(100_000), "malformed_json"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "malformed_json"),
    (b"[" * 100_000, "malformed_json"),  # never closed
    # --- numbers: too large for a float is non_finite (even where the field is ignored)
    (obj("1e400", x=b"1e400"), "non_finite"),
    (obj("-1e400", x=b"-1e400"), "non_finite"),
    (obj("400-digits", x=b"1" * 400), "non_finite"),
    (obj("5000-digits", x=b"7" * 5000), "non_finite"),
    (obj("310-digits", x=b"2" + b"0" * 309), "non_finite"),
    (obj("309-digits", x=b"1" + b"0" * 308), "out_of_space"),  # 1e308 is finite
    (obj("nan", x=b"NaN"), "non_finite"),
    (obj("ts-1e400", b'"terms":["sushi"],"ts":1e400'), "non_finite"),
    (obj("expires-400-digits", b'"terms":["sushi"],"expires_at":' + b"9" * 400), "non_finite"),
    (obj("extra-1e400", b'"terms":["sushi"],"extra":[1e400]'), "non_finite"),
    (obj("ts-null", b'"terms":["sushi"],"ts":null,"expires_at":null'), ACCEPTED),  # null: absent (skpub)
    (obj("ts-string", b'"terms":["sushi"],"ts":"5"'), "wrong_field"),
    (
        b'{"type":"subscribe","id":"h-knn-null","kind":"knn","point":[1,1],"keywords":["a"],"k":1,"match":null}',
        "wrong_field",
    ),
    (b'{"type":"subscribe","id":"h-knn-k","kind":"knn","point":[1,1],"keywords":["sushi"],"k":1e400}', "non_finite"),
    (obj("underflow", x=b"1e-400"), ACCEPTED),  # underflows to 0.0: finite
    (obj("negative-zero", x=b"-0.0", y=b"-0"), ACCEPTED),
    (obj("x-rounds-to-100", x=b"100.00000000000000000001"), ACCEPTED),  # rounds to 100.0
    # --- size: a line longer than max_record_bytes is too_large; exactly the limit is fine
    (sized_object("too-large", MAX_RECORD_BYTES + 1), "too_large"),
    (sized_object("just-fits", MAX_RECORD_BYTES), ACCEPTED),
    # --- expressions: 32 nested parentheses and 256 clauses are the limits
    (expr("parens-33", "(" * 33 + "sushi" + ")" * 33), "bad_expr"),
    (expr("parens-32", "(" * 32 + "sushi" + ")" * 32), ACCEPTED),
    (expr("wide", WIDE_EXPR), "bad_expr"),
    (expr("or-257", " OR ".join(["sushi"] * 257)), "bad_expr"),
    (expr("or-256", " OR ".join(["sushi"] * 256)), ACCEPTED),
    (expr("and-or-9", " AND ".join(f"(a{i} OR b{i})" for i in range(9))), "bad_expr"),  # 512 clauses
    (expr("and-or-8", " AND ".join(f"(a{i} OR b{i})" for i in range(8))), ACCEPTED),  # 256 clauses
    (expr("unbalanced-deep", "(" * 40), "bad_expr"),
    # --- rectangles: any finite floats, even far beyond space
    (rng("huge-rect", b'"keywords":["sushi"]', b"[-1.7e308,-1.7e308,1.7e308,1.7e308]"), ACCEPTED),
    (rng("max-rect", b'"keywords":["jazz"]', b"[-1.7976931348623157e308,0,1.7976931348623157e308,100]"), ACCEPTED),
    (rng("1e308-rect", b'"keywords":["ramen"]', b"[-1e308,-1e308,1e308,1e308]"), ACCEPTED),
    (rng("inverted-huge-rect", b'"keywords":["ramen"]', b"[1e308,0,-1e308,100]"), "bad_rect"),
    (rng("overflow-rect", b'"keywords":["ramen"]', b"[0,0,1e309,100]"), "non_finite"),
    # --- control characters: escaped they are data, raw inside a string they are not JSON
    (obj("escaped-controls", b'"text":"bar\\u0000\\u001f\\t\\n\\r\\b\\f jazz"'), ACCEPTED),
    (obj("raw-soh", b'"text":"bar\x01jazz"'), "malformed_json"),
    (obj("raw-nul", b'"text":"bar\x00jazz"'), "malformed_json"),
    (obj("raw-tab", b'"text":"bar\tjazz"'), "malformed_json"),
    (obj("raw-cr-in-string", b'"text":"bar\rjazz"'), "malformed_json"),  # a control character, not a line end
    (obj("raw-del", b'"text":"bar\x7fjazz"'), ACCEPTED),  # DEL is not a JSON control character
    (obj("raw-unit-separator-outside") + b"\x1f", "malformed_json"),
    # --- characters that end lines elsewhere are data here
    (obj("raw-vt-ff", b'"text":"bar\x0b\x0cjazz"'), "malformed_json"),
    (obj("u2028", '"text":"bar\u2028jazz"'.encode()), ACCEPTED),
    (obj("u2029", '"text":"bar\u2029jazz"'.encode()), ACCEPTED),
    (obj("nel", '"text":"bar\x85jazz"'.encode()), ACCEPTED),
    (b'{"type":"object",\r"id":"h-cr-whitespace",\r"x":10,"y":10,"text":"bar"}', ACCEPTED),
    # --- blank lines and a byte-order mark that is not at the start of a file
    (b"", "malformed_json"),
    (b"     ", "malformed_json"),
    (b"\t \r \t", "malformed_json"),
    (b"\xef\xbb\xbf" + obj("mid-bom"), "malformed_json"),
    # --- huge but valid strings
    (b'{"type":"object","id":"h-' + b"i" * 100_000 + b'","x":10,"y":10,"text":"jazz"}', ACCEPTED),
    (rng("j" * 100_000, b'"keywords":["noodle"]'), ACCEPTED),
    (obj("many-terms", b'"terms":[' + b",".join([b'"jazz"'] * 20_000) + b"]"), ACCEPTED),
    # --- ids of the wrong JSON type
    (b'{"type":"object","id":1,"x":10,"y":10,"text":"a"}', "wrong_field"),
    (b'{"type":"object","id":null,"x":10,"y":10,"text":"a"}', "wrong_field"),
    (b'{"type":"object","id":["h-list"],"x":10,"y":10,"text":"a"}', "wrong_field"),
    (b'{"type":"object","id":{"h":1},"x":10,"y":10,"text":"a"}', "wrong_field"),
    (b'{"type":"object","id":true,"x":10,"y":10,"text":"a"}', "wrong_field"),
    (b'{"type":"object","id":"","x":10,"y":10,"text":"a"}', "wrong_field"),
    (b'{"type":"unsubscribe","id":1e5}', "wrong_field"),
    (b'{"type":"snapshot","id":["' + b"s" * 100_000 + b'"]}', "wrong_field"),
    # --- not a JSON object, or not JSON
    (b'"a string"', "malformed_json"),
    (b"42", "malformed_json"),
    (b"1e400", "non_finite"),
    (b'["type","object"]', "malformed_json"),
    (b"null", "malformed_json"),
    (b"true", "malformed_json"),
    (obj("trailing-garbage") + b" x", "malformed_json"),
    (obj("two-on-a-line") + obj("two-on-a-line-2"), "malformed_json"),
    (obj("trailing-comma", b'"terms":["sushi"],'), "malformed_json"),
    (b"{'type':'object','id':'h-single-quotes','x':10,'y':10,'text':'a'}", "malformed_json"),
    (obj("comment", b'"terms":["sushi"] /* hi */'), "malformed_json"),
    (b"\x00" * 64, "malformed_json"),
    (b"{" * 10_000, "malformed_json"),
    # NaN and Infinity are not JSON: non_finite wherever they stand, like an overflowing number.
    (obj("extra-infinity", b'"terms":["sushi"],"extra":Infinity'), "non_finite"),
    (obj("extra-nan", b'"terms":["sushi"],"extra":[NaN]'), "non_finite"),
    # Integer literals past 64 bits are read as floats (docs/SEMANTICS.md decision): k is not an integer.
    (
        b'{"type":"subscribe","id":"h-k-2-64","kind":"knn","point":[1,1],"keywords":["sushi"],'
        b'"k":18446744073709551616}',
        "bad_k",
    ),
]
