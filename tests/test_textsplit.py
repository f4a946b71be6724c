"""PS2Stream V-A phase I: text splits and merges reshape the partitioning and change no result."""

import numpy as np
import pytest

from skpub.balancer.migration import greedy, migration
from skpub.balancer.operation import Loads, apply_moves
from skpub.balancer.policy import adaptive
from skpub.balancer.textsplit import concentrated, mergeable, phase_one, text_merge, text_split
from skpub.evaluators.load import CellLoad
from skpub.kernel.config import BalancerConfig, Window
from skpub.kernel.load import BlockLoad, LoadSummary, RectangleLoad
from skpub.kernel.parts import read_stream
from skpub.kernel.text import hashed_evaluator
from skpub.kernel.transfer import Move
from skpub.router.errors import RoutingError
from skpub.router.gridt import TermTable
from skpub.router.partitioning import Partitioning
from tests.test_rebalancing import chaos, per_batch, run
from tests.tiers import tiered
from tests.workloads import assert_outputs_equal_oracle, deployment, random_workload, ranked_workload

BOXES = np.array([[0, 0, 3, 7], [4, 0, 7, 3], [4, 4, 7, 7]])


def rect(box, cost, queries, hot=False):
    """A rectangle's load: ``cost`` spread evenly (``hot``: all in its first cell), ``queries`` over all of it."""
    w, h = box[2] - box[0] + 1, box[3] - box[1] + 1
    first_x, last_x, first_y, last_y = (np.zeros(n, np.int64) for n in (w, w, h, h))
    first_x[0] = last_x[-1] = first_y[0] = last_y[-1] = queries
    columns, rows = np.full(w, cost / w), np.full(h, cost / h)
    if hot:
        columns, rows = np.eye(1, w).ravel() * cost, np.eye(1, h).ravel() * cost
    return RectangleLoad(tuple(box), columns, rows, first_x, last_x, first_y, last_y)


def summary(e, *rects):
    return LoadSummary(e, 0, tuple(rect(*r) for r in rects), ())


def summaries(costs):
    """One summary per evaluator: rectangle ``e`` of ``BOXES`` costs ``costs[e]``, with 10 subscriptions."""
    return [summary(e, (tuple(BOXES[e].tolist()), cost, 10)) for e, cost in enumerate(costs)]


def test_a_split_shares_a_rectangle_by_terms_and_a_merge_gives_it_back_whole():
    part = Partitioning(8, BOXES, np.array([0, 1, 2]))
    split = apply_moves(part, [Move((4, 4, 7, 7), 2, 0, text="split")])
    (i,) = [i for i, t in enumerate(split.texts) if t is not None]
    assert split.texts[i] == TermTable((2, 0)) and split.owners[i] == 2 and tuple(split.boxes[i]) == (4, 4, 7, 7)
    assert split.boxes_of(0) == [(0, 0, 3, 7), (4, 4, 7, 7)]
    # 2 holds nothing else, so only 0 may leave it; leaving gives back the partitioning split
    assert mergeable(split, i, 0) and not mergeable(split, i, 2) and not mergeable(split, i, 1)
    merged = apply_moves(split, [Move((4, 4, 7, 7), 0, 2, text="merge")])
    assert (merged.owner == part.owner).all() and not merged.has_text and merged.count == 3
    with pytest.raises(RoutingError, match="no cell"):
        apply_moves(split, [Move((4, 4, 7, 7), 2, 0, text="merge")])
    with pytest.raises(RoutingError, match="no such rectangle"):
        apply_moves(part, [Move((4, 4, 7, 6), 2, 0, text="split")])
    with pytest.raises(RoutingError, match="no such rectangle"):
        apply_moves(part, [Move((4, 4, 7, 7), 2, 0, text="merge")])
    with pytest.raises(ValueError):
        Move((0, 0, 1, 1), 0, 1, text="shuffle")
    move = Move((4, 4, 7, 7), 2, 0, 3.5, 4, "split")
    assert Move.from_json(move.to_json()) == move and "text" not in Move((0, 0, 1, 1), 0, 1).to_json()


def test_a_split_moves_half_the_load_and_a_merge_all_of_the_leaving_share():
    part = Partitioning(8, BOXES, np.array([0, 1, 2]))
    loads = Loads(part, summaries([100.0, 10.0, 10.0]), beta=1.0)
    op = text_split(part, loads, 0, 1)
    assert op.kind == "text_split" and op.moves[0].cost == 50.0 and op.moves[0].queries == 5
    assert op.costs_after == (50.0, 60.0, 10.0) and op.c_r == 40.0 and op.c_t == 5.0
    split = apply_moves(part, op.moves)
    box = (0, 0, 3, 7)
    shares = [summary(0, (box, 60.0, 10)), summary(1, (box, 30.0, 6), ((4, 0, 7, 3), 20.0, 4, True)),
              summary(2, ((4, 4, 7, 7), 10.0, 10))]  # fmt: skip
    loads = Loads(split, shares, beta=1.0)
    i = next(i for i, t in enumerate(split.texts) if t is not None)
    merge = text_merge(split, loads, i, 1)
    assert merge.moves[0] == Move(box, 1, 0, 30.0, 6, "merge")
    assert phase_one(split, loads, 0, [1, 2]) == []  # 0 holds no plain rectangle, nor another to stay in
    assert {o.kind for o in phase_one(split, loads, 1, [0, 2])} == {"text_split", "text_merge"}


