"""Top-k and kNN: the buffers, the merge and the local engine against the brute-force oracle."""

import json
import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.app.engines.local import run_local
from skpub.app.summary import RunObserver, RunSummary
from skpub.evaluators.merge import RankedMerge
from skpub.evaluators.ranked import TOLERANCE, Entry, rank
from skpub.evaluators.skyband import Skyband
from skpub.kernel.config import SKYBANDS, Window
from skpub.kernel.messages import RankedUpdate
from skpub.kernel.oracle import _ranked
from skpub.kernel.parts import read_stream
from skpub.kernel.records import ObjectRecord
from skpub.kernel.wire import from_columns, table_columns
from tests.profiles import examples
from tests.tiers import case_id, grid, tiered
from tests.workloads import assert_outputs_equal_oracle, deployment, ranked_workload, results_from_events, write_lines

WINDOWS = [Window(), Window("count", 30), Window("seconds", 15)]

# Goodness values clustered so that exact ties and chains of near ties (steps of 0.4e-9) are common.
goodness = st.builds(
    lambda base, step: base + step * 4e-10, st.sampled_from([0.0, 0.5, 0.5 + 1e-6, 1.0]), st.integers(0, 6)
)
entries = st.lists(
    st.tuples(goodness, st.integers(0, 5), st.sampled_from([math.inf, 3.0, 6.0])), min_size=0, max_size=40
).map(lambda rows: [Entry(g, g, float(ts), pos, f"o{pos}", exp) for pos, (g, ts, exp) in enumerate(rows)])


def first_k(items: list[Entry], k: int) -> list[int]:
    head, _ = rank(items, k)
    return [e.pos for e in head[:k]]


@given(entries, st.integers(1, 6))
def test_rank_equals_the_oracles_independent_order(items, k):
    expected = _ranked([(e.g, e.ts, e.pos, e.id) for e in items], True, k)
    assert first_k(items, k) == [pos for _, _, pos in expected]


@given(entries, st.integers(1, 6))
def test_floor_is_the_lowest_value_of_the_kth_group(items, k):
    head, floor = rank(items, k)
    if not items:
        assert floor == -math.inf
        return
    assert len(head) >= min(k, len(items))
    assert floor == min(e.g for e in head)
    below = [e.g for e in items if e.g < floor]
    assert all(floor - g > TOLERANCE for g in below)


@examples(3)
@given(entries, st.integers(1, 5), st.sampled_from(SKYBANDS), st.booleans())
def test_a_valid_buffer_never_loses_a_result_an_expiry_needs(items, k, policy, count_window):
    """Arrivals, then expiries in leaving order: whenever the buffer says it is valid, its first k are the truth."""
    band = Skyband(k, policy, count_window)
    band.refill([], 0)
    window: list[Entry] = []

    def alive(pos: int) -> bool:
        return any(e.pos == pos for e in window)

    def counts_agree() -> bool:  # ``high``: the entries dominated k times or more; ``best``: the k highest values
        values = sorted(e.g for e in band.entries.values())[-k:]
        return (
            band.high == {p for p, count in band.dominators.items() if count >= k}
            and band.high <= set(band.entries)
            and (band.best is None or band.best == values)
        )

    for entry in items:
        window.append(entry)
        band.offer(entry)
        assert counts_agree()
        if band.read(alive) is not None:
            assert first_k(list(band.entries.values()), k) == first_k(window, k)

    # Objects leave as a window makes them: in arrival order (count), or at min(expires_at, ts + T)
    # (seconds, T = 10), everything due at the same moment together.
    def leaves(e: Entry) -> float:
        return e.pos if count_window else min(e.expires_at, e.ts + 10)

    while window:
        due = min(leaves(e) for e in window)
        for gone in [e for e in window if leaves(e) == due]:
            window.remove(gone)
            band.remove(gone.pos)
        if band.read(alive) is None:
            band.refill(window, len(window))
            assert band.read(alive) is not None
        assert counts_agree()
        assert first_k(list(band.entries.values()), k) == first_k(window, k)


