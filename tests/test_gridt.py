"""grid^t: text-partitioned rectangles route every matching (subscription, object) pair to an evaluator that
delivers it, and exactly one does; the kd^t-tree and the text baseline build valid partitionings."""

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.evaluators.gi2 import GI2Index
from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.kernel.records import ObjectRecord, RangeSubscription
from skpub.kernel.text import Vocabulary
from skpub.router.agrid import AGrid
from skpub.router.epoch import RoutingEpoch
from skpub.router.errors import RoutingError
from skpub.router.gridt import TermTable, route_objects, routing_classes
from skpub.router.kdt import KdtSettings, kdt_partitioning
from skpub.router.partitioning import Partitioning, cost_partitioning
from skpub.router.sample import KeyedSample, parse_sample
from skpub.router.summary import TextualSummaries
from skpub.router.textpart import text_partitioning
from tests.profiles import examples
from tests.workloads import match_one

WORDS = ["a", "ab", "b", "é", "ÿ", "Ā", "日本", "𝄞"]  # multi-byte and beyond the BMP: Arrow sorts UTF-8 bytes
SPACE = Rect(0, 0, 100, 100)


@st.composite
def text_partitionings(draw):
    size = draw(st.integers(2, 16))
    n = min(draw(st.integers(1, 6)), size * size)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base = cost_partitioning(rng.random((size, size)), n)
    texts, owners = [], []
    for owner in base.owners.tolist():
        if rng.random() < 0.6:
            others = [e for e in range(n) if e != owner]
            chosen = rng.choice(others, size=int(rng.integers(0, len(others) + 1)), replace=False).tolist()
            members = (owner, *chosen)
            assigned = {w: int(rng.choice(members)) for w in WORDS if rng.random() < 0.4}
            table = TermTable(members, assigned)
            while len(table.evaluators) > 2 and rng.random() < 0.5:  # an evaluator left: a ring naming one twice
                source, target = rng.choice(table.evaluators, size=2, replace=False).tolist()
                if source != owner:  # the rectangle keeps its owner as primary
                    table = table.without(source, target)
            texts.append(table)
        else:
            texts.append(None)
        owners.append(owner)
    return Partitioning(size, base.boxes, np.array(owners), tuple(texts))


@st.composite
def dnfs(draw):
    clauses = draw(st.lists(st.frozensets(st.sampled_from(WORDS), min_size=1, max_size=3), min_size=1, max_size=3))
    return tuple(dict.fromkeys(clauses))


@examples(1.5)
@given(
    text_partitionings(),
    st.lists(st.tuples(st.floats(0, 90), st.floats(0, 90), st.floats(1, 60), st.floats(1, 60), dnfs()), max_size=12),
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100), st.frozensets(st.sampled_from(WORDS))), max_size=20),
    st.dictionaries(st.sampled_from(WORDS), st.integers(1, 50)),
)
def test_every_matching_pair_reaches_a_common_evaluator_and_exactly_one_delivers_it(part, subs, objects, df):
    grid = FineGrid(SPACE, part.size)
    table = AGrid(grid, part)
    vocabulary = Vocabulary(100, df)
    indexes = {e: GI2Index(2, vocabulary) for e in range(part.count)}
    summaries = TextualSummaries(part.count)
    records = []
    for i, (x, y, w, h, dnf) in enumerate(subs):
        sub = RangeSubscription(i, f"s{i}", Rect(x, y, min(100, x + w), min(100, y + h)), dnf)
        records.append(sub)
        keys = vocabulary.summary_keywords(dnf)
        for e, cells in table.route_parts(grid.cell_box(sub.rect), keys):
            indexes[e].insert(sub, cells)
            summaries.add(e, keys)
    cells = [grid.cell_of(x, y) for x, y, _ in objects]
    rects = [int(part.rect_of[cy, cx]) for cx, cy in cells]
    text = [k for k, r in enumerate(rects) if part.texts[r] is not None]
    # one batch, its terms in any order and repeated: grid^t routes them all at once
    lists = pa.array([sorted(objects[k][2]) * 2 for k in text], pa.list_(pa.string()))
    routes = route_objects(part.term_tables, part.text_class[[rects[k] for k in text]], lists, summaries.counts)
    pairs = list(zip(routes.objects.tolist(), routes.evaluators.tolist(), strict=True))
    assert pairs == sorted(set(pairs)), "one row per (object, evaluator), in order"
    rows: dict[int, dict[int, frozenset | None]] = {k: {part.owners[r]: None} for k, r in enumerate(rects)}
    for k in text:
        rows[k] = {}
    for k, e, only in zip(routes.objects.tolist(), routes.evaluators.tolist(), routes.terms.to_pylist(), strict=True):
        assert only == sorted(set(only)) and only, "distinct sorted terms"
        rows[text[k]][e] = frozenset(only)
    delivered = []
    for j, (x, y, terms) in enumerate(objects):
        obj = ObjectRecord(1000 + j, f"o{j}", x, y, tuple(sorted(terms)), terms)
        cx, cy = cells[j]
        for e, only in rows[j].items():
            matched, _ = match_one(indexes[e], obj, cx, cy, only)
            delivered += [(s, obj.id) for s in matched]
    expected = [
        (s.id, f"o{j}")
        for j, (x, y, terms) in enumerate(objects)
        for s in records
        if s.rect.contains_point(x, y) and any(c <= terms for c in s.dnf)
    ]
    assert sorted(delivered) == sorted(expected)


