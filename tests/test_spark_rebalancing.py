"""The balancer on the Spark engine: exact under chaos, the same operations as the local engine, restart-safe."""

import os
import signal
import time

import pytest

from skpub.app.engines.local import run_local
from skpub.app.summary import RunObserver, RunSummary
from skpub.kernel.config import BalancerConfig, Window
from skpub.kernel.parts import PART_RE, read_stream
from tests.test_spark_engine import _cli, run
from tests.tiers import case_id, tiered
from tests.workloads import (
    assert_outputs_equal_oracle,
    deployment,
    drifting_cluster_workload,
    projected_deployment,
    random_workload,
    ranked_workload,
    write_lines,
)

pytestmark = [pytest.mark.spark]
"""The fast tier keeps one chaos run (ranked, seconds window) against the oracle and the local engine; the rest is
slow."""


def chaos(dep, seed=0):
    return dep.replace(balancer=BalancerConfig(mode="chaos", seed=seed))


def operation_log(out):
    """The balancer's lines without their timings (the only fields that may differ between engines or runs)."""
    return [{k: v for k, v in row.items() if not k.endswith("seconds")} for row in read_stream(out, "balancer")]


def run_local_too(tmp_path, lines, dep):
    source = tmp_path / "local-in.jsonl"
    write_lines(source, lines)
    out = tmp_path / "local"
    run_local(source, out, dep, RunObserver(RunSummary("local", dep.router, dep.evaluators), stream=None))
    return out