@examples(3)
@given(entries, st.integers(1, 5), st.integers(1, 4), st.randoms(use_true_random=False))
def test_merged_local_buffers_give_the_global_first_k(items, k, evaluators, rnd):
    """Candidates spread over evaluators: the merge of their reports equals the ranking of all of them."""
    shares: list[list[Entry]] = [[] for _ in range(evaluators)]
    for entry in items:
        shares[rnd.randrange(evaluators)].append(entry)
    updates = []
    for e, share in enumerate(shares):
        band = Skyband(k, "cskyband", False)
        band.refill(share, len(share) + 100)
        sent, bound = band.read()
        rows = tuple((x.id, x.value, x.g, x.ts, x.pos) for x in sent)
        updates.append(RankedUpdate(5, "s", 0, e, k, "score", rows, bound))
    merge = RankedMerge()
    _, snapshots = merge.apply([(5, "q")], updates)
    assert merge.unproven == 0
    assert [row[0] for row in snapshots[0]["results"]] == [f"o{pos}" for pos in first_k(items, k)]


def run(tmp_path, lines, dep):
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    out = tmp_path / "out"
    observer = RunObserver(RunSummary("local", dep.router, dep.evaluators), stream=None)
    run_local(source, out, dep, observer)
    return out


def test_an_id_that_recurs_after_the_horizon_is_a_second_result_object(tmp_path):
    """With an object-id horizon of 1, "o" may arrive again as a new object: both are in the top-2 of the knn
    subscription, so its events enter "o" twice (SEMANTICS 4: result objects are told apart by stream position),
    and the results fold as a multiset (a set-based fold refused the second enter)."""
    dep = deployment(evaluators=2, batch_size=2).replace(object_id_horizon=1)
    lines = [json.dumps({"type": "subscribe", "id": "near", "kind": "knn", "point": [10, 10], "k": 2,
                         "keywords": ["cafe"]})]  # fmt: skip
    lines += [json.dumps({"type": "object", "id": oid, "x": x, "y": 10, "terms": ["cafe"]})
              for oid, x in (("o", 11), ("p", 50), ("o", 12))]  # fmt: skip
    lines.append(json.dumps({"type": "snapshot", "id": "now"}))
    out = run(tmp_path, lines, dep)
    expected = assert_outputs_equal_oracle(out, lines, dep)
    assert [o for o, _ in expected.snapshots[0]["results"]] == ["o", "o"]
    events = [d for d in read_stream(out, "deliveries") if d["sub"] == "near"]
    assert results_from_events(events, frozenset({"o"})) == {"near": Counter({"o": 2})}
    with pytest.raises(AssertionError):  # an id no second object carries may not enter twice
        results_from_events(events)


def test_a_batch_writes_its_net_change_exits_then_enters_in_result_order(tmp_path):
    """docs/SEMANTICS.md (decisions on outputs): per subscription, a micro-batch writes its net change up to each
    snapshot record and up to its end, exits (earlier result order) then enters (new result order); micro-batches
    of one record write the per-record events. Knn k=2 at the origin, batches of three records: a and b enter in
    batch 0 (b, the nearer, first); a snapshot splits batch 1 (c enters and a exits before it, d enters and b
    exits after it); e and f push out d and c in batch 2, which writes both exits, then both enters."""
    from skpub.kernel.parts import read_batches

    def obj(oid, x, term="a"):
        return json.dumps({"type": "object", "id": oid, "x": x, "y": 0, "terms": [term]})

    lines = [json.dumps({"type": "subscribe", "id": "n", "kind": "knn", "point": [0, 0], "k": 2, "keywords": ["a"]})]
    lines += [obj("a", 50), obj("b", 40), obj("c", 10), json.dumps({"type": "snapshot", "id": "s"}), obj("d", 5)]
    lines += [obj("e", 2), obj("f", 1), obj("g", 0, "z")]
    by_batch = [["enter b", "enter a"], ["exit a", "enter c", "exit b", "enter d"],
                ["exit d", "exit c", "enter f", "enter e"]]  # fmt: skip
    by_record = [["enter a"], ["enter b"], ["exit a", "enter c"], ["exit b", "enter d"], ["exit c", "enter e"],
                 ["exit d", "enter f"]]  # fmt: skip
    for batch_size, wanted in ((3, by_batch), (1, by_record)):
        dep = deployment(evaluators=3, batch_size=batch_size)
        (tmp_path / str(batch_size)).mkdir()
        out = run(tmp_path / str(batch_size), lines, dep)
        expected = assert_outputs_equal_oracle(out, lines, dep, exact_events=batch_size == 1)
        assert expected.snapshots == [{"snapshot": "s", "sub": "n", "results": [["c", 10.0], ["b", 40.0]]}]
        batches = read_batches(out, "deliveries")
        assert [[f"{d['event']} {d['obj']}" for d in batches[b]] for b in sorted(batches)] == wanted


