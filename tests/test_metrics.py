"""Metrics: read back from the registry, and scraped by a real Prometheus server."""

import json
import shutil
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from skpub.app.engines.local import run_local
from skpub.app.metrics import Metrics
from skpub.app.summary import RunObserver, RunSummary
from tests.served import free_port, start_prometheus
from tests.workloads import deployment, random_workload, write_lines


def run_with_metrics(tmp_path, metrics):
    lines = random_workload(seed=8, n=400)
    write_lines(tmp_path / "in.jsonl", lines)
    dep = deployment(evaluators=3, batch_size=50)
    observer = RunObserver(RunSummary("local", "agrid", 3), metrics, stream=None)
    return run_local(tmp_path / "in.jsonl", tmp_path / "out", dep, observer)


def sample_values(metrics: Metrics) -> dict:
    from prometheus_client import generate_latest

    values = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def test_metrics_count_what_the_summary_counts(tmp_path):
    metrics = Metrics()
    summary = run_with_metrics(tmp_path, metrics)
    values = sample_values(metrics)
    assert values[("skpub_objects_total", ())] == summary.objects
    assert values[("skpub_deliveries_total", ())] == summary.deliveries
    assert values[("skpub_batches_total", ())] == summary.batches
    for reason, count in summary.dead_letters.items():
        assert values[("skpub_dead_letters_total", (("reason", reason),))] == count
    assert sum(v for (name, _), v in values.items() if name == "skpub_evaluator_cost_total") == sum(
        summary.evaluator_cost
    )
    assert values[("skpub_batch_routing_seconds_count", ())] == summary.batches


def test_balancer_metrics_count_what_the_balancer_did(tmp_path):
    from skpub.kernel.config import BalancerConfig
    from skpub.kernel.parts import read_stream

    metrics = Metrics()
    write_lines(tmp_path / "in.jsonl", random_workload(seed=9, n=400))
    dep = deployment(evaluators=3, batch_size=50).replace(balancer=BalancerConfig(mode="chaos", seed=2))
    observer = RunObserver(RunSummary("local", "agrid", 3), metrics, stream=None)
    summary = run_local(tmp_path / "in.jsonl", tmp_path / "out", dep, observer)
    values = sample_values(metrics)
    log = read_stream(tmp_path / "out", "balancer")
    operations = {labels: v for (name, labels), v in values.items() if name == "skpub_rebalance_operations_total"}
    assert sum(operations.values()) == len(log) == summary.batches // 2  # none decided while one is in flight
    assert {dict(labels)["operation"] for labels in operations} == {r["operation"] for r in log}
    assert values[("skpub_migrated_subscriptions_total", ())] == sum(r["subscription_parts_moved"] for r in log)
    loads = [v for (name, _), v in values.items() if name == "skpub_evaluator_load"]
    assert len(loads) == 3 and values[("skpub_evaluator_imbalance", ())] == pytest.approx(max(loads) / (sum(loads) / 3))


def test_imbalance_counts_an_evaluator_that_reported_nothing_as_idle():
    from skpub.app.summary import BatchReport
    from skpub.kernel.load import imbalance

    report = BatchReport(0, evaluator_cost={0: 30, 1: 10})  # evaluators 2 and 3 had no rows: no task on Spark
    metrics = Metrics()
    metrics.observe_batch(report, 4)
    assert values_of(metrics, "skpub_evaluator_imbalance") == [3.0] == [report.imbalance(4)]  # 30 / (40 / 4)
    assert report.costs_per_evaluator(4) == [30, 10, 0, 0]
    loads = {labels: v for (name, labels), v in sample_values(metrics).items() if name == "skpub_evaluator_load"}
    assert loads == {(("evaluator", str(e)),): float(c) for e, c in enumerate([30, 10, 0, 0])}
    metrics.observe_batch(BatchReport(1, evaluator_cost={0: 5, 3: 5}), 4)  # evaluator 1 silent now: its load is 0
    assert values_of(metrics, "skpub_evaluator_load") == [5.0, 0.0, 0.0, 5.0]
    with pytest.raises(ValueError, match="not 0-3"):
        BatchReport(2, evaluator_cost={4: 1}).costs_per_evaluator(4)
    assert imbalance([0.0, 0.0]) == imbalance([]) == 1.0 and imbalance([2.0, 2.0]) == 1.0


def values_of(metrics: Metrics, name: str) -> list[float]:
    return [v for (n, _), v in sample_values(metrics).items() if n == name]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus server (.ci/run installs it)")
def test_real_prometheus_scrapes_the_metrics_endpoint(tmp_path):
    metrics = Metrics()
    port = free_port()
    metrics.serve(port)
    summary = run_with_metrics(tmp_path, metrics)
    prom_port = free_port()  # picked just before it is bound: another test process may take a free port meanwhile
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n"
        f"  - job_name: skpub\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    server = start_prometheus(config, tmp_path / "tsdb", prom_port)
    try:
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?query=skpub_objects_total"
        deadline, value = time.monotonic() + 60, None
        while time.monotonic() < deadline and value is None:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    result = json.load(resp)["data"]["result"]
                value = float(result[0]["value"][1]) if result else None
            except OSError:
                pass
            if value is None:
                time.sleep(0.5)
        assert value == summary.objects
    finally:
        server.terminate()
        server.wait(timeout=30)
