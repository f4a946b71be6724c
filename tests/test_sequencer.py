"""The serial stage: bulk object acceptance and the vectorized summary test equal their one-by-one forms."""

import dataclasses

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from skpub.kernel.registry import IdRegistry
from skpub.kernel.wire import KIND_CODES
from skpub.router.sequencer import Sequencer
from skpub.router.summary import TextualSummaries
from tests.profiles import examples

WORDS = ["a", "b", "c", "d", "é", "f"]


def sequence_objects(sequencer, ids):
    """Sequence a batch of objects only, all at evaluator 0, none admitted."""
    return sequencer.sequence(
        np.full(len(ids), KIND_CODES["object"], dtype=np.int8),
        ids,
        np.zeros(len(ids), dtype=np.int64),
        {},
        lambda summaries, objects: [False] * len(objects),
    )


def cut(ids, cuts):
    """Split ``ids`` into consecutive micro-batches at the positions ``cuts`` (those within it)."""
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    return [ids[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False)]


@examples(1.5)
@given(
    ids=st.lists(st.sampled_from([f"o{i}" for i in range(12)]), max_size=60),
    horizon=st.integers(1, 8),
    cuts=st.lists(st.integers(0, 60), max_size=5),
)
def test_object_ids_are_decided_exactly_as_one_by_one(ids, horizon, cuts):
    """Batches of any size, duplicates inside a batch and horizon evictions mid-batch."""
    reference = IdRegistry(horizon)
    expected = []
    for oid in ids:
        rejected = reference.check("object", oid) is not None
        if not rejected:
            reference.accept_id("object", oid)
        expected.append(not rejected)
    sequencer = Sequencer(2, IdRegistry(horizon, journal=[]))
    got = []
    for batch in cut(ids, cuts):
        decisions = sequence_objects(sequencer, batch)
        rejected = {i for i, _, _ in decisions.rejected}
        got += [i not in rejected for i in range(len(batch))]
        assert decisions.objects == len(batch) - len(rejected)
    assert got == expected
    universe = [f"o{i}" for i in range(12)]
    assert sequencer.registry.objects.ages(universe).tolist() == reference.objects.ages(universe).tolist()
    assert sequencer.registry.objects_accepted == reference.objects_accepted == sum(expected)
    assert len(sequencer.registry.objects) == min(horizon, sum(expected))
    replayed = IdRegistry(horizon)
    replayed.replay(sequencer.registry.take_journal())
    assert replayed.objects.ages(universe).tolist() == reference.objects.ages(universe).tolist()


@examples(1.5)
@given(
    ids=st.lists(st.sampled_from([f"o{i}" for i in range(8)]), max_size=40),
    horizon=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_journals_replay_in_bulk_to_the_same_registry(ids, horizon, cuts):
    """Per-batch journals through their durable form rebuild exactly the registry the sequencer holds."""
    from skpub.router.state import decode_journal, encode_journal

    sequencer = Sequencer(2, IdRegistry(horizon, journal=[]))
    replica = IdRegistry(horizon)
    for batch in cut(ids, cuts):
        sequence_objects(sequencer, batch)
        objects, changes = decode_journal(encode_journal(sequencer.registry.take_journal()))
        replica.replay_objects(objects)
        replica.replay(changes)
        universe = [f"o{i}" for i in range(8)]
        assert replica.objects.ages(universe).tolist() == sequencer.registry.objects.ages(universe).tolist()
        assert len(replica.objects) == len(sequencer.registry.objects)
        assert replica.objects_accepted == sequencer.registry.objects_accepted


@examples(1.5)
@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 2), st.lists(st.sampled_from(WORDS), max_size=3)), max_size=10
    ),
    objects=st.lists(
        st.tuples(st.integers(0, 2), st.none() | st.lists(st.none() | st.sampled_from(WORDS), max_size=4)), max_size=20
    ),
    large=st.booleans(),
)
def test_vectorized_summary_test_equals_per_object_test(steps, objects, large):
    """After every add or remove (the cached key array kept in step), the batch test equals the test per object."""
    summaries = TextualSummaries(3)
    held: list[list[str]] = [[], [], []]
    string = pa.large_string() if large else pa.string()
    terms = pa.array([t for _, t in objects], pa.large_list(string) if large else pa.list_(string))
    owners = np.array([e for e, _ in objects], dtype=np.int64)
    for remove, e, keywords in steps:
        if remove:  # remove keywords this evaluator holds, once per holding
            removed = []
            for k in keywords:
                if k in held[e]:
                    held[e].remove(k)
                    removed.append(k)
            summaries.remove(e, removed)
        else:
            held[e].extend(keywords)
            summaries.add(e, keywords)
        expected = [summaries.admits(e, [w for w in t or () if w is not None]) for e, t in objects]
        assert summaries.admits_many(owners, terms).tolist() == expected


