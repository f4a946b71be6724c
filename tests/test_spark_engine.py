"""The Spark engine against the oracle: local[2], restarts, and separate executor JVMs."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from skpub.app.engines.local import run_local
from skpub.app.engines.spark import run_spark
from skpub.app.summary import RunObserver, RunSummary
from skpub.kernel.config import Deployment, Window
from skpub.kernel.errors import CheckpointError, OutputError
from skpub.kernel.inputs import BOM, iter_lines
from skpub.kernel.parts import PART_RE, read_stream
from skpub.sims.geonames import WorkloadSpec, write_workload
from tests.tiers import case_id, tiered
from tests.workloads import (
    assert_outputs_equal_oracle,
    deployment,
    random_workload,
    ranked_workload,
    write_lines,
)

pytestmark = [pytest.mark.spark]
"""The fast tier keeps one range and one ranked run against the oracle, and the runs of no record; the rest is slow."""


def run(spark, tmp_path, lines, dep, name="run", overwrite=False):
    source = tmp_path / f"{name}.jsonl"
    write_lines(source, lines)
    out = tmp_path / name
    observer = RunObserver(RunSummary("spark", dep.router, dep.evaluators), stream=None)
    summary = run_spark(source, out, dep, observer, spark=spark, overwrite=overwrite)
    return out, summary


def assert_equals_oracle(out, lines, dep):
    return assert_outputs_equal_oracle(out, lines, dep)


@pytest.mark.parametrize(
    ("router", "evaluators", "batch_size"),
    tiered(
        [
            ("agrid", 4, 150),
            ("uniform", 3, 400),
            ("kdtree", 5, 200),
            ("text", 3, 170),
            ("kdt", 8, 120),
            ("agrid", 1, 10_000),
        ],
        fast={("uniform", 3, 400)},
    ),
)
def test_spark_engine_equals_oracle(spark, tmp_path, router, evaluators, batch_size):
    lines = random_workload(seed=evaluators + batch_size, n=550)
    dep = deployment(evaluators=evaluators, router=router, batch_size=batch_size)
    out, summary = run(spark, tmp_path, lines, dep)
    expected = assert_equals_oracle(out, lines, dep)
    assert len(expected.deliveries) > 50
    assert summary.batches == -(-len(lines) // batch_size)
    stats = read_stream(out, "statistics")
    assert {row["evaluator"] for row in stats} <= set(range(evaluators))
    offsets = json.loads((out / "_checkpoint" / "query" / "offsets" / "0").read_text().splitlines()[1])
    assert offsets["conf"]["spark.sql.shuffle.partitions"] == str(min(evaluators, 2)), "one task a core, at most"


@pytest.mark.parametrize(
    ("window", "evaluators", "batch_size", "router"),
    tiered(
        [
            (Window("count", 30), 3, 37, "uniform"),
            (Window(), 4, 1000, "agrid"),
            (Window("seconds", 15), 3, 50, "agrid"),
            (Window("seconds", 15), 1, 120, "agrid"),
            (Window("count", 25), 8, 7, "agrid"),
        ],
        fast={(Window(), 4, 1000, "agrid")},
    ),
    ids=case_id,
)
def test_spark_engine_equals_oracle_on_ranked_workloads(spark, tmp_path, window, evaluators, batch_size, router):
    lines = ranked_workload(seed=evaluators + batch_size, n=300 if batch_size < 10 else 450)
    dep = deployment(evaluators=evaluators, batch_size=batch_size, router=router).replace(window=window)
    run(spark, tmp_path, lines, dep)
    expected = assert_outputs_equal_oracle(tmp_path / "run", lines, dep)
    assert sum(1 for s in expected.snapshots if s["results"]) > 20


@pytest.mark.slow
def test_spark_engine_on_a_geonames_sample_equals_oracle(spark, tmp_path):
    spec = WorkloadSpec(seed=11, live=400, objects=6000, topk_fraction=0, knn_fraction=0, window=0)
    stream, vocabulary = write_workload(spec, tmp_path / "wl")
    lines = list(iter_lines(stream))
    dep = Deployment(evaluators=4, batch_size=3000, vocabulary=str(vocabulary), sample_size=2000)
    out, summary = run(spark, tmp_path, lines, dep, name="geo")
    expected = assert_equals_oracle(out, lines, dep)
    assert summary.objects == 6000
    assert len(expected.deliveries) > 0


@pytest.mark.slow
def test_spark_engine_on_a_ranked_geonames_sample_equals_oracle(spark, tmp_path, monkeypatch):
    """Real places, real tf-idf: topk and knn subscriptions over a count window, near and exact distance ties.

    The vocabulary path is relative, as a user types it: the evaluator hosts, which run elsewhere, still apply
    every batch.
    """
    spec = WorkloadSpec(seed=12, live=80, objects=1500, topk_fraction=0.4, knn_fraction=0.4, keyword_percentile=100)
    stream, vocabulary = write_workload(spec, tmp_path / "wl")
    lines = list(iter_lines(stream))
    monkeypatch.chdir(tmp_path)
    dep = Deployment(
        evaluators=3,
        batch_size=400,
        vocabulary=str(vocabulary.relative_to(tmp_path)),
        sample_size=500,
        window=Window("count", 300),
    )
    out, summary = run(spark, tmp_path, lines, dep, name="geo")
    expected = assert_equals_oracle(out, lines, dep)
    events = [d for d in expected.deliveries if d["event"] != "match"]
    assert len(events) > 200 and {"score", "dist"} <= {key for d in events for key in d}
    assert summary.hosts["applied"] == 3 * summary.batches and summary.hosts["hosted"] > 0
    assert f"of {3 * summary.batches} evaluator batches applied in a host" in summary.format()
    assert summary.hosts["sequenced"] == summary.batches and summary.hosts["sequenced_in_host"] > 0


@pytest.mark.slow
def test_finished_output_is_refused_and_overwrite_replaces_it(spark, tmp_path):
    lines = random_workload(seed=21, n=300)
    dep = deployment(batch_size=100)
    out, _ = run(spark, tmp_path, lines, dep)
    assert (out / "_SUCCESS").exists()
    before = {p: p.read_bytes() for p in out.rglob("part-*.jsonl")}
    with pytest.raises(OutputError, match="--overwrite"):
        run(spark, tmp_path, lines, dep)
    assert {p: p.read_bytes() for p in out.rglob("part-*.jsonl")} == before
    other = random_workload(seed=22, n=200)
    out, summary = run(spark, tmp_path, other, dep, overwrite=True)
    assert summary.batches == -(-len(other) // 100)
    assert_equals_oracle(out, other, dep)
    assert (out / "_SUCCESS").exists()


@pytest.mark.slow
def test_checkpoint_of_another_output_or_with_foreign_files_is_refused(spark, tmp_path):
    lines = random_workload(seed=23, n=120)
    dep = deployment(batch_size=100)
    write_lines(tmp_path / "in.jsonl", lines)
    observer = RunObserver(RunSummary("spark", dep.router, dep.evaluators), stream=None)
    shared = tmp_path / "ckpt"
    run_spark(tmp_path / "in.jsonl", tmp_path / "a", dep, observer, spark=spark, checkpoint=shared)
    with pytest.raises(CheckpointError, match="belongs to the output"):
        run_spark(tmp_path / "in.jsonl", tmp_path / "b", dep, observer, spark=spark, checkpoint=shared)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(CheckpointError, match="did not write"):
        run_spark(tmp_path / "in.jsonl", tmp_path / "c", dep, observer, spark=spark, checkpoint=foreign)
    assert (foreign / "thesis.tex").read_text() == "precious"
    assert not (tmp_path / "b" / "_SUCCESS").exists()


def _cli(args, **kwargs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "skpub.app.cli", "run", "--engine", "spark", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs,
    )  # fmt: skip


def _batches_written(folder):
    """Micro-batches with a part file in ``folder`` (parts are named ``part-<batch>[-<writer>].jsonl``)."""
    return len({PART_RE.fullmatch(p.name)["batch"] for p in folder.glob("part-*.jsonl")})


def _wait_for_parts(folder, count, proc, timeout_seconds=240):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if _batches_written(folder) >= count:
            return
        if proc.poll() is not None:
            pytest.fail(f"run ended before it could be killed:\n{proc.stdout.read()}")
        time.sleep(0.2)
    pytest.fail("run made no progress")


@pytest.mark.slow
@pytest.mark.integration
def test_killed_run_restarts_from_checkpoint_with_exact_output(tmp_path):
    """SIGKILL the driver (and its JVM) mid-stream, restart: none lost, none twice, ranked results exact.

    The kill comes after the router's and the merge's first bases (batch
    15), so the restart rebuilds the registry and the merged results from a
    base plus later deltas, and the evaluators their windows from the
    state store.
    """
    lines = ranked_workload(seed=33, n=1200)
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    out = tmp_path / "out"
    args = ["--input", str(source), "--output", str(out), "--evaluators", "3", "--batch-size", "40"]
    (tmp_path / "dep.json").write_text(
        '{"space": [0, 0, 100, 100], "grid_size": 20, "index_block": 2, "sample_size": 200,'
        ' "window": {"kind": "count", "size": 60}}'
    )
    args += ["--config", str(tmp_path / "dep.json")]
    proc = _cli(args, start_new_session=True)
    _wait_for_parts(out / "statistics", 18, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    batches = -(-len(lines) // 40)
    done = _batches_written(out / "statistics")
    assert done < batches, "the run finished before the kill; nothing was tested"
    assert not (out / "_SUCCESS").exists()
    assert (out / "_checkpoint" / "router" / "base-00000015.json").exists()
    rerun = _cli(args)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output
    assert "resuming from checkpoint" in output
    assert (out / "_SUCCESS").exists()
    dep = deployment(evaluators=3, batch_size=40).replace(window=Window("count", 60))
    expected = assert_equals_oracle(out, lines, dep)
    assert sum(1 for s in expected.snapshots if s["results"]) > 50
    for folder in ("router", "merge"):
        deltas = list((out / "_checkpoint" / folder).glob("delta-*.json"))
        assert 0 < len(deltas) <= 16, f"{folder} deltas before the last base must be pruned"
    for folder in ("located", "routed"):
        assert not list((out / "_checkpoint" / folder).iterdir()), f"{folder} rows of finished batches must be deleted"


@pytest.mark.slow
@pytest.mark.integration
def test_local_cluster_with_separate_executor_jvms_equals_oracle_under_chaos(tmp_path):
    lines = random_workload(seed=44, n=500)
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    (tmp_path / "dep.json").write_text(
        '{"space": [0, 0, 100, 100], "grid_size": 20, "index_block": 2, "sample_size": 200}'
    )
    out = tmp_path / "out"
    proc = _cli([
        "--input", str(source), "--output", str(out), "--evaluators", "2", "--batch-size", "250",
        "--config", str(tmp_path / "dep.json"), "--master", "local-cluster[2,1,1024]",
        "--balancer", "chaos",
    ])  # fmt: skip
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    assert "spark engine" in output
    assert_equals_oracle(out, lines, deployment(evaluators=2, batch_size=250))
    assert read_stream(out, "balancer"), "the hand-off crossed executors: a source and its target in two JVMs"
    quiet = [line for line in output.splitlines() if line and not line.startswith(("[skpub]", "skpub", "  "))]
    assert quiet == [], "Spark's own lines must go to the engine log, not the terminal"
    log = (out / "_engine.log").read_text()
    assert log.startswith("==== skpub run") and "Spark" in log
    assert "engine log" in output


def test_the_daemon_takes_only_the_installed_pysparks_own_zip_off_the_path(tmp_path):
    from skpub.app.engines.spark_daemon import without_own_zip

    site, other = tmp_path / "site", tmp_path / "spark-home"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    own = str(site / "pyspark" / "python" / "lib" / "pyspark.zip")
    foreign, py4j = str(other / "python" / "lib" / "pyspark.zip"), str(site / "pyspark" / "python" / "lib" / "py4j.zip")
    assert without_own_zip([own, py4j, foreign, str(site)]) == [py4j, foreign, str(site)]
    assert without_own_zip([own, py4j, str(other)]) == [own, py4j, str(other)], "no installed PySpark: keep its zip"


def test_spark_workers_import_pyspark_from_the_installed_package_not_its_zip(spark):
    """Spark puts pyspark.zip first on a worker's path; skpub's daemon takes it off, so PySpark's bytecode is cached."""

    def where(_):  # noqa: ANN001, ANN202
        import sys

        import pyspark

        return pyspark.__file__, [k for k in sys.path_importer_cache if k.endswith("pyspark.zip")]

    found = spark.sparkContext.parallelize([0, 1], 2).map(where).collect()
    assert found and all(".zip" not in f and not cached for f, cached in found), found


