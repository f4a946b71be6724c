import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.evaluators import gi2
from skpub.evaluators.gi2 import SIDE, GI2Index
from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.kernel.records import ObjectRecord, RangeSubscription
from skpub.kernel.text import Vocabulary, dnf_matches, parse_expression
from tests.profiles import examples
from tests.workloads import match_one, object_batch

SPACE = Rect(0.0, 0.0, 100.0, 100.0)
WORDS = ["a", "b", "c", "d"]


def random_subscription(rng, pos, mixed):
    """A range subscription ``s<pos>`` with a random rectangle (partly outside the space) over :data:`WORDS`.

    Its expression is 1-3 words joined by OR or by AND, or (``mixed``) 1-3
    AND-clauses of 1-2 words joined by OR.
    """
    x0, x1 = sorted(rng.uniform(-10, 110, 2))
    y0, y1 = sorted(rng.uniform(-10, 110, 2))
    if mixed:
        expr = " OR ".join(
            " AND ".join(rng.choice(WORDS, size=int(rng.integers(1, 3)), replace=False))
            for _ in range(int(rng.integers(1, 4)))
        )
    else:
        words = list(rng.choice(WORDS, size=int(rng.integers(1, 4)), replace=False))
        expr = " OR ".join(words) if rng.random() < 0.5 else " AND ".join(words)
    return RangeSubscription(pos, f"s{pos}", Rect(x0, y0, x1, y1), parse_expression(expr))


def make_object(i, x, y, terms):
    return ObjectRecord(i, f"o{i}", x, y, tuple(terms), frozenset(terms))


@examples(1.5)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 40), st.sampled_from([2, 16, gi2.WIDE_ENTRIES]))
def test_gi2_matches_brute_force_with_lazy_deletion(seed, block, size, wide_entries):
    """Random inserts, deletes and objects; wide subscriptions (over ``wide_entries`` entries) included."""
    gi2.WIDE_ENTRIES, default = wide_entries, gi2.WIDE_ENTRIES
    try:
        _check_against_brute_force(seed, block, size)
    finally:
        gi2.WIDE_ENTRIES = default


def _check_against_brute_force(seed, block, size):
    rng = np.random.default_rng(seed)
    grid = FineGrid(SPACE, size)
    index = GI2Index(block, Vocabulary(10, {"a": 9, "b": 5}))
    live: dict[str, RangeSubscription] = {}
    for step in range(200):
        u = rng.random()
        if u < 0.3:
            sub = random_subscription(rng, step, mixed=False)
            index.insert(sub, grid.cell_box(sub.rect))
            live[sub.id] = sub
        elif u < 0.4 and live:
            sid = list(live)[int(rng.integers(len(live)))]
            index.delete(sid, step)
            del live[sid]
            index.end_batch()
        elif u < 0.45 and live:  # a rebalancing drops several at once
            ids = rng.choice(list(live), size=int(rng.integers(1, len(live) + 1)), replace=False).tolist()
            index.remove_many(ids)
            for sid in ids:
                del live[sid]
            kept = {sid for sids in index.postings().values() for sid in sids}
            assert kept.isdisjoint(ids)
        else:
            x, y = rng.uniform(0, 100, 2)
            terms = set(rng.choice(WORDS, size=int(rng.integers(0, 4)), replace=False))
            obj = make_object(step, x, y, terms)
            cx, cy = grid.cell_of(x, y)
            matched, _ = match_one(index, obj, cx, cy)
            expected = {s.id for s in live.values() if s.rect.contains_point(x, y) and dnf_matches(s.dnf, obj.term_set)}
            assert sorted(matched) == sorted(expected)
    assert len(index) == len(live)