def test_a_sequencer_caught_up_by_journals_equals_one_rebuilt_from_them():
    """The Spark sequencer catches a stale cached state up by the deltas it missed: same registry, same summaries."""
    from skpub.kernel.config import Deployment
    from skpub.kernel.text import Vocabulary
    from skpub.router.epoch import RoutingEpoch
    from skpub.router.initial import initial_table
    from skpub.router.locate import Locator, located_table
    from skpub.router.state import decode_journal, encode_journal
    from tests.workloads import object_ids, random_workload

    dep = Deployment(evaluators=3, grid_size=20, index_block=2, sample_size=200).replace(object_id_horizon=50)
    lines = [line.encode() for line in random_workload(seed=21, n=600)]
    ids = object_ids(lines)
    epoch = RoutingEpoch(0, 0, initial_table(dep, Vocabulary(), [line.decode() for line in lines[:200]]))
    locator = Locator(dep, Vocabulary(), epoch.table)
    live = Sequencer(3, IdRegistry(50, journal=[]))
    stale = Sequencer(3, IdRegistry(50))
    for batch_id, start in enumerate(range(0, len(lines), 60)):
        decisions = live.sequence_table(located_table(locator.locate_lines(lines[start : start + 60], batch_id)))
        assert decisions.objects >= 0
        stale.replay(*decode_journal(encode_journal(live.registry.take_journal())))
        assert stale.registry.active == live.registry.active
        assert stale.registry.objects.ages(ids).tolist() == live.registry.objects.ages(ids).tolist()
        assert stale.summaries.counts == live.summaries.counts


@examples(0.5)
@given(seed=st.integers(0, 10_000), start=st.integers(0, 300), size=st.integers(0, 300))
def test_located_rows_are_in_stream_order_with_every_value(seed: int, start: int, size: int) -> None:
    """The located table equals its objects' and other records' rows concatenated, then sorted by position."""
    from skpub.kernel.config import Deployment
    from skpub.kernel.text import Vocabulary
    from skpub.kernel.wire import OBJECT
    from skpub.router.initial import initial_table
    from skpub.router.locate import Locator, _others_table, located_table
    from tests.workloads import random_workload

    dep = Deployment(evaluators=3, grid_size=20, index_block=2, sample_size=100)
    lines = [line.encode() for line in random_workload(seed=seed, n=600)]
    locator = Locator(dep, Vocabulary(), initial_table(dep, Vocabulary(), [line.decode() for line in lines[:100]]))
    located = locator.locate_lines(lines[start : start + size], 7)
    table = located_table(located)
    objects = located_table(dataclasses.replace(located, others=[]))  # the objects' rows alone
    parts = [objects, _others_table(located.others)] if located.others else [objects]
    assert table.equals(pa.concat_tables(parts).sort_by("pos"))  # an independent merge: Arrow's sort
    kinds = table.column("kind").to_numpy()
    assert np.count_nonzero(kinds == OBJECT) == len(located.objects)
    assert np.count_nonzero(kinds != OBJECT) == len(located.others)


