"""Hostile input (SEMANTICS section 1): whatever a line holds, it becomes a record or a dead letter.

The corpus of :mod:`tests.hostile` pins the reason of each hand-written
hostile line; property tests feed arbitrary bytes, arbitrary JSON values,
mutated valid records and arbitrary AND/OR expressions; end-to-end tests run
a stream mixing all of it through the local engine (and Spark) against the
oracle.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import random
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from skpub.app.engines.local import run_local
from skpub.app.summary import RunObserver, RunSummary
from skpub.kernel.config import Deployment
from skpub.kernel.errors import ExpressionError
from skpub.kernel.inputs import BOM, iter_lines
from skpub.kernel.objects import decode_objects
from skpub.kernel.oracle import replay
from skpub.kernel.parts import STREAMS, read_stream
from skpub.kernel.records import REASONS, DeadLetter, RangeSubscription, parse_line
from skpub.kernel.text import dnf_matches, parse_expression
from tests.hostile import ACCEPTED, HOSTILE_LINES, MAX_RECORD_BYTES
from tests.profiles import TOO_SLOW, examples
from tests.tiers import grid
from tests.workloads import SPACE, assert_outputs_equal_oracle, deployment, random_workload, ranked_workload

OUTCOMES = frozenset(REASONS) - {"internal_error"}
"""Every reason an input line may get: ``internal_error`` is a bug, never the fault of the input."""

TYPES = ("object", "subscribe", "unsubscribe", "snapshot")


def text_of(line: bytes) -> str:
    r"""The ``line`` of a dead letter: UTF-8, invalid bytes as ``\xNN`` (SEMANTICS section 1)."""
    return line.decode("utf-8", "backslashreplace")


def outcome(line: bytes | str, max_record_bytes: int = MAX_RECORD_BYTES) -> str:
    """Parse ``line`` and return its dead-letter reason or :data:`ACCEPTED`, checking the dead letter's form.

    A line the bulk object decoder takes must give the record ``parse_line`` gives.
    """
    record = parse_line(line, 3, SPACE, max_record_bytes)
    raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
    bulk, rest = decode_objects([raw], 3, SPACE, max_record_bytes)
    if not rest:  # the bulk decoder took the line: it must give the very record parse_line gives
        assert bulk.records([0]) == [record]
    if not isinstance(record, DeadLetter):
        assert record.pos == 3
        return ACCEPTED
    assert record.reason in OUTCOMES, record
    assert record.pos == 3
    assert record.line == text_of(raw)
    record.line.encode("utf-8")  # strict: every output file stays valid UTF-8
    assert record.message
    assert len(record.message) <= 600, "a message must not repeat a hostile line"
    orjson.dumps(record.to_json())  # what the sink does; orjson refuses lone surrogates
    return record.reason


# --------------------------------------------------------------------------- the corpus


@pytest.mark.parametrize(
    ("line", "reason"), HOSTILE_LINES, ids=[f"{i:03d}-{reason}" for i, (_, reason) in enumerate(HOSTILE_LINES)]
)
def test_hostile_line_gets_the_reason_semantics_names(line, reason):
    assert outcome(line) == reason
    try:
        as_str = line.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert outcome(as_str) == reason, "a str line is taken as its UTF-8 encoding"


def test_hostile_corpus_is_well_formed():
    lines = [line for line, _ in HOSTILE_LINES]
    assert len(set(lines)) == len(lines)
    assert len({text_of(line) for line in lines}) == len(lines), "dead letters are matched by their text"
    for line in lines:
        assert b"\n" not in line and not line.endswith(b"\r"), "a corpus line must survive a round trip through a file"
    ids = [r.id for line in lines if not isinstance(r := parse_line(line, 0, SPACE), DeadLetter)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("h-") for i in ids)


def by_id(prefix: str):
    """The record of the accepted corpus line whose id starts with ``h-<prefix>``."""
    for line, reason in HOSTILE_LINES:
        record = parse_line(line, 0, SPACE)
        if reason == ACCEPTED and record.id.startswith("h-" + prefix):
            return record
    raise KeyError(prefix)


def test_accepted_hostile_lines_keep_their_data():
    assert by_id("surrogate-pair").term_set == {"\U0001f363", "sushi"}
    assert by_id("u2028").terms == ("bar", "jazz"), "U+2028 is data: the line is one record"
    assert by_id("nel").terms == ("bar", "jazz")
    assert by_id("escaped-controls").terms == ("bar", "jazz")
    assert by_id("raw-del").terms == ("bar", "jazz")
    assert by_id("underflow").x == 0.0
    assert by_id("x-rounds-to-100").x == 100.0
    assert len(by_id("i" * 1000).id) == 100_002
    assert len(by_id("just-fits").terms[0]) > MAX_RECORD_BYTES - 100
    huge = by_id("huge-rect")
    assert isinstance(huge, RangeSubscription)
    assert huge.dnf == (frozenset({"sushi"}),)
    for x, y in itertools.product((0.0, 50.0, 100.0), repeat=2):
        assert huge.rect.contains_point(x, y)
    assert by_id("parens-32").dnf == (frozenset({"sushi"}),)
    assert by_id("or-256").dnf == (frozenset({"sushi"}),), "257 would be too many clauses, 256 is not"
    assert len(by_id("and-or-8").dnf) == 256


def test_str_line_with_a_lone_surrogate_is_a_dead_letter():
    record = parse_line('{"type": "object", "id": "\ud800", "x": 1, "y": 1, "text": "a"}', 0, SPACE)
    assert isinstance(record, DeadLetter)
    assert record.reason == "malformed_json"


# --------------------------------------------------------------------------- expression bounds


@pytest.mark.parametrize(
    "expression",
    [
        " AND ".join(["(a OR b)"] * 1_000),  # 13 KB
        " AND ".join(["(a OR b)"] * 80_000),  # 1 MB, 2**80000 clauses
        "(" * 31 + " AND ".join(["(a OR b OR c)"] * 6_000) + ")" * 31,  # 100 KB, 32 levels deep
        " OR ".join(["a"] * 20_000),  # 100 KB, one clause per operand
    ],
    ids=["13KB", "1MB", "100KB-nested", "100KB-or-chain"],
)
def test_expression_limit_is_decided_in_memory_linear_in_its_length(expression):
    tracemalloc.start()
    try:
        with pytest.raises(ExpressionError, match="256 AND-clauses"):
            parse_expression(expression)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # About 34 bytes a character today (the token list and the tree); an expansion would be exponential.
    assert peak < 48 * len(expression) + (1 << 20)


# --------------------------------------------------------------------------- property: arbitrary input


VALID_RECORDS = [
    {"type": "object", "id": "o1", "x": 10.5, "y": 20, "terms": ["sushi", "jazz"]},
    {"type": "object", "id": "o2", "x": 0, "y": 100, "text": "Café bar", "ts": 1.5, "expires_at": 9},
    {"type": "subscribe", "id": "s1", "kind": "range", "rect": [0, 0, 50, 50], "keywords": ["sushi"]},
    {"type": "subscribe", "id": "s2", "kind": "range", "rect": [-10, 0, 150, 50], "expr": "(sushi OR ramen) AND jazz"},
    {"type": "subscribe", "id": "s3", "kind": "topk", "point": [1, 2], "weights": {"sushi": 2}, "k": 3, "alpha": 0.3},
    {"type": "subscribe", "id": "s4", "kind": "knn", "point": [1, 2], "keywords": ["bar"], "k": 2, "match": "all"},
    {"type": "unsubscribe", "id": "s1"},
    {"type": "snapshot", "id": "m1"},
]
FIELDS = sorted({key for record in VALID_RECORDS for key in record} | {"from", "alpha", "weights", "extra"})


def test_the_records_mutated_below_are_valid():
    for record in VALID_RECORDS:
        assert outcome(json.dumps(record).encode()) == ACCEPTED


@st.composite
def spliced_lines(draw) -> bytes:
    """A valid record line with a few bytes replaced, inserted or cut off."""
    line = json.dumps(draw(st.sampled_from(VALID_RECORDS)), ensure_ascii=False).encode()
    start = draw(st.integers(0, len(line)))
    end = draw(st.integers(start, min(len(line), start + 6)))
    return line[:start] + draw(st.binary(max_size=6)) + line[end:]


@examples(6)
@given(st.one_of(st.binary(max_size=200), spliced_lines()))
@example(b"\xed\xa0\x80")
@example(b'{"type":"object","id":"\xff","x":1,"y":1,"text":"a"}')
@example(b"\\xff\xff")
def test_arbitrary_bytes_never_raise(line):
    outcome(line)


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**700), max_value=10**700)
    | st.floats()
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=24,
)
record_like = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES) | json_values},
    optional={name: json_values for name in FIELDS if name != "type"},
)


def depth(value) -> int:
    """JSON nesting depth: a scalar is 0, the record object is level 1."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def numbers(value):
    """Every number in ``value`` (bools excluded)."""
    if isinstance(value, dict):
        for v in value.values():
            yield from numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def overflows(number: int | float) -> bool:
    """Whether a number is too large for a 64-bit float."""
    try:
        return math.isinf(float(number))
    except OverflowError:
        return True