def test_a_term_table_routes_assigned_terms_and_hashes_the_rest_the_same_everywhere():
    a = TermTable((2, 0, 5), {"jazz": 5})
    b = TermTable((5, 2, 0), {"jazz": 5})
    assert a.primary == 2 and b.primary == 5
    assert a.evaluator_of("jazz") == 5
    for word in ("sushi", "ramen", "café", "\udcff"):
        assert a.evaluator_of(word) == b.evaluator_of(word) in (0, 2, 5)
    assert TermTable.from_json(json.loads(json.dumps(a.to_json()))) == a
    with pytest.raises(RoutingError):
        TermTable((1, 1))
    with pytest.raises(RoutingError):
        TermTable((1, 2), {"x": 3})
    with pytest.raises(RoutingError):
        TermTable.from_json({"evaluators": "no"})


@examples(0.8)
@given(
    members=st.lists(st.integers(0, 9), min_size=3, max_size=6, unique=True),
    leaving=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    assigned=st.dictionaries(st.sampled_from(WORDS), st.integers(0, 5), max_size=6),
)
def test_an_evaluator_leaving_a_term_table_moves_only_its_own_terms(members, leaving, assigned):
    """A text merge inside a rectangle of three evaluators or more (TermTable.without): the leaving evaluator's
    terms, assigned or hashed, go to the target, every other term stays where it was, the primary stays unless it
    left, and the table survives its JSON."""
    table = TermTable(tuple(members), {t: members[k % len(members)] for t, k in assigned.items()})
    terms = [*WORDS, *(f"w{i}" for i in range(60))]
    for k in leaving:
        if len(table.evaluators) < 3:
            break
        source, target = table.evaluators[k % len(table.evaluators)], table.evaluators[(k + 1) % len(table.evaluators)]
        after = table.without(source, target)
        assert set(after.evaluators) == set(table.evaluators) - {source}
        assert after.primary == (target if table.primary == source else table.primary)
        for term in terms:
            before = table.evaluator_of(term)
            assert after.evaluator_of(term) == (target if before == source else before)
        assert TermTable.from_json(json.loads(json.dumps(after.to_json()))) == after and "ring" in after.to_json()
        table = after
    with pytest.raises(RoutingError):
        TermTable((0, 1)).without(0, 1)  # of two, a merge makes the rectangle plain instead
    with pytest.raises(RoutingError):
        TermTable((0, 1, 2)).without(0, 3)
    with pytest.raises(RoutingError, match="ring"):
        TermTable((0, 1, 2), ring=(0, 1, 1))
    for ring in ("012", [], [0, 1, True], [0.0, 1]):
        with pytest.raises(RoutingError, match="damaged term table"):
            TermTable.from_json({"evaluators": [0, 1], "assigned": {}, "ring": ring})