def test_an_evaluator_leaves_a_text_rectangle_of_three_by_a_merge_into_the_lightest_it_shares_it_with():
    boxes = np.array([[0, 0, 3, 7], [4, 0, 7, 7]])
    whole = Partitioning(8, boxes, np.array([0, 1]), (TermTable((0, 1, 2)), TermTable((1, 2, 0))))
    assert mergeable(whole, 0, 0) and mergeable(whole, 0, 2)
    shares = [summary(e, ((0, 0, 3, 7), cost, 4), ((4, 0, 7, 7), cost, 4)) for e, cost in enumerate([90.0, 30, 10])]
    loads = Loads(whole, shares, beta=1.0)
    (op,) = [o for o in phase_one(whole, loads, 0, [1, 2]) if o.moves[0].cells == (0, 0, 3, 7)]
    assert op.kind == "text_merge" and op.moves[0] == Move((0, 0, 3, 7), 0, 2, 90.0, 4, "merge")  # 2 is lightest
    merged = apply_moves(whole, op.moves)

    def at(part, box):
        """The table and owner of ``part``'s rectangle ``box``."""
        i = [tuple(b) for b in part.boxes.tolist()].index(box)
        return part.texts[i], int(part.owners[i])

    left, right = (0, 0, 3, 7), (4, 0, 7, 7)
    assert at(merged, left) == (TermTable((0, 1, 2)).without(0, 2), 2)  # 0 was its primary: 2 takes over
    assert at(merged, left)[0].evaluators == (2, 1) and at(merged, right) == (whole.texts[1], 1)
    assert merged.boxes_of(0) == [right]
    again = apply_moves(merged, [Move(left, 1, 2, text="merge")])  # of two left, the rectangle becomes plain
    assert at(again, left) == (None, 2)
    assert not mergeable(again, [tuple(b) for b in again.boxes.tolist()].index(right), 0)  # 0 holds nothing else
    with pytest.raises(RoutingError, match="no cell"):
        apply_moves(again, [Move(right, 0, 1, text="merge")])


def test_a_load_is_concentrated_when_every_cut_leaves_one_side_over_three_quarters():
    box = (0, 0, 3, 1)
    assert concentrated(rect(box, 80.0, 5, hot=True)) and concentrated(rect((2, 2, 2, 2), 1.0, 1))
    assert not concentrated(rect(box, 80.0, 5)) and not concentrated(rect(box, 0.0, 5)) and not concentrated(None)
    z = np.zeros(2, np.int64)
    # a quarter on one side of a column cut: spread; the rows are cut too
    assert not concentrated(RectangleLoad((0, 0, 1, 1), np.array([20.0, 60.0]), np.array([80.0, 0.0]), z, z, z, z))
    assert concentrated(RectangleLoad((0, 0, 1, 1), np.array([19.0, 61.0]), np.array([80.0, 0.0]), z, z, z, z))
    assert not concentrated(RectangleLoad((0, 0, 1, 1), np.array([19.0, 61.0]), np.array([60.0, 20.0]), z, z, z, z))
    one_row = [np.zeros(5, np.int64)] * 2 + [np.zeros(1, np.int64)] * 2
    middle = np.array([1.0, 1.0, 96.0, 1.0, 1.0])  # a hot middle column of a one-row rectangle: no cut halves it
    assert concentrated(RectangleLoad((0, 0, 4, 0), middle, np.array([100.0]), *one_row))
    assert not concentrated(RectangleLoad((0, 0, 1, 1), np.array([40.0, 40.0]), np.array([40.0, 40.0]), z, z, z, z))
    nan = RectangleLoad((0, 0, 1, 1), np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), z, z, z, z)
    assert not concentrated(nan)  # a damaged summary never makes a rectangle a text split's candidate


def test_phase_one_never_splits_by_text_a_rectangle_whose_load_cells_can_spread():
    # a text rectangle is frozen for every later move of cells: a wide hot one would stay with two evaluators
    part = Partitioning(8, BOXES, np.array([0, 1, 2]))
    spread = [summary(0, (tuple(BOXES[0].tolist()), 900.0, 10)), *summaries([0.0, 50.0, 50.0])[1:]]
    assert phase_one(part, Loads(part, spread, beta=1.0), 0, [1, 2]) == []
    ops = adaptive(part, Loads(part, spread, beta=1.0), sigma=1.2)
    assert ops and "text_split" not in {o.kind for o in ops}
    hot = [summary(0, (tuple(BOXES[0].tolist()), 900.0, 10, True)), *spread[1:]]
    assert [o.kind for o in phase_one(part, Loads(part, hot, beta=1.0), 0, [1, 2])] == ["text_split"]