def test_spread_lists_keeps_nulls_of_its_own_and_adds_the_others() -> None:
    """A list column spread over rows keeps its values, its own nulls, and is null at the rows it does not fill."""
    from skpub.router.locate import _spread_lists

    lists = pa.array([["a"], None, [], ["b", "c"]], pa.list_(pa.string())).slice(1)
    rows = np.array([False, True, True, False, True, False])
    spread = _spread_lists(lists, rows)
    assert spread.to_pylist() == [None, None, [], None, ["b", "c"], None]
    assert _spread_lists(lists.slice(0, 0), np.zeros(2, bool)).to_pylist() == [None, None]


_CHANGE = st.one_of(
    st.tuples(  # a range subscribe: (evaluator, cell box) targets and summary keywords
        st.just("subscribe"),
        st.sampled_from([f"s{i}" for i in range(10)]),
        st.lists(st.tuples(st.integers(-1, 3), st.tuples(*[st.integers(0, 9)] * 4)), max_size=3),
        st.frozensets(st.sampled_from(WORDS), max_size=3),
        st.just(False),
    ),
    st.tuples(  # a ranked subscribe: no targets of its own (it goes to every evaluator), its keywords
        st.just("subscribe"),
        st.sampled_from([f"s{i}" for i in range(10)]),
        st.just(()),
        st.frozensets(st.sampled_from(WORDS), max_size=2),
        st.just(True),
    ),
    st.tuples(st.just("unsubscribe"), st.sampled_from([f"s{i}" for i in range(10)])),
    st.tuples(
        st.just("subscribe"),
        st.uuids().map(str),
        st.just(((1, (2, 2, 3, 3)),)),
        st.just(frozenset("a")),
        st.just(False),
    ),  # fmt: skip - a new id, never rejected
    st.tuples(st.just("snapshot"), st.sampled_from(["n0", "n1"])),
    st.tuples(st.just("object"), st.sampled_from([f"o{i}" for i in range(6)]), st.integers(0, 2)),
)


def _sequence_changes(sequencer, batch):
    """Sequence one batch of :data:`_CHANGE` tuples (3 evaluators: a target of evaluator -1 or 3 names none)."""
    kinds = np.array([KIND_CODES[change[0]] for change in batch], np.int8)
    ids = [change[1] for change in batch]
    owners = np.array([change[2] if change[0] == "object" else 0 for change in batch], np.int64)
    subscriptions = {i: change[2:] for i, change in enumerate(batch) if change[0] == "subscribe"}
    return sequencer.sequence(kinds, ids, owners, subscriptions, lambda summaries, objects: [True] * len(objects))


def _plain(change):
    """Whether ``change`` may go in bulk: no snapshot, no ranked subscribe, every target an evaluator."""
    if change[0] == "snapshot":
        return False
    return change[0] != "subscribe" or (not change[4] and all(0 <= e < 3 for e, _ in change[2]))