def test_tables_with_the_same_evaluators_and_another_ring_are_routing_classes_apart():
    left = TermTable((0, 1, 2)).without(2, 1)  # evaluators (0, 1), ring (0, 1, 1)
    plain = TermTable((0, 1))
    classes, tables = routing_classes((left, plain, TermTable((1, 0))))
    assert classes.tolist() == [0, 1, 1] and tables == (left, plain)
    differ = [w for w in (f"w{i}" for i in range(50)) if left.evaluator_of(w) != plain.evaluator_of(w)]
    assert differ, "a term the two rings send apart"
    with pytest.raises(RoutingError, match="hash ring"):
        boxes = np.array([[0, 0, 1, 3], [2, 0, 3, 3]])
        Partitioning(4, boxes, np.array([0, 1]), (TermTable((0, 1), ring=(0, 1, 1)), None))


def test_a_text_rectangle_must_be_owned_by_its_primary_and_every_evaluator_must_hold_one():
    boxes = np.array([[0, 0, 1, 3], [2, 0, 3, 3]])
    with pytest.raises(RoutingError, match="primary"):
        Partitioning(4, boxes, np.array([0, 1]), (TermTable((1, 0)), None))
    part = Partitioning(4, boxes, np.array([0, 0]), (TermTable((0, 2, 1)), None))
    assert part.count == 3 and part.boxes_of(2) == [(0, 0, 1, 3)] and part.boxes_of(0) == [(0, 0, 1, 3), (2, 0, 3, 3)]
    with pytest.raises(RoutingError, match="every evaluator"):
        Partitioning(4, boxes, np.array([0, 0]), (TermTable((0, 2)), None))


def test_an_epoch_with_text_rectangles_survives_its_json():
    boxes = np.array([[0, 0, 1, 3], [2, 0, 3, 3]])
    part = Partitioning(4, boxes, np.array([0, 1]), (TermTable((0, 1), {"a": 1}), None))
    epoch = RoutingEpoch(3, 7, AGrid(FineGrid(SPACE, 4), part))
    again = RoutingEpoch.from_json(json.loads(json.dumps(epoch.to_json())))
    assert again.table.partitioning.texts == part.texts
    assert again.to_json() == epoch.to_json()


def _sample_lines(seed, regions):
    """Objects everywhere; per region (box, keyword pool, side): subscriptions over it."""
    rng = np.random.default_rng(seed)
    lines = []
    for i, (box, pool, side) in enumerate(regions):
        x0, y0, x1, y1 = box
        for j in range(300):
            x, y = rng.uniform(x0, x1 - side), rng.uniform(y0, y1 - side)
            keywords = sorted(set(rng.choice(pool, size=2).tolist()))
            rect = [x, y, x + side, y + side]
            lines.append(json.dumps({"type": "subscribe", "id": f"s{i}-{j}", "kind": "range", "rect": rect,
                                     "keywords": keywords[:1]}))  # fmt: skip
    for k in range(4000):
        x, y = rng.uniform(0, 100), rng.uniform(0, 100)
        terms = sorted(set(rng.choice(WORDS + [f"w{i}" for i in range(40)], size=4).tolist()))
        lines.append(json.dumps({"type": "object", "id": f"o{k}", "x": x, "y": y, "terms": terms}))
    return lines


def test_kdt_partitions_by_text_where_ranges_are_large_and_by_space_where_they_are_small():
    # west: many selective keywords over whole-region ranges (Q2), east: one frequent keyword over tiny ranges (Q1)
    west = ((0, 0, 50, 100), [f"w{i}" for i in range(40)], 45.0)
    east = ((50, 0, 100, 100), ["a"], 0.5)
    grid = FineGrid(SPACE, 50)
    sample = parse_sample(_sample_lines(3, [west, east]), grid, Vocabulary(), 1 << 20)
    keyed = KeyedSample.of(sample)
    part = kdt_partitioning(keyed, np.ones((50, 50)), 8, KdtSettings(delta=0.3, min_objects=100))
    assert part.count == 8
    text_columns = {
        cx for i, t in enumerate(part.texts) if t is not None for cx in range(part.boxes[i][0], part.boxes[i][2] + 1)
    }
    assert text_columns and max(text_columns) < 25  # text partitions only in the west half
    assert any(t is None and part.boxes[i][0] >= 25 for i, t in enumerate(part.texts))
    whole = text_partitioning(keyed, np.ones((50, 50)), 8)
    assert whole.text_cells.all() and {t.primary for t in whole.texts} == set(range(8))