def test_evaluator_keys_spread_the_evaluators_evenly_over_at_most_one_partition_per_core(spark):
    """Evaluator e's key hashes to partition e % partitions; partitions are the evaluators, at most the cores (2)."""
    from skpub.app.engines.spark import evaluator_keys, evaluator_partitions

    assert [evaluator_partitions(spark, n) for n in (1, 2, 3, 8)] == [1, 2, 2, 2]
    cluster = SimpleNamespace(sparkContext=SimpleNamespace(master="local-cluster[2,1,1024]", defaultParallelism=2))
    assert evaluator_partitions(cluster, 8) == 8, "a cluster's cores are not known when its checkpoint is made"
    for evaluators, partitions in ((1, 1), (4, 2), (5, 2), (8, 8), (7, 3)):
        keys = evaluator_keys(spark, evaluators, partitions)
        assert len(set(keys)) == evaluators
        placed = spark.createDataFrame([(k,) for k in keys], "k int").selectExpr(f"pmod(hash(k), {partitions}) as p")
        assert [row.p for row in placed.collect()] == [e % partitions for e in range(evaluators)]


@pytest.mark.slow
def test_every_task_writes_its_own_parts(spark, tmp_path):
    """Parse tasks write their dead letters, evaluators their deliveries and statistics: one file per writer."""
    lines = random_workload(seed=5, n=400)
    dep = deployment(evaluators=3, batch_size=200)
    out, _ = run(spark, tmp_path, lines, dep)
    assert_equals_oracle(out, lines, dep)
    writers = {PART_RE.fullmatch(p.name)["writer"] for p in (out / "dead_letters").glob("part-*.jsonl")}
    assert {"p000", "p001"} <= writers, "both parse tasks of a batch must write dead letters"
    writers = {PART_RE.fullmatch(p.name)["writer"] for p in (out / "deliveries").glob("part-*.jsonl")}
    assert writers <= {"e000", "e001", "e002"} and len(writers) >= 2


