"""The object-id horizon decides exactly as a list of the last N accepted ids, whatever its hashes do."""

import base64

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.kernel.errors import CheckpointError
from skpub.kernel.horizon import ObjectIdHorizon, memory_bytes
from tests.profiles import examples

KEY = "0123456789abcdef" + "fedcba9876543210"
IDS = [f"o{i}" for i in range(14)] + ["", "é", "o1 "]


class CollidingHorizon(ObjectIdHorizon):
    """A horizon whose ``lo`` hashes collide on purpose (4 values): long probe chains, equal ``lo`` of other ids."""

    def _hash(self, oids):
        hi = np.array([IDS.index(o) if o in IDS else len(IDS) for o in oids], dtype=np.uint64)  # else: the probe
        return hi % np.uint64(4), hi


def reference(batches, capacity):
    """Per batch, the indices a list of the last ``capacity`` accepted ids rejects; and that list."""
    accepted, rejected = [], []
    for batch in batches:
        rejected.append([])
        for k, oid in enumerate(batch):
            if oid in accepted[-capacity:]:
                rejected[-1].append(k)
            else:
                accepted.append(oid)
    return rejected, accepted[-capacity:]


batches_strategy = st.lists(st.lists(st.sampled_from(IDS), max_size=25), max_size=8)


@examples(2)
@given(batches=batches_strategy, capacity=st.integers(1, 9), colliding=st.booleans(), reload=st.integers(0, 8))
def test_batches_are_decided_as_one_by_one_across_generations_and_durable_form(batches, capacity, colliding, reload):
    expected, held = reference(batches, capacity)
    horizon = (CollidingHorizon if colliding else ObjectIdHorizon)(capacity)
    got = []
    for b, batch in enumerate(batches):
        if b == reload:
            data, blob = horizon.to_json(), b"".join(horizon.hash_buffers())
            assert len(blob) == 16 * len(horizon) == 16 * data["count"]
            legacy = type(horizon).from_json(legacy_form(data, blob), capacity)  # router state format 4
            horizon = type(horizon).from_json(data, capacity, blob)
            assert horizon.to_json() == data and b"".join(horizon.hash_buffers()) == blob
            assert b"".join(legacy.hash_buffers()) == blob
        got.append(horizon.add(batch))
    assert got == expected
    assert len(horizon) == len(held)
    ages = {oid: len(held) - 1 - k for k, oid in enumerate(held)}
    assert horizon.ages(IDS).tolist() == [ages.get(oid, -1) for oid in IDS]
    assert [oid in horizon for oid in IDS] == [oid in ages for oid in IDS]


def legacy_form(data, blob):
    """The durable form of router state format 4: base64 of (lo, hi) pairs inside the JSON."""
    both = np.frombuffer(blob, dtype="<u8").reshape(2, -1)
    pairs = np.stack([both[0], both[1]], axis=1).astype("<u8")
    return {"key": data["key"], "check": data["check"], "hashes": base64.b64encode(pairs.tobytes()).decode()}


def held_arrays(horizon):
    tables = (horizon._older, horizon._newer)
    return [horizon._lo, horizon._hi, *(t.slots for t in tables)]


def test_memory_is_allocated_when_made_and_does_not_grow():
    horizon = ObjectIdHorizon(1000)
    before = [(id(a), a.nbytes) for a in held_arrays(horizon)]
    assert sum(n for _, n in before) == memory_bytes(1000) == 16 * 1000 + 32 * 2048
    for start in range(0, 25_000, 700):
        assert horizon.add([f"x{i}" for i in range(start, start + 700)]) == []
    assert sorted((id(a), a.nbytes) for a in held_arrays(horizon)) == sorted(before)
    assert len(horizon) == 1000
    assert horizon.ages(["x24199", "x24200", "x25199"]).tolist() == [-1, 999, 0]


def test_two_horizons_draw_different_keys_and_read_each_other_only_through_their_durable_form():
    a, b = ObjectIdHorizon(10), ObjectIdHorizon(10)
    assert a.key != b.key
    a.add(["p", "q"])
    copy = ObjectIdHorizon.from_json(a.to_json(), 10, b"".join(a.hash_buffers()))
    assert copy.key == a.key and copy.ages(["p", "q", "r"]).tolist() == [1, 0, -1]


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"key": KEY},
        {"key": KEY, "check": "0", "hashes": ""},  # a probe check another hash function would give
        {"key": "ab" * 16, "hashes": ""},  # two equal key halves
        {"key": KEY, "hashes": base64.b64encode(bytes(32)).decode()},  # one hash twice
        {"key": KEY[:31], "hashes": ""},
        {"key": "G" * 32, "hashes": ""},
        {"key": KEY, "hashes": "not base64!"},
        {"key": KEY, "hashes": "AAAA"},  # 3 bytes: not whole hashes
        {"key": KEY, "hashes": "A" * 64},  # 3 hashes: more hashes than the capacity
        {"key": 7, "hashes": ""},
        [],
    ],
)
def test_a_damaged_durable_form_is_refused(raw):
    if isinstance(raw, dict) and "hashes" in raw and "check" not in raw:
        raw = {**raw, "check": ObjectIdHorizon(2, KEY).to_json()["check"]}
    with pytest.raises(CheckpointError):
        ObjectIdHorizon.from_json(raw, 2)


def pair_bytes(*pairs):
    """The binary durable form of ``(lo, hi)`` pairs: every lo, then every hi, little-endian uint64."""
    return np.array([p[0] for p in pairs] + [p[1] for p in pairs], dtype="<u8").tobytes()


@pytest.mark.parametrize(
    "count, blob",
    [
        (1, pair_bytes()),  # fewer bytes than the count says
        (0, pair_bytes((1, 2))),  # more
        (1, pair_bytes((1, 2))[:15]),  # not whole hashes
        (3, pair_bytes((1, 2), (3, 4), (5, 6))),  # more than the capacity
        (2, pair_bytes((1, 2), (1, 2))),  # one hash twice
        (-1, b""),
        (True, pair_bytes((1, 2))),
        (1.0, pair_bytes((1, 2))),
        ("1", pair_bytes((1, 2))),
    ],
)
def test_a_damaged_binary_durable_form_is_refused(count, blob):
    raw = {"key": KEY, "check": ObjectIdHorizon(2, KEY).to_json()["check"], "count": count}
    with pytest.raises(CheckpointError):
        ObjectIdHorizon.from_json(raw, 2, blob)
    assert ObjectIdHorizon.from_json({**raw, "count": 2}, 2, pair_bytes((1, 2), (1, 3))).ages(["x"]).tolist() == [-1]