def line_level_reason(value) -> str | None:
    """The reason SEMANTICS gives ``json.dumps(value)`` before any field is read; None when the fields decide.

    Raises ``LookupError`` when the value holds NaN or an infinity (not JSON: which reason is open).
    """
    if any(isinstance(n, float) and not math.isfinite(n) for n in numbers(value)):
        raise LookupError("NaN or Infinity")
    if depth(value) > 64:
        return "malformed_json"
    if any(overflows(n) for n in numbers(value)):
        return "non_finite"
    if not isinstance(value, dict):
        return "malformed_json"
    if "type" not in value:
        return "missing_field"
    if value["type"] not in TYPES:
        return "unknown_type"
    return None


@examples(3)
@given(st.one_of(json_values, record_like), st.booleans())
@example(10**400, True)
@example({"type": "object", "id": "o", "x": 10**400, "y": 1, "text": "a"}, True)
@example({"type": "object", "id": "\U0001f363", "x": 1, "y": 1, "text": "a"}, True)
def test_arbitrary_json_values_never_raise(value, ensure_ascii):
    line = json.dumps(value, ensure_ascii=ensure_ascii)
    got = outcome(line.encode())
    assert outcome(line) == got
    try:
        expected = line_level_reason(value)
    except LookupError:
        return
    if expected is not None:
        assert got == expected