@pytest.mark.parametrize("scale", [5e-324, 1e-160, 1e-60, 1e60, 1e200, 1.7e308])
def test_weights_of_any_finite_size_score_as_their_direction(tmp_path, scale):
    """A topk subscription's weights are normalized to unit length (SEMANTICS 3.2), so weights scaled by any
    finite factor score exactly as the unscaled ones, in the engine and in the oracle, with an idf above 1 (a
    weight near the largest float times it must not overflow). Fails when squares underflow to zero or overflow
    to infinity (the subscription then scores as if it had no weight: 0.5 where 1.0 is due)."""
    vocabulary = tmp_path / "vocabulary.json"
    vocabulary.write_text(json.dumps({"N": 100, "df": {"cafe": 5, "bar": 20}}))
    dep = deployment(evaluators=3, batch_size=4).replace(vocabulary=str(vocabulary))
    lines = []
    for name, factor in (("plain", 1.0), ("scaled", scale)):
        for terms in (["cafe"], ["cafe", "bar"]):
            weights = dict.fromkeys(terms, factor)
            lines.append(json.dumps({"type": "subscribe", "id": f"{name}-{len(terms)}", "kind": "topk",
                                     "point": [10, 10], "k": 3, "alpha": 0.5, "weights": weights}))  # fmt: skip
    lines += [json.dumps({"type": "object", "id": f"o{i}", "x": 10 + i, "y": 10, "terms": terms})
              for i, terms in enumerate((["cafe"], ["cafe", "bar"], ["bar", "bar", "cafe"]))]  # fmt: skip
    lines.append(json.dumps({"type": "snapshot", "id": "now"}))
    out = run(tmp_path, lines, dep)
    expected = assert_outputs_equal_oracle(out, lines, dep)
    results = {s["sub"]: s["results"] for s in expected.snapshots}
    assert results["plain-1"][0] == ["o0", 1.0]
    for n in (1, 2):
        plain, scaled = results[f"plain-{n}"], results[f"scaled-{n}"]
        assert [o for o, _ in scaled] == [o for o, _ in plain] and len(plain) == 3
        assert [score for _, score in scaled] == pytest.approx([score for _, score in plain], abs=1e-12)


def test_a_term_of_idf_zero_beside_a_tiny_weight_leaves_a_unit_vector(tmp_path):
    """A term in every document has idf 0 (df = N), so with weights {c: 1, b: 1e-160} the vector is b's alone: unit
    length 1 in the engine and in the oracle alike (its square, 1e-320 times idf squared, is subnormal: a norm
    taken from it skews the vector, 0.99998 where 1.0 is due, and the engine and the oracle disagreed)."""
    vocabulary = tmp_path / "vocabulary.json"
    vocabulary.write_text(json.dumps({"N": 100, "df": {"c": 100, "b": 5}}))
    dep = deployment(evaluators=2, batch_size=3).replace(vocabulary=str(vocabulary))
    lines = [json.dumps({"type": "subscribe", "id": "t", "kind": "topk", "point": [10, 10], "k": 2, "alpha": 0.5,
                         "weights": {"c": 1.0, "b": 1e-160}})]  # fmt: skip
    lines += [json.dumps({"type": "object", "id": f"o{i}", "x": 10, "y": 10, "terms": terms})
              for i, terms in enumerate((["b"], ["c"]))]  # fmt: skip
    lines.append(json.dumps({"type": "snapshot", "id": "now"}))
    expected = assert_outputs_equal_oracle(run(tmp_path, lines, dep), lines, dep)
    assert expected.snapshots[0]["results"] == [["o0", 1.0], ["o1", 0.5]]


@pytest.mark.parametrize(
    ("window", "evaluators", "batch_size"),
    grid(
        WINDOWS,
        [1, 3, 8],
        [1, 7, 5000],
        fast={*((w, 3, 7) for w in WINDOWS), (WINDOWS[1], 3, 1), (WINDOWS[2], 8, 5000)},
    ),
    ids=case_id,
)
def test_local_engine_equals_oracle_on_ranked_workloads(tmp_path, window, evaluators, batch_size):
    lines = ranked_workload(seed=evaluators * 7 + batch_size, n=400)
    dep = deployment(evaluators=evaluators, batch_size=batch_size).replace(window=window)
    out = run(tmp_path, lines, dep)
    expected = assert_outputs_equal_oracle(out, lines, dep, exact_events=batch_size == 1)
    assert sum(1 for s in expected.snapshots if s["results"]) > 20