def test_compaction_frees_deleted_entries(monkeypatch):
    monkeypatch.setattr(gi2, "COMPACT_MIN_DELETED", 4)
    monkeypatch.setattr(gi2, "WIDE_ENTRIES", 1000)
    grid = FineGrid(SPACE, 10)
    index = GI2Index(1, Vocabulary())
    for i in range(20):
        sub = RangeSubscription(i, f"s{i}", Rect(0, 0, 100, 100), parse_expression("a"))
        index.insert(sub, grid.cell_box(sub.rect))
    for i in range(15):
        index.delete(f"s{i}", 20 + i)
        index.end_batch()
    assert len(index) == 5
    assert index.dead < 15
    assert len(index.main[0]) + len(index.delta[0]) < 20 * 100
    matched, examined = match_one(index, make_object(99, 50, 50, ["a"]), 5, 5)
    assert sorted(matched) == [f"s{i}" for i in range(15, 20)]
    assert examined == 5


def test_a_wide_subscription_costs_its_clauses_not_its_cells():
    """A whole-space rectangle with 256 clauses on a 1000 x 1000 grid: 256 entries, not 62,500 x 256."""
    grid = FineGrid(SPACE, 1000)
    index = GI2Index(4, Vocabulary())
    expr = " OR ".join(f"k{i}" for i in range(256))
    sub = RangeSubscription(0, "wide", Rect(-1.7e308, -1.7e308, 1.7e308, 1.7e308), parse_expression(expr))
    index.insert(sub, grid.cell_box(sub.rect))
    postings = index.postings()
    assert {cell for cell, _ in postings} == {None} and len(postings) == 256
    assert match_one(index, make_object(1, 99.9, 0.1, ["k17"]), 999, 0) == (["wide"], 1)
    assert match_one(index, make_object(2, 50, 50, ["other"]), 500, 500) == ([], 0)
    index.delete("wide", 3)
    index.compact()
    assert not index.wide and len(index) == 0 and not index.postings()
    ordinary = RangeSubscription(4, "city", Rect(10, 10, 30, 30), parse_expression("a OR b OR c"))
    index.insert(ordinary, grid.cell_box(ordinary.rect))
    assert not index.wide, "a rectangle with a few keywords stays in its cells"
    assert match_one(index, make_object(5, 90, 90, ["a"]), 900, 900) == ([], 0)


@examples(0.6)
@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 16, gi2.WIDE_ENTRIES]))
def test_removing_several_at_once_leaves_the_index_one_by_one_removal_leaves(seed, wide_entries):
    """A take-over's drops in one pass equal the drops one at a time: same lists, same entry order, same counts."""
    gi2.WIDE_ENTRIES, default = wide_entries, gi2.WIDE_ENTRIES
    try:
        rng = np.random.default_rng(seed)
        grid = FineGrid(SPACE, 20)
        indexes = [GI2Index(3, Vocabulary(10, {"a": 9, "b": 5})) for _ in range(2)]
        subs = [random_subscription(rng, i, mixed=False) for i in range(40)]
        for index in indexes:
            for sub in subs:
                index.insert(sub, grid.cell_box(sub.rect))
            index.delete("s0", 40)  # a lazily deleted one stays as it was
        gone = [subs[i] for i in sorted(rng.choice(np.arange(1, 40), size=int(rng.integers(1, 39)), replace=False))]
        indexes[0].remove_many([sub.id for sub in gone])
        for sub in gone:
            indexes[1].remove_many([sub.id])
        one, many = indexes[1], indexes[0]
        assert many.postings() == one.postings()
        assert many.slot_of == one.slot_of and "s0" not in many.slot_of and many.dead == one.dead == len(gone) + 1
    finally:
        gi2.WIDE_ENTRIES = default


_boxes = st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(0, 60), st.integers(0, 60)).map(
    lambda c: (min(c[0], c[2]), min(c[1], c[3]), max(c[0], c[2]), max(c[1], c[3]))
)