# --------------------------------------------------------------------------- property: mutated valid records

HOLE = "\x00hole\x00"


def with_hole(record: dict, key: str) -> tuple[str, str]:
    """Serialize ``record`` with ``key`` set to a placeholder; return the text and the placeholder's JSON."""
    return json.dumps({**record, key: HOLE}), json.dumps(HOLE)


def fill(record: dict, key: str, raw_value: str) -> bytes:
    """``record`` as a line with the value of ``key`` written as the raw JSON text ``raw_value``."""
    text, hole = with_hole(record, key)
    return text.replace(hole, raw_value).encode()


@st.composite
def mutated(draw) -> tuple[bytes, str | None, int]:
    """A valid record with one hostile mutation: ``(line, expected outcome or None, max_record_bytes)``."""
    record = dict(draw(st.sampled_from(VALID_RECORDS)))
    key = draw(st.sampled_from(list(record)) | st.just("extra"))  # "extra" is ignored: the outcome is known
    ignored = key == "extra"
    kind = draw(
        st.sampled_from(
            ["replace", "nest", "huge_number", "surrogate", "control", "oversize", "parentheses", "duplicate"]
        )
    )
    if kind == "replace":
        value = draw(json_values)
        line = json.dumps({**record, key: value}).encode()
        try:
            expected = line_level_reason({**record, key: value}) or (ACCEPTED if ignored else None)
        except LookupError:
            expected = None
        return line, expected, MAX_RECORD_BYTES
    if kind == "nest":
        levels = draw(st.integers(60, 66) | st.integers(1, 300))  # total depth 64 is the edge
        arrays = draw(st.booleans())
        inner = json.dumps(record.get(key, 1))
        wrapped = "[" * levels + inner + "]" * levels if arrays else '{"a":' * levels + inner + "}" * levels
        total = 1 + levels + depth(record.get(key, 1))
        expected = "malformed_json" if total > 64 else (ACCEPTED if ignored else None)
        return fill(record, key, wrapped), expected, MAX_RECORD_BYTES
    if kind == "huge_number":
        digits = draw(st.integers(1, 6000))
        number = ("-" if draw(st.booleans()) else "") + "9" * digits
        if draw(st.booleans()):
            number += f"e{draw(st.integers(-1000, 1000))}"
        expected = "non_finite" if math.isinf(float(number)) else (ACCEPTED if ignored else None)
        return fill(record, key, number), expected, MAX_RECORD_BYTES
    if kind == "surrogate":
        high, low = draw(st.integers(0xD800, 0xDBFF)), draw(st.integers(0xDC00, 0xDFFF))
        lone = draw(
            st.sampled_from([f"\\u{high:04x}", f"\\u{low:04X}", f"\\u{low:04x}\\u{high:04x}", f"x\\u{high:04x}y"])
        )
        where = draw(st.sampled_from(["value", "key", "in_list"]))
        if where == "value":
            line = fill(record, key, f'"{lone}"')
        elif where == "key":
            line = fill(record, "extra", f'{{"{lone}": 1}}')
        else:
            line = fill(record, key, f'["sushi", "{lone}"]')
        return line, "malformed_json", MAX_RECORD_BYTES
    if kind == "control":
        char = draw(st.integers(0, 0x1F))
        if draw(st.booleans()):
            return fill(record, key, f'"ab{chr(char)}cd"'), "malformed_json", MAX_RECORD_BYTES
        return fill(record, key, f'"ab\\u{char:04x}cd"'), ACCEPTED if ignored else None, MAX_RECORD_BYTES
    if kind == "oversize":
        limit = draw(st.integers(200, 4096))
        text, hole = with_hole(record, key)
        pad = limit - (len(text.encode()) - len(hole)) - 2 + draw(st.integers(-3, 3))
        if pad < 0:
            pad = 0
        line = text.replace(hole, '"' + "z" * pad + '"').encode()
        expected = "too_large" if len(line) > limit else (ACCEPTED if ignored else None)
        return line, expected, limit
    if kind == "parentheses":
        opened, closed = draw(st.integers(0, 40)), draw(st.integers(0, 40))
        expression = "(" * opened + "sushi AND jazz" + ")" * closed
        line = json.dumps({**VALID_RECORDS[3], "expr": expression}).encode()
        return line, ACCEPTED if opened == closed <= 32 else "bad_expr", MAX_RECORD_BYTES
    # duplicate: the key written twice, maybe the second time with a \u escape
    key = draw(st.sampled_from(list(record)))
    spelled = json.dumps(key)
    if draw(st.booleans()):
        spelled = f'"\\u{ord(key[0]):04x}{key[1:]}"'
    again = draw(st.sampled_from([json.dumps(record[key]), "null", '"x"']))
    line = ("{" + spelled + ": " + again + ", " + json.dumps(record)[1:]).encode()
    return line, "malformed_json", MAX_RECORD_BYTES


