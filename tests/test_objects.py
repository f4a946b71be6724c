"""The bulk object decoder (the parse stage's fast lane) against the line-by-line parser.

Whatever lines it is given, :func:`decode_objects` must take only lines that
:func:`parse_line` accepts as objects, give exactly the record ``parse_line``
gives, and hand every other line back. The generators below aim at the
places the two could part: number spellings, duplicate and extra keys, colons
and escapes in strings, Unicode terms that need normalizing, nulls and the
optional fields.
"""

from __future__ import annotations

import json
import math
import unicodedata

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.kernel.objects import ObjectColumns, _arrow_lane, _msgspec_lane, decode_objects
from skpub.kernel.records import ObjectRecord, parse_line
from skpub.kernel.text import normalize_array, normalize_each
from tests.profiles import examples
from tests.workloads import SPACE

MAX = 1 << 20
TERMS = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('AaÉé\u0301ß\u00adﬁ:\\"\0 Σς'),
    max_size=6,
)
NUMBERS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**25), 10**25).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=None).map(str),
    st.sampled_from(["-0.0", "0", "1e400", "-1e400", "1e-400", "50", "100", "100.0000000000000001", "true", "null"]),
    st.sampled_from(['"1"', "[1]", "NaN", "1.", "01", "+1"]),
)


IN_SPACE = st.one_of(
    st.floats(0, 100).map(repr),
    st.integers(0, 100).map(str),
    st.floats(0, 100).map(lambda v: f"{v:.17e}"),
    st.floats(0, 100).map(lambda v: f"{v:.3E}"),
    st.decimals(0, 100, allow_nan=False, allow_infinity=False, places=20).map(str),
    st.sampled_from(["-0.0", "0e5", "1E1", "5e-324", "99.99999999999999999999", "100.00000000000000001"]),
)


@st.composite
def object_lines(draw) -> bytes:
    """An object line, usually valid, spelled in many ways, now and then broken in one place."""

    def sometimes(usual, rare):
        return draw(st.one_of(usual, rare) if draw(st.integers(0, 9)) == 0 else usual)

    fields = {
        "type": json.dumps(sometimes(st.just("object"), st.sampled_from(["Object", "subscribe", "obj\u0065ct"]))),
        "id": json.dumps(sometimes(st.text(min_size=1, max_size=4), st.sampled_from(["", "a:b", "\ud800"]))),
        "x": sometimes(IN_SPACE, NUMBERS),
        "y": sometimes(IN_SPACE, NUMBERS),
        "terms": json.dumps(draw(st.lists(TERMS, max_size=5)), ensure_ascii=draw(st.booleans())),
    }
    for name in ("ts", "expires_at"):
        if draw(st.booleans()):
            fields[name] = sometimes(IN_SPACE | st.just("null"), NUMBERS)
    items = list(fields.items())
    extra = sometimes(st.none(), st.sampled_from(["text", "other", "id", "x", "terms", "ts"]))
    if extra:
        items.append((extra, '"a"'))  # an extra field, or a repeated key
    order = draw(st.permutations(range(len(items))))
    sep = draw(st.sampled_from([", ", ",", " , "]))
    colon = draw(st.sampled_from([": ", ":", " :"]))
    body = sep.join(f'"{items[k][0]}"{colon}{items[k][1]}' for k in order)
    return ("{" + body + "}").encode()


def check_against_parse_line(lines: list[bytes], first_pos: int = 0) -> int:
    """Decode ``lines`` in bulk; check every line taken against parse_line; return how many were taken."""
    columns, rest = decode_objects(lines, first_pos, SPACE, MAX)
    taken = sorted(set(range(len(lines))) - set(rest))
    assert rest == sorted(rest) and len(set(rest)) == len(rest)
    assert columns.pos.tolist() == [first_pos + i for i in taken]
    for i, record in zip(taken, columns.records(range(len(columns))), strict=True):
        expected = parse_line(lines[i], first_pos + i, SPACE, MAX)
        assert type(expected) is ObjectRecord, (lines[i], expected)
        assert record == expected, lines[i]
        signs = [(record.x, expected.x), (record.y, expected.y), (record.ts, expected.ts)]
        signs.append((record.expires_at, expected.expires_at))
        for got, want in signs:  # == does not tell -0.0 from 0.0
            assert want is None or math.copysign(1, got) == math.copysign(1, want)
    return len(taken)


@examples(15)
@given(st.lists(object_lines(), min_size=1, max_size=8), st.integers(0, 1 << 40))
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": ["A"], "id": "b"}'], 0)
@example([b'{"type": "object", "id": "a:b", "x": 1, "y": 2, "terms": []}'], 0)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": ["\\ud800"]}'], 0)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": ["\xff"]}'], 0)
@example([b'{"type": "object", "id": "a", "x": 1e400, "y": 2, "terms": []}'], 0)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": [], "ts": null, "expires_at": 3}'], 0)
@example([b'\xef\xbb\xbf{"type": "object", "id": "a", "x": 1, "y": 2, "terms": []}'], 0)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": ["", "\\u00ad", "B"]}'], 0)
def test_bulk_decoded_objects_equal_parse_line(lines, first_pos):
    check_against_parse_line(lines, first_pos)