@examples(3)
@given(st.integers(1, 7), _boxes, _boxes, st.booleans())
def test_added_index_cells_are_those_of_the_new_box_the_old_does_not_meet(block, old, new, nested):
    """What a widening appends to, row by row: the set difference, whether or not ``new`` contains ``old``."""
    if nested:  # the take-over's case: ``new`` is the union box of the held and the carried part
        new = (min(old[0], new[0]), min(old[1], new[1]), max(old[2], new[2]), max(old[3], new[3]))
    index = GI2Index(block, Vocabulary())

    def cells(box):  # the index cells a box meets, row by row, as GI^2 keys them
        x0, y0, x1, y1 = (c // block for c in box)
        return [gy * SIDE + gx for gy in range(y0, y1 + 1) for gx in range(x0, x1 + 1)]

    held = set(cells(old))
    assert index._added_cell_keys(old, new) == [k for k in cells(new) if k not in held]


SMALL = {"COMPACT_MIN_DELETED": 2, "_DELTA_MIN": 4, "_PENDING_MAX": 8, "CHUNK_OBJECTS": 3, "EXPANSION": 5}
"""GI^2's thresholds made tiny, so a short test crosses every one of them: compaction with term renumbering, the
delta's merge into the main array, a flush in the middle of inserts, matching in chunks, clause tests in pieces."""


@examples(2)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 5),
    st.sampled_from([2, 16, gi2.WIDE_ENTRIES]),
    st.booleans(),
    st.booleans(),
)
def test_batches_match_each_object_against_the_subscriptions_live_at_its_position(seed, block, wide, only, small):
    """Subscribes, unsubscribes and objects interleaved, matched a batch at a time: each object sees what was live.

    Between batches, a rebalancing may drop subscriptions (``remove_many``)
    and the index compacts. The expected matches come from replaying the
    events in order with plain Python sets, in subscribe-position order;
    with ``only``, each object's terms are dealt to three "evaluators" and
    the three answers must add up to the full match set, each match found
    once (the text-partition rule). With ``small``, GI^2's thresholds are
    tiny (:data:`SMALL`).
    """
    saved = {name: getattr(gi2, name) for name in (*SMALL, "WIDE_ENTRIES")}
    for name, value in {**(SMALL if small else {}), "WIDE_ENTRIES": wide}.items():
        setattr(gi2, name, value)
    try:
        _check_batches(np.random.default_rng(seed), block, only)
    finally:
        for name, value in saved.items():
            setattr(gi2, name, value)


def _check_batches(rng, block, only):
    grid = FineGrid(SPACE, 30)
    index = GI2Index(block, Vocabulary(10, {"a": 9, "b": 5, "c": 2}))
    live: dict[str, RangeSubscription] = {}
    objects, cells, expected = [], [], []

    def close_batch():
        if not only:
            found = index.match_many(object_batch(objects, cells))
            got = [[] for _ in objects]
            for r, sid in zip(found.rows.tolist(), found.sids.to_pylist(), strict=True):
                got[r].append(sid)
            assert got == expected
        else:
            deal = [{t: int(rng.integers(3)) for t in o.term_set} for o in objects]
            got = [[] for _ in objects]
            for e in range(3):
                mine = [frozenset(t for t, d in dealt.items() if d == e) for dealt in deal]
                found = index.match_many(object_batch(objects, cells, mine))
                for r, sid in zip(found.rows.tolist(), found.sids.to_pylist(), strict=True):
                    got[r].append(sid)
            assert [sorted(g) for g in got] == [sorted(e) for e in expected]
        index.end_batch()
        objects.clear(), cells.clear(), expected.clear()
        if live and rng.random() < 0.3:  # a rebalancing between batches
            gone = [sid for sid in live if rng.random() < 0.3]
            index.remove_many(gone)
            for sid in gone:
                del live[sid]

    for pos in range(160):
        u = rng.random()
        if u < 0.25:
            sub = random_subscription(rng, pos, mixed=True)
            index.insert(sub, grid.cell_box(sub.rect))
            live[sub.id] = sub
        elif u < 0.35 and live:
            sid = sorted(live)[int(rng.integers(len(live)))]
            index.delete(sid, pos)
            del live[sid]
        elif u < 0.4:
            close_batch()
        else:
            x, y = rng.uniform(0, 100, 2)
            obj = make_object(pos, x, y, rng.choice(WORDS + ["z"], size=int(rng.integers(0, 5))).tolist())
            objects.append(obj)
            cells.append(grid.cell_of(x, y))
            expected.append(  # in subscribe-position order, as GI^2 returns them
                [s.id for s in live.values() if s.rect.contains_point(x, y) and dnf_matches(s.dnf, obj.term_set)]
            )
    close_batch()
    assert len(index) == len(live)
    live_postings = {sid for sids in index.postings().values() for sid in sids}
    assert live_postings == set(live) or not live