@examples(6, suppress_health_check=TOO_SLOW)
@given(mutated())
def test_mutated_records_never_raise_and_line_level_reasons_hold(case):
    line, expected, limit = case
    got = outcome(line, limit)
    if expected is not None:
        assert got == expected


# --------------------------------------------------------------------------- property: expressions


EXPR_TOKENS = ["(", ")", "AND", "OR", "and", "or", "a", "b", "c", " "]
ALLOWED_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.Name, ast.Load)


def as_python(expression: str) -> tuple[ast.Expression | None, list[str]]:
    """Translate an AND/OR expression to Python, written independently of the product's tokenizer.

    Returns the Python AST (None if the text is not an AND/OR expression for
    Python) and the distinct operands, normalized (``tN`` in the AST is the
    N-th operand).
    """
    words = expression.replace("(", " ( ").replace(")", " ) ").split()
    operands: list[str] = []
    out = []
    for word in words:
        if word in "()":
            out.append(word)
        elif word.upper() in ("AND", "OR"):
            out.append(word.lower())
        else:
            term = word.lower()
            if term not in operands:
                operands.append(term)
            out.append(f"t{operands.index(term)}")
    try:
        tree = ast.parse(" ".join(out), mode="eval")
    except SyntaxError:
        return None, operands
    if not all(isinstance(node, ALLOWED_NODES) for node in ast.walk(tree)):
        return None, operands  # e.g. "()" is a tuple and "a (b)" a call to Python
    return tree, operands


