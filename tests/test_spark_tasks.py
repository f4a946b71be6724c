"""The Spark engine's routing tasks without Spark: stream order, completeness, rejections."""

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from skpub.app.checkpoint import Checkpoint
from skpub.app.engines.spark_tasks import (
    PARSE_REPORT_SCHEMA,
    _check_complete,
    _in_stream_order,
    _rejected_letters,
)
from skpub.kernel.errors import CheckpointError, InputError
from skpub.kernel.slices import file_sizes, split
from skpub.kernel.text import Vocabulary
from skpub.kernel.wire import bytes_table, table_bytes
from skpub.router.initial import initial_table
from skpub.router.locate import Locator, located_table
from skpub.router.sequencer import Decisions
from skpub.router.summary import TextualSummaries
from tests.workloads import deployment, random_workload


def _located(directory, lines, batch_id=0, parts=3):
    """Parse ``lines`` as the parse tasks do: each part's located rows to a file, a report row naming it."""
    dep = deployment(evaluators=3)
    locator = Locator(dep, Vocabulary(), initial_table(dep, Vocabulary(), lines))
    raw = [line.encode() for line in lines]
    size = -(-len(raw) // parts)
    runs = []
    for part in range(parts):
        first = part * size
        located = locator.locate_lines(raw[first : first + size], batch_id, first)
        path = directory / f"rows-{batch_id:08d}-{part:03d}.arrow"
        rows = located_table(located)
        path.write_bytes(table_bytes(rows))
        report = {"part": part, "first": first, "lines": len(raw[first : first + size]), "dead_letters": {},
                  "cpu_seconds": 0.0, "path": str(path), "rows": rows.num_rows}  # fmt: skip
        runs.append(pa.RecordBatch.from_pydict({"report": [json.dumps(report)]}, schema=PARSE_REPORT_SCHEMA))
    return runs


def test_parse_reports_arriving_in_any_order_give_the_rows_in_stream_order(tmp_path):
    runs = _located(tmp_path, random_workload(seed=3, n=300))
    random.Random(1).shuffle(runs)
    items, reports = _in_stream_order(pa.Table.from_batches(runs), 3, 0)
    positions = items.column("pos").to_numpy()
    assert (np.diff(positions) > 0).all() and len(positions) > 200
    assert sorted(r["part"] for r in reports) == [0, 1, 2]
    with pytest.raises(CheckpointError, match="parts"):
        _in_stream_order(pa.Table.from_batches(runs[:2]), 3, 0)
    with pytest.raises(CheckpointError, match="parts"):
        _check_complete(reports[:2], 3, 0)
    gap = [dict(r, first=r["first"] + 1) if r["part"] == 2 else r for r in reports]
    with pytest.raises(CheckpointError, match="starts at line"):
        _check_complete(gap, 3, 0)


def test_a_part_whose_rows_cannot_be_read_or_are_cut_is_refused_not_dropped(tmp_path):
    runs = _located(tmp_path, random_workload(seed=3, n=60))
    part_1 = tmp_path / "rows-00000000-001.arrow"
    rows = part_1.read_bytes()
    part_1.write_bytes(table_bytes(bytes_table(rows).slice(1)))
    with pytest.raises(CheckpointError, match="holds .* located rows, not"):
        _in_stream_order(pa.Table.from_batches(runs), 3, 0)
    part_1.write_bytes(b"not arrow")
    with pytest.raises(CheckpointError, match="part 1 cannot be read"):
        _in_stream_order(pa.Table.from_batches(runs), 3, 0)
    part_1.unlink()
    with pytest.raises(CheckpointError, match="part 1 cannot be read"):
        _in_stream_order(pa.Table.from_batches(runs), 3, 0)


def test_rejections_get_their_own_input_line_from_the_slices(tmp_path):
    lines = [f'{{"type": "unsubscribe", "id": "u{i}"}}' for i in range(10)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(line.encode() + b"\n" for line in lines))
    sizes = file_sizes([path])
    reports = [{"slice": s.to_json().decode()} for s in split([path], sizes, (0, 0), (1, 0), 3)]
    items, _ = _in_stream_order(pa.Table.from_batches(_located(tmp_path, lines)), 3, 0)
    decisions = Decisions(rejected=[(i, "unknown_id", "no") for i in (0, 4, 9)])
    letters = _rejected_letters([str(path)], reports, items, decisions)
    assert [d.line for d in letters] == [lines[0], lines[4], lines[9]]
    path.write_bytes(b"changed\n")
    with pytest.raises(InputError, match="input changed"):
        _rejected_letters([str(path)], reports, items, decisions)


def test_vectorized_summaries_handle_null_terms_and_sliced_arrays():
    summaries = TextualSummaries(2)
    summaries.add(1, ["jazz"])
    terms = pa.array([None, ["x"], ["jazz"], None, ["jazz", "y"], []], pa.list_(pa.string())).slice(1)
    owners = np.array([0, 1, 0, 1, 1])
    assert summaries.admits_many(owners, terms).tolist() == [False, True, False, True, False]
    # A null row may still span values in its offsets: they are not its terms.
    masked = pa.ListArray.from_arrays(
        pa.array([0, 1, 2, 3]), pa.array(["jazz", "jazz", "x"]), mask=pa.array([True, False, False])
    )
    assert summaries.admits_many(np.array([1, 1, 1]), masked).tolist() == [False, True, False]


def test_row_files_are_the_checkpoints_own_and_nothing_else_there_is(tmp_path):
    """Located and routed row files (and their temporary names) belong to the checkpoint; anything else is foreign."""
    from skpub.app.checkpoint import checkpoint_foreign_entries

    checkpoint = Checkpoint(tmp_path / "ck")
    checkpoint.create()
    for path in (checkpoint.located_file(3, 1), checkpoint.routed_file(3, 0)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    (checkpoint.routed / ".rows-00000004-002.arrow.x1y2.tmp").write_bytes(b"")
    assert checkpoint_foreign_entries(checkpoint.root) == []
    assert sorted(p.name for p in checkpoint.row_files()[3]) == ["rows-00000003-000.arrow", "rows-00000003-001.arrow"]
    (checkpoint.routed / "notes.txt").write_text("mine")
    assert checkpoint_foreign_entries(checkpoint.root) == ["routed/notes.txt"]


def test_routed_rows_go_to_one_file_per_evaluator_with_rows_in_stream_order(tmp_path):
    """Each evaluator's file holds exactly its rows, in the routed table's order; no file without rows; the files
    the prune deletes (row_files) are a batch's row files, temporary names included, and nothing else."""
    from skpub.app.engines.spark_tasks import _write_routed

    checkpoint = Checkpoint(tmp_path / "ck")
    checkpoint.create()
    keys = [7, 3, 11]
    evaluator = pa.array([3, 7, 3, 3, 7, 3], pa.int32())
    routed = pa.table({"evaluator": evaluator, "pos": pa.array([1, 2, 5, 9, 12, 20], pa.int64())})
    files = _write_routed(checkpoint, 4, routed, keys)
    assert sorted(files) == [0, 1]
    for e, (path, rows) in files.items():
        table = bytes_table(path.read_bytes())
        expected = [
            p for k, p in zip(evaluator.to_pylist(), routed.column("pos").to_pylist(), strict=True) if k == keys[e]
        ]
        assert table.column("pos").to_pylist() == expected and rows == len(expected)
    (checkpoint.routed / ".rows-00000004-002.arrow.killed.tmp").write_bytes(b"")
    (checkpoint.routed / "rows-x.arrow").write_bytes(b"")
    assert sorted(p.name for p in checkpoint.row_files()[4]) == [
        ".rows-00000004-002.arrow.killed.tmp",
        "rows-00000004-000.arrow",
        "rows-00000004-001.arrow",
    ]
    assert list(checkpoint.row_files()) == [4]


def test_an_evaluator_refuses_a_routed_file_that_is_missing_or_not_of_the_counted_rows(tmp_path):
    from skpub.evaluators.batch import BatchInput, read_rows
    from skpub.evaluators.errors import EvaluatorError

    path = tmp_path / "rows-00000002-001.arrow"
    path.write_bytes(table_bytes(pa.table({"pos": pa.array([4, 8, 15], pa.int64())})))

    def batch(rows, rows_path=str(path)):
        return BatchInput("run", 1, 2, 1, "g", "{}", 0, rows_path, rows)

    assert read_rows(batch(3)).to_pydict() == {"pos": [4, 8, 15]}
    with pytest.raises(EvaluatorError, match="holds 3 routed rows, not 4"):
        read_rows(batch(4))
    with pytest.raises(EvaluatorError, match="cannot be read"):
        read_rows(batch(3, str(tmp_path / "gone.arrow")))


def _sequenced_batches(tmp_path, name, lines, batch, before=None, sample=None):  # noqa: ANN001
    """Run the sequencer task over ``lines`` in micro-batches of ``batch`` in a checkpoint of its own.

    The routing table is computed from ``sample`` (default ``lines``).
    ``before(b)`` runs before batch ``b`` (to empty or swap the process's
    sequencer cache). Returns, per batch, the routed rows of every evaluator
    (as JSON text, so that NaN equals NaN), the dead letters and the routing
    report without its CPU figures; and ``replay(b)``, which runs batch ``b``
    again as a replay after a restart does (its own files written, no state
    in the process) and returns the same of it.
    """
    from skpub.app.engines import spark_tasks
    from skpub.router.epoch import EpochLog, RoutingEpoch

    dep = deployment(evaluators=3)
    vocabulary = Vocabulary()
    table = initial_table(dep, vocabulary, lines if sample is None else sample)
    checkpoint = Checkpoint(tmp_path / name)
    checkpoint.create()
    EpochLog(checkpoint.epochs).publish(RoutingEpoch(0, 0, table))
    locator = Locator(dep, vocabulary, table)
    out, tasks = [], []
    for b, first in enumerate(range(0, len(lines), batch)):
        raw = [line.encode() for line in lines[first : first + batch]]
        source = tmp_path / f"{name}-{b}.jsonl"
        source.write_bytes(b"".join(line + b"\n" for line in raw))
        [piece] = split([source], file_sizes([source]), (0, 0), (1, 0), 1)
        rows = located_table(locator.locate_lines(raw, b, 0))
        path = tmp_path / f"{name}-rows-{b}.arrow"
        path.write_bytes(table_bytes(rows))
        report = {"part": 0, "first": 0, "lines": len(raw), "dead_letters": {}, "cpu_seconds": 0.0,
                  "path": str(path), "rows": rows.num_rows, "slice": piece.to_json().decode()}  # fmt: skip
        reports = pa.Table.from_pydict({"report": [json.dumps(report)]}, schema=PARSE_REPORT_SCHEMA)
        task = spark_tasks.SequencerTask(
            str(checkpoint.root), str(tmp_path / f"{name}-out"), "run", json.dumps(dep.to_json()), [0, 1, 2], 1,
            [str(source)],
        )  # fmt: skip
        tasks.append((task, reports))

    def outcome(b: int) -> tuple:
        task, reports = tasks[b]
        files, letters = task.run(b, reports)
        paths = zip(files["evaluator"].to_pylist(), files["path"].to_pylist(), strict=True)
        routed = {e: bytes_table(Path(p).read_bytes()) for e, p in paths}
        counted = json.loads(checkpoint.router_report(b).read_text())
        counted = {k: v for k, v in counted.items() if not k.endswith("cpu_seconds")}
        return {e: json.dumps(t.to_pylist()) for e, t in routed.items()}, letters, counted  # NaN as text

    def replay(b: int) -> tuple:
        spark_tasks._SEQUENCERS.clear()
        return outcome(b)

    for b in range(len(tasks)):
        if before is not None:
            before(b)
        out.append(outcome(b))
    return out, replay


def test_a_sequencer_rebuilt_or_caught_up_from_the_checkpoint_routes_as_the_cached_one(tmp_path, monkeypatch):
    """Restarts never change results: at every batch the sequencer task routes, rejects, counts and journals the
    same whether its state comes from the process's cache, from the checkpoint (deltas alone, a base, a base under
    its old name, and the deltas after it), or from an older cached state caught up by the deltas it missed; a
    cached state at or after the batch (a replay) is never used."""
    from collections import Counter

    from skpub.app.engines import spark_tasks
    from skpub.router.sequencer import Sequencer

    monkeypatch.setattr(spark_tasks, "ROUTER_BASE_EVERY", 4)  # bases after batches 3, 7 and 11
    taken: list[Counter] = []  # per batch: bases read, deltas read, deltas a cached state caught up by
    for name, owner, attribute in (
        ("base", spark_tasks, "decode_registry"),
        ("delta", spark_tasks, "decode_journal"),
        ("caught up", Sequencer, "replay"),
    ):
        real = getattr(owner, attribute)
        monkeypatch.setattr(owner, attribute, lambda *a, _real=real, _name=name: taken[-1].update([_name]) or _real(*a))
    lines = random_workload(seed=12, n=480)[:480]  # 12 batches of 40

    def run(name: str, lines: list[str], restarts: dict) -> tuple:  # noqa: ANN001
        taken.clear()
        monkeypatch.setattr(spark_tasks, "_SEQUENCERS", {})

        def before(b: int) -> None:
            taken.append(Counter())
            if b in restarts:
                spark_tasks._SEQUENCERS.clear()
                if restarts[b] == "old name":
                    base = tmp_path / name / "router" / "base-00000007.json"
                    base.rename(base.with_name("snapshot-00000007.json"))
                elif restarts[b] is not None:
                    spark_tasks._SEQUENCERS.update(restarts[b])

        return _sequenced_batches(tmp_path, name, lines, 40, before=before, sample=all_lines)

    all_lines = lines
    cached, _ = run("cached", lines, {})
    assert taken == [Counter()] * 12  # every batch from the cache
    assert sum(len(letters) > 0 for _, letters, _ in cached) >= 2  # rejections are read back from the input too
    ahead = dict(spark_tasks._SEQUENCERS)
    assert ahead["run"][0] == 11
    run("old", lines[: 3 * 40], {})
    behind = dict(spark_tasks._SEQUENCERS)  # an equal state after batch 2, built in a checkpoint of its own
    assert behind["run"][0] == 2

    restarts = {2: None, 4: None, 6: behind, 7: None, 8: ahead, 10: "old name", 11: ahead}
    restarted, replay = run("restarted", lines, restarts)
    assert taken == [
        Counter(),  # 0: nothing before it
        Counter(),
        Counter(delta=2),  # 2: deltas 0 and 1
        Counter(),
        Counter(base=1),  # 4: base 3
        Counter(),
        Counter(delta=3, **{"caught up": 3}),  # 6: the state after 2, caught up by deltas 3, 4 and 5
        Counter(base=1, delta=3),  # 7: base 3, deltas 4 to 6 (6 written by the caught-up state)
        Counter(base=1),  # 8: a state after 11 is not used: base 7
        Counter(),
        Counter(base=1, delta=2),  # 10: base 7 under its old name, deltas 8 and 9
        Counter(base=1, delta=3),  # 11: a state after 11 itself is not used either
    ]
    assert restarted == cached
    for b, reads in ((11, Counter(base=1, delta=3)), (7, Counter(base=1, delta=3))):
        taken.append(Counter())
        assert replay(b) == cached[b]  # a replay after a restart: the batch's own base is written, and not read
        assert taken[-1] == reads  # base 7 (by its old name) and deltas 8 to 10; base 3 and deltas 4 to 6
    journals = {}  # bases hold a horizon key drawn at random, so only the deltas compare byte for byte
    for name in ("cached", "restarted"):
        files = Checkpoint(tmp_path / name).router_files
        journals[name] = (sorted(files("base")), {b: p.read_bytes() for b, p in files("delta").items()})
    assert journals["restarted"] == journals["cached"]