@pytest.mark.parametrize("router", ["agrid", "kdt", "text", "uniform"])
def test_both_routers_and_near_tie_chains_equal_the_oracle(tmp_path, router):
    lines = ranked_workload(seed=99, n=500)
    dep = deployment(evaluators=4, router=router, batch_size=13).replace(window=Window("count", 40))
    assert_outputs_equal_oracle(run(tmp_path, lines, dep), lines, dep, exact_events=False)


@pytest.mark.parametrize(("evaluators", "batch_size"), tiered([(1, 1), (3, 1), (4, 9)], fast={(4, 9)}))
def test_ids_recurring_after_the_horizon_are_new_objects_in_ranked_results(tmp_path, evaluators, batch_size):
    """Object ids cycle through 8 values with a horizon of 6 and a window of 30: one result can hold several objects
    of one id, told apart by position, in snapshots and (one record per batch) in every event."""
    from skpub.kernel.oracle import replay
    from skpub.kernel.parts import read_stream
    from tests.workloads import canonical, letters

    lines, count = [], 0
    for line in ranked_workload(seed=evaluators + batch_size, n=500):
        doc = json.loads(line)
        if doc["type"] == "object":
            doc["id"], count = f"o{count % 8}", count + 1
        lines.append(json.dumps(doc))
    dep = deployment(evaluators=evaluators, batch_size=batch_size)
    dep = dep.replace(window=Window("count", 30), object_id_horizon=6)
    out = run(tmp_path, lines, dep)
    expected = replay(lines, dep)
    assert any(len({oid for oid, _ in s["results"]}) < len(s["results"]) for s in expected.snapshots)
    assert read_stream(out, "snapshots") == expected.snapshots
    assert letters(read_stream(out, "dead_letters")) == letters(expected.dead_letters)
    deliveries = read_stream(out, "deliveries")
    assert canonical([d for d in deliveries if d["event"] == "match"]) == canonical(
        [d for d in expected.deliveries if d["event"] == "match"]
    )
    if batch_size == 1:
        events = [d for d in deliveries if d["event"] != "match"]
        wanted = [d for d in expected.deliveries if d["event"] != "match"]
        assert {d["sub"] for d in events} == {d["sub"] for d in wanted}
        for sub in {d["sub"] for d in wanted}:
            assert [d for d in events if d["sub"] == sub] == [d for d in wanted if d["sub"] == sub]


def test_objects_without_ts_take_the_stream_clock(tmp_path):
    """Objects without ts take the watermark (0 first); a late object never enters a seconds window."""
    lines = ranked_workload(seed=5, n=300, times=False)
    lines[50:50] = [
        '{"type": "object", "id": "late", "x": 0, "y": 0, "terms": ["sushi"], "ts": -100}',
        '{"type": "object", "id": "gone", "x": 0, "y": 0, "terms": ["sushi"], "expires_at": -1}',
    ]
    dep = deployment(evaluators=3, batch_size=20).replace(window=Window("seconds", 5))
    assert_outputs_equal_oracle(run(tmp_path, lines, dep), lines, dep, exact_events=False)


def test_the_sequencer_stamps_the_stream_clock():
    from skpub.kernel.text import Vocabulary
    from skpub.router.dispatch import Router
    from skpub.router.epoch import RoutingEpoch
    from skpub.router.initial import initial_table

    dep = deployment(evaluators=2).replace(window=Window("count", 10))
    lines = [
        b'{"type": "object", "id": "a", "x": 1, "y": 1, "terms": ["x"]}',
        b'{"type": "object", "id": "b", "x": 1, "y": 1, "terms": ["x"], "ts": 5}',
        b'{"type": "object", "id": "a", "x": 1, "y": 1, "terms": ["x"], "ts": 9}',
        b'{"type": "object", "id": "c", "x": 1, "y": 1, "terms": ["x"], "ts": 2}',
        b'{"type": "object", "id": "d", "x": 1, "y": 1, "terms": ["x"]}',
    ]
    epoch = RoutingEpoch(0, 0, initial_table(dep, Vocabulary(), []))
    routed = Router(dep, Vocabulary()).route_many(lines, 0, epoch)
    rows = [r for e, mine in enumerate(routed.rows_for(2)) for r in from_columns(table_columns(mine), e)]
    rows = [r for r in rows if isinstance(r.record, ObjectRecord)]
    rows.sort(key=lambda r: r.record.pos)
    assert [r.record.id for r in rows] == ["a", "b", "c", "d"]
    assert [r.record.ts for r in rows] == [0.0, 5.0, 2.0, 5.0]
    assert [r.accepted for r in rows] == [1, 2, 3, 4]
    assert [r.watermark for r in rows] == [0.0, 5.0, 5.0, 5.0]