@examples(15)
@given(st.lists(st.sampled_from(EXPR_TOKENS), max_size=30).map("".join))
@example("a OR b AND c")
@example("(a OR b) and c")
@example("aANDb or c")
@example("a and or b")
@example("a OR a AND b")
@example("(a OR b) AND a")
@example("()")
@example("a (b)")
@example("")
def test_parse_expression_agrees_with_python_boolean_logic(expression):
    try:
        dnf = parse_expression(expression)
    except ExpressionError:
        dnf = None
    tree, operands = as_python(expression)
    if not operands and dnf is not None:
        assert dnf == (), "an expression without operands has no clause (empty_keywords)"
        return
    assert (dnf is None) == (tree is None), f"{expression!r}: parser {dnf}, Python {tree and ast.dump(tree)}"
    if dnf is None:
        return
    clauses = list(dnf)
    assert all(not (a < b) for a, b in itertools.permutations(clauses, 2)), "the DNF is minimal"
    assert set().union(*clauses) <= set(operands)
    universe = operands if len(operands) <= 6 else [t for t in operands if t in "abc"]
    code = compile(tree, "<expression>", "eval")
    for size in range(len(universe) + 1):
        for present in itertools.combinations(universe, size):
            env = {f"t{i}": term in present for i, term in enumerate(operands)}
            assert dnf_matches(dnf, frozenset(present)) == eval(code, {"__builtins__": {}}, env), present


# --------------------------------------------------------------------------- end to end


def hostile_stream(seed: int = 17) -> list[bytes]:
    """A random workload with every corpus line inserted at a seeded position (never first)."""
    lines = [line.encode() for line in random_workload(seed, n=300)]
    rnd = random.Random(seed)
    for line, _ in HOSTILE_LINES:
        lines.insert(rnd.randint(1, len(lines)), line)
    return lines


def write_stream(path: Path, lines: list[bytes], variant: str) -> Path:
    """Write ``lines`` as ``lf`` (no final terminator) or ``bom-crlf`` (a BOM, every line ended by CRLF)."""
    if variant == "lf":
        # No final terminator, unless the last line is empty: "a\n" holds one line, "a\n\n" two.
        path.write_bytes(b"\n".join(lines) + (b"\n" if lines and not lines[-1] else b""))
    else:
        path.write_bytes(BOM + b"".join(line + b"\r\n" for line in lines))
    assert list(iter_lines(path)) == lines, "the reader gives back exactly the lines written"
    return path


@pytest.fixture(scope="module")
def stream() -> tuple[list[bytes], object]:
    lines = hostile_stream()
    return lines, replay(lines, deployment())