def test_route_objects_takes_null_rows_repeats_and_no_summaries():
    a = TermTable((0, 1), {"jazz": 1, "sushi": 0})
    b = TermTable((1, 0), {"jazz": 1, "sushi": 0})
    classes, tables = routing_classes((a, None, b))
    assert classes.tolist() == [0, -1, 0] and tables == (a,)
    lists = pa.array([["jazz", "sushi", "jazz"], None, [], ["sushi"]], pa.list_(pa.string()))
    routes = route_objects(tables, np.zeros(4, np.int64), lists)
    rows = list(zip(routes.objects.tolist(), routes.evaluators.tolist(), routes.terms.to_pylist(), strict=True))
    assert rows == [(0, 0, ["sushi"]), (0, 1, ["jazz"]), (3, 0, ["sushi"])]
    held = [{"sushi": 1}, {}]
    routes = route_objects(tables, np.zeros(4, np.int64), lists, held)
    assert routes.objects.tolist() == [0, 3] and routes.terms.to_pylist() == [["sushi"], ["sushi"]]
    empty = route_objects(tables, np.zeros(1, np.int64), pa.array([["x"]], pa.list_(pa.string())), [{}, {}])
    assert len(empty.objects) == 0 and len(empty.terms) == 0


def test_the_summaries_key_array_follows_keys_appearing_and_leaving():
    summaries = TextualSummaries(3)
    assert summaries.key_array().to_pylist() == []
    summaries.add(0, ["jazz", "sushi"])
    summaries.add(2, ["jazz"])
    first = summaries.key_array()
    assert sorted(first.to_pylist()) == ["jazz", "sushi"] and summaries.key_array() is first  # unchanged: kept
    summaries.remove(0, ["jazz"])  # still held at 2
    assert summaries.key_array() is first
    summaries.remove(2, ["jazz"])
    assert summaries.key_array().to_pylist() == ["sushi"]
    summaries.add(1, ["sushi", "ramen"])
    assert sorted(summaries.key_array().to_pylist()) == ["ramen", "sushi"]


def _q_lines(seed, subscriptions, side, pool, objects=3000, keyed=0.3, keys=1, hot=0.0):
    """Subscriptions anywhere, of one keyword of ``pool`` (or, a share ``hot`` of them, of ``hot``) and sides
    ``side``; objects of common words, a share ``keyed`` of them also with ``keys`` keywords of ``pool``, and a
    share ``hot`` with ``hot``."""
    rng = np.random.default_rng(seed)
    lines = []
    for j in range(subscriptions):
        x, y = rng.uniform(0, 100 - side), rng.uniform(0, 100 - side)
        lines.append(json.dumps({"type": "subscribe", "id": f"s{j}", "kind": "range",
                                 "rect": [x, y, x + side, y + side],
                                 "keywords": ["hot" if rng.random() < hot else str(rng.choice(pool))]}))  # fmt: skip
    for k in range(objects):
        terms = set(rng.choice(WORDS, size=3).tolist())
        if rng.random() < keyed:
            terms |= set(rng.choice(pool, size=keys).tolist())
        if rng.random() < hot:
            terms.add("hot")
        lines.append(json.dumps({"type": "object", "id": f"o{k}", "x": rng.uniform(0, 100),
                                 "y": rng.uniform(0, 100), "terms": sorted(terms)}))  # fmt: skip
    return lines