@pytest.mark.parametrize("skyband", SKYBANDS)
def test_every_buffer_policy_gives_the_oracles_results(tmp_path, skyband):
    """cSkyband, kmax and the first-k-only buffers differ in re-evaluations, never in results; the statistics
    count the re-evaluations and their CPU (none without re-evaluations)."""
    from skpub.kernel.parts import read_stream

    lines = ranked_workload(seed=123, n=500)
    dep = deployment(evaluators=3, batch_size=11).replace(window=Window("count", 25), skyband=skyband)
    out = run(tmp_path, lines, dep)
    assert_outputs_equal_oracle(out, lines, dep)
    stats = read_stream(out, "statistics")
    reevaluations = sum(row["reevaluations"] for row in stats)
    assert reevaluations > 0  # every policy re-evaluates on this stream (cskyband 40, kmax 13, topk 318)
    assert all((row["reevaluation_cpu_seconds"] > 0) == (row["reevaluations"] > 0) for row in stats)


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: w.kind)
@pytest.mark.parametrize("skyband", SKYBANDS)
def test_restored_monitors_and_rebuilt_merges_equal_the_oracle(window, skyband):
    """The Spark engine's state path in one process: after any micro-batch an evaluator may be rebuilt from
    its saved window segments and ranked changes (compacted or not), and the merge from its results (a new
    generation, which makes every evaluator report anew). Results stay the oracle's."""
    import random

    from skpub.evaluators.evaluator import Evaluator
    from skpub.evaluators.merge import apply_changes, results_json
    from skpub.evaluators.monitor import RankedMonitor
    from skpub.kernel.oracle import replay
    from skpub.kernel.text import Vocabulary
    from skpub.router.dispatch import Router
    from skpub.router.epoch import RoutingEpoch
    from skpub.router.initial import initial_table

    rng = random.Random(f"{window.kind}-{skyband}")
    lines = ranked_workload(seed=31, n=500)
    dep = deployment(evaluators=3, batch_size=17).replace(window=window, skyband=skyband)
    vocabulary = Vocabulary()
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, []))
    router = Router(dep, vocabulary)
    evaluators = [Evaluator(e, dep, vocabulary, durable=True) for e in range(dep.evaluators)]
    saved = [({}, []) for _ in evaluators]
    merge, generation = RankedMerge(), 0
    events, snapshots, restores = [], [], 0
    encoded = [line.encode() for line in lines]
    for batch_id, start in enumerate(range(0, len(encoded), dep.batch_size)):
        routed = router.route_many(encoded[start : start + dep.batch_size], batch_id, epoch)
        results = [ev.apply_many(rows, batch_id) for ev, rows in zip(evaluators, routed.rows_for(3), strict=True)]
        batch_events, batch_snapshots = merge.apply(routed.marks, (u for r in results for u in r.updates))
        events += batch_events
        snapshots += batch_snapshots
        for ev, (segments, ranked) in zip(evaluators, saved, strict=True):
            window_changes, changes = ev.monitor.take_changes()
            for key, data in window_changes.items():
                if data is None:
                    segments.pop(key, None)
                else:
                    segments[key] = data
            if changes is not None:
                ranked.append(changes)
            if rng.random() < 0.3:
                ranked[:] = [ev.monitor.subscriptions_json()]
            if rng.random() < 0.4:
                store, reported_to = ev.monitor.store, ev.monitor.generation
                clock = (store.accepted, store.watermark)
                ev.monitor = RankedMonitor.restore(
                    ev.evaluator_id, dep, vocabulary, clock, dict(segments), list(ranked)
                )
                ev.monitor.generation = reported_to
                restores += 1
        if rng.random() < 0.2:
            merge, kept, generation = RankedMerge(), results_json(merge), generation + 1
            apply_changes(merge, kept)
        for ev in evaluators:  # as EvaluatorProcessor does before its next micro-batch
            if ev.monitor.generation != str(generation):
                ev.monitor.forget_reports()
                ev.monitor.generation = str(generation)
    expected = replay(lines, dep)
    assert restores > 20
    assert snapshots == expected.snapshots
    wanted = [d for d in expected.deliveries if d["event"] != "match"]
    assert results_from_events(events) == results_from_events(wanted)