def assert_run_is_exact(out: Path, summary: RunSummary, lines: list[bytes], dep: Deployment, expected) -> None:
    """The run finished, wrote valid UTF-8, accounted for every line once and equals the oracle.

    Deliveries are compared by :func:`~tests.workloads.assert_outputs_equal_oracle`: topk/knn events one by one
    at batch size 1, results at every batch boundary otherwise (a micro-batch may coalesce an enter and an exit
    of one object inside it: SEMANTICS section 5).
    """
    assert (out / "_SUCCESS").exists()
    parts = [part for stream in STREAMS for part in (out / stream).glob("*.jsonl")]
    assert parts
    for part in parts:
        part.read_bytes().decode("utf-8")  # strict: the input's invalid bytes never reach an output file
    assert_outputs_equal_oracle(out, lines, dep, exact_events=dep.batch_size == 1, expected=expected)
    dead = read_stream(out, "dead_letters")
    assert not [d for d in dead if d["reason"] == "internal_error"]
    accepted = len(lines) - len(expected.dead_letters)
    assert summary.records == len(lines)
    assert len(dead) + accepted == len(lines)
    assert sum(summary.dead_letters.values()) == len(dead)


def assert_hostile_reasons(dead: list[dict]) -> None:
    reasons = {}
    for d in dead:
        reasons.setdefault(d["line"], []).append(d["reason"])
    for line, reason in HOSTILE_LINES:
        got = reasons.get(text_of(line), [])
        assert got == ([] if reason == ACCEPTED else [reason]), line[:80]


def test_hostile_stream_oracle_sanity(stream):
    lines, expected = stream
    assert_hostile_reasons(expected.dead_letters)
    hostile_subs = {"h-huge-rect", "h-max-rect", "h-1e308-rect", "h-parens-32", "h-or-256", "h-" + "j" * 100_000}
    assert hostile_subs <= {d["sub"] for d in expected.deliveries}, "accepted hostile subscriptions do match"
    counts = Counter(d["reason"] for d in expected.dead_letters)
    assert counts["duplicate_id"] >= 2 and counts["internal_error"] == 0


def observer(dep) -> RunObserver:
    return RunObserver(RunSummary("test", dep.router, dep.evaluators), stream=None)


@pytest.mark.parametrize(
    ("variant", "batch_size", "evaluators", "router"),
    [("lf", 7, 3, "agrid"), ("lf", 5000, 1, "uniform"), ("bom-crlf", 50, 4, "agrid"), ("bom-crlf", 1, 2, "uniform")],
)
def test_local_engine_on_a_hostile_stream_equals_oracle(tmp_path, stream, variant, batch_size, evaluators, router):
    lines, expected = stream
    dep = deployment(evaluators=evaluators, router=router, batch_size=batch_size)
    source = write_stream(tmp_path / "in.jsonl", lines, variant)
    out = tmp_path / "out"
    summary = run_local(source, out, dep, observer(dep))
    assert_run_is_exact(out, summary, lines, dep, expected)
    assert_hostile_reasons(read_stream(out, "dead_letters"))


@pytest.mark.spark
@pytest.mark.slow
def test_spark_engine_on_a_hostile_stream_equals_oracle(spark, tmp_path, stream):
    from skpub.app.engines.spark import run_spark

    lines, expected = stream
    dep = deployment(evaluators=4, batch_size=150)
    source = write_stream(tmp_path / "in.jsonl", lines, "bom-crlf")
    out = tmp_path / "out"
    summary = run_spark(source, out, dep, observer(dep), spark=spark)
    assert_run_is_exact(out, summary, lines, dep, expected)
    assert_hostile_reasons(read_stream(out, "dead_letters"))


def as_stream_line(line: bytes) -> bytes:
    """Make ``line`` one line of a file: no ``\\n`` inside, no ``\\r`` at its end (the reader drops it)."""
    line = line.replace(b"\n", b"")
    return line + b"!" if line.endswith(b"\r") else line


