import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from skpub.kernel.geometry import Rect
from skpub.kernel.oracle import replay
from skpub.kernel.records import REASONS, DeadLetter, ObjectRecord, RangeSubscription, parse_line
from tests.hostile import ACCEPTED, HOSTILE_LINES
from tests.workloads import INVALID_LINES, SPACE, deployment


@pytest.mark.parametrize(("line", "reason"), INVALID_LINES)
def test_invalid_line_becomes_dead_letter_with_reason(line, reason):
    record = parse_line(line, 0, SPACE)
    if reason == "unknown_id":
        assert not isinstance(record, DeadLetter)
        result = replay([line], deployment())
        assert [d["reason"] for d in result.dead_letters] == [reason]
        assert result.dead_letters[0]["line"] == line
    else:
        assert isinstance(record, DeadLetter)
        assert (record.reason, record.line) == (reason, line)
        assert record.message


def test_every_reason_is_exercised_by_the_test_workload():
    hostile = {reason for _, reason in HOSTILE_LINES} - {ACCEPTED}
    covered = {reason for _, reason in INVALID_LINES} | hostile | {"duplicate_id", "internal_error"}
    assert covered == set(REASONS)


def test_valid_object_and_subscription_parse():
    obj = parse_line(json.dumps({"type": "object", "id": "o", "x": 0, "y": 100, "text": "Jazz jazz BAR"}), 7, SPACE)
    assert isinstance(obj, ObjectRecord)
    assert (obj.pos, obj.terms, obj.term_set) == (7, ("jazz", "jazz", "bar"), frozenset({"jazz", "bar"}))
    sub = parse_line(
        json.dumps({"type": "subscribe", "id": "s", "kind": "range", "rect": [-10, 5, 200, 5], "expr": "A or b"}),
        1,
        SPACE,
    )
    assert isinstance(sub, RangeSubscription)
    assert sub.rect == Rect(-10, 5, 200, 5)
    assert set(sub.dnf) == {frozenset({"a"}), frozenset({"b"})}


def test_duplicates_and_unknown_ids_follow_stream_order():
    lines = [
        '{"type": "unsubscribe", "id": "s"}',
        '{"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"]}',
        '{"type": "unsubscribe", "id": "s"}',
        '{"type": "unsubscribe", "id": "s"}',
        '{"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"]}',
        '{"type": "snapshot", "id": "m"}',
        '{"type": "snapshot", "id": "m"}',
    ]
    reasons = [d["reason"] for d in replay(lines, deployment()).dead_letters]
    assert reasons == ["unknown_id", "unknown_id", "duplicate_id", "duplicate_id"]


def test_rejected_subscription_does_not_reserve_its_id():
    lines = [
        '{"type": "subscribe", "id": "s", "kind": "range", "rect": [5, 0, 1, 1], "keywords": ["a"]}',
        '{"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"]}',
        '{"type": "object", "id": "o", "x": 1, "y": 1, "terms": ["A"]}',
    ]
    result = replay(lines, deployment())
    assert [d["reason"] for d in result.dead_letters] == ["bad_rect"]
    assert result.deliveries == [{"sub": "s", "obj": "o", "event": "match"}]


_RAW = ("1e400", "-1e999", "NaN")  # written raw below: not JSON numbers a float can hold
_RECT_VALUES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.sampled_from(_RAW),
)


@given(st.lists(_RECT_VALUES, min_size=4, max_size=4))
@example(["@", 0.0, '"@', "1e400"])  # a text that holds JSON's own characters
@example(['@"', None, 1, 2.5])
def test_a_rect_of_any_four_values_is_parsed_as_its_numbers_say(values):
    """Floats pass as they are and integers become floats; a value that is no number is wrong_field, one no
    float holds non_finite (the whole line), and an inverted rect bad_rect."""
    text = "[" + ", ".join(v if v in _RAW else json.dumps(v) for v in values) + "]"
    line = f'{{"type": "subscribe", "id": "s", "kind": "range", "rect": {text}, "keywords": ["a"]}}'
    got = parse_line(line.encode(), 3, Rect(-10.0, -10.0, 10.0, 10.0))
    if any(v in _RAW for v in values):
        assert isinstance(got, DeadLetter) and got.reason == "non_finite"  # refused while decoding, fields unread
        return
    if not any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        numbers = [float(v) for v in values]
        if numbers[0] > numbers[2] or numbers[1] > numbers[3]:
            assert isinstance(got, DeadLetter) and got.reason == "bad_rect"
        else:
            assert got == RangeSubscription(3, "s", Rect(*numbers), (frozenset({"a"}),))
            assert all(type(c) is float for c in (got.rect.xmin, got.rect.ymin, got.rect.xmax, got.rect.ymax))
    else:
        assert isinstance(got, DeadLetter) and got.reason == "wrong_field"