@examples(3)
@given(batches=st.lists(st.tuples(st.booleans(), st.lists(_CHANGE, max_size=30)), max_size=6))
def test_a_batch_decided_in_bulk_equals_it_decided_record_by_record(batches):
    """Range subscribes and unsubscribes decided at once give the rows, rejections, registry, journal and summaries
    that deciding each in stream order gives: with duplicates, unknown ids, a subscribe and its unsubscribe in one
    batch, ranked subscribes, snapshots and targets naming no evaluator among them (which go record by record).
    Half the batches hold only what may go in bulk, so that the bulk path is taken."""
    bulk = Sequencer(3, IdRegistry(16, journal=[]))
    one_by_one = Sequencer(3, IdRegistry(16, journal=[]))
    one_by_one._sequence_in_bulk = lambda *args: None  # noqa: SLF001 - the reference path
    for plain, batch in batches:
        batch = [change for change in batch if _plain(change)] if plain else batch
        got, want = _sequence_changes(bulk, batch), _sequence_changes(one_by_one, batch)
        for name in ("index", "evaluator", "box_rows", "boxes"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
        assert (got.rejected, got.snapshots, got.mark) == (want.rejected, want.snapshots, want.mark)
        assert list(bulk.registry.active.items()) == list(one_by_one.registry.active.items())
        assert bulk.registry.subscription_ids == one_by_one.registry.subscription_ids
        assert bulk.registry.take_journal() == one_by_one.registry.take_journal()
        assert bulk.summaries.counts == one_by_one.summaries.counts
        assert (bulk.ranked_keywords, bulk.ranked_active) == (one_by_one.ranked_keywords, one_by_one.ranked_active)


def test_a_batch_of_range_changes_the_registry_accepts_is_decided_in_bulk():
    """The bulk path is the one taken on a batch of range changes, rejections among them (else the test above
    would compare the loop with itself), and the journal holds its changes in stream order."""
    sequencer = Sequencer(3, IdRegistry(16, journal=[]))
    taken = []
    real = sequencer._sequence_in_bulk  # noqa: SLF001
    sequencer._sequence_in_bulk = lambda *args: (taken.append(r := real(*args)), r)[1]  # noqa: SLF001
    first = [("subscribe", "s1", ((0, (1, 1, 2, 2)), (2, (3, 3, 4, 4))), frozenset({"a"}), False),
             ("object", "o1", 1), ("subscribe", "s2", ((1, (0, 0, 0, 0)),), frozenset({"b", "c"}), False)]  # fmt: skip
    decisions = _sequence_changes(sequencer, first)
    assert taken[-1] is not None
    assert decisions.index.tolist() == [0, 0, 1, 2] and decisions.evaluator.tolist() == [0, 2, 1, 1]
    assert decisions.box_rows.tolist() == [0, 1, 3]
    assert decisions.boxes.tolist() == [[1, 1, 2, 2], [3, 3, 4, 4], [0, 0, 0, 0]]
    assert sequencer.summaries.counts == [{"a": 1}, {"b": 1, "c": 1}, {"a": 1}]
    sequencer.registry.take_journal()
    _sequence_changes(
        sequencer, [("unsubscribe", "s2"), ("subscribe", "s3", ((2, (5, 5, 5, 5)),), frozenset("d"), False)]
    )
    assert taken[-1] is not None
    assert [(kind, rid) for kind, rid, _ in sequencer.registry.take_journal()] == [
        ("unsubscribe", "s2"),
        ("subscribe", "s3"),
    ]
    again = ("subscribe", "s1", ((1, (6, 6, 6, 6)),), frozenset("e"), False)
    decisions = _sequence_changes(sequencer, [("unsubscribe", "s1"), again, ("unsubscribe", "s9")])
    assert taken[-1] is not None
    assert decisions.rejected == [
        (1, "duplicate_id", "subscription id 's1' was already accepted"),
        (2, "unknown_id", "no active subscription 's9'"),
    ]
    assert decisions.index.tolist() == [0, 0] and decisions.evaluator.tolist() == [0, 2]
    assert len(decisions.box_rows) == 0 and "e" not in sequencer.summaries.counts[1]


def test_a_subscribe_with_targets_that_are_not_integers_is_rejected_alone_and_changes_nothing():
    """``sequence`` never raises for an item: a target whose evaluator or cells are not integers (what no located
    table gives, but a direct caller might), or that names no evaluator, is an internal_error of that subscribe
    alone, before any state change, whichever path the batch takes."""
    for bad in [(1.5, (0, 0, 1, 1)), (1, (0, None, 1, 1)), (1, (0, 0, 1)), ("1", (0, 0, 1, 1)), (-1, (0, 0, 1, 1)),
                (3, (0, 0, 1, 1))]:  # fmt: skip
        sequencer = Sequencer(3, IdRegistry(16, journal=[]))
        batch = [("subscribe", "good", ((0, (1, 1, 1, 1)),), frozenset("a"), False),
                 ("subscribe", "bad", (bad,), frozenset("b"), False)]  # fmt: skip
        decisions = _sequence_changes(sequencer, batch)
        assert [(item, reason) for item, reason, _ in decisions.rejected] == [(1, "internal_error")], bad
        assert list(sequencer.registry.active) == ["good"]
        assert [rid for _, rid, _ in sequencer.registry.take_journal()] == ["good"]
        assert sequencer.summaries.counts == [{"a": 1}, {}, {}]
        assert decisions.index.tolist() == [0] and decisions.boxes.tolist() == [[1, 1, 1, 1]]
