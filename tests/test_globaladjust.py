"""PS2Stream V-B: the global adjustment repartitions the plain cells by a kd-tree and changes no result."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.balancer.globaladjust import KIND, block_costs, global_adjustment
from skpub.balancer.operation import Loads, Operation, apply_moves
from skpub.balancer.policy import decide, with_global_adjustment
from skpub.kernel.config import BalancerConfig, Window
from skpub.kernel.load import BlockLoad, LoadSummary
from skpub.kernel.parts import read_stream
from skpub.kernel.transfer import Move
from skpub.router.kdtree import kdtree_partitioning
from skpub.router.partitioning import Partitioning, uniform_partitioning
from tests.profiles import examples
from tests.test_rebalancing import chaos, per_batch, run
from tests.test_textsplit import rect
from tests.tiers import tiered
from tests.workloads import assert_outputs_equal_oracle, deployment, random_workload, ranked_workload


def summaries_of(partitioning, cost, queries):
    """Every evaluator's summary: per cell (a grid^t block on grids up to 40 cells a side) cost and queries."""
    out = []
    for e in range(partitioning.count):
        rects, blocks = [], []
        for i, box in enumerate(partitioning.boxes.tolist()):
            if partitioning.owners[i] != e and (
                partitioning.texts[i] is None or e not in partitioning.texts[i].evaluators
            ):
                continue
            x0, y0, x1, y1 = box
            rects.append(
                rect(box, float(cost[y0 : y1 + 1, x0 : x1 + 1].sum()), int(queries[y0 : y1 + 1, x0 : x1 + 1].sum()))
            )
            blocks += [BlockLoad((x, y, x, y), float(cost[y, x]), int(queries[y, x]))
                       for y in range(y0, y1 + 1) for x in range(x0, x1 + 1)
                       if cost[y, x] or queries[y, x]]  # fmt: skip
        out.append(LoadSummary(e, 0, tuple(rects), tuple(blocks)))
    return out


def evaluator_costs(partitioning, cost):
    return np.bincount(partitioning.owner[~partitioning.text_cells], cost[~partitioning.text_cells], partitioning.count)


def test_a_hot_quarter_is_repartitioned_into_balanced_leaves_keeping_the_most_subscriptions_in_place():
    part = uniform_partitioning(8, 4)
    cost = np.zeros((8, 8))
    cost[:4, :4] = 1.0  # every load in one evaluator's quarter
    queries = np.ones((8, 8), dtype=np.int64)
    loads = Loads(part, summaries_of(part, cost, queries), beta=1.0)
    op = global_adjustment(part, loads)
    assert op.kind == KIND and op.c_r == pytest.approx(12.0) and op.costs_after == (4.0, 4.0, 4.0, 4.0)
    after = apply_moves(part, op.moves)
    assert evaluator_costs(after, cost).tolist() == [4.0, 4.0, 4.0, 4.0]
    # each evaluator keeps the leaf where it holds the most subscriptions: the hot quarter's owner keeps a part of it
    assert sum(m.queries for m in op.moves) == op.subscriptions == 64 - 36  # kept: 16 + 8 + 8 + 4
    assert sum(m.cost for m in op.moves) == pytest.approx(12.0)
    assert all(
        (part.owner[m.cells[1] : m.cells[3] + 1, m.cells[0] : m.cells[2] + 1] == m.source).all() for m in op.moves
    )


def test_the_decision_takes_it_alone_only_when_it_beats_the_local_one():
    part = uniform_partitioning(8, 4)
    cost = (part.owner != 3) * 0.5  # three hot quarters: the local rounds can only relieve one of them
    loads = Loads(part, summaries_of(part, cost, np.ones((8, 8), dtype=np.int64)), beta=0.1)
    glob = global_adjustment(part, loads)
    assert with_global_adjustment(part, loads, [], sigma=1.2, gain=10.0) == [glob]
    assert glob.c_r == pytest.approx(1.0) and glob.c_t == pytest.approx(1.6)  # leaves of 6, 5, 6, 7
    better = Operation("migration", (Move((0, 0, 0, 0), 0, 3),), c_r=1.5, costs_after=(6.5, 6.5, 5.5, 5.5))
    assert with_global_adjustment(part, loads, [better], sigma=1.2, gain=10.0) == [better]
    assert with_global_adjustment(part, loads, [], sigma=1.2, gain=1.0) == []  # C_r 1 x 1 < C_t 1.6
    assert with_global_adjustment(part, loads, [], sigma=20.0, gain=10.0) == []  # balanced enough
    # adaptive weighs it every global_period batches (two chances: a transfer may be in flight at the first)
    config = BalancerConfig(beta=0.1, horizon=20, global_period=10)
    summaries = summaries_of(part, cost, np.ones((8, 8), dtype=np.int64))
    assert [op.kind for op in decide(config, part, summaries, 21)] == [KIND]
    assert KIND not in [op.kind for op in decide(config, part, summaries, 22)]
    assert KIND not in [op.kind for op in decide(config, part, summaries, 1)]  # not in the first period
    assert KIND not in [
        op.kind for op in decide(BalancerConfig(beta=0.1, horizon=20, global_period=0), part, summaries, 20)
    ]