@pytest.mark.parametrize(
    ("workload", "router", "evaluators", "batch_size", "window"),
    tiered(
        [
            ("range", "agrid", 3, 40, Window()),
            ("range", "uniform", 8, 7, Window()),
            ("range", "agrid", 3, 1, Window()),
            ("ranked", "agrid", 4, 30, Window("count", 40)),
            ("ranked", "uniform", 3, 50, Window("seconds", 30.0)),
            ("range", "kdt", 8, 20, Window()),
            ("ranked", "kdt", 8, 30, Window("count", 40)),
            ("ranked", "text", 4, 30, Window("count", 40)),
        ],
        fast={("ranked", "uniform", 3, 50, Window("seconds", 30.0))},
    ),
    ids=case_id,
)
def test_spark_equals_the_oracle_under_chaos_and_logs_the_local_engines_operations(
    spark, tmp_path, workload, router, evaluators, batch_size, window
):
    n = {1: 40, 7: 200}.get(batch_size, 400)
    lines = random_workload(seed=batch_size, n=n) if workload == "range" else ranked_workload(seed=evaluators, n=n)
    dep = chaos(deployment(evaluators=evaluators, router=router, batch_size=batch_size).replace(window=window), seed=5)
    out, summary = run(spark, tmp_path, lines, dep)
    assert_outputs_equal_oracle(out, lines, dep, exact_events=batch_size == 1)
    log = operation_log(out)
    # in a text rectangle only text merges and splits may start, so a draw may find nothing legal
    text = router in ("kdt", "text")
    assert (0 < len(log) <= summary.batches // 2) if text else len(log) == summary.batches // 2 > 0
    assert router != "text" or log[0]["operation"] == "text_merge"  # of four evaluators: a ring is written
    assert log == operation_log(run_local_too(tmp_path, lines, dep))
    assert sum(n for k, n in summary.balancer.items() if k not in ("subscriptions", "placements")) == len(log)
    if workload == "range":
        assert summary.balancer["subscriptions"] == sum(r["subscription_parts_moved"] for r in log) > 0
    leftovers = {p.name for p in (out / "_checkpoint" / "balancer").iterdir()}
    assert len(leftovers) <= 2 + 2 * evaluators, f"plans and hand-offs of finished transfers are pruned: {leftovers}"
    epochs = sorted(p.name for p in (out / "_checkpoint" / "epochs").iterdir())
    # the epochs in force for the last batches: at b - 2, b - 1 (a transfer's), and the one published after b
    assert 0 < len(epochs) <= 3, f"epochs no replay can need are pruned: {epochs}"


@pytest.mark.slow
@pytest.mark.parametrize(("router", "window"), [("kdt", Window("count", 150)), ("agrid", Window())])
def test_spark_equals_the_oracle_on_a_moving_cluster_in_metres_under_adaptive(spark, tmp_path, router, window):
    """Data unlike the other tests' (a projected space in metres, a cluster jumping between four places, Zipf
    terms), the balancer adaptive and eager: Spark equals the oracle and decides as the local engine does."""
    lines = drifting_cluster_workload(seed=11, n=1200)
    balancer = BalancerConfig(mode="adaptive", sigma=1.05, beta=1.0, global_period=7)
    dep = projected_deployment(router, 6, 150, balancer, window)
    out, summary = run(spark, tmp_path, lines, dep)
    assert_outputs_equal_oracle(out, lines, dep)
    log = operation_log(out)
    assert log and log == operation_log(run_local_too(tmp_path, lines, dep))
    assert summary.balancer["subscriptions"] == sum(r["subscription_parts_moved"] for r in log) > 0


@pytest.mark.slow
def test_spark_deliveries_per_batch_equal_a_run_without_rebalancing(spark, tmp_path):
    lines = ranked_workload(seed=5, n=200) + random_workload(seed=6, n=200, invalid=False)
    dep = deployment(evaluators=4, batch_size=25).replace(window=Window("count", 50))
    off, _ = run(spark, tmp_path, lines, dep.replace(balancer=BalancerConfig(mode="off")), name="off")
    on, _ = run(spark, tmp_path, lines, chaos(dep, seed=1), name="on")
    for stream in ("deliveries", "snapshots"):
        assert _per_batch(on, stream) == _per_batch(off, stream)
    # PS2Stream's phase I (a rectangle split by text and merged back) and V-B among them, on Spark's evaluators
    assert {"text_split", "text_merge", "global_adjustment"} <= {row["operation"] for row in operation_log(on)}


def _per_batch(out, stream):
    batches = {}
    for part in (out / stream).glob("part-*.jsonl"):
        batch = int(PART_RE.fullmatch(part.name)["batch"])
        batches.setdefault(batch, set()).update(line for line in part.read_text().splitlines() if line)
    return batches


@pytest.mark.slow
@pytest.mark.integration
def test_a_run_killed_after_a_transfer_batch_commits_resumes_exactly(tmp_path):
    """SIGKILL the driver once a transfer batch is committed (hand-offs saved, routing update not yet run), resume.

    The resumed run completes the transfer from the checkpoint (the plan, the
    hand-offs, the published epoch) and its output equals the oracle's.
    """
    lines = random_workload(seed=12, n=1500, invalid=False)
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    out = tmp_path / "out"
    (tmp_path / "dep.json").write_text(
        '{"space": [0, 0, 100, 100], "grid_size": 20, "index_block": 2, "sample_size": 200}'
    )
    args = ["--input", str(source), "--output", str(out), "--evaluators", "3", "--batch-size", "50",
            "--config", str(tmp_path / "dep.json"), "--balancer", "chaos", "--balancer-seed", "4"]  # fmt: skip
    proc = _cli(args, start_new_session=True)
    commits = out / "_checkpoint" / "query" / "commits"
    handoffs = out / "_checkpoint" / "balancer"
    deadline = time.monotonic() + 300
    transfer = None
    while transfer is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the run ended before it could be killed:\n{proc.stdout.read()}")
        done = {int(p.name) for p in commits.glob("[0-9]*")} if commits.is_dir() else set()
        sent = {int(p.name.split("-")[1]) for p in handoffs.glob("handoff-*.json")} if handoffs.is_dir() else set()
        transfer = next((b for b in sorted(sent) if b >= 5 and b in done), None)
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "_SUCCESS").exists()
    assert (handoffs / f"plan-{transfer - 1:08d}.json").exists()
    rerun = _cli(args)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output
    assert "resuming from checkpoint" in output
    dep = chaos(deployment(evaluators=3, batch_size=50), seed=4)
    assert_outputs_equal_oracle(out, lines, dep)
    assert operation_log(out) == operation_log(run_local_too(tmp_path, lines, dep))


@pytest.mark.slow
def test_the_drivers_balancer_step_is_counted_once_in_the_stage_cpu(spark, tmp_path, monkeypatch):
    """On Spark the driver's balancer step is the ``balancer`` stage, not also part of ``sink`` (the summary's
    serial fraction sums the stages): a step made to spend 1 s of CPU a batch shows in the one, not the other.

    The sink's own CPU is about 0.16 s a batch, and up to 0.21 s under a second suite; a second count of the step
    would add 1 s, so the bound of half of that leaves the sink's own work a wide margin on a busy machine."""
    from skpub.app.engines import spark as spark_engine

    real = spark_engine.Sink._balance
    step_seconds = 1.0

    def slow_balance(self, batch_id, counters, report):  # noqa: ANN001, ANN202
        start = time.thread_time()
        while time.thread_time() - start < step_seconds:
            pass
        return real(self, batch_id, counters, report)

    monkeypatch.setattr(spark_engine.Sink, "_balance", slow_balance)
    lines = random_workload(seed=61, n=120, invalid=False)
    _, summary = run(spark, tmp_path, lines, chaos(deployment(evaluators=3, batch_size=40), seed=1))
    batches = summary.batches
    assert batches == 3
    assert summary.stage_cpu["balancer"] >= step_seconds * batches
    assert summary.stage_cpu["sink"] < step_seconds * batches / 2, summary.stage_cpu