@examples(15)
@given(st.lists(object_lines(), min_size=1, max_size=8), st.sampled_from([_arrow_lane, _msgspec_lane]))
@example([b'{"type": "object", "id": "a", "x": NaN, "y": 2, "terms": []}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": [], "ts": Infinity}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": ["a", null]}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": []}{"type": "object"}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": []}\n{"type": "object", "id": "b"}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": ["\xed\xa0\x80"]}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": [], "ts": null}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": -0, "y": -0.0, "terms": [], "ts": -0}'], _arrow_lane)
@example([b'{"type": "object", "id": "a", "x": 1, "y": 2, "terms": [], "text": "a b"}'], _arrow_lane)
def test_each_lane_alone_takes_only_what_parse_line_accepts(lines, lane):
    """Each lane of the decoder decides on its own; neither may rely on the other to catch a line."""
    taken, rest = lane(lines, list(range(len(lines))))
    assert sorted(taken.lines.tolist() + rest) == list(range(len(lines)))
    columns, outside = taken.columns(0, SPACE)
    inside = [i for i in taken.lines.tolist() if i not in outside]
    for i, record in zip(inside, columns.records(range(len(columns))), strict=True):
        expected = parse_line(lines[i], i, SPACE, MAX)
        assert type(expected) is ObjectRecord, (lines[i], expected)
        assert repr(record) == repr(expected), lines[i]  # repr tells -0.0 from 0.0


def test_the_arrow_lane_takes_a_clean_chunk_and_leaves_only_its_bad_rows():
    good = b'{"type": "object", "id": "o%d", "x": 1, "y": 2, "terms": ["Caf\\u00e9"], "ts": %d}'
    lines = [good % (i, i) for i in range(5)]
    lines[2] = b'{"type": "object", "id": "", "x": 1, "y": 2, "terms": []}'
    taken, rest = _arrow_lane(lines, list(range(5)))
    assert taken.lines.tolist() == [0, 1, 3, 4] and rest == [2]
    lines[3] = b'{"type": "object", "id": "o3", "x": 1, "y": 2, "terms": [], "other": 1}'
    assert _arrow_lane(lines, list(range(5)))[1] == [2, 3]  # another field: that row alone
    lines[3] = b'{"type": "object", "id": "o3", "x": "1", "y": 2, "terms": []}'
    assert _arrow_lane(lines, list(range(5)))[1] == [0, 1, 2, 3, 4]  # the reader refuses the chunk whole


def test_the_common_shapes_take_the_fast_lane():
    lines = [
        b'{"type": "object", "id": "o1", "x": 1.5, "y": 2, "terms": ["Sushi", "caf\\u00e9", "\xc3\x89T\xc3\x89"]}',
        b'{"id":"o2","type":"object","terms":[],"x":0,"y":100,"ts":12.5}',
        b'{"type": "object", "id": "o3", "x": 100, "y": 0, "terms": ["a"], "ts": null, "expires_at": 9}',
        b'{"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"]}',
        b'{"type": "object", "id": "o4", "x": 101, "y": 0, "terms": ["a"]}',  # outside the space
        b'{"type": "object", "id": "o5", "x": 1, "y": 0, "text": "a b"}',
    ]
    columns, rest = decode_objects(lines, 7, SPACE, MAX)
    assert rest == [3, 4, 5]
    assert check_against_parse_line(lines, 7) == 3
    first = columns.records([0])[0]
    assert first.terms == ("sushi", "café", "été") and first.ts is None
    assert columns.records([1])[0].ts == 12.5 and columns.records([2])[0].expires_at == 9.0


def test_lines_over_the_size_limit_are_left_to_the_line_by_line_parser():
    line = b'{"type": "object", "id": "o", "x": 1, "y": 2, "terms": ["a"]}'
    assert decode_objects([line], 0, SPACE, len(line) - 1)[1] == [0]
    assert decode_objects([line], 0, SPACE, len(line))[1] == []


def test_columns_round_trip_records_and_concat_keeps_stream_order():
    records = [
        ObjectRecord(5, "b", 1.0, 2.0, ("x", "y", "x"), frozenset({"x", "y"}), None, 3.0),
        ObjectRecord(2, "a", -0.0, 0.5, (), frozenset(), 1.0, None),
        ObjectRecord(9, "c", 3.0, 4.0, ("z",), frozenset({"z"}), None, None),
    ]
    columns = ObjectColumns.from_records(records)
    assert columns.records([0, 1, 2]) == records
    joined = ObjectColumns.concat([ObjectColumns.from_records(records[:1]), ObjectColumns.from_records(records[1:])])
    assert joined.pos.tolist() == [2, 5, 9]
    assert joined.records(range(3)) == sorted(records, key=lambda r: r.pos)
    assert len(ObjectColumns.from_records([])) == 0


@examples(5)
@given(st.lists(TERMS, max_size=40))
@example(["ǅ", "Σ", "ß", "", "ﬁ", "e\u0301", "\u0301", "İ"])
def test_normalize_each_and_normalize_array_equal_term_by_term_normalization(terms):
    nfkc = unicodedata.normalize
    expected = [nfkc("NFKC", nfkc("NFKC", t).casefold()) for t in terms]
    assert normalize_each(terms) == expected
    assert normalize_array(terms).to_pylist() == expected


def test_normalize_each_refuses_what_is_not_a_string():
    with pytest.raises(TypeError):
        normalize_each(["a", 1])


@examples(5)
@given(
    st.lists(st.tuples(st.floats(-180, 180), st.floats(-90, 90)), min_size=1, max_size=20),
    st.sampled_from([1, 7, 100, 1000]),
)
@example([(-180.0, -90.0), (180.0, 90.0), (0.0, 0.0), (179.99999999999997, 89.99999999999999)], 1000)
def test_vectorized_cells_equal_the_scalar_cell_of(points, size):
    grid = FineGrid(Rect(-180, -90, 180, 90), size)
    xs, ys = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    cx, cy = grid.cells_of(xs, ys)
    assert list(zip(cx.tolist(), cy.tolist(), strict=True)) == [grid.cell_of(x, y) for x, y in points]