def test_a_deployment_whose_index_cells_gi2_cannot_name_is_refused(monkeypatch):
    """2**15 index cells a side or more do not fit GI^2's keys: refused with a sentence, not a wrong match (on a
    machine whose memory would hold the grid)."""
    from skpub.kernel import config
    from skpub.kernel.config import Deployment
    from skpub.kernel.errors import ConfigError

    monkeypatch.setattr(config, "physical_memory", lambda: 1 << 50)
    Deployment(grid_size=40_000, index_block=2)
    Deployment(grid_size=32_768, index_block=1)  # index cells 0 .. 32,767: they fit
    with pytest.raises(ConfigError, match="32,769 GI\\^2 index cells a side"):
        Deployment(grid_size=32_769, index_block=1)
    with pytest.raises(ConfigError, match="GI\\^2 index cells a side"):
        Deployment(grid_size=40_000, index_block=1)


def test_terms_the_index_has_never_seen_match_nothing_and_cost_nothing():
    """An object whose terms no subscription uses examines no candidate, in its cell or the wide one."""
    grid = FineGrid(SPACE, 10)
    index = GI2Index(2, Vocabulary())
    sub = RangeSubscription(0, "s", Rect(0, 0, 100, 100), parse_expression("a AND b"))
    index.insert(sub, grid.cell_box(sub.rect))
    assert match_one(index, make_object(1, 5, 5, ["a", "x"]), 0, 0) == ([], 1)  # "a" is the keyword
    assert match_one(index, make_object(2, 5, 5, ["x", "y"]), 0, 0) == ([], 0)
    assert match_one(index, make_object(3, 5, 5, ["b", "a", "a"]), 0, 0) == (["s"], 1)


def test_a_flush_that_fails_leaves_the_index_as_it_was_and_is_tried_again(monkeypatch):
    """A failure while pending subscriptions become arrays (memory) sets every array back; the next lookup
    flushes them once, and matching is right (fails if a retry appended the slots twice)."""
    grid = FineGrid(SPACE, 10)
    index = GI2Index(2, Vocabulary())
    subs = [RangeSubscription(i, f"s{i}", Rect(0, 0, 100, 100), parse_expression("a OR b")) for i in range(5)]
    for sub in subs[:2]:
        index.insert(sub, grid.cell_box(sub.rect))
    index._flush()
    for sub in subs[2:]:
        index.insert(sub, grid.cell_box(sub.rect))
    before = [(c.n, c.view.copy()) for c in (index.rects, index.born, index.clauses, index.terms)]
    real = gi2._merge
    monkeypatch.setattr(gi2, "_merge", lambda a, b: (_ for _ in ()).throw(MemoryError("injected")))
    with pytest.raises(MemoryError):
        index._flush()
    assert [(c.n, c.view.tolist()) for c in (index.rects, index.born, index.clauses, index.terms)] == [
        (n, v.tolist()) for n, v in before
    ]
    monkeypatch.setattr(gi2, "_merge", real)
    assert match_one(index, make_object(9, 5, 5, ["b"]), 0, 0) == ([s.id for s in subs], 5)
    assert index.born.n == 5 and len(index.main[0]) + len(index.delta[0]) == 5 * 25 * 2  # 25 index cells, 2 keys


_terms = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=6)
_coordinates = st.floats(allow_nan=False, allow_infinity=False)
_changes = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8),
            st.lists(st.lists(_terms, min_size=1, max_size=3), min_size=1, max_size=3),
            st.tuples(_coordinates, _coordinates, _coordinates, _coordinates),
            st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.integers(0, 9)),
        ),
        st.tuples(st.sampled_from(["delete", "remove", "compact", "flush"]), st.integers(0, 50)),
    ),
    max_size=40,
)