@pytest.mark.slow
def test_spark_engine_honours_the_object_id_horizon(spark, tmp_path):
    """Ids recur after the horizon across micro-batches (registry journals and bases carry the FIFO)."""
    sub = '{"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 100, 100], "keywords": ["a"]}'
    ids = [f"o{i % 4}" for i in range(20)] + [f"o{i % 9}" for i in range(40)]
    lines = [sub] + [f'{{"type": "object", "id": "{i}", "x": 1, "y": 1, "terms": ["a"]}}' for i in ids]
    dep = deployment(batch_size=4).replace(object_id_horizon=5)
    out, _ = run(spark, tmp_path, lines, dep)
    expected = assert_equals_oracle(out, lines, dep)
    assert len(expected.deliveries) > 7 and expected.dead_letters


@pytest.mark.slow
def test_a_byte_order_mark_inside_the_stream_is_data_not_stripped(spark, tmp_path):
    """Only a BOM at the start of a file is skipped; one at a micro-batch's or a slice's start is data."""
    sub = '{"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 100, 100], "keywords": ["a"]}'
    objects = [f'{{"type": "object", "id": "o{i}", "x": 1, "y": 1, "terms": ["a"]}}' for i in range(5)]
    lines = [
        sub.encode(),
        objects[0].encode(),
        b"\xef\xbb\xbf" + objects[1].encode(),
        *(o.encode() for o in objects[2:]),
    ]
    dep = deployment(batch_size=2)
    out, _ = run(spark, tmp_path, lines, dep)
    expected = assert_equals_oracle(out, lines, dep)
    assert [d["reason"] for d in expected.dead_letters] == ["malformed_json"]


