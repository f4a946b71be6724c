"""dashboards/: the Grafana dashboard, its provisioning, the Prometheus scrape config and alert rules.

Checked statically (every panel queries metrics the daemon exports), with
promtool (rules, their unit tests, the config), and against a real Prometheus
scraping a daemon under load: every panel's query returns data.
"""

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from skpub.app.daemon import Daemon
from skpub.kernel.config import BalancerConfig
from tests.served import Served, WebhookReceiver, free_port, start_prometheus
from tests.workloads import deployment, random_workload

DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards"
DASHBOARD = DASHBOARDS / "grafana" / "dashboards" / "skpub.json"
PROMETHEUS = DASHBOARDS / "prometheus"
NOT_METRICS = {"sum", "rate", "increase", "histogram_quantile", "max", "by", "le", "or", "on", "up", "label_values"}


def panel_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = dashboard["templating"]["list"]
    assert [v["name"] for v in variables] == ["datasource", "instance"]  # imported without edits: any Prometheus
    assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
    sources = [p["datasource"] for p in dashboard["panels"]] + [t["datasource"] for p in dashboard["panels"]
                                                                 for t in p["targets"]]  # fmt: skip
    assert {s["uid"] for s in sources} == {"${datasource}"} and variables[1]["datasource"]["uid"] == "${datasource}"
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(dashboard["panels"]) >= 18 and all(queries)
    return queries


def test_every_panel_queries_metrics_the_daemon_exports(tmp_path):
    daemon = Daemon(tmp_path, deployment())
    exported = set()
    for family in daemon.metrics.registry.collect():
        exported |= {family.name, *(s.name for s in family.samples)}
        if family.type == "counter":
            exported.add(family.name + "_total")
        if family.type == "histogram":
            exported |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    daemon.stop()
    for query in panel_queries():
        names = set(re.findall(r"\b([a-z_]+)(?=\{|\[)", query)) - NOT_METRICS
        assert names and names <= exported, (query, names - exported)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=PROMETHEUS, check=False)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (.ci/run installs prometheus)")
def test_alert_rules_pass_promtool_and_their_unit_tests(tmp_path):
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    (tmp_path / "token").write_text("t0ken\n")
    config = scrape_config(tmp_path, "127.0.0.1:8750", tmp_path / "token")
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def scrape_config(tmp_path: Path, target: str, token_file: Path, interval: str = "15s") -> Path:
    """The shipped prometheus.yml with its placeholders filled in, beside a copy of the rules."""
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    text = (PROMETHEUS / "prometheus.yml").read_text()
    text = text.replace("SKPUB_TARGET", target).replace("SKPUB_TOKEN_FILE", str(token_file))
    text = text.replace("scrape_interval: 15s", f"scrape_interval: {interval}")
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    return path


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus server (.ci/run installs it)")
def test_a_real_prometheus_scrapes_a_daemon_under_load_and_every_panel_has_data(tmp_path):
    dep = deployment(evaluators=3, batch_size=20).replace(balancer=BalancerConfig(mode="chaos", seed=3))
    (tmp_path / "dep.json").write_text(json.dumps(dep.to_json()))
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    served = Served(tmp_path / "data", tmp_path / "dep.json", token="t0ken")
    receiver = WebhookReceiver()
    assert served.http.put("/v1/targets/hook", json={"kind": "webhook", "url": receiver.url}).status_code == 201
    prom_port = free_port()
    config = scrape_config(tmp_path, f"127.0.0.1:{served.port}", token, interval="1s")
    prometheus = start_prometheus(config, tmp_path / "tsdb", prom_port)
    try:
        lines = random_workload(seed=41, n=3000)
        for start in range(0, len(lines), 100):  # load over several scrapes
            served.post(lines[start : start + 100])
            served.http.get("/v1/deliveries", params={"after": 0, "limit": 10})
            time.sleep(0.15)
        served.wait_ready()
        instance = f"127.0.0.1:{served.port}"  # a regex matching itself (a dot matches a dot)
        pending = {q.replace("$instance", instance) for q in panel_queries()}
        deadline = time.monotonic() + 90
        while pending and time.monotonic() < deadline:
            for expr in sorted(pending):
                try:
                    if query(prom_port, expr):
                        pending.discard(expr)
                except OSError:
                    break  # Prometheus still starting
            time.sleep(1)
        assert not pending, f"panels without data: {sorted(pending)}"
        assert query(prom_port, 'ALERTS{alertname="SkpubInternalError"}') == []
    finally:
        receiver.close()
        prometheus.terminate()
        prometheus.wait(30)
        served.proc.terminate()
        served.proc.wait(60)