@examples(2)
@given(_changes)
def test_the_rows_written_from_the_slot_arrays_are_the_rows_of_the_subscriptions_held(changes):
    """GI^2 keeps no subscription record: the row of each live slot, written from its arrays, is ``range_row``'s.

    Unicode terms (sorted by code point), a term in several clauses, a
    repeated clause, any finite coordinates (-0.0, 1e300), slots still
    pending or flushed, deletions, removals and compactions (which renumber
    slots and terms).
    """
    import math

    import orjson

    from skpub.kernel.records import range_from_row, range_row

    index = GI2Index(2, Vocabulary(10, {"a": 1}))
    live: dict[str, tuple[RangeSubscription, tuple]] = {}
    for pos, change in enumerate(changes):
        if change[0] == "insert":
            _, sid, clauses, (x0, y0, x1, y1), (a, b, c, d) = change
            if sid in live:
                continue
            sub = RangeSubscription(pos, sid, Rect(x0, y0, x1, y1), tuple(frozenset(c) for c in clauses))
            box = (min(a, c), min(b, d), max(a, c), max(b, d))
            index.insert(sub, box)
            live[sid] = (sub, box)
        elif change[0] in ("delete", "remove") and live:
            sid = list(live)[change[1] % len(live)]
            index.delete(sid, pos) if change[0] == "delete" else index.remove_many([sid])
            del live[sid]
        elif change[0] == "compact":
            index.compact()
        elif change[0] == "flush":
            index.held_slots()
    slots, positions, boxes = index.held_slots()
    texts = index.row_texts(slots).to_pylist()
    rows = [orjson.loads(text) for text in texts]
    assert sorted(row[0] for row in rows) == sorted(live)
    for row, pos, box in zip(rows, positions.tolist(), boxes.tolist(), strict=True):
        sub, held_box = live[row[0]]
        want = range_row(sub, held_box)
        assert row[:2] == want[:2] and row[3:] == want[3:]  # id, position, clauses (in order), box
        assert [(v, math.copysign(1, v)) for v in row[2]] == [(v, math.copysign(1, v)) for v in want[2]]  # -0.0 too
        assert range_from_row(row) == (sub, held_box)
        assert (pos, tuple(box)) == (sub.pos, held_box)
    assert index.row_texts(slots[::-1]).to_pylist() == texts[::-1] and len(index.row_texts(slots[:0])) == 0


_TERMS = st.sampled_from(["a", "b", "bb", "B", "é", "e\u0301", "zz", "ab", "\U0001f600", "x"])
_CLAUSES = st.lists(st.frozensets(_TERMS, min_size=1, max_size=3), min_size=1, max_size=4).map(tuple)
_SUBSCRIBES = st.lists(st.tuples(_CLAUSES, _boxes), min_size=1, max_size=12)