@pytest.mark.slow
def test_spark_engine_without_hosts_equals_oracle(spark, tmp_path, monkeypatch):
    """With the hosts off every worker sequences and applies its batches itself, rebuilding what it did not hold."""
    monkeypatch.setenv("SKPUB_HOSTS", "0")
    lines = ranked_workload(seed=77, n=400)
    dep = deployment(evaluators=3, batch_size=41).replace(window=Window("count", 30))
    _, summary = run(spark, tmp_path, lines, dep)
    assert_outputs_equal_oracle(tmp_path / "run", lines, dep)
    assert summary.batches == -(-len(lines) // 41)
    assert summary.hosts["sequenced"] == summary.batches and summary.hosts["sequenced_in_host"] == 0
    assert summary.hosts["applied"] == 3 * summary.batches and summary.hosts["hosted"] == 0


@pytest.mark.slow
def test_a_directory_input_read_in_place_equals_the_local_engine(spark, tmp_path):
    """Slices cross file boundaries; each file's BOM is skipped, CRLF endings and a last line without newline are
    records as the local engine reads them; the input is neither copied nor changed."""
    lines = [line.encode() for line in random_workload(seed=31, n=240)]
    folder = tmp_path / "in"
    folder.mkdir()
    cuts = [0, 50, 51, 130, len(lines)]
    for k, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        body = b"\r\n".join(lines[a:b]) if k == 1 else b"\n".join(lines[a:b])
        (folder / f"part-{k}.jsonl").write_bytes(
            (b"\xef\xbb\xbf" if k % 2 == 0 else b"") + body + (b"\n" if k < 3 else b"")
        )
    (folder / "part-2b.jsonl").write_bytes(b"")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    dep = deployment(evaluators=3, batch_size=37)
    observer = RunObserver(RunSummary("spark", dep.router, dep.evaluators), stream=None)
    summary = run_spark(folder, tmp_path / "out", dep, observer, spark=spark)
    expected = assert_outputs_equal_oracle(tmp_path / "out", list(iter_lines(folder)), dep)
    assert list(iter_lines(folder)) == lines and len(expected.deliveries) > 20
    assert summary.batches == -(-len(lines) // 37)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not list((tmp_path / "out").rglob("chunk-*"))


@pytest.mark.parametrize("content", [b"", BOM], ids=["empty", "bom-only"])
def test_an_input_of_no_record_is_a_run_of_no_batch_as_on_the_local_engine(spark, tmp_path, content):
    """Spark ran a batch 0 of no slice for an input without records, and its sequencer failed it (parts [] where
    0..1 were due); a file of a byte-order mark alone was one malformed_json record on both engines."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(content)
    dep = deployment(evaluators=2)
    summaries = {}
    for engine, runner in (("spark", run_spark), ("local", run_local)):
        observer = RunObserver(RunSummary(engine, dep.router, dep.evaluators), stream=None)
        kwargs = {"spark": spark} if engine == "spark" else {}
        summaries[engine] = runner(source, tmp_path / engine, dep, observer, **kwargs)
        assert read_stream(tmp_path / engine, "dead_letters") == []
        assert (tmp_path / engine / "_SUCCESS").exists()
    assert summaries["spark"].batches == summaries["local"].batches == 0
    assert summaries["spark"].records == summaries["local"].records == 0