def test_an_evaluator_that_saves_nothing_keeps_only_its_window():
    """The local engine's evaluators keep no arrival log or change set: memory follows the window, not the stream."""
    from skpub.evaluators.evaluator import Evaluator
    from skpub.kernel.text import Vocabulary
    from skpub.router.dispatch import Router
    from skpub.router.epoch import RoutingEpoch
    from skpub.router.initial import initial_table

    dep = deployment(evaluators=2, batch_size=50).replace(window=Window("count", 20))
    vocabulary = Vocabulary()
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, []))
    router = Router(dep, vocabulary)
    evaluators = [Evaluator(e, dep, vocabulary) for e in range(2)]
    encoded = [line.encode() for line in ranked_workload(seed=3, n=400)]
    for batch_id, start in enumerate(range(0, len(encoded), 50)):
        routed = router.route_many(encoded[start : start + 50], batch_id, epoch)
        for ev, rows in zip(evaluators, routed.rows_for(2), strict=True):
            ev.apply_many(rows, batch_id)
    for ev in evaluators:
        assert len(ev.monitor.store) <= 20
        assert ev.monitor.store.arrived == [] and ev.monitor.store.emptied == set()
        assert ev.monitor.changed == {} and ev.monitor.reports_changed == set()


def one_object(monitor, pos: int, oid: str, x: float, y: float, number: int) -> None:
    """Give ``monitor`` one object with term ``a`` at time 0, as an evaluator does (kept in bulk, then arrived)."""
    import numpy as np
    import pyarrow as pa

    from skpub.evaluators.window import WindowColumns

    cols = WindowColumns(
        np.array([pos]), pa.array([oid]), np.array([x]), np.array([y]), pa.array([["a"]]), np.zeros(1),
        np.array([np.inf]), np.array([number]), np.zeros(1, np.int64),
    )  # fmt: skip
    for row in monitor.receive(cols, np.array([number + 1]), np.array([np.nan])):
        (obj,) = cols.take(np.array([row])).objects()
        monitor.arrive(obj, number + 1, np.nan)


def test_an_unsubscribe_whose_report_fails_ends_the_subscription_all_the_same(monkeypatch):
    """A failing final report (a bug) still ends the subscription: the home evaluator sends its last report as the
    final one, so the merge ends it, and later objects and marks neither fail nor bring it back."""
    from skpub.evaluators.monitor import RankedMonitor
    from skpub.kernel.records import KnnSubscription
    from skpub.kernel.text import Vocabulary

    monitor = RankedMonitor(0, deployment(evaluators=1).replace(window=Window("count", 10)), Vocabulary())
    monitor.subscribe(KnnSubscription(0, "s", 0.5, 0.5, frozenset({"a"}), 1, "any", "window"))
    (first,), _ = monitor.mark(0)
    one_object(monitor, 1, "p", 0.4, 0.4, 0)
    with monkeypatch.context() as patch:
        patch.setattr(Skyband, "read", lambda self, alive=None: None)
        with pytest.raises(Exception, match="cannot prove"):
            monitor.unsubscribe("s", 2)
    assert not monitor.subscriptions and not monitor.index and not monitor.holders
    one_object(monitor, 3, "o", 0.5, 0.5, 1)
    (final,), failed = monitor.mark(4)
    assert not failed and final.ended and (final.sub, final.entries, final.bound) == ("s", first.entries, first.bound)
    assert monitor.mark(5) == ([], []) and not monitor.unsubscribe("s", 6)


def test_a_restored_report_of_objects_gone_is_sent_again_even_without_candidates():
    """A saved report naming objects the restored store no longer holds is replaced at the next mark."""
    from skpub.evaluators.durable import state_document
    from skpub.evaluators.monitor import RankedMonitor
    from skpub.kernel.records import KnnSubscription
    from skpub.kernel.text import Vocabulary
    from skpub.kernel.wire import ranked_spec

    sub = KnnSubscription(0, "s", 0.5, 0.5, frozenset({"a"}), 1, "any", "window")
    saved = {"subscriptions": {"s": [0, ranked_spec(sub)]}, "reports": {"s": [[["o5", 0.1, -0.1, 0.0, 5]], None]}}
    dep = deployment(evaluators=2).replace(window=Window("count", 10))
    monitor = RankedMonitor.restore(1, dep, Vocabulary(), (20, math.nan), {}, [state_document(saved, "ranked")])
    updates, failed = monitor.mark(30)
    assert not failed and [(u.sub, u.entries, u.bound) for u in updates] == [("s", (), -math.inf)]