SMALL_WORKLOAD = [line.encode() for line in random_workload(seed=4, n=60, invalid=False)]
noise_lines = st.one_of(
    st.binary(max_size=80), spliced_lines(), st.sampled_from([line for line, _ in HOSTILE_LINES if len(line) < 300])
).map(as_stream_line)


@examples(0.1, suppress_health_check=TOO_SLOW)
@given(
    noise=st.lists(st.tuples(st.integers(0, 10**6), noise_lines), min_size=1, max_size=25),
    batch_size=st.sampled_from([1, 4, 50]),
    variant=st.sampled_from(["lf", "bom-crlf"]),
)
def test_local_engine_accounts_for_random_lines_exactly_once(noise, batch_size, variant):
    lines = list(SMALL_WORKLOAD)
    for where, line in noise:
        lines.insert(1 + where % len(lines), line)
    dep = deployment(evaluators=3, batch_size=batch_size)
    expected = replay(lines, dep)
    with tempfile.TemporaryDirectory() as tmp:
        source = write_stream(Path(tmp) / "in.jsonl", lines, variant)
        summary = run_local(source, Path(tmp) / "out", dep, observer(dep))
        assert_run_is_exact(Path(tmp) / "out", summary, lines, dep, expected)


@pytest.mark.parametrize(
    ("fault", "batch_size"),
    grid(
        ["dropped", "extra", "late event", "late match"],
        [1, 4],
        fast={("dropped", 1), ("extra", 4), ("late event", 4), ("late match", 4)},
    ),
)
def test_the_exactness_check_catches_a_dropped_an_extra_or_a_late_delivery(tmp_path, batch_size, fault):
    """The check of the runs above is not blind: a correct run's output with one topk/knn event dropped or doubled,
    or one event or range match moved into the next batch, fails it.

    A dropped or doubled event breaks the fold or the results; a late one leaves every subscription's events in
    their order and the final results as they were: only the batch-by-batch comparison sees it.
    """
    from skpub.kernel.parts import PART_RE, part_path

    lines = [line.encode() for line in ranked_workload(5, n=100) + random_workload(4, n=200, invalid=False)]
    dep = deployment(evaluators=3, batch_size=batch_size)
    expected = replay(lines, dep)
    out = tmp_path / "out"
    summary = run_local(write_stream(tmp_path / "in.jsonl", lines, "lf"), out, dep, observer(dep))
    assert_run_is_exact(out, summary, lines, dep, expected)  # the run itself is exact
    last = -(-len(lines) // batch_size) - 1
    wanted = b'"match"' if fault == "late match" else b'"e'  # "event":"enter" or "exit"
    candidates = [
        (part, i, int(match["batch"]), match["writer"])
        for part in sorted((out / "deliveries").glob("part-*.jsonl"))
        if (match := PART_RE.fullmatch(part.name)) and (not fault.startswith("late") or int(match["batch"]) < last)
        for i, line in enumerate(part.read_bytes().splitlines())
        if wanted in line and (fault == "late match" or match["writer"] == "m")
    ]
    assert len(candidates) >= 5, "the workload makes range matches and topk/knn events"
    for part, i, batch, writer in random.Random(batch_size).sample(candidates, 5):
        later = part_path(out, "deliveries", batch + 1, writer or "")
        kept = {path: path.read_bytes() if path.exists() else None for path in (part, later)}
        rows = kept[part].splitlines(keepends=True)
        if fault == "dropped":
            part.write_bytes(b"".join(rows[:i] + rows[i + 1 :]))
        elif fault == "extra":
            part.write_bytes(b"".join(rows[: i + 1] + rows[i:]))
        else:
            part.write_bytes(b"".join(rows[:i] + rows[i + 1 :]))
            later.write_bytes(rows[i] + (kept[later] or b""))  # first in the next batch: its order kept
        with pytest.raises(AssertionError):
            assert_run_is_exact(out, summary, lines, dep, expected)
        for path, content in kept.items():
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(content)
        assert_run_is_exact(out, summary, lines, dep, expected)  # restored
