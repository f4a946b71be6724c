"""The balancer's operations, cost model, migration selection and policies (skpub.balancer)."""

import copy
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.balancer.migration import (
    _strip_spans,
    by_size,
    dynamic,
    fan_out_shares,
    greedy,
    migration,
    optimum,
    random_cells,
    strip_migration,
)
from skpub.balancer.operation import Loads, Move, apply_moves
from skpub.balancer.policy import candidates, chaos, decide, movable
from skpub.balancer.splitmerge import best_split
from skpub.evaluators.load import CellLoad
from skpub.kernel.config import BalancerConfig
from skpub.kernel.grid import union_boxes
from skpub.kernel.load import LoadSummary, imbalance
from skpub.router.errors import RoutingError
from skpub.router.gridt import TermTable
from skpub.router.partitioning import Partitioning, cost_partitioning
from tests.profiles import examples
from tests.workloads import deployment


def _held_boxes(parts: dict) -> np.ndarray:
    """The cell boxes of ``parts`` (id -> box) as an evaluator hands them to its load statistics."""
    return np.array(list(parts.values()), dtype=np.int64).reshape(-1, 4)


def summaries_of(part: Partitioning, costs: np.ndarray, subs: list[tuple[str, tuple]], block: int = 4):
    """Every evaluator's summary when cell (cx, cy) costs costs[cy, cx] and the subscriptions lie over their boxes."""
    out = []
    for e in range(part.count):
        load = CellLoad(part.size, part.boxes_of(e), block, decay=1.0)
        ys, xs = np.nonzero((part.owner == e) & (costs > 0))
        for cx, cy in zip(xs.tolist(), ys.tolist(), strict=True):
            load.add_cost(cx, cy, float(costs[cy, cx]))
        for _, box in subs:
            for r in part.boxes_of(e):
                if not (box[2] < r[0] or box[0] > r[2] or box[3] < r[1] or box[1] > r[3]):
                    load.add_subscription(box)
                    break
        out.append(load.summary(e, 0))
    return out


def true_queries(part: Partitioning, subs, e: int) -> int:
    return sum(1 for _, (x0, y0, x1, y1) in subs if (part.owner[y0 : y1 + 1, x0 : x1 + 1] == e).any())