@examples(2)
@given(
    _SUBSCRIBES,
    st.integers(1, 4),
    st.sampled_from([3, 12, gi2.WIDE_ENTRIES]),
    st.integers(0, 11),
    st.sampled_from([1, 7, gi2._INSERT_ENTRIES]),
)
def test_inserting_many_at_once_indexes_what_each_insert_would(subscribes, block, wide_entries, cut, run_entries):
    """insert_many's vectorized filing equals the definition, subscription by subscription (PS2Stream IV-C).

    Each clause is filed under ``Vocabulary.least_frequent`` (document
    frequency ties, length ties and code point order all occur among the
    terms), each summary keyword in every index cell the box meets, or once
    in the wide cell past ``wide_entries`` entries. Inserting the same
    subscriptions in two calls (cut anywhere) or one by one gives the same
    entries, rows and matches.
    """
    vocabulary = Vocabulary(100, {"a": 7, "b": 7, "bb": 7, "B": 3, "é": 3, "zz": 50, "x": 1})
    subs = [
        RangeSubscription(10 + i, f"s{i}", Rect(float(i), 0.0, i + 1.5, 2.0), clauses)
        for i, (clauses, _) in enumerate(subscribes)
    ]
    boxes = [box for _, box in subscribes]
    gi2.WIDE_ENTRIES, default = wide_entries, gi2.WIDE_ENTRIES
    gi2._INSERT_ENTRIES, default_run = run_entries, gi2._INSERT_ENTRIES  # runs of one or a few subscriptions too
    try:
        at_once, in_two, one_by_one = (GI2Index(block, vocabulary) for _ in range(3))
        at_once.insert_many(subs, boxes)
        in_two.insert_many(subs[:cut], boxes[:cut])
        in_two.insert_many(subs[cut:], boxes[cut:])
        for sub, box in zip(subs, boxes, strict=True):
            one_by_one.insert(sub, box)
        filed = [_entries(index) for index in (at_once, in_two, one_by_one)]
    finally:
        gi2.WIDE_ENTRIES, gi2._INSERT_ENTRIES = default, default_run
    expected = set()
    for slot, (sub, box) in enumerate(zip(subs, boxes, strict=True)):
        keywords = {vocabulary.least_frequent(clause) for clause in sub.dnf}
        x0, y0, x1, y1 = (c // block for c in box)
        cells = [gy * SIDE + gx for gy in range(y0, y1 + 1) for gx in range(x0, x1 + 1)]
        if len(cells) * len(keywords) > wide_entries:
            cells = [gi2._WIDE]
        expected |= {(cell, keyword, slot) for cell in cells for keyword in keywords}
    assert filed[0] == filed[1] == filed[2] == (expected, [vocabulary.least_frequent(c) for s in subs for c in s.dnf])
    rows = [index.row_texts(np.arange(len(subs))).to_pylist() for index in (at_once, in_two, one_by_one)]
    assert rows[0] == rows[1] == rows[2]
    assert [at_once.box_of(s.id) for s in subs] == [tuple(b) for b in boxes]


def _entries(index):
    """Return an index's entries as (cell, term, slot) and its clauses' keywords in slot order, by term name."""
    index._flush()
    names = list(index.term_ids)
    keys, slots = (np.concatenate([index.main[k], index.delta[k]]) for k in (0, 1))
    entries = {(int(k) >> 32, names[int(k) & 0xFFFFFFFF], int(s)) for k, s in zip(keys, slots, strict=True)}
    return entries, [names[t] for t in index.clause_keys.view.tolist()]


def test_a_failed_run_of_inserts_leaves_none_of_the_batch_indexed(monkeypatch):
    """insert_many is all or nothing across its runs: the runs before a failure are removed again."""
    grid = FineGrid(SPACE, 20)
    subs = [RangeSubscription(i, f"s{i}", Rect(0.0, 0.0, 50.0, 50.0), parse_expression("a OR b")) for i in range(6)]
    index = GI2Index(2, Vocabulary())
    monkeypatch.setattr(gi2, "_INSERT_ENTRIES", 1)  # one subscription a run
    real, runs = GI2Index._insert_run, []

    def failing(self, *args):
        runs.append(len(args[0]))
        if len(runs) == 3:
            raise MemoryError("injected")
        return real(self, *args)

    monkeypatch.setattr(GI2Index, "_insert_run", failing)
    with pytest.raises(MemoryError):
        index.insert_many(subs, [grid.cell_box(s.rect) for s in subs])
    assert runs == [1, 1, 1] and len(index) == 0
    found = index.match_many(object_batch([make_object(10, 1.0, 1.0, ["a"])], [grid.cell_of(1.0, 1.0)]))
    assert found.sids.to_pylist() == []
    with pytest.raises(ValueError, match="no term"):
        index.insert_many([RangeSubscription(9, "s9", Rect(0.0, 0.0, 1.0, 1.0), (frozenset(),))], [(0, 0, 0, 0)])


def test_insert_many_refuses_before_changing_anything_and_undoes_a_failed_flush(monkeypatch):
    """Bad boxes and ids already held (or named twice) change nothing; a flush that fails leaves nothing live.

    After the failed flush the same subscriptions index again and each matches once (no slot of the failed
    call stays live beside the new one).
    """
    grid = FineGrid(SPACE, 20)
    subs = [RangeSubscription(i, f"s{i}", Rect(0.0, 0.0, 50.0, 50.0), parse_expression("a OR b")) for i in range(4)]
    boxes = [grid.cell_box(s.rect) for s in subs]
    index = GI2Index(2, Vocabulary())
    index.insert(subs[0], boxes[0])
    for wrong_subs, wrong_boxes in [
        (subs[1:3], [boxes[1], (5, 0, 3, 3)]),  # inverted
        (subs[1:3], [boxes[1], (-1, 0, 3, 3)]),
        ([subs[1], subs[1]], boxes[1:3]),  # named twice
        (subs[:2], boxes[:2]),  # s0 is held
    ]:
        with pytest.raises(ValueError):
            index.insert_many(wrong_subs, wrong_boxes)
        assert len(index) == 1 and len(index.sids) == 1
    _fail_the_next_flush(monkeypatch, pending_max=1)
    with pytest.raises(MemoryError):
        index.insert_many(subs[1:], boxes[1:])
    assert len(index) == 1
    index.insert_many(subs[1:], boxes[1:])
    found = index.match_many(object_batch([make_object(10, 1.0, 1.0, ["a"])], [grid.cell_of(1.0, 1.0)]))
    assert sorted(found.sids.to_pylist()) == ["s0", "s1", "s2", "s3"]


def test_a_widening_whose_flush_fails_keeps_its_box_and_entries_in_step(monkeypatch):
    """The entries a widening adds are queued with its new box, then flushed: a failed flush loses neither."""
    grid = FineGrid(SPACE, 20)
    sub = RangeSubscription(1, "s1", Rect(0.0, 0.0, 30.0, 30.0), parse_expression("a"))
    index = GI2Index(1, Vocabulary())
    index.insert(sub, (0, 0, 1, 1))
    index._flush()
    _fail_the_next_flush(monkeypatch, pending_max=0)
    with pytest.raises(MemoryError):
        index.widen(sub, (0, 0, 1, 1), (0, 0, 3, 1))
    assert index.box_of("s1") == (0, 0, 3, 1)
    index.widen(sub, (0, 0, 3, 1), (0, 0, 3, 1))  # a retried take-over: nothing more to add
    entries, _ = _entries(index)
    assert sorted(cell for cell, _, _ in entries) == [0, 1, 2, 3, SIDE, SIDE + 1, SIDE + 2, SIDE + 3]
    found = index.match_many(object_batch([make_object(10, 16.0, 1.0, ["a"])], [grid.cell_of(16.0, 1.0)]))
    assert found.sids.to_pylist() == ["s1"]


def _fail_the_next_flush(monkeypatch, pending_max):
    """Make GI^2 flush past ``pending_max`` pending entries, and the next flush fail (as memory would)."""
    monkeypatch.setattr(gi2, "_PENDING_MAX", pending_max)
    real, calls = GI2Index._flush, []

    def failing(self):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("injected")
        return real(self)

    monkeypatch.setattr(GI2Index, "_flush", failing)


@examples(0.3)
@given(seed=st.integers(0, 10_000), flushed=st.integers(0, 12))
def test_deleting_many_at_once_matches_what_deleting_each_in_turn_does(seed, flushed):
    """delete_many gives each subscription the end position delete gives it, flushed slots and pending ones alike."""
    rng = np.random.default_rng(seed)
    grid = FineGrid(SPACE, 20)
    subs = [random_subscription(rng, pos, mixed=True) for pos in range(12)]
    at_once, one_by_one = GI2Index(2, Vocabulary()), GI2Index(2, Vocabulary())
    for index in (at_once, one_by_one):
        index.insert_many(subs[:flushed], [grid.cell_box(s.rect) for s in subs[:flushed]])
        index.match_many(object_batch([make_object(100, 1.0, 1.0, ["a"])], [grid.cell_of(1.0, 1.0)]))  # flushes
        index.insert_many(subs[flushed:], [grid.cell_box(s.rect) for s in subs[flushed:]])
    gone = [s.id for s in subs if rng.random() < 0.5]
    ends = [int(p) for p in rng.integers(20, 40, len(gone))]
    at_once.delete_many(gone, ends)
    for sid, end in zip(gone, ends, strict=True):
        one_by_one.delete(sid, end)
    objects = [make_object(pos, *rng.uniform(0, 100, 2), list(rng.choice(WORDS, 2))) for pos in range(15, 45)]
    batch = object_batch(objects, [grid.cell_of(o.x, o.y) for o in objects])
    found, expected = at_once.match_many(batch), one_by_one.match_many(batch)
    assert found.sids.to_pylist() == expected.sids.to_pylist() and len(at_once) == len(one_by_one)
    assert found.rows.tolist() == expected.rows.tolist()


def test_delete_many_refuses_an_unknown_or_repeated_id_before_deleting_any():
    """An id not held, or named twice, raises and leaves every subscription live."""
    grid = FineGrid(SPACE, 20)
    subs = [RangeSubscription(i, f"s{i}", Rect(0.0, 0.0, 50.0, 50.0), parse_expression("a")) for i in range(3)]
    index = GI2Index(2, Vocabulary())
    index.insert_many(subs, [grid.cell_box(s.rect) for s in subs])
    with pytest.raises(KeyError):
        index.delete_many(["s0", "nobody"], [5, 6])
    with pytest.raises(ValueError, match="twice"):
        index.delete_many(["s1", "s1"], [5, 6])
    assert len(index) == 3 and all(sid in index for sid in ("s0", "s1", "s2"))
    found = index.match_many(object_batch([make_object(10, 1.0, 1.0, ["a"])], [grid.cell_of(1.0, 1.0)]))
    assert sorted(found.sids.to_pylist()) == ["s0", "s1", "s2"]


@examples(0.3)
@given(seed=st.integers(0, 10_000))
def test_the_term_names_follow_the_term_ids_through_inserts_deletions_and_compactions(seed):
    """The Arrow array of known terms GI^2 matches with is extended as terms arrive and rebuilt when they are
    numbered anew (fails if a stale array were kept: an object's term would map to another term's id)."""
    rng = np.random.default_rng(seed)
    grid = FineGrid(SPACE, 20)
    vocabulary = Vocabulary()
    index = GI2Index(2, vocabulary)
    words = [f"w{i}" for i in range(30)]
    pos = 0
    for _ in range(12):
        subs = []
        for _ in range(int(rng.integers(1, 6))):
            terms = rng.choice(words, size=int(rng.integers(1, 4)), replace=False)
            x0, y0 = rng.uniform(0, 90, 2)
            subs.append(RangeSubscription(pos, f"s{pos}", Rect(x0, y0, x0 + 10, y0 + 10), (frozenset(terms),)))
            pos += 1
        index.insert_many(subs, [grid.cell_box(s.rect) for s in subs])
        if rng.random() < 0.3:
            index.delete_many([s.id for s in subs], [pos] * len(subs))
            index.compact()
        assert index._names().to_pylist() == list(index.term_ids)
        objects = [make_object(pos + k, *rng.uniform(0, 100, 2), list(rng.choice(words, 3))) for k in range(5)]
        found = index.match_many(object_batch(objects, [grid.cell_of(o.x, o.y) for o in objects]))
        assert len(found.rows) == len(found.sids)
    assert index._names().to_pylist() == list(index.term_ids)


def test_a_delete_many_that_fails_midway_leaves_every_subscription_live(monkeypatch):
    """Should setting an end position fail after others were set, those are set back: every subscription still
    matches (fails if a slot kept its end while its id stayed listed)."""
    grid = FineGrid(SPACE, 20)
    subs = [RangeSubscription(i, f"s{i}", Rect(0.0, 0.0, 50.0, 50.0), parse_expression("a")) for i in range(3)]
    index = GI2Index(2, Vocabulary())
    index.insert_many(subs, [grid.cell_box(s.rect) for s in subs])
    real, calls = GI2Index._set, []

    def failing(self, column, name, slot, value):
        calls.append(slot)
        if len(calls) == 2:
            raise MemoryError("injected")
        return real(self, column, name, slot, value)

    monkeypatch.setattr(GI2Index, "_set", failing)
    with pytest.raises(MemoryError):
        index.delete_many(["s0", "s1", "s2"], [5, 5, 5])
    monkeypatch.undo()
    assert len(index) == 3 and index.dead == 0
    found = index.match_many(object_batch([make_object(10, 1.0, 1.0, ["a"])], [grid.cell_of(1.0, 1.0)]))
    assert sorted(found.sids.to_pylist()) == ["s0", "s1", "s2"]