def test_an_adjustment_that_leaves_the_costliest_evaluator_as_costly_is_not_taken():
    part = Partitioning(6, np.array([[0, 0, 0, 5], [1, 0, 3, 5], [4, 0, 5, 5]]))
    cost = np.zeros((6, 6))
    cost[0, 0] = 100.0  # one hot cell: no repartitioning can lower the costliest evaluator
    cost[0, 1], cost[5, 3], cost[5, 5] = 5.0, 5.0, 1.0
    loads = Loads(part, summaries_of(part, cost, np.ones((6, 6), dtype=np.int64)), beta=0.001)
    op = global_adjustment(part, loads)
    assert op.c_r > 0 and max(op.costs_after) >= 100.0  # it relieves the evaluators it touches, not the costliest
    assert with_global_adjustment(part, loads, [], sigma=1.2, gain=10.0) == []


def test_a_moves_subscriptions_count_a_subscription_over_many_blocks_once():
    size, side = 80, 2  # grid^t blocks of 2 x 2 cells
    part = uniform_partitioning(size, 2)
    summaries = []
    for e in range(2):
        x0, y0, x1, y1 = part.boxes_of(e)[0]
        cost = 1.0 if e == 1 else 0.01  # the hot rectangle away from the origin: offsets into it matter
        blocks = tuple(BlockLoad((x, y, min(x + side - 1, x1), min(y + side - 1, y1)), cost, 3)
                       for y in range(y0, y1 + 1, side) for x in range(x0, x1 + 1, side))  # fmt: skip
        box = (x0, y0, x1, y1)
        summaries.append(LoadSummary(e, 0, (rect(box, cost * len(blocks), 3),), blocks))  # 3 over it all
    op = global_adjustment(part, Loads(part, summaries, beta=1.0))
    assert op is not None and op.moves
    assert all(0 < m.queries <= 3 for m in op.moves)  # the blocks' sum would count each subscription per block
    assert {m.source for m in op.moves} == {1} and part.boxes_of(1)[0][0] > 0


@examples(0.6)
@given(
    n=st.integers(2, 6),
    size=st.integers(4, 12),
    seed=st.integers(0, 2**32 - 1),
    text=st.booleans(),
)
def test_any_drawn_adjustment_is_legal_and_realizes_the_kd_tree_on_the_plain_cells(n, size, seed, text):
    rng = np.random.default_rng(seed)
    part = kdtree_partitioning(rng.random((size, size)), n)
    # a few random migrations first: partitions of several rectangles
    for _ in range(3):
        i = int(rng.integers(len(part.boxes)))
        x0, y0, x1, y1 = part.boxes[i].tolist()
        source = int(part.owners[i])
        if len(part.boxes_of(source)) > 1 or (x0, y0) != (x1, y1):
            cells = (x0, y0, x0, y0) if (x0, y0) != (x1, y1) else (x0, y0, x1, y1)
            target = int(rng.choice([e for e in range(n) if e != source]))
            part = apply_moves(part, [Move(cells, source, target)])
    if text:
        i = int(rng.integers(len(part.boxes)))
        target = int(rng.choice([e for e in range(n) if e != part.owners[i]]))
        part = apply_moves(part, [Move(tuple(part.boxes[i].tolist()), int(part.owners[i]), target, text="split")])
    cost = rng.random((size, size)) * (rng.random((size, size)) < 0.5)
    loads = Loads(part, summaries_of(part, cost, rng.integers(0, 3, (size, size))), beta=1.0)
    draw = np.random.default_rng(seed + 1)
    op = global_adjustment(part, loads, draw)
    if op is None:
        return
    after = apply_moves(part, op.moves)  # every move inside one rectangle of its source as the earlier ones leave it
    assert (after.text_cells == part.text_cells).all() and (
        after.owner[part.text_cells] == part.owner[part.text_cells]
    ).all()
    replay = np.random.default_rng(seed + 1)
    leaves = kdtree_partitioning(replay.random(block_costs(part, loads).shape), n)
    owner = replay.permutation(n)[leaves.owner]
    plain = ~part.text_cells
    assert (after.owner[plain] == owner[plain]).all()
    moved = np.zeros((size, size), dtype=bool)
    for m in op.moves:
        box = (slice(m.cells[1], m.cells[3] + 1), slice(m.cells[0], m.cells[2] + 1))
        assert not moved[box].any() and (part.owner[box] == m.source).all() and (owner[box] == m.target).all()
        moved[box] = True
        assert m.cost == pytest.approx(float(cost[box].sum()))
    assert (moved == (plain & (part.owner != owner))).all()


@pytest.mark.parametrize(
    ("router", "evaluators", "batch_size"),
    tiered(
        ((r, e, b) for r in ["agrid", "kdt", "uniform"] for e, b in [(2, 7), (4, 7), (8, 25)]), fast={("agrid", 4, 7)}
    ),
)
def test_global_adjustments_under_chaos_equal_the_oracle_and_the_run_without_them(
    tmp_path, router, evaluators, batch_size
):
    lines = random_workload(seed=evaluators * 3 + batch_size, n=500, invalid=False)
    lines += ranked_workload(seed=batch_size + 1, n=200)
    dep = deployment(evaluators=evaluators, router=router, batch_size=batch_size).replace(window=Window("count", 40))
    seen = []
    for seed in range(3):
        on, _ = run(tmp_path, f"chaos{seed}", lines, chaos(dep, seed=seed))
        assert_outputs_equal_oracle(on, lines, dep, exact_events=False)
        seen += [r["operation"] for r in read_stream(on, "balancer")]
    off, _ = run(tmp_path, "off", lines, dep.replace(balancer=BalancerConfig(mode="off")))
    assert per_batch(on) == per_batch(off) and per_batch(on, "snapshots") == per_batch(off, "snapshots")
    assert KIND in seen or (router == "kdt" and not seen)  # a kd^t-tree may text-partition every cell
