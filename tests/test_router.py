import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.router.agrid import AGrid
from skpub.router.errors import RoutingError
from skpub.router.kdtree import kdtree_partitioning
from skpub.router.partitioning import Partitioning, cost_partitioning, uniform_partitioning
from skpub.router.summary import TextualSummaries
from skpub.router.uniform import UniformGrid
from tests.profiles import examples

SPACE = Rect(0.0, 0.0, 100.0, 100.0)


def brute_force(partitioning: Partitioning, box) -> set[int]:
    x0, y0, x1, y1 = box
    return set(np.unique(partitioning.owner[y0 : y1 + 1, x0 : x1 + 1]).tolist())


@st.composite
def partitionings(draw, max_size=40):
    size = draw(st.integers(1, max_size))
    n = draw(st.integers(1, min(64, size * size)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    costs = rng.pareto(1.0, size=(size, size)) * (rng.random((size, size)) < draw(st.floats(0.05, 1.0)))
    build = draw(st.sampled_from([cost_partitioning, kdtree_partitioning]))
    return build(costs, n)


@st.composite
def tilings(draw, max_size=24):
    """Any tiling by rectangles (pinwheels and other non-guillotine ones included), owners drawn at random."""
    size = draw(st.integers(1, max_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    free = np.ones((size, size), dtype=bool)
    rects = []
    for cy in range(size):
        for cx in range(size):
            if not free[cy, cx]:
                continue
            w = 1
            while cx + w < size and free[cy, cx + w] and rng.random() < 0.8:
                w += 1
            h = 1
            while cy + h < size and free[cy + h, cx : cx + w].all() and rng.random() < 0.8:
                h += 1
            free[cy : cy + h, cx : cx + w] = False
            rects.append((cx, cy, cx + w - 1, cy + h - 1))
    n = draw(st.integers(1, len(rects)))
    owners = np.concatenate([np.arange(n), rng.integers(0, n, len(rects) - n)])
    rng.shuffle(owners)
    return Partitioning(size, np.array(rects), owners)


@st.composite
def boxes(draw, size):
    x0, x1 = sorted(draw(st.lists(st.integers(0, size - 1), min_size=2, max_size=2)))
    y0, y1 = sorted(draw(st.lists(st.integers(0, size - 1), min_size=2, max_size=2)))
    return x0, y0, x1, y1


@examples(3)
@given(st.data())
def test_neighbor_search_returns_exactly_the_overlapped_partitions(data):
    partitioning = data.draw(partitionings())
    agrid = AGrid(FineGrid(SPACE, partitioning.size), partitioning)
    box = data.draw(boxes(partitioning.size))
    found, pops = agrid.neighbor_search(box)
    assert agrid.route_cells(box) == found
    assert len(found) == len(set(found))
    assert set(found) == brute_force(partitioning, box)
    assert pops <= 2 * len(found) + 1


@examples(3)
@given(st.data())
def test_neighbor_search_over_partitions_of_several_rectangles(data):
    """After corner shifts and migrations a partition is several rectangles: the search runs over rectangles,
    finds each overlapped one once, and each evaluator's part is the bounding box of its overlapped cells."""
    partitioning = data.draw(tilings())
    agrid = AGrid(FineGrid(SPACE, partitioning.size), partitioning)
    box = data.draw(boxes(partitioning.size))
    rects, cells = agrid.neighbor_search(box)
    x0, y0, x1, y1 = box
    inside = partitioning.rect_of[y0 : y1 + 1, x0 : x1 + 1]
    assert sorted(rects) == sorted(np.unique(inside).tolist())
    assert cells <= 2 * len(rects) + 1
    parts = dict(agrid.route_parts(box))
    assert set(parts) == brute_force(partitioning, box) == set(agrid.route_cells(box))
    for e, (px0, py0, px1, py1) in parts.items():
        ys, xs = np.nonzero(partitioning.owner[y0 : y1 + 1, x0 : x1 + 1] == e)
        assert (px0, py0, px1, py1) == (x0 + xs.min(), y0 + ys.min(), x0 + xs.max(), y0 + ys.max())


def test_every_evaluator_owns_a_rectangle():
    with pytest.raises(RoutingError):
        Partitioning(2, np.array([[0, 0, 1, 0], [0, 1, 1, 1]]), np.array([0, 2]))
    part = Partitioning(2, np.array([[0, 0, 0, 0], [1, 0, 1, 1], [0, 1, 0, 1]]), np.array([0, 1, 0]))
    assert part.count == 2 and part.boxes_of(0) == [(0, 0, 0, 0), (0, 1, 0, 1)]
    assert part.owner.tolist() == [[0, 1], [0, 1]]


@examples(1)
@given(st.integers(1, 64), st.data())
def test_uniform_router_returns_exactly_the_overlapped_partitions(n, data):
    size = data.draw(st.integers(n, 70))
    table = UniformGrid(FineGrid(SPACE, size), n)
    box = data.draw(boxes(size))
    found = table.route_cells(box)
    assert len(found) == len(set(found))
    assert set(found) == brute_force(table.partitioning, box)


@examples(1)
@given(st.data(), st.integers(2, 60))
def test_cells_visited_grow_with_partitions_not_grid_size(data, factor):
    """Lemma 1: the same layout on a grid ``factor`` times finer visits exactly as many cells."""
    coarse = data.draw(partitionings(max_size=30))
    size = coarse.size
    fine_boxes = [
        (x0 * factor, y0 * factor, (x1 + 1) * factor - 1, (y1 + 1) * factor - 1)
        for x0, y0, x1, y1 in coarse.boxes.tolist()
    ]
    fine = Partitioning(size * factor, np.array(fine_boxes))
    small, large = AGrid(FineGrid(SPACE, size), coarse), AGrid(FineGrid(SPACE, size * factor), fine)
    box = data.draw(boxes(size))
    scaled = (box[0] * factor, box[1] * factor, (box[2] + 1) * factor - 1, (box[3] + 1) * factor - 1)
    found_small, cells_small = small.neighbor_search(box)
    found_large, cells_large = large.neighbor_search(scaled)
    assert set(found_small) == set(found_large)
    assert cells_small == cells_large <= 2 * len(found_small) + 1


@examples(2)
@given(
    st.floats(0, 100),
    st.floats(0, 100),
    st.floats(-20, 120),
    st.floats(-20, 120),
    st.floats(0, 60),
    st.floats(0, 60),
    st.integers(1, 300),
)
def test_point_in_rect_always_falls_in_rect_cells(x, y, rx, ry, w, h, size):
    grid = FineGrid(SPACE, size)
    rect = Rect(rx, ry, rx + w, ry + h)
    if not rect.contains_point(x, y):
        return
    cx, cy = grid.cell_of(x, y)
    x0, y0, x1, y1 = grid.cell_box(rect)
    assert x0 <= cx <= x1 and y0 <= cy <= y1
    vx, vy = grid.cells_of(np.array([x]), np.array([y]))
    assert (vx[0], vy[0]) == (cx, cy)
    table = UniformGrid(grid, 4) if size >= 2 else None
    if table is not None:
        assert table.route_one(x, y) in table.route_range(rect)
        assert table.route_many(np.array([x]), np.array([y]))[0] == table.route_one(x, y)


def skewed_costs():
    """100 x 100 cell costs: a dense corner and a thin uniform background."""
    rng = np.random.default_rng(0)
    costs = np.zeros((100, 100))
    costs[rng.integers(0, 20, 5000), rng.integers(0, 30, 5000)] += 1
    costs[rng.integers(0, 100, 500), rng.integers(0, 100, 500)] += 1
    return costs


def max_over_mean(costs, part):
    """The partitioning's imbalance over ``costs``: its costliest rectangle over the mean."""
    loads = [costs[y0 : y1 + 1, x0 : x1 + 1].sum() for x0, y0, x1, y1 in part.boxes.tolist()]
    return max(loads) / np.mean(loads)


def test_cost_partitioning_balances_skewed_costs():
    costs = skewed_costs()
    assert max_over_mean(costs, cost_partitioning(costs, 8)) < 1.5
    assert max_over_mean(costs, uniform_partitioning(100, 8)) > 3


@given(st.integers(1, 12), st.integers(1, 144), st.integers(0, 2**32 - 1))
def test_kdtree_partitioning_gives_every_evaluator_one_rectangle(size, n, seed):
    n = min(n, size * size)
    costs = np.random.default_rng(seed).pareto(1.0, (size, size))
    part = kdtree_partitioning(costs, n)
    assert part.count == n and len(part.boxes) == n


def test_kdtree_balances_skewed_costs_by_load_medians():
    costs = skewed_costs()
    part = kdtree_partitioning(costs, 8)
    assert max_over_mean(costs, part) < 1.2
    # the root cuts x at the load median: the low half's four leaves hold half the load
    x_cut = max(b[2] for b in part.boxes.tolist()[:4])
    assert abs(costs[:, : x_cut + 1].sum() / costs.sum() - 0.5) < 0.05
    assert part.boxes.tolist() != cost_partitioning(costs, 8).boxes.tolist()


def test_partitions_must_tile_the_grid():
    with pytest.raises(RoutingError):
        Partitioning(4, np.array([[0, 0, 3, 1], [0, 1, 3, 3]]))
    with pytest.raises(RoutingError):
        Partitioning(4, np.array([[0, 0, 3, 1]]))


def test_textual_summary_expires_keywords_with_their_last_subscription():
    summaries = TextualSummaries(2)
    summaries.add(0, {"jazz", "sushi"})
    summaries.add(0, {"jazz"})
    assert summaries.admits(0, frozenset({"jazz", "x"}))
    assert not summaries.admits(1, frozenset({"jazz"}))
    assert summaries.remove(0, {"jazz", "sushi"}) == ["sushi"]
    assert summaries.remove(0, {"jazz"}) == ["jazz"]
    assert not summaries.admits(0, frozenset({"jazz", "sushi"}))


def test_subscription_costs_spread_one_unit_plus_index_entries():
    from skpub.router.initial import subscription_costs

    boxes = np.array([[0, 0, 3, 1], [2, 1, 2, 1]])
    costs = subscription_costs(boxes, 6, index_block=2)
    assert costs.shape == (6, 6)
    assert costs[5, 5] == 0
    assert np.isclose(costs.sum(), 2 + (8 + 1) / 4)
    assert np.isclose(costs[1, 2], 1 / 8 + 1 / 4 + 1 + 1 / 4)


def test_initial_partitioning_balances_a_sample_of_subscriptions_only():
    import json

    from skpub.kernel.config import Deployment
    from skpub.kernel.text import Vocabulary
    from skpub.router.initial import initial_table

    rng = np.random.default_rng(4)
    lines = []
    for i in range(2000):
        x, y = (rng.normal(20, 3), rng.normal(20, 3)) if i % 4 else (rng.uniform(0, 100), rng.uniform(0, 100))
        rect = [x - 0.5, y - 0.5, x + 0.5, y + 0.5]
        lines.append(json.dumps({"type": "subscribe", "id": f"s{i}", "kind": "range", "rect": rect, "keywords": ["a"]}))
    dep = Deployment(space=SPACE, evaluators=8, grid_size=100)
    table = initial_table(dep, Vocabulary(), lines)
    counts = np.bincount(
        [table.route_one((r[0] + r[2]) / 2, (r[1] + r[3]) / 2) for r in (json.loads(line)["rect"] for line in lines)],
        minlength=8,
    )
    assert counts.max() / counts.mean() < 1.6


def test_sample_costs_equal_tornado_equation_1_record_by_record():
    """The bulk-decoded sample costs what each parsed record costs alone: 1 + covering range subscriptions sharing a
    term + ranked subscriptions sharing a term, per object, plus the subscriptions' registration costs."""
    import json

    from skpub.kernel.records import KnnSubscription, ObjectRecord, RangeSubscription, TopkSubscription, parse_line
    from skpub.kernel.text import Vocabulary
    from skpub.router.initial import sample_cell_costs, subscription_costs

    rng = np.random.default_rng(11)
    words = ["a", "b", "c", "d"]
    lines = []
    for i in range(600):
        x, y = rng.uniform(-5, 105, 2)
        kind = i % 6
        if kind < 3:
            terms = list(rng.choice(words, rng.integers(1, 4)))
            extra = {"ts": 1.0} if kind == 1 else {"bogus": 1} if kind == 2 and i % 12 == 2 else {}
            lines.append(json.dumps({"type": "object", "id": f"o{i}", "x": x, "y": y, "terms": terms, **extra}))
        elif kind == 3:
            rect = [x, y, x + rng.uniform(0, 30), y + rng.uniform(0, 30)]
            spec = {"kind": "range", "rect": rect, "expr": "a OR b"}
            lines.append(json.dumps({"type": "subscribe", "id": f"s{i}", **spec}))
        elif kind == 4:
            spec = {"kind": "topk", "point": [x, y], "k": 3, "alpha": 0.5, "keywords": ["c"]}
            lines.append(json.dumps({"type": "subscribe", "id": f"t{i}", **spec}))
        else:
            spec = {"kind": "knn", "point": [x, y], "keywords": ["d", "a"], "k": 2}
            lines.append(json.dumps({"type": "subscribe", "id": f"k{i}", **spec}).encode())
    lines.append(b"not json")
    grid = FineGrid(SPACE, 20)
    records = [parse_line(line, i, SPACE, 10_000) for i, line in enumerate(lines)]
    ranges = [r for r in records if isinstance(r, RangeSubscription)]
    ranked = [t for r in records if isinstance(r, TopkSubscription | KnnSubscription) for t in r.keywords]
    boxes = np.array([grid.cell_box(r.rect) for r in ranges], dtype=np.int64).reshape(-1, 4)
    expected = subscription_costs(boxes, grid.size, 4)
    summary = Vocabulary().summary_keywords
    for obj in (r for r in records if isinstance(r, ObjectRecord)):
        cx, cy = grid.cell_of(obj.x, obj.y)
        q = sum(1 for t in obj.term_set for r in ranges if t in summary(r.dnf) and r.rect.contains_point(obj.x, obj.y))
        expected[cy, cx] += 1 + q + sum(ranked.count(t) for t in obj.term_set)
    assert sum(isinstance(r, ObjectRecord) for r in records) > 150
    np.testing.assert_allclose(sample_cell_costs(lines, grid, Vocabulary(), 4, 10_000), expected)


@examples(0.3)
@given(starts=st.lists(st.integers(1, 6), min_size=1, max_size=30), probe=st.integers(0, 200))
def test_the_epoch_log_gives_the_newest_epoch_started_by_a_batch_reading_only_newer_ones(
    tmp_path_factory, starts, probe
):
    from skpub.router.epoch import EpochError, EpochLog, RoutingEpoch, _load

    log = EpochLog(tmp_path_factory.mktemp("epochs"))
    table = UniformGrid(FineGrid(Rect(0, 0, 1, 1), 8), 2)
    from_batches = np.cumsum([0, *starts]).tolist()  # strictly increasing, as decisions publish them
    for number, first in enumerate(from_batches):
        log.publish(RoutingEpoch(number, first, table))
    expected = max(n for n, first in enumerate(from_batches) if first <= probe)  # brute force over every epoch
    _load.cache_clear()
    assert log.for_batch(probe).number == expected
    assert _load.cache_info().misses == len(from_batches) - expected  # newest back to the one in force
    with pytest.raises(EpochError, match="would not start after epoch"):
        log.publish(RoutingEpoch(len(from_batches), from_batches[-1], table))
    with pytest.raises(EpochError, match="other content"):
        log.publish(RoutingEpoch(0, 1, table))
    assert log.numbers() == list(range(len(from_batches)))
    before = {b: log.for_batch(b).number for b in range(probe, from_batches[-1] + 3)}
    assert log.prune(-1) == [] and log.numbers() == list(range(len(from_batches)))  # none in force: nothing goes
    gone = log.prune(probe)
    assert gone == list(range(expected)) and log.numbers() == list(range(expected, len(from_batches)))
    assert {b: log.for_batch(b).number for b in before} == before  # every batch from ``probe`` on routes as before
    if expected:  # the batches before the kept epochs no longer have one
        with pytest.raises(EpochError, match="no routing epoch"):
            log.for_batch(from_batches[expected] - 1)


def test_the_epoch_log_skips_missing_numbers_and_keeps_epochs_in_order_around_a_gap(tmp_path):
    from skpub.router.epoch import EpochError, EpochLog, RoutingEpoch

    log = EpochLog(tmp_path)
    table = UniformGrid(FineGrid(Rect(0, 0, 1, 1), 8), 2)
    log.publish(RoutingEpoch(0, 0, table))
    log.publish(RoutingEpoch(2, 5, table))
    assert [log.for_batch(b).number for b in (0, 4, 5, 9)] == [0, 0, 2, 2]
    for start in (0, 5, 7):  # epoch 1 must start after epoch 0 and before epoch 2
        with pytest.raises(EpochError, match="would not start"):
            log.publish(RoutingEpoch(1, start, table))
    log.publish(RoutingEpoch(1, 3, table))
    assert [log.for_batch(b).number for b in (2, 3, 4, 5)] == [0, 1, 1, 2]


def test_the_epoch_prune_removes_what_a_killed_publish_left_of_older_epochs_and_skips_foreign_names(tmp_path):
    from skpub.router.epoch import EpochLog, RoutingEpoch

    log = EpochLog(tmp_path)
    table = UniformGrid(FineGrid(Rect(0, 0, 1, 1), 8), 2)
    for number, first in enumerate((0, 4, 8)):
        log.publish(RoutingEpoch(number, first, table))
    older, newer = tmp_path / ".epoch-000000.json.k1ll3d.tmp", tmp_path / ".epoch-000003.json.k1ll3d.tmp"
    kept = tmp_path / ".epoch-000001.json.k1ll3d.tmp"  # of the epoch in force: stays
    foreign = [tmp_path / "epoch-old.json", tmp_path / "epoch-0000001.json", tmp_path / ".epoch-x.json.a.tmp"]
    for path in (older, newer, kept, *foreign):
        path.write_text("{")
    assert log.numbers() == [0, 1, 2]  # skpub's names only: a foreign file is neither read nor removed
    assert log.prune(5) == [0]  # epoch 1 is in force for batch 5
    assert not older.exists() and newer.exists() and kept.exists() and all(p.exists() for p in foreign)
    assert log.numbers() == [1, 2]


@examples(2)
@given(st.data())
def test_range_subscriptions_located_at_once_go_where_each_alone_goes(data):
    """Cell boxes in numpy and sole owners take the place of route_parts only where it would give the same parts:
    boxes inside one plain rectangle (fails if a box spanning rectangles, or one in a text rectangle, took the
    shortcut). Rectangles of any tiling, some text-partitioned; corners beyond the space clamp alike."""
    from skpub.kernel.config import Deployment
    from skpub.kernel.records import RangeSubscription
    from skpub.kernel.text import Vocabulary, parse_expression
    from skpub.router.gridt import TermTable
    from skpub.router.locate import Locator

    plain = data.draw(tilings())
    n = int(plain.owners.max()) + 1
    texts = [
        TermTable((int(owner), *(e for e in range(n) if e != owner)))
        if n > 1 and data.draw(st.booleans(), label=f"text {i}") else None
        for i, owner in enumerate(plain.owners.tolist())
    ]  # fmt: skip
    partitioning = Partitioning(plain.size, plain.boxes, plain.owners, texts)
    table = AGrid(FineGrid(SPACE, partitioning.size), partitioning)
    locator = Locator(Deployment(), Vocabulary(), table)
    coordinate = st.one_of(st.floats(-10, 110), st.sampled_from([-1.7e308, 0.0, 50.0, 100.0, 1.7e308]))
    subs = []
    for pos in range(data.draw(st.integers(1, 12))):
        x0, x1 = sorted(data.draw(st.lists(coordinate, min_size=2, max_size=2)))
        y0, y1 = sorted(data.draw(st.lists(coordinate, min_size=2, max_size=2)))
        expr = data.draw(st.sampled_from(["a", "a OR b", "b AND c", "(a OR b) AND c"]))
        subs.append(RangeSubscription(pos, f"s{pos}", Rect(x0, y0, x1, y1), parse_expression(expr)))
    assert locator._locate_range_batch(subs) == [locator._locate(sub) for sub in subs]
    boxes = table.grid.cell_boxes([sub.rect.as_list() for sub in subs])
    assert [tuple(b) for b in boxes.tolist()] == [table.grid.cell_box(sub.rect) for sub in subs]
    for box, owner in zip(boxes.tolist(), table.sole_owners(boxes).tolist(), strict=True):
        if owner >= 0:
            assert table.route_parts(tuple(box), ["a"]) == [(owner, tuple(box))]
            assert len(set(partitioning.rect_of[box[1] : box[3] + 1, box[0] : box[2] + 1].ravel().tolist())) == 1
