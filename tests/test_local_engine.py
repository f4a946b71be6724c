import json

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.app.engines.local import run_local
from skpub.app.summary import RunObserver, RunSummary
from skpub.kernel.errors import OutputError
from skpub.kernel.oracle import replay
from skpub.kernel.parts import read_stream
from skpub.kernel.registry import IdRegistry
from skpub.kernel.text import Vocabulary
from skpub.kernel.wire import from_columns, table_columns, to_columns
from skpub.router.dispatch import Router
from skpub.router.epoch import RoutingEpoch
from skpub.router.initial import initial_table
from skpub.router.state import decode_journal, decode_registry, encode_journal, encode_registry
from tests.profiles import examples
from tests.tiers import grid
from tests.workloads import canonical, deployment, letters, object_ids, random_workload, write_lines

ROUTERS = ["agrid", "kdt", "kdtree", "text", "uniform"]


def run(tmp_path, lines, dep, overwrite=False):
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    out = tmp_path / "out"
    observer = RunObserver(RunSummary("local", dep.router, dep.evaluators), stream=None)
    summary = run_local(source, out, dep, observer, overwrite=overwrite)
    return out, summary


@pytest.mark.parametrize(
    ("router", "evaluators", "batch_size"),
    grid(ROUTERS, [1, 3, 8], [1, 7, 5000], fast={*((r, 3, 7) for r in ROUTERS), ("agrid", 3, 1), ("uniform", 8, 5000)}),
)
def test_local_engine_equals_oracle(tmp_path, router, evaluators, batch_size):
    lines = random_workload(seed=evaluators * 31 + batch_size, n=500)
    dep = deployment(evaluators=evaluators, router=router, batch_size=batch_size)
    out, summary = run(tmp_path, lines, dep)
    expected = replay(lines, dep)
    deliveries = read_stream(out, "deliveries")
    assert len(expected.deliveries) > 50
    assert canonical(deliveries) == canonical(expected.deliveries)
    assert letters(read_stream(out, "dead_letters")) == letters(expected.dead_letters)
    assert summary.deliveries == len(expected.deliveries)
    assert sum(summary.dead_letters.values()) == len(expected.dead_letters)


def test_finished_output_is_refused_and_overwrite_replaces_it(tmp_path):
    dep = deployment(batch_size=10)
    out, _ = run(tmp_path, random_workload(seed=1, n=300), dep)
    before = sorted(p.name for p in (out / "deliveries").iterdir())
    lines = random_workload(seed=2, n=100, invalid=False)
    with pytest.raises(OutputError, match="--overwrite"):
        run(tmp_path, lines, dep)
    assert sorted(p.name for p in (out / "deliveries").iterdir()) == before
    out, _ = run(tmp_path, lines, dep, overwrite=True)
    assert canonical(read_stream(out, "deliveries")) == canonical(replay(lines, dep).deliveries)
    assert (out / "_SUCCESS").exists()


def test_statistics_account_every_forwarded_object(tmp_path):
    dep = deployment(evaluators=3, batch_size=100)
    out, summary = run(tmp_path, random_workload(seed=5, n=400), dep)
    stats = read_stream(out, "statistics")
    assert {row["evaluator"] for row in stats} == {0, 1, 2}
    assert sum(row["objects"] for row in stats) == summary.forwarded
    for row in stats:
        assert sum(row["rows"].values()) == sum(row["columns"].values()) == sum(row["cells"].values()) == row["cost"]
    assert summary.forwarded < summary.objects


def test_wire_format_round_trips_routed_rows():
    dep = deployment(evaluators=3)
    lines = random_workload(seed=9, n=200)
    vocabulary = Vocabulary()
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, lines))
    routed = Router(dep, vocabulary).route_many([line.encode() for line in lines], 4, epoch)
    keys = [101, 202, 303]
    for e, table in enumerate(routed.rows_for(3)):
        mine = from_columns(table_columns(table), e)
        assert mine and all(row.evaluator == e for row in mine)
        cols = to_columns(mine, keys)
        assert to_columns(mine)["evaluator"] == [e] * len(mine)
        assert set(cols["evaluator"]) <= {keys[e]}
        assert from_columns(cols, e) == mine


def test_table_columns_equal_arrow_values_with_terms_as_tuples():
    """The bulk conversion equals ``to_pydict`` on whole, taken, sliced and chunked tables (terms as tuples)."""
    dep = deployment(evaluators=3)
    lines = random_workload(seed=10, n=300)
    vocabulary = Vocabulary()
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, lines))
    table = Router(dep, vocabulary).route_many([line.encode() for line in lines], 2, epoch).table
    assert sum(len(t or ()) for t in table.column("terms").to_pylist()) > 100
    taken = table.take(pa.array(list(range(table.num_rows - 1, 0, -3))))
    chunked = pa.concat_tables([table.slice(0, 40), table.slice(40)])
    for candidate in (table, taken, table.slice(17, 60), chunked):
        expected = candidate.to_pydict()
        expected["terms"] = [tuple(t or ()) for t in expected["terms"]]
        assert repr(table_columns(candidate)) == repr(expected)  # repr: NaN times equal as text, not as floats


def test_registry_journal_replays_to_the_same_router_state():
    dep = deployment(evaluators=4)
    vocabulary = Vocabulary()
    lines = random_workload(seed=12, n=400)
    ids = object_ids(lines)
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, lines))
    journaled = Router(dep, vocabulary, IdRegistry(dep.object_id_horizon, journal=[]))
    replica = IdRegistry(dep.object_id_horizon)
    for batch_id, start in enumerate(range(0, len(lines), 50)):
        journaled.route_many([line.encode() for line in lines[start : start + 50]], batch_id, epoch)
        objects, changes = decode_journal(encode_journal(journaled.registry.take_journal()))
        replica.replay_objects(objects)
        replica.replay(changes)
        base = decode_registry(encode_registry(replica))
        rebuilt = Router(dep, vocabulary, base)
        assert base.active == journaled.registry.active
        assert base.objects.ages(ids).tolist() == journaled.registry.objects.ages(ids).tolist()
        assert len(base.objects) == len(journaled.registry.objects)
        assert rebuilt.sequencer.summaries.counts == journaled.sequencer.summaries.counts


_ids = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)


@examples(1)
@given(st.lists(st.tuples(st.integers(0, 2**62), _ids, _ids), max_size=30), st.integers(0, 3))
def test_delivery_lines_are_one_json_line_per_match_in_order(rows, cut):
    """Plain, dictionary-encoded and sliced id columns: each line reads back as its match (ids with quotes,
    backslashes, control and non-BMP characters), in order, and nothing else is written; the bytes are orjson's."""
    from skpub.kernel.messages import Deliveries
    from skpub.kernel.parts import delivery_lines

    expected = [{"sub": s, "obj": o, "event": "match"} for _, s, o in rows[cut:]]
    exact = b"".join(orjson.dumps(line) + b"\n" for line in expected)
    plain = Deliveries.of(rows)
    sliced = Deliveries(plain.pos[cut:], plain.sub.slice(cut), plain.obj.slice(cut))
    encoded = Deliveries(sliced.pos, sliced.sub.dictionary_encode(), sliced.obj.dictionary_encode())
    for deliveries in (sliced, encoded, Deliveries.concat([sliced, Deliveries.empty()])):
        data = delivery_lines(deliveries)
        assert data.endswith(b"\n") or not rows[cut:]
        assert [json.loads(line) for line in data.splitlines()] == expected
        assert data == exact
    assert (
        delivery_lines(Deliveries(np.empty(0, np.int64), pa.array([], pa.string()), pa.array([], pa.string()))) == b""
    )