def test_kdt_takes_the_text_partitioning_when_its_many_small_nodes_would_file_large_ranges_everywhere(monkeypatch):
    """Selective keywords over large ranges everywhere (PS2Stream's Q2), and a phase one that ends with more N_t
    nodes than evaluators: none would be cut by text, so the kd^t-tree gives way to the text partitioning, whose
    total load (Definition 1) is lower and largest load no higher; where ranges are small and objects carry many
    keys (Q1) cutting by text loads more, and it keeps its space partitioning."""
    from skpub.router import kdt

    decided = []
    real = kdt._Builder.text_is_better
    monkeypatch.setattr(kdt._Builder, "text_is_better", lambda *a: decided.append(real(*a)) or decided[-1])
    grid = FineGrid(SPACE, 50)
    costs = np.ones((50, 50))
    settings = KdtSettings(delta=0.9, epsilon=0.0, min_objects=50)

    q2 = KeyedSample.of(
        parse_sample(_q_lines(4, 2000, 45.0, [f"w{i}" for i in range(200)]), grid, Vocabulary(), 1 << 20)
    )
    builder = kdt._Builder(q2, settings)
    root = builder.region((0, 0, 49, 49), np.arange(len(q2.keys)), np.arange(len(q2.sub_keys)))
    nodes = builder.phase_one(root)
    assert len(nodes) >= 8  # the case: every node one leaf, none cut by text
    by_text, space = builder.by_text(root, 8), builder.merge(nodes, 8)[0]
    assert sum(builder.evaluator_loads(by_text, list(range(8)))) < sum(builder.evaluator_loads(nodes, space))
    part, alone = kdt_partitioning(q2, costs, 8, settings), text_partitioning(q2, costs, 8)
    assert decided == [True]
    assert part.boxes.tolist() == alone.boxes.tolist() and part.owners.tolist() == alone.owners.tolist()
    assert part.texts == alone.texts and part.text_cells.all()

    lines = _q_lines(4, 2000, 0.5, [f"k{i}" for i in range(12)], keyed=1.0, keys=6)
    part = kdt_partitioning(KeyedSample.of(parse_sample(lines, grid, Vocabulary(), 1 << 20)), costs, 8, settings)
    assert decided == [True, False]
    assert all(t is None for t in part.texts) and part.count == 8

    # phase one stops at the root, which PartitionNode cuts by text: the hybrid is the text cut (a tie, so it
    # stays), laid out as the text router lays it out, its primaries spread by space
    lines = _q_lines(4, 2000, 45.0, [f"w{i}" for i in range(200)], hot=0.1)
    part = kdt_partitioning(KeyedSample.of(parse_sample(lines, grid, Vocabulary(), 1 << 20)), costs, 8, settings)
    assert decided == [True, False, False]
    assert len(part.boxes) == 8 and part.text_cells.all() and {t.primary for t in part.texts} == set(range(8))
    assert all(t.assigned == part.texts[0].assigned for t in part.texts) and part.texts[0].assigned


def test_the_text_cut_wins_only_with_less_in_total_and_no_more_at_the_most_loaded_evaluator():
    """kd^t-tree step 4: a lower total that loads one evaluator more, or one lower only by rounding, loses."""
    from skpub.router import kdt

    lines = _q_lines(1, 10, 5.0, ["w"], objects=10)
    keyed = KeyedSample.of(parse_sample(lines, FineGrid(SPACE, 50), Vocabulary(), 1 << 20))
    builder = kdt._Builder(keyed, KdtSettings())
    none = np.array([], dtype=np.int64)

    def leaves(*loads):  # leaves of pairs only: their load is what they add to their evaluator's
        return [kdt.Leaf((0, 0, 0, 0), none, none, load) for load in loads]

    hybrid = leaves(10.0, 10.0)
    assert builder.text_is_better(leaves(9.0, 9.0), hybrid, [0, 1])
    assert not builder.text_is_better(leaves(18.0, 1.0), hybrid, [0, 1])  # 19 < 20, but 18 > 10
    assert not builder.text_is_better(leaves(10.0, 10.0 - 1e-12), hybrid, [0, 1])  # rounding
    assert builder.evaluator_loads(leaves(3.0, 4.0, 5.0), [1, 0, 1]) == [4.0, 8.0]