@st.composite
def workloads(draw, max_size=30):
    size = draw(st.integers(4, max_size))
    n = draw(st.integers(2, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    costs = rng.pareto(1.0, (size, size)) * (rng.random((size, size)) < 0.5)
    hot = rng.integers(0, size, 2)
    costs[hot[1] : hot[1] + 3, hot[0] : hot[0] + 3] += 50 * draw(st.floats(0, 1))
    part = cost_partitioning(rng.random((size, size)), n)
    subs = []
    for i in range(draw(st.integers(0, 40))):
        x, y = rng.integers(0, size, 2).tolist()
        w, h = rng.integers(0, 4, 2).tolist()
        subs.append((f"s{i}", (x, y, min(size - 1, x + w), min(size - 1, y + h))))
    return part, costs, subs, rng


@examples(1.5)
@given(workloads(), st.integers(0, 2**16), st.booleans())
def test_chaos_operations_are_legal_and_move_exactly_their_cells(workload, seed, by_text):
    part, costs, subs, _ = workload
    if by_text:  # every rectangle shared by every evaluator, as the text router's: only merges can start
        n = part.count
        texts = tuple(TermTable(tuple((o + j) % n for j in range(n))) for o in part.owners.tolist())
        part = Partitioning(part.size, part.boxes, part.owners, texts)
    for batch in range(6):
        [op] = decide(BalancerConfig(mode="chaos", seed=seed), part, summaries_of(part, costs, subs), batch)
        expected = part.owner.copy()
        for m in op.moves:
            x0, y0, x1, y1 = m.cells
            rect = part.rect_of[y0, x0]
            assert tuple(part.boxes[rect]) == m.cells or not m.text, "a text move takes a whole rectangle"
            if m.text == "merge":  # the source leaves; of two evaluators, the rectangle becomes the target's
                assert {m.source, m.target} <= set(part.texts[rect].evaluators)
            else:
                assert (expected[y0 : y1 + 1, x0 : x1 + 1] == m.source).all() and not part.text_cells[y0, x0]
            if m.text == "" or (m.text == "merge" and len(part.texts[rect].evaluators) == 2):
                expected[y0 : y1 + 1, x0 : x1 + 1] = m.target
            elif m.text == "merge" and part.texts[rect].primary == m.source:
                expected[y0 : y1 + 1, x0 : x1 + 1] = m.target  # the target becomes the primary, the owner
        new = apply_moves(part, op.moves)
        assert new.count == part.count
        np.testing.assert_array_equal(new.owner, expected)
        for m in op.moves:
            x0, y0, x1, y1 = m.cells
            table, old = new.texts[new.rect_of[y0, x0]], part.texts[part.rect_of[y0, x0]]
            if m.text == "split":
                assert table == TermTable((m.source, m.target)) and table.evaluators == (m.source, m.target)
            elif m.text == "merge":
                assert table == (None if len(old.evaluators) == 2 else old.without(m.source, m.target))
        part = new


@pytest.mark.parametrize("text_rectangles", [7, 4])
def test_every_chaos_draw_is_a_legal_operation_beside_text_partitioned_rectangles(text_rectangles):
    """No draw is wasted: a spatial kind is drawn only from cells that may move, and a global adjustment that
    moves nothing gives way to another kind (a found case: every rectangle shared by text, and ``decide``
    ended the batch with no operation when 32 draws were a shift, a split/merge or an empty global adjustment)."""
    rng = np.random.default_rng(5)
    part = cost_partitioning(rng.random((12, 12)), 7)
    n = part.count
    texts = tuple(TermTable(tuple((o + j) % n for j in range(n))) if i < text_rectangles else None
                  for i, o in enumerate(part.owners.tolist()))  # fmt: skip
    part = Partitioning(part.size, part.boxes, part.owners, texts)
    loads = Loads(part, summaries_of(part, rng.pareto(1.0, (12, 12)), []), 60.0)
    kinds = set()
    for seed in range(300):
        op = chaos(part, loads, np.random.default_rng(seed))
        assert op is not None and movable(part, op), (seed, op)
        kinds.add(op.kind)
    assert "text_merge" in kinds and (text_rectangles == 7) == kinds.isdisjoint({"migration", "text_split"})


@examples(2)
@given(workloads(), st.integers(0, 2**16))
def test_summaries_predict_every_candidates_costs_and_subscriptions_exactly(workload, seed):
    """C_r and C_t come from summaries (aggregates, blocks), never cells: what they predict must be what happens,
    also on partitions of several rectangles (after chaos operations)."""
    part, costs, subs, _ = workload
    for batch in range(seed % 4):
        [op] = decide(BalancerConfig(mode="chaos", seed=seed), part, summaries_of(part, costs, subs), batch)
        if not any(m.text for m in op.moves):  # costs follow owners here; a text split's share is an estimate
            part = apply_moves(part, op.moves)
    loads = Loads(part, summaries_of(part, costs, subs), beta=1.0)
    truth = np.array([costs[part.owner == e].sum() for e in range(part.count)])
    np.testing.assert_allclose(loads.costs, truth)
    source = int(np.argmax(loads.costs))
    shares = fan_out_shares(loads.costs, source, range(part.count))
    fan, strips = migration(part, loads, source, shares), strip_migration(part, loads, source, shares)
    for op in [*candidates(part, loads), *(op for op in (fan, strips) if op is not None)]:
        new = apply_moves(part, op.moves)
        after = np.array([costs[new.owner == e].sum() for e in range(part.count)])
        np.testing.assert_allclose(op.costs_after, after, atol=1e-9 * max(1.0, truth.max()))
        touched = op.evaluators
        assert op.c_r == pytest.approx(truth[touched].max() - after[touched].max(), abs=1e-9 * max(1.0, truth.max()))
        for m in op.moves:
            x0, y0, x1, y1 = m.cells
            assert m.queries == sum(1 for _, b in subs if not (b[2] < x0 or b[0] > x1 or b[3] < y0 or b[1] > y1)), (
                op.kind
            )


@examples(2)
@given(workloads())
def test_best_split_is_the_most_even_cut(workload):
    part, costs, subs, _ = workload
    (summary,) = summaries_of(Partitioning(part.size, np.array([[0, 0, part.size - 1, part.size - 1]])), costs, subs)
    (rect,) = summary.rectangles
    halves = best_split(rect)
    got = abs(costs[halves[0][1] : halves[0][3] + 1, halves[0][0] : halves[0][2] + 1].sum() * 2 - costs.sum())
    cuts = [abs(costs[:, : k + 1].sum() * 2 - costs.sum()) for k in range(part.size - 1)]
    cuts += [abs(costs[: k + 1, :].sum() * 2 - costs.sum()) for k in range(part.size - 1)]
    assert got == pytest.approx(min(cuts))


@examples(2)
@given(
    st.lists(st.tuples(st.floats(0, 100), st.integers(0, 30)), min_size=1, max_size=14),
    st.floats(0.05, 0.95),
)
def test_migration_selectors_reach_tau_and_dp_is_optimal(cells, fraction):
    """Every selector reaches tau, none beats the 0-1 program's optimum, and DP equals it.

    Instances where a set of cells carries tau to within 1e-4 of it are
    left out: the optimum (HiGHS) counts a constraint met to within 1e-6,
    the selectors to within 1e-9, so at such a tie either may call a set
    feasible that the other does not.
    """
    from hypothesis import assume

    loads = np.array([c[0] for c in cells])
    sizes = np.array([c[1] for c in cells], dtype=np.int64)
    tau = fraction * loads.sum()
    subsets = np.zeros(1)
    for load in loads:
        subsets = np.concatenate([subsets, subsets + load])
    assume(tau == 0 or not np.any(np.abs(subsets - tau) <= 1e-4 * tau))
    best = optimum(loads, sizes, tau) if loads.sum() > 0 else []
    for select in (greedy, dynamic, by_size, random_cells):
        chosen = select(loads, sizes, tau)
        assert len(set(chosen)) == len(chosen)
        assert set(chosen) <= set(np.flatnonzero(loads > 0).tolist())
        assert loads[chosen].sum() >= tau * (1 - 1e-9) or loads[chosen].sum() == loads[loads > 0].sum()
        assert sizes[chosen].sum() >= sizes[best].sum()
    assert sizes[dynamic(loads, sizes, tau)].sum() == sizes[best].sum()


def test_greedy_scans_by_relative_cost_and_keeps_the_cheapest_candidate():
    """PS2Stream Figure 5: GS cells accumulate under tau; each GL cell closes a candidate; the cheapest wins."""
    loads = np.array([4.0, 10.0, 2.0, 2.0])
    sizes = np.array([1, 9, 1, 2])
    # relative cost 0.25, 0.9, 0.5, 1.0 -> scan 0, 2, 1, 3: GS {0, 2} (6 < 8); 1 is GL ({0, 2, 1}: size 11);
    # 3 closes {0, 2, 3} (size 4), cheaper: taken although 1 came first in the scan
    assert sorted(greedy(loads, sizes, 8.0)) == [0, 2, 3]
    assert sorted(by_size(loads, sizes, 8.0)) == [1]
    # GS, then GL cells, then GS again:
    loads = np.array([4.0, 10.0, 0.5, 2.0])
    sizes = np.array([1, 9, 1, 2])
    # order 0 (0.25), 1 (0.9), 3 (1.0), 2 (2.0): GS {0}; 1 is GL ({0, 1}: size 10); 3 is GL ({0, 3}: size 3);
    # 2 joins GS (4.5 < 5); no cell is left to close {0, 2}: the cheapest candidate seen, {0, 3}, is the answer
    assert sorted(greedy(loads, sizes, 5.0)) == [0, 3]


def test_adaptive_moves_load_off_the_hot_evaluator_and_rests_when_balanced():
    size = 40
    part = cost_partitioning(np.ones((size, size)), 4)
    costs = np.ones((size, size))
    costs[:10, :10] += 20
    subs = [(f"s{i}", (i, i, i + 1, i + 1)) for i in range(30)]
    settings_ = BalancerConfig(mode="adaptive", beta=0.01)
    summaries = summaries_of(part, costs, subs)
    before = imbalance(np.array([s.cost for s in summaries]))
    ops = decide(settings_, part, summaries, 0)
    assert ops and all(op.c_r > op.c_t for op in ops)
    assert ops == decide(settings_, part, summaries, 7)
    touched = [e for op in ops for e in op.evaluators]
    assert len(touched) == len(set(touched))  # an evaluator takes part in one operation of a decision
    new = apply_moves(part, [m for op in ops for m in op.moves])
    assert imbalance(np.array([costs[new.owner == e].sum() for e in range(4)])) < before
    even = summaries_of(part, np.ones((size, size)), subs)
    assert decide(settings_, part, even, 0) == []
    assert decide(BalancerConfig(mode="off"), part, summaries, 0) == []
    expensive = BalancerConfig(mode="adaptive", beta=1e9)
    assert decide(expensive, part, summaries, 0) == []


@pytest.mark.parametrize("hot", [(0, 0), (40, 40)])
def test_adaptive_spreads_a_hot_spot_over_every_evaluator_in_one_decision(hot):
    """PS2Stream's pair migration halves the hot evaluator's load per operation; the fan-out spreads it at once."""
    size = 64
    part = cost_partitioning(np.ones((size, size)), 8)
    costs = np.ones((size, size))
    x, y = hot
    costs[y : y + 12, x : x + 12] += 100
    subs = [(f"s{i}", (i % size, i // 2 % size, i % size, i // 2 % size)) for i in range(64)]
    summaries = summaries_of(part, costs, subs, block=2)
    truth = np.array([costs[part.owner == e].sum() for e in range(8)])
    assert imbalance(truth) > 3
    ops = decide(BalancerConfig(mode="adaptive", beta=0.01), part, summaries, 0)
    new = apply_moves(part, [m for op in ops for m in op.moves])
    after = np.array([costs[new.owner == e].sum() for e in range(8)])
    assert imbalance(after) < 1.5
    touched = [e for op in ops for e in op.evaluators]
    assert len(touched) == len(set(touched))
    predicted = np.array(ops[-1].costs_after)
    np.testing.assert_allclose(predicted, after)  # each round is weighed on the costs the rounds before leave


def test_a_hot_spot_inside_one_block_moves_as_strips_of_lines_to_the_evaluators_under_the_mean():
    """A grid^t block is indivisible for GR's migration: a hot spot inside one (here the source's one block) moves
    as strips of its rectangle's lines, weighed by adaptive; a text-partitioned rectangle gives none."""
    size = 32
    part = cost_partitioning(np.ones((size, size)), 4)
    costs = np.ones((size, size))
    costs[2:6, 2:6] += 100  # 16 cells inside the block of cell (0, 0)
    subs = [(f"s{i}", (i % 8, i // 8, i % 8, i // 8)) for i in range(64)]
    summaries = summaries_of(part, costs, subs, block=16)
    loads = Loads(part, summaries, beta=0.01)
    source = int(part.owner[0, 0])
    assert int(np.argmax(loads.costs)) == source
    shares = fan_out_shares(loads.costs, source, range(4))
    whole = migration(part, loads, source, shares)
    assert whole is None or max(whole.costs_after) >= 0.9 * loads.costs.max()  # the block moves whole, or nothing
    op = strip_migration(part, loads, source, shares)
    assert op.kind == "migration" and op.c_r > 0.4 * loads.costs.max()
    [rect] = [tuple(b) for b in part.boxes.tolist() if b[0] == 0 and b[1] == 0]
    kept = set(np.ndindex(rect[3] - rect[1] + 1, rect[2] - rect[0] + 1))
    for m in op.moves:  # whole lines of the rectangle, disjoint, to evaluators other than the source
        x0, y0, x1, y1 = m.cells
        assert m.source == source != m.target
        assert (x0, x1) == (rect[0], rect[2]) or (y0, y1) == (rect[1], rect[3])
        lines = {(y - rect[1], x - rect[0]) for y in range(y0, y1 + 1) for x in range(x0, x1 + 1)}
        assert lines <= kept
        kept -= lines
    assert kept  # the source keeps a line
    new = apply_moves(part, op.moves)
    after = np.array([costs[new.owner == e].sum() for e in range(4)])
    np.testing.assert_allclose(op.costs_after, after)
    assert after.max() < 0.6 * loads.costs.max()
    [chosen, *_] = decide(BalancerConfig(mode="adaptive", beta=0.01), part, summaries, 0)
    assert chosen.c_r >= op.c_r  # adaptive weighs the strips: it takes them or something better
    texts = tuple(TermTable((o, (o + 1) % 4)) if o == source else None for o in part.owners.tolist())
    shared = Partitioning(part.size, part.boxes, part.owners, texts)
    assert strip_migration(shared, Loads(shared, summaries, beta=0.01), source, shares) is None
    # the source's costliest rectangle is one cell, which has no line to give: its next one gives rows
    column = Partitioning(part.size, np.array([[0, 0, 0, 0], [1, 0, 31, 31], [0, 1, 0, 31]]), np.array([0, 1, 0]))
    cell_costs = np.ones((size, size))
    cell_costs[0, 0] = 1000.0
    column_loads = Loads(column, summaries_of(column, cell_costs, subs, block=16), 0.01)
    rows = strip_migration(column, column_loads, 0, [(1, 10.0)])
    # ten rows of cost 1 fill the share from either end; the top ten carry no subscription (those lie in rows 0-7)
    assert [(m.cells, m.cost, m.queries) for m in rows.moves] == [((0, 22, 0, 31), 10.0, 0)]


def test_each_strip_target_fills_to_its_share_and_takes_a_line_beyond_only_while_it_stays_below_the_source():
    lines = np.array([5.0, 1.0])
    assert _strip_spans(lines, 20.0, [(0.0, 2.0)]) == [(0, 0)]  # 5 > share 2, but 0 + 5 < 20 - 5
    assert _strip_spans(lines, 10.0, [(0.0, 2.0)]) == []  # 0 + 5 is not below 10 - 5: the walk ends
    assert _strip_spans(lines, 6.0, [(0.0, 2.0), (0.0, 9.0)]) == []  # and no later target is asked
    # the first target's 12 is taken off the later shares (16 in all): the second gets 4, so one line, not two
    assert _strip_spans(np.array([12.0, 3, 3, 3, 1]), 100.0, [(0.0, 10.0), (0.0, 6.0)]) == [(0, 0), (1, 1)]
    # lines of no cost are never a run alone, nor its tail; the source keeps the last line
    assert _strip_spans(np.array([0.0, 50, 1, 1]), 200.0, [(0.0, 20.0), (15.0, 20.0)]) == [(0, 1)]
    assert _strip_spans(np.array([5.0, 0, 0, 0, 10]), 100.0, [(0.0, 5.0)]) == [(0, 0)]
    assert _strip_spans(np.array([1.0, 1.0, 1.0]), 100.0, [(0.0, 50.0)]) == [(0, 1)]
    assert _strip_spans(np.array([0.0, 0.0, 7.0]), 100.0, [(0.0, 50.0)]) == []


def test_a_load_summary_with_a_cost_that_is_not_a_finite_number_from_0_is_refused():
    """JSON has no NaN: ``null`` would read back as one and turn every comparison of the decision false."""
    part = cost_partitioning(np.ones((8, 8)), 2)
    [summary, _] = summaries_of(part, np.ones((8, 8)), [("s0", (0, 0, 1, 1))])
    good = json.loads(json.dumps(summary.to_json()))
    assert LoadSummary.from_json(good).to_json() == summary.to_json()
    for damage in (None, -1.0, float("inf")):
        columns = copy.deepcopy(good)
        columns["rectangles"][0][1][0] = damage
        with pytest.raises(ValueError, match="damaged load summary: the costs of rectangle"):
            LoadSummary.from_json(columns)
        blocks = copy.deepcopy(good)
        blocks["blocks"][0][1] = damage
        with pytest.raises(ValueError, match="damaged load summary"):
            LoadSummary.from_json(blocks)


def test_fan_out_shares_fill_the_least_loaded_up_to_the_mean():
    costs = np.array([10.0, 0.0, 1.0, 3.0, 6.0])  # mean 4
    assert fan_out_shares(costs, 0, range(5)) == [(1, 4.0), (2, 2.0)]  # the excess, 6, is spent
    assert fan_out_shares(costs, 0, [3, 4]) == [(3, 1.0)]  # only those under the mean
    assert fan_out_shares(np.array([8.0, 2.0]), 0, [1]) == [(1, 3.0)]  # two evaluators: PS2Stream's gap / 2


def test_chaos_is_seeded_by_seed_and_batch():
    part = cost_partitioning(np.ones((20, 20)), 5)
    summaries = summaries_of(part, np.ones((20, 20)), [])
    ops = [decide(BalancerConfig(mode="chaos", seed=4), part, summaries, b) for b in range(8)]
    again = [decide(BalancerConfig(mode="chaos", seed=4), part, summaries, b) for b in range(8)]
    assert ops == again
    assert all(len(op) == 1 for op in ops)  # chaos: one operation per boundary
    assert len({op[0].moves for op in ops}) > 1


def test_moves_outside_the_source_or_emptying_an_evaluator_are_refused():
    part = Partitioning(4, np.array([[0, 0, 1, 3], [2, 0, 3, 3]]))
    with pytest.raises(RoutingError):
        apply_moves(part, [Move((1, 0, 2, 0), 0, 1)])
    with pytest.raises(RoutingError):
        apply_moves(part, [Move((0, 0, 1, 3), 0, 1)])
    new = apply_moves(part, [Move((1, 0, 1, 3), 0, 1)])
    assert new.boxes.tolist() == [[0, 0, 0, 3], [1, 0, 3, 3]]


def _object_cells(rows, size: int) -> Counter:
    """Objects per fine cell (``cy * size + cx``) among routed rows (a ROUTED_SCHEMA table)."""
    from skpub.kernel.wire import OBJECT

    objects = rows.filter(np.asarray(rows.column("kind")) == OBJECT)
    cx, cy = (objects.column(name).to_numpy().astype(np.int64) for name in ("cx0", "cy0"))
    return Counter((cy * size + cx).tolist())


@pytest.mark.parametrize("object_cost", [2, 7])
def test_an_object_costs_object_cost_units_beside_its_candidates(object_cost):
    """Each object adds ``object_cost`` to its cell beside the GI^2 candidates it met: the same stream with cost 1
    and with ``object_cost`` differs per cell by (object_cost - 1) x the objects received there (an evaluator that
    ignored the setting fails), and a stream of objects alone costs exactly ``object_cost`` per object (one that
    added a constant beside it fails)."""
    from skpub.evaluators.evaluator import Evaluator
    from skpub.kernel.config import BalancerConfig
    from skpub.kernel.text import Vocabulary
    from skpub.router.dispatch import Router
    from skpub.router.epoch import RoutingEpoch
    from skpub.router.initial import initial_table
    from tests.workloads import random_workload

    lines = [line.encode() for line in random_workload(seed=5, n=400, invalid=False)]
    cells = {}
    for cost in (1, object_cost):
        dep = deployment(evaluators=1, batch_size=400).replace(balancer=BalancerConfig(object_cost=cost))
        epoch = RoutingEpoch(0, 0, initial_table(dep, Vocabulary(), []))
        (rows,) = Router(dep, Vocabulary()).route_many(lines, 0, epoch).rows_for(1)
        stats = Evaluator(0, dep, Vocabulary()).apply_many(rows, 0).stats
        assert stats.overall == sum(stats.cells.values())
        cells[cost] = (stats.cells, stats.objects)
    (base, objects), (weighted, _) = cells[1], cells[object_cost]
    per_cell = _object_cells(rows, dep.grid_size)
    assert objects > 50 and sum(per_cell.values()) == objects
    assert weighted == {c: base[c] + (object_cost - 1) * per_cell[c] for c in base}
    # objects with the subscription's keyword, forwarded, but far from its rectangle: no GI^2 candidate
    far = [json.dumps({"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"]})]
    far += [json.dumps({"type": "object", "id": f"o{i}", "x": 50 + i % 45, "y": 60 + i % 7, "terms": ["a"]})
            for i in range(120)]  # fmt: skip
    (rows,) = Router(dep, Vocabulary()).route_many([line.encode() for line in far], 0, epoch).rows_for(1)
    stats = Evaluator(0, dep, Vocabulary()).apply_many(rows, 0).stats
    received = _object_cells(rows, dep.grid_size)
    assert stats.objects == sum(received.values()) == 120
    assert stats.cells == {c: object_cost * n for c, n in received.items()}


def test_only_a_balancing_evaluator_counts_subscriptions_in_its_load_statistics():
    """Nothing reads the load statistics when the balancer is off, so an evaluator then pays nothing for them at
    subscribes and unsubscribes (no query counted), while a balancing one counts each part held and uncounts it at
    its unsubscribe (fails if ``off`` still counts, or if ``adaptive`` stops counting)."""
    from skpub.evaluators.evaluator import Evaluator
    from skpub.kernel.text import Vocabulary
    from skpub.router.dispatch import Router
    from skpub.router.epoch import RoutingEpoch
    from skpub.router.initial import initial_table

    subscribe = [json.dumps({"type": "subscribe", "id": f"s{i}", "kind": "range", "rect": [i, i, i + 20, i + 9],
                             "keywords": ["a"]}) for i in range(6)]  # fmt: skip
    unsubscribe = [json.dumps({"type": "unsubscribe", "id": f"s{i}"}) for i in range(2)]
    for mode, counted in (("off", (0, 0)), ("adaptive", (6, 4))):
        dep = deployment(evaluators=1).replace(balancer=BalancerConfig(mode=mode))
        epoch = RoutingEpoch(0, 0, initial_table(dep, Vocabulary(), []))
        router, ev = Router(dep, Vocabulary()), Evaluator(0, dep, Vocabulary())
        ev.set_partition(epoch.table.partitioning.boxes_of(0))
        queries = []
        for batch, lines in enumerate((subscribe, unsubscribe)):
            (rows,) = router.route_many([line.encode() for line in lines], batch, epoch).rows_for(1)
            ev.apply_many(rows, batch)
            queries.append(sum(r.queries for r in ev.load.summary(0, batch).rectangles))
        assert tuple(queries) == counted, mode
        assert ev.subscriptions == 4


def test_cell_load_decays_and_renormalizes():
    load = CellLoad(10, [(0, 0, 9, 9)], 5, decay=0.5)
    load.add_cost(1, 2, 8.0)
    load.end_batch()
    load.add_cost(1, 2, 1.0)
    assert load.summary(0, 1).cost == pytest.approx(5.0)
    for _ in range(1100):  # 2**1100 overflows a float: the scale must renormalize on the way
        load.add_cost(3, 3, 2.0)
        load.end_batch()
    load.add_cost(9, 9, 1.0)
    summary = load.summary(0, 1101)
    assert summary.cost == pytest.approx(3.0)  # 1 + 2 (1/2 + 1/4 + ...)
    assert summary.rectangles[0].rows[3] == pytest.approx(2.0)
    assert summary.rectangles[0].columns[1] == 0.0  # the first costs decayed below 1e-9 and were dropped
    assert [(b.cells, round(b.cost, 9)) for b in summary.blocks] == [((0, 0, 4, 4), 2.0), ((5, 5, 9, 9), 1.0)]
    with pytest.raises(ValueError):
        CellLoad(10, [(0, 0, 9, 9)], 5, decay=0)


def test_summary_is_smaller_than_the_cells_it_summarizes():
    rng = np.random.default_rng(3)
    size = 400
    part = cost_partitioning(np.ones((size, size)), 8)
    costs = rng.random((size, size)) * (rng.random((size, size)) < 0.3)
    summaries = summaries_of(part, costs, [], block=25)
    centralized = 12 * int((costs > 0).sum())
    assert sum(s.nbytes() for s in summaries) * 5 < centralized


@examples(1)
@given(workloads(), st.integers(0, 2**16))
def test_cell_load_after_moves_equals_one_built_afresh(workload, seed):
    """After chaos moves (costs taken from sources and put at targets, subscriptions imported, new partitions
    taken), every summary equals that of a CellLoad of the final partition given the workload's costs of the cells
    it owns now (decay 1: costs follow their cells), cell by cell."""
    part, costs, subs, rng = workload
    loads, held = [], [{} for _ in range(part.count)]  # held[e]: the parts e indexes (its GI^2 boxes), id -> box

    def count(e, sid, box):  # as the evaluator counts a part: once per subscription, over the union of its parts
        old = held[e].get(sid)
        if old is not None:
            loads[e].remove_subscription(old)
            box = union_boxes(old, box)
        held[e][sid] = box
        loads[e].add_subscription(box)

    for e in range(part.count):
        load = CellLoad(part.size, part.boxes_of(e), 4, decay=1.0)
        ys, xs = np.nonzero((part.owner == e) & (costs > 0))
        for cx, cy in zip(xs.tolist(), ys.tolist(), strict=True):
            load.add_cost(cx, cy, float(costs[cy, cx]))
        loads.append(load)
        for sid, box in subs:
            if any(not (box[2] < r[0] or box[0] > r[2] or box[3] < r[1] or box[1] > r[3]) for r in part.boxes_of(e)):
                count(e, sid, box)
    for batch in range(4):
        [op] = decide(
            BalancerConfig(mode="chaos", seed=seed), part, [s.summary(e, 0) for e, s in enumerate(loads)], batch
        )
        if any(m.text for m in op.moves):  # costs follow owners here; a text split's share is an estimate
            continue
        after = apply_moves(part, op.moves)
        for m in op.moves:
            loads[m.target].put(loads[m.source].take(m.cells))
            for sid, box in subs:
                x0, y0, x1, y1 = m.cells
                if not (box[2] < x0 or box[0] > x1 or box[3] < y0 or box[1] > y1):
                    count(m.target, sid, box)
        for e in op.evaluators:
            loads[e].set_partition(after.boxes_of(e), _held_boxes(held[e]))
        part = after
    for e, load in enumerate(loads):
        fresh = CellLoad(part.size, part.boxes_of(e), 4, decay=1.0)
        ys, xs = np.nonzero((part.owner == e) & (costs > 0))  # the cells e owns at the end, with their costs
        for cx, cy in zip(xs.tolist(), ys.tolist(), strict=True):
            fresh.add_cost(cx, cy, float(costs[cy, cx]))
        for box in held[e].values():
            fresh.add_subscription(box)
        got, want = load.summary(e, 0), fresh.summary(e, 0)
        restored = CellLoad(part.size, [], 4, decay=1.0)
        restored.restore(load.to_document(), _held_boxes(held[e]))
        assert restored.summary(e, 0).to_json() == got.to_json(), "the state store's copy sends the same summary"
        assert LoadSummary.from_json(json.loads(json.dumps(got.to_json()))).to_json() == got.to_json()
        assert [r.box for r in got.rectangles] == [r.box for r in want.rectangles]
        for a, b in zip(got.rectangles, want.rectangles, strict=True):
            np.testing.assert_allclose(a.columns, b.columns, atol=1e-9)
            np.testing.assert_allclose(a.rows, b.rows, atol=1e-9)
            for name in ("starts_x", "ends_x", "starts_y", "ends_y"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert [(b.cells, round(b.cost, 6), b.queries) for b in got.blocks] == [
            (b.cells, round(b.cost, 6), b.queries) for b in want.blocks
        ]


def _boxes(side: int):
    """Cell boxes ``(x0, y0, x1, y1)`` of a ``side`` x ``side`` grid, corners in either order."""
    corner = st.integers(0, side - 1)
    return st.tuples(corner, corner, corner, corner).map(
        lambda b: (min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3]))
    )


_BOX = _boxes(20)


@examples(0.6)
@given(held=st.lists(_BOX, max_size=40), moved=st.lists(_BOX, min_size=1, max_size=5))
def test_a_source_exports_over_each_moved_box_the_subscriptions_it_holds_there_clipped(held, moved):
    """What a hand-off carries per move: every subscription whose box meets the moved cells, clipped to them, in
    stream order, as plain ints (they go to JSON); the scan it replaced is the reference."""
    from skpub.evaluators.evaluator import Evaluator
    from skpub.kernel.geometry import Rect
    from skpub.kernel.records import RangeSubscription
    from skpub.kernel.text import Vocabulary, parse_expression

    evaluator = Evaluator(0, deployment(evaluators=2), Vocabulary())
    subs = [
        (RangeSubscription(40 - i, f"s{i}", Rect(0, 0, 1, 1), parse_expression("a")), b) for i, b in enumerate(held)
    ]
    for sub, box in subs:
        evaluator._insert(sub, box)
    exported = evaluator.export_cells(moved)
    for (x0, y0, x1, y1), parts in zip(moved, exported, strict=True):
        expected = sorted(
            ((sub, (max(b[0], x0), max(b[1], y0), min(b[2], x1), min(b[3], y1))) for sub, b in subs
             if b[0] <= x1 and b[2] >= x0 and b[1] <= y1 and b[3] >= y0),
            key=lambda item: item[0].pos,
        )  # fmt: skip
        assert parts == expected
        assert all(type(v) is int for _, box in parts for v in box)


@examples(1)
@given(
    boxes=st.lists(_BOX, max_size=12),
    others=st.lists(_BOX, max_size=6),
    per_step=st.sampled_from([1, 3, 1 << 20]),
)
def test_meets_any_answers_as_a_box_by_box_test_in_any_step(boxes, others, per_step):
    """kernel.grid.meets_any (a take-over's drop test): per box, whether it shares a cell with any other box, the
    same whatever the pairs tested per numpy step."""
    from skpub.kernel import grid

    expected = [any(grid.intersect_boxes(a, b) is not None for b in others) for a in boxes]
    default, grid.BOX_TESTS_PER_STEP = grid.BOX_TESTS_PER_STEP, per_step
    try:
        got = grid.meets_any(np.array(boxes, dtype=np.int64).reshape(-1, 4), np.array(others).reshape(-1, 4))
    finally:
        grid.BOX_TESTS_PER_STEP = default
    assert got.dtype == bool and got.tolist() == expected


@examples(0.6)
@given(
    held=st.lists(_BOX, max_size=12),
    carried=st.lists(st.tuples(st.integers(0, 15), _BOX), max_size=20),
    wide_entries=st.sampled_from([4, 30, 65_536]),
)
def test_a_target_indexes_what_is_carried_over_the_union_with_what_it_holds(held, carried, wide_entries):
    """A take-over's import: a subscription held already or carried twice ends indexed once, over the bounding
    box of all its parts, exactly as an evaluator that indexed those boxes afresh: GI^2's cell and wide lists and
    entry counts, the blocks, and the load statistics' subscription counts over a partition of two rectangles."""
    from skpub.evaluators import gi2, window
    from skpub.evaluators.evaluator import Evaluator, decode_block
    from skpub.kernel.geometry import Rect
    from skpub.kernel.records import RangeSubscription
    from skpub.kernel.text import Vocabulary, parse_expression

    expressions = ["a", "a OR b", "a AND c", "(a AND b) OR c OR d"]
    subs = [
        RangeSubscription(i, f"s{i}", Rect(0, 0, 1, 1), parse_expression(expressions[i % len(expressions)]))
        for i in range(16)
    ]
    target, fresh = (Evaluator(0, deployment(evaluators=2), Vocabulary(10, {"a": 5, "b": 3})) for _ in range(2))
    for ev in (target, fresh):
        ev.index.index_block = 2  # boxes of up to 20 x 20 cells meet up to 100 index cells: some are wide below
        ev.set_partition([(0, 0, 9, 19), (10, 0, 19, 19)])
    want: dict[int, tuple] = {}
    gi2.WIDE_ENTRIES, default = wide_entries, gi2.WIDE_ENTRIES
    window.STATE_BLOCK, state_block = 4, window.STATE_BLOCK  # state blocks smaller than the grid: a union moves keys
    try:
        for i, box in enumerate(held):
            target._insert(subs[i], box)
            want[i] = box
        store = {k: v for k, v in target.take_dirty_blocks().items() if v is not None}
        target.import_subscriptions([(subs[i], box) for i, box in carried])
        for key, data in target.take_dirty_blocks().items():  # what Spark's state store keeps of the import
            if data is None:
                store.pop(key, None)
            else:
                store[key] = data
        restored = Evaluator.restore(0, deployment(evaluators=2), target.index.vocabulary, store)
        for i, box in carried:
            want[i] = union_boxes(want[i], box) if i in want else box
        for i, box in sorted(want.items()):
            fresh._insert(subs[i], box)
        blocks = [{k: decode_block(v) for k, v in ev.encode_blocks().items()} for ev in (target, fresh, restored)]
    finally:
        gi2.WIDE_ENTRIES, window.STATE_BLOCK = default, state_block
    assert {sid: target.index.box_of(sid) for sid in target.range_ids()} == {f"s{i}": box for i, box in want.items()}

    assert target.index.postings() == fresh.index.postings() == restored.index.postings()
    assert set(target.index.slot_of) == set(fresh.index.slot_of) == set(restored.index.slot_of)
    assert set(restored.range_ids()) == set(target.range_ids())
    assert {k: decode_block(v) for k, v in store.items()} == blocks[0] == blocks[1] == blocks[2]
    got, built = target.load.summary(0, 0), fresh.load.summary(0, 0)
    assert [b.queries for b in got.blocks] == [b.queries for b in built.blocks]
    for a, b in zip(got.rectangles, built.rectangles, strict=True):
        for name in ("starts_x", "ends_x", "starts_y", "ends_y"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def _guillotine(draw, box, depth):
    """Rectangles tiling ``box``, cut at random along random axes (at most ``depth`` cuts deep)."""
    x0, y0, x1, y1 = box
    if depth == 0 or (x0 == x1 and y0 == y1) or not draw(st.booleans()):
        return [box]
    vertical = x1 > x0 and (y0 == y1 or draw(st.booleans()))
    if vertical:
        cut = draw(st.integers(x0, x1 - 1))
        halves = (x0, y0, cut, y1), (cut + 1, y0, x1, y1)
    else:
        cut = draw(st.integers(y0, y1 - 1))
        halves = (x0, y0, x1, cut), (x0, cut + 1, x1, y1)
    return [r for half in halves for r in _guillotine(draw, half, depth - 1)]


@st.composite
def _partitionings(draw):
    size = draw(st.integers(2, 12))
    boxes = _guillotine(draw, (0, 0, size - 1, size - 1), 6)
    owners = list(range(min(len(boxes), 4)))
    owners += [draw(st.integers(0, len(owners) - 1)) for _ in boxes[len(owners) :]]
    return Partitioning(size, np.array(boxes), np.array(draw(st.permutations(owners))))


@examples(2)
@given(partitioning=_partitionings())
def test_adjacent_rectangles_are_the_pairs_of_other_owners_sharing_an_edge_stretch(partitioning):
    """Against the brute force over every pair of rectangles (the vectorized pass over the grid is skpub's)."""
    from skpub.balancer.adjacency import adjacent_rectangles

    boxes, owners = partitioning.boxes.tolist(), partitioning.owners.tolist()

    def touch(a, b):
        across = a[2] + 1 == b[0] or b[2] + 1 == a[0]
        above = a[3] + 1 == b[1] or b[3] + 1 == a[1]
        overlap_y, overlap_x = a[1] <= b[3] and b[1] <= a[3], a[0] <= b[2] and b[0] <= a[2]
        return (across and overlap_y) or (above and overlap_x)

    expected = [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                if owners[i] != owners[j] and touch(boxes[i], boxes[j])]  # fmt: skip
    assert adjacent_rectangles(partitioning) == expected


def test_adjacent_rectangles_answer_for_the_partitioning_asked_about_not_the_last_one():
    """Rectangles sharing an edge between different owners; the memo of the last partitioning never leaks."""
    from skpub.balancer.adjacency import adjacent_rectangles

    halves = Partitioning(4, np.array([[0, 0, 1, 3], [2, 0, 3, 3]]))
    quarters = Partitioning(4, np.array([[0, 0, 1, 1], [2, 0, 3, 1], [0, 2, 1, 3], [2, 2, 3, 3]]))
    one_owner = Partitioning(4, np.array([[0, 0, 1, 3], [2, 0, 3, 3]]), np.array([0, 0]))
    for _ in range(2):
        assert adjacent_rectangles(halves) == [(0, 1)]
        assert adjacent_rectangles(quarters) == [(0, 1), (0, 2), (1, 3), (2, 3)]
        assert adjacent_rectangles(quarters) == [(0, 1), (0, 2), (1, 3), (2, 3)]
        assert adjacent_rectangles(one_owner) == []
    pairs = adjacent_rectangles(halves)
    pairs.append((7, 7))  # a caller's list is its own
    assert adjacent_rectangles(halves) == [(0, 1)]


def test_the_drift_benchmark_measures_each_phase_on_the_batches_holding_its_objects():
    """benchmarks/balancer.py's phase windows (its imbalance per phase is the issue's target): a batch straddling
    a phase change belongs to both phases, batches without objects to none."""
    from benchmarks.balancer import phase_batches

    assert phase_batches([10, 10, 10, 10], 2) == [[0, 1], [2, 3]]
    assert phase_batches([10, 15, 5, 10], 2) == [[0, 1], [1, 2, 3]]
    assert phase_batches([0, 40, 0, 40], 2) == [[1], [3]]
    assert phase_batches([], 4) == [[], [], [], []]


def test_a_load_document_of_format_1_is_read_for_its_cells_and_a_damaged_one_is_refused():
    """The state store's document of an skpub before 2026-11-29 (aggregates written too) restores the same
    summary; a rectangle without cost sums to float zeros; a damaged document is a ValueError, never a crash."""
    load = CellLoad(10, [(0, 0, 4, 9), (5, 0, 9, 9)], 5, decay=0.5)
    load.add_cost(1, 2, 8.0)
    load.end_batch()
    assert json.loads(load.to_document()) == {
        "format": 2, "scale": 2.0, "cells": [[21], [8.0]], "rectangles": [[0, 0, 4, 9], [5, 0, 9, 9]],
    }  # fmt: skip
    old = {"format": 1, "scale": 2.0, "cells": [[21], [8.0]], "blocks": [[0, 0, 0, 8.0]],
           "rectangles": [[[0, 0, 4, 9], [0.0, 8.0, 0.0, 0.0, 0.0], [0.0] * 2 + [8.0] + [0.0] * 7],
                          [[5, 0, 9, 9], [0.0] * 5, [0.0] * 10]]}  # fmt: skip
    restored = CellLoad(10, [], 5, decay=0.5)
    restored.restore(json.dumps(old).encode(), _held_boxes({}))
    summary = restored.summary(0, 1)
    assert summary.to_json() == load.summary(0, 1).to_json() and summary.cost == 4.0
    assert summary.rectangles[1].columns.dtype == np.float64 and not summary.rectangles[1].columns.any()
    damages = [
        {"format": 3},
        {"cells": [[21, 5], [1.0, 1.0]]},
        {"cells": [[100], [1.0]]},
        {"cells": [[21], []]},
        {"cells": [[21], [-1.0]]},
        {"rectangles": [[[0, 0, 4, 10], [], []]]},
        {"scale": "x"},
        {"scale": 0.0},
    ]
    overlapping = {**old, "format": 2, "rectangles": [[0, 0, 4, 9], [4, 0, 9, 9]]}  # a cell counted twice
    for damaged in [{**old, **damage} for damage in damages] + [{"format": 2}, overlapping]:
        with pytest.raises(ValueError, match="damaged load statistics"):
            restored.restore(json.dumps(damaged).encode(), _held_boxes({}))
    restored.restore(json.dumps({**overlapping, "rectangles": [[0, 0, 3, 9], [4, 0, 9, 9]]}).encode(), _held_boxes({}))


def _counted_reference(parts: dict[str, tuple], rectangles: list[tuple], block: int) -> tuple[list, dict]:
    """Query counts by brute force: per rectangle, the parts' clipped starts and ends; per (rectangle, block) key,
    the parts meeting the block's cells inside the rectangle, cell by cell."""
    sides, blocks = [], Counter()
    for i, (x0, y0, x1, y1) in enumerate(rectangles):
        sx, ex, sy, ey = [0] * (x1 - x0 + 1), [0] * (x1 - x0 + 1), [0] * (y1 - y0 + 1), [0] * (y1 - y0 + 1)
        for bx0, by0, bx1, by1 in parts.values():
            cells = [
                (x, y) for x in range(max(x0, bx0), min(x1, bx1) + 1) for y in range(max(y0, by0), min(y1, by1) + 1)
            ]
            if not cells:
                continue
            sx[min(x for x, _ in cells) - x0] += 1
            ex[max(x for x, _ in cells) - x0] += 1
            sy[min(y for _, y in cells) - y0] += 1
            ey[max(y for _, y in cells) - y0] += 1
            for key in {(i, x // block, y // block) for x, y in cells}:
                blocks[key] += 1
        sides.append((sx, ex, sy, ey))
    return sides, dict(blocks)


@st.composite
def _count_scripts(draw):
    """A partition of a 13 x 13 grid (blocks of 3: the last block is short), then subscribes, unsubscribes,
    repartitions (each rectangle kept or cut again, or a whole new partition), restores and summaries."""
    current = _guillotine(draw, (0, 0, 12, 12), 4)
    script = [list(current)]
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["add", "add", "add", "remove", "partition", "restore", "summary"]))
        if kind == "add":
            script.append(("add", f"s{draw(st.integers(0, 9))}", draw(_boxes(13))))
        elif kind == "remove":
            script.append(("remove", f"s{draw(st.integers(0, 9))}"))
        elif kind == "partition":
            if draw(st.booleans()):
                current = [r for box in current for r in (_guillotine(draw, box, 2) if draw(st.booleans()) else [box])]
            else:
                current = _guillotine(draw, (0, 0, 12, 12), 4)
            script.append(("partition", list(current)))
        else:
            script.append((kind,))
    return script


@pytest.mark.parametrize("limits", [None, (3, 2)], ids=["default limits", "a flush every 3 notes, chunks of 2 pairs"])
@examples(1.5)
@given(script=_count_scripts())
def test_query_counts_noted_per_part_and_counted_per_batch_equal_the_brute_force_count(limits, script):
    """Subscribes and unsubscribes are noted and counted together when read (a summary or a new partition): at
    every read the counts equal a count of the parts held, clipped to each rectangle, made cell by cell; a part
    brought again for a held id counts once over the union of both boxes; a restored copy counts the same."""
    import skpub.evaluators.load as load_module

    saved = load_module._PENDING_MAX, load_module._CHUNK_ENTRIES
    if limits is not None:
        load_module._PENDING_MAX, load_module._CHUNK_ENTRIES = limits
    try:
        _run_count_script(script)
    finally:
        load_module._PENDING_MAX, load_module._CHUNK_ENTRIES = saved


def _run_count_script(script: list) -> None:
    rectangles, *steps = script
    load, parts = CellLoad(13, rectangles, 3, decay=1.0), {}
    for step in [*steps, ("summary",)]:
        if step[0] == "add":
            sid, box = step[1], step[2]
            old = parts.get(sid)
            parts[sid] = box if old is None else (min(old[0], box[0]), min(old[1], box[1]),
                                                  max(old[2], box[2]), max(old[3], box[3]))  # fmt: skip
            if old is not None:  # as the evaluator counts a part it holds already: once, over the union
                load.remove_subscription(old)
            load.add_subscription(parts[sid])
        elif step[0] == "remove":
            if step[1] in parts:
                load.remove_subscription(parts.pop(step[1]))
        elif step[0] == "partition":
            rectangles = step[1]
            load.set_partition(rectangles, _held_boxes(parts))
        elif step[0] == "restore":  # in place: what it holds, noted parts included, is replaced
            load.restore(load.to_document(), _held_boxes(parts))
        else:
            got = load.summary(0, 0)
            sides, blocks = _counted_reference(parts, rectangles, 3)
            assert [r.box for r in got.rectangles] == [tuple(r) for r in rectangles]
            for r, want in zip(got.rectangles, sides, strict=True):
                assert [r.starts_x.tolist(), r.ends_x.tolist(), r.starts_y.tolist(), r.ends_y.tolist()] == list(want)
            assert {b.cells: b.queries for b in got.blocks if b.queries} == {
                _block_cells(rectangles[i], gx, gy, 3): n for (i, gx, gy), n in blocks.items()
            }


def _block_cells(rectangle: tuple, gx: int, gy: int, block: int) -> tuple:
    x0, y0, x1, y1 = rectangle
    return (max(x0, gx * block), max(y0, gy * block), min(x1, gx * block + block - 1), min(y1, gy * block + block - 1))


@st.composite
def _costed_partitions(draw):
    """A partition of some of a 13 x 13 grid (blocks of 3), costs on random cells of it, parts over random boxes."""
    rectangles = [r for r in _guillotine(draw, (0, 0, 12, 12), 4) if draw(st.integers(0, 4))]  # some cells owned
    cells = [(x, y) for x0, y0, x1, y1 in rectangles for x in range(x0, x1 + 1) for y in range(y0, y1 + 1)]
    costed = draw(st.lists(st.sampled_from(cells), max_size=60)) if cells else []
    costs = [(x, y, draw(st.floats(0.01, 1e6))) for x, y in costed]
    parts = draw(st.lists(_boxes(13), max_size=8))
    return rectangles, costs, parts, draw(st.integers(0, 3))


@pytest.mark.parametrize("chunk", [None, 3], ids=["default chunks", "chunks of 3 part-rectangle pairs"])
@examples(1.5)
@given(case=_costed_partitions())
def test_a_summary_sums_each_rectangles_cells_in_cell_id_order_as_a_brute_force_does(chunk, case):
    """Every rectangle's columns and rows, and every grid^t block with cost or a part (by rectangle, block column,
    block row, clipped to its rectangle), equal sums made cell by cell in cell-id order, divided by the scale:
    the same floats, whatever the number of rectangles (the summary lays them end to end in one pass)."""
    import skpub.evaluators.load as load_module

    rectangles, costs, parts, batches = case
    saved = load_module._CHUNK_ENTRIES
    if chunk is not None:
        load_module._CHUNK_ENTRIES = chunk
    try:
        load = CellLoad(13, rectangles, 3, decay=0.5)
        for x, y, cost in costs:
            load.add_cost(x, y, cost)
        for _ in range(batches):
            load.end_batch()
        for box in parts:
            load.add_subscription(box)
        got = load.summary(0, 0)
    finally:
        load_module._CHUNK_ENTRIES = saved
    raw = dict(zip(load._ids.tolist(), load._raw.tolist(), strict=True))
    scale = load._scale

    def summed(cells):  # cell-id order, as the summary's bincount adds them
        total = 0.0
        for cell in sorted(cells):
            total += raw.get(cell, 0.0)
        return total / scale

    sides, counted = _counted_reference(dict(enumerate(parts)), rectangles, 3)
    assert [r.box for r in got.rectangles] == [tuple(r) for r in rectangles]
    want_blocks = []
    for i, ((x0, y0, x1, y1), r) in enumerate(zip(rectangles, got.rectangles, strict=True)):
        column_cells = [[y * 13 + x for y in range(y0, y1 + 1)] for x in range(x0, x1 + 1)]
        row_cells = [[y * 13 + x for x in range(x0, x1 + 1)] for y in range(y0, y1 + 1)]
        assert r.columns.tolist() == [summed(c) for c in column_cells]
        assert r.rows.tolist() == [summed(c) for c in row_cells]
        assert [r.starts_x.tolist(), r.ends_x.tolist(), r.starts_y.tolist(), r.ends_y.tolist()] == list(sides[i])
        for gx in range(x0 // 3, x1 // 3 + 1):
            for gy in range(y0 // 3, y1 // 3 + 1):
                box = (max(gx * 3, x0), max(gy * 3, y0), min(gx * 3 + 2, x1), min(gy * 3 + 2, y1))
                cells = [y * 13 + x for x in range(box[0], box[2] + 1) for y in range(box[1], box[3] + 1)]
                queries = counted.get((i, gx, gy), 0)
                if any(c in raw for c in cells) or queries:
                    want_blocks.append((box, summed(cells), queries))
    assert [(b.cells, b.cost, b.queries) for b in got.blocks] == want_blocks


def test_a_count_of_noted_parts_that_fails_changes_nothing_and_is_made_at_the_next_read(monkeypatch):
    """Counting the parts noted since the last read is all or nothing: should it fail (memory), no count changed
    and the notes wait, so the next summary equals that of statistics that never failed."""
    import skpub.evaluators.load as load_module

    rects = [(0, 0, 6, 12), (7, 0, 12, 12)]
    loads = [CellLoad(13, rects, 3, decay=1.0) for _ in range(2)]
    for load in loads:
        for box in [(0, 0, 8, 3), (5, 5, 12, 12), (2, 9, 3, 10)]:
            load.add_subscription(box)
        load.summary(0, 0)
        load.remove_subscription((5, 5, 12, 12))
        load.add_subscription((1, 1, 11, 2))
    real, calls = load_module._signed_count, []

    def failing(at, up, size):
        calls.append(size)
        if len(calls) == 3:  # some of the counts are computed by then
            raise MemoryError("injected")
        return real(at, up, size)

    monkeypatch.setattr(load_module, "_signed_count", failing)
    with pytest.raises(MemoryError):
        loads[0].summary(0, 1)
    monkeypatch.setattr(load_module, "_signed_count", real)
    assert loads[0].summary(0, 1).to_json() == loads[1].summary(0, 1).to_json()


@examples(0.5)
@given(seed=st.integers(0, 10_000), skipped=st.sets(st.integers(0, 7)))
def test_a_batch_without_a_summary_changes_no_later_summary(seed, skipped):
    """A transfer batch only ages the statistics (no summary, its parts left uncounted): every later summary equals
    the one of statistics summarized after every batch (fails if a skipped summary's counting were lost)."""
    rng = np.random.default_rng(seed)
    every, some = (CellLoad(12, [(0, 0, 5, 11), (6, 0, 11, 11)], 3, decay=0.5) for _ in range(2))
    held: list = []
    for batch in range(8):
        costs = {int(c): float(rng.uniform(0, 5)) for c in rng.integers(0, 144, 6)}
        boxes = [tuple(int(v) for v in (x, y, x + rng.integers(0, 4), y + rng.integers(0, 4)))
                 for x, y in rng.integers(0, 8, (3, 2))]  # fmt: skip
        gone = held[: int(rng.integers(0, len(held) + 1))]
        held = held[len(gone) :] + boxes
        for load in (every, some):
            load.add_costs(costs)
            load.add_subscriptions(boxes)
            load.remove_subscriptions(gone)
        expected = every.summary(0, batch)
        every.end_batch()
        if batch in skipped:
            some.end_batch()  # Evaluator.age_load
        else:
            assert some.summary(0, batch).to_json() == expected.to_json()
            some.end_batch()


@pytest.mark.parametrize("failing", ["state_block", "delete_many", "remove_subscriptions"])
def test_unsubscribes_that_fail_at_once_leave_the_evaluator_as_it_was(monkeypatch, failing):
    """Evaluator._delete_many is all or nothing: whichever step fails, every subscription stays held, the load
    statistics count what they counted, and no block lost its mark (fails if the load were left short, or GI^2
    kept a deletion the statistics undid)."""
    from skpub.evaluators import evaluator as evaluator_module
    from skpub.evaluators.evaluator import Evaluator
    from skpub.evaluators.gi2 import GI2Index
    from skpub.kernel.geometry import Rect
    from skpub.kernel.records import RangeSubscription
    from skpub.kernel.text import Vocabulary, parse_expression

    dep = deployment(evaluators=2).replace(balancer=BalancerConfig(mode="adaptive"))
    ev = Evaluator(0, dep, Vocabulary())
    ev.set_partition([(0, 0, dep.grid_size - 1, dep.grid_size - 1)])
    boxes = [(0, 0, 3, 3), (10, 10, 12, 19), (30, 5, 30, 5)]
    for i, box in enumerate(boxes):
        ev._insert(RangeSubscription(i, f"s{i}", Rect(0, 0, 1, 1), parse_expression("a")), box)
    ev.take_dirty_blocks()
    before = ev.load.summary(0, 0).to_json()

    def fail(*args, **kwargs):
        raise MemoryError("injected")

    target = {"state_block": evaluator_module, "delete_many": GI2Index, "remove_subscriptions": CellLoad}[failing]
    monkeypatch.setattr(target, failing, fail)
    with pytest.raises(MemoryError):
        ev._delete_many(["s0", "s2"], [5, 6])
    monkeypatch.undo()
    assert all(f"s{i}" in ev.index for i in range(3))
    assert ev.load.summary(0, 0).to_json() == before
    ev._delete_many(["s0", "s2"], [5, 6])  # and it can be applied again, once
    assert "s0" not in ev.index and "s1" in ev.index and "s2" not in ev.index
    assert len(ev.take_dirty_blocks()) >= 1