def test_adaptive_splits_by_text_a_hot_rectangle_no_move_of_cells_can_spread():
    # one hot single-cell rectangle: no shift or migration can leave both sides under the old maximum
    boxes = np.array([[0, 0, 0, 0], [1, 0, 3, 3], [0, 1, 0, 3]])
    part = Partitioning(4, boxes, np.array([0, 1, 2]))
    loads = [summary(e, (tuple(boxes[e].tolist()), c, 10)) for e, c in enumerate([900.0, 50.0, 50.0])]
    ops = adaptive(part, Loads(part, loads, beta=1.0), sigma=1.2)
    assert ops[0].kind == "text_split" and ops[0].moves[0].source == 0 and ops[0].moves[0].target in (1, 2)


def test_an_evaluator_hands_over_on_a_split_exactly_the_subscriptions_the_new_table_sends_to_the_target():
    # the term table's hash and the evaluator's selection are one function
    for term in ("jazz", "sushi", "café", "x" * 50):
        assert TermTable((5, 2)).evaluator_of(term) == hashed_evaluator(term, (2, 5))


@pytest.mark.parametrize(
    ("router", "evaluators", "batch_size"),
    tiered(
        ((r, e, b) for r in ["agrid", "kdt", "text", "uniform"] for e, b in [(2, 1), (2, 7), (4, 7), (8, 25)]),
        fast={("kdt", 4, 7)},
    ),
)
def test_text_splits_and_merges_under_chaos_equal_the_oracle_and_the_run_without_them(
    tmp_path, router, evaluators, batch_size
):
    lines = random_workload(seed=evaluators * 5 + batch_size, n=500, invalid=False)
    lines += ranked_workload(seed=batch_size, n=200)
    dep = deployment(evaluators=evaluators, router=router, batch_size=batch_size).replace(window=Window("count", 40))
    seen = set()
    for seed in range(3):
        on, _ = run(tmp_path, f"chaos{seed}", lines, chaos(dep, seed=seed))
        assert_outputs_equal_oracle(on, lines, dep, exact_events=batch_size == 1)
        seen.update(r["operation"] for r in read_stream(on, "balancer"))
    off, _ = run(tmp_path, "off", lines, dep.replace(balancer=BalancerConfig(mode="off")))
    assert per_batch(on) == per_batch(off) and per_batch(on, "snapshots") == per_batch(off, "snapshots")
    # the text router's rectangles hold every evaluator: a split needs a plain one, which only merges make
    assert {"text_split", "text_merge"} <= seen if router != "text" or evaluators == 2 else "text_merge" in seen


def test_a_merges_costs_join_the_aggregates_of_the_rectangle_that_stays():
    # the staying evaluator held the text rectangle already: its aggregates must take the leaving one's costs
    rects = [(0, 0, 3, 7), (4, 4, 7, 7)]
    stay = CellLoad(8, rects, 4, decay=1.0)
    stay.add_cost(5, 5, 10.0)
    stay.put({6 * 8 + 6: 30.0})
    stay.set_partition(rects, np.empty((0, 4), dtype=np.int64))
    fresh = CellLoad(8, rects, 4, decay=1.0)
    fresh.add_cost(5, 5, 10.0)
    fresh.add_cost(6, 6, 30.0)
    assert stay.summary(0, 0).cost == 40.0
    assert stay.summary(0, 0).to_json() == fresh.summary(0, 0).to_json()


def test_gr_migrates_no_block_of_a_text_rectangle():
    part = apply_moves(Partitioning(8, BOXES, np.array([0, 1, 2])), [Move((4, 0, 7, 3), 1, 0, text="split")])
    blocks = (BlockLoad((4, 0, 7, 3), 100.0, 1), BlockLoad((0, 0, 3, 3), 5.0, 1), BlockLoad((0, 4, 3, 7), 5.0, 1))
    hot = LoadSummary(0, 0, (rect((0, 0, 3, 7), 10.0, 2), rect((4, 0, 7, 3), 100.0, 1)), blocks)
    loads = Loads(part, [hot, summary(1, ((4, 0, 7, 3), 1.0, 1)), summary(2, ((4, 4, 7, 7), 0.0, 0))], beta=1.0)
    op = migration(part, loads, 0, [(2, 50.0)], greedy)
    # the hot block is the text rectangle's: GR takes the plain ones, short of tau, and 0 keeps its text share
    assert op is not None and [m.cells for m in op.moves] == [(0, 0, 3, 3), (0, 4, 3, 7)]
    assert apply_moves(part, op.moves).boxes_of(0) == [(4, 0, 7, 3)]
