"""``skpub simulate``: scenarios, runs, the recommendation and the report (opened in headless Chromium)."""

import csv
import json
import re
import shutil
import subprocess
from collections import defaultdict

import pytest

from skpub.app.cli import main
from skpub.app.simulate import (
    BatchFigures,
    RunResult,
    Strategy,
    load_scenario,
    median_run,
    override,
    parse_scenario,
    recommend,
    shipped_scenarios,
)
from skpub.kernel.errors import ConfigError

TINY = {
    "title": "tiny",
    "description": "a few thousand GeoNames places, every kind of subscription",
    "workload": {"objects": 2500, "live": 150, "window": 800, "burst_regions": 0.3, "burst_side_scale": 0.2},
    "batch_size": 300,
    "routers": ["agrid", "kdt", "kdtree", "text", "uniform"],
    "balancers": ["off", "chaos"],
    "evaluators": [2, 5],
    "maps": [0, 3, -1],
}


def test_every_shipped_scenario_parses_and_names_its_strategies():
    names = shipped_scenarios()
    assert {"uniform", "drift", "burst", "shift", "q1", "q2", "q3"} <= set(names)
    for name in names:
        scenario = load_scenario(name)
        assert scenario.name == name and scenario.title
        assert len(scenario.strategies()) == len(scenario.routers) * len(scenario.balancers) * len(scenario.evaluators)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"routers": ["agrid", "rtree"]}, "router 'rtree'"),
        ({"balancers": ["sometimes"]}, "balancer 'sometimes'"),
        ({"evaluators": [0]}, "evaluators 0"),
        ({"batch_size": 0}, "batch_size 0"),
        ({"workload": {"drift_scale": 2}}, "workload: drift_scale"),
        ({"workload": {"colour": "red"}}, "workload: "),
        ({"stray": 1}, "stray"),
        ({"routers": []}, "no strategy"),
        ({"evaluators": list(range(1, 40))}, "strategies (at most 64)"),
        ({"evaluators": [5000]}, "evaluators 5000"),
        ({"workload": {"live": 10**9}}, "workload live"),
        ({"workload": {"objects": "many"}}, "workload: Expected `int | null`"),
        ({"workload": {"seed": 1.5}}, "workload: "),
        ({"maps": list(range(20))}, "20 maps"),
        ({"routing_units": 0}, "routing_units 0"),
        ({"routing_units": 5000}, "routing_units 5000"),
    ],
)
def test_a_bad_scenario_is_refused_with_the_reason(change, message):
    raw = {**TINY, **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_scenario("bad", json.dumps(raw).encode())


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"title": 3}', b"\xff\xfe"])
def test_malformed_scenario_bytes_are_a_config_error(data):
    with pytest.raises(ConfigError):
        parse_scenario("bad", data)


def test_a_strategy_the_deployment_refuses_stops_simulate_before_any_run(tmp_path):
    from skpub.app.simulate import simulate

    scenario = parse_scenario(
        "tiny", json.dumps({**TINY, "routers": ["agrid", "uniform"], "evaluators": [2, 1021]}).encode()
    )
    seen = []
    with pytest.raises(ConfigError, match="1021 x 1 ranges"):  # 1021 is prime: one row on a 1000-cell side
        simulate([scenario], tmp_path / "work", lambda done, text: seen.append(text))
    assert seen == [] and not (tmp_path / "work").exists()


def test_a_scenario_name_must_be_a_safe_file_name(tmp_path):
    path = tmp_path / "no good.json"
    path.write_text(json.dumps(TINY))
    with pytest.raises(ConfigError, match="scenario name"):
        load_scenario(str(path))
    with pytest.raises(ConfigError, match="no scenario 'nope'"):
        load_scenario("nope")


def _result(router, evaluators, throughput, workload):
    batch = BatchFigures(0, 1000, 1000 / throughput, 0.0, 1, workload, 1.0, 1.0, 1.0, 0, 0, 0)
    return RunResult("s", Strategy(router, "off", evaluators), [batch])


def test_recommend_takes_the_fewest_evaluators_that_are_fast_enough_and_breaks_near_ties_by_workload():
    results = [
        _result("agrid", 4, 1000, 50),
        _result("kdtree", 4, 1020, 90),  # faster by 2%: a tie, and more work
        _result("uniform", 4, 700, 40),
        _result("agrid", 8, 1080, 60),  # only 8% more with twice the evaluators
        _result("agrid", 2, 600, 30),
    ]
    pick = recommend(results)
    assert pick.result.strategy == Strategy("agrid", "off", 4)
    assert "uniform · off · 4 ev" in pick.reason and "8 evaluators give only 8% more" in pick.reason
    assert recommend(results, enough=0.99).result.strategy.evaluators == 8
    with pytest.raises(ValueError):
        recommend([])


def test_the_command_line_routing_units_are_bounded():
    scenario = load_scenario("q1")
    assert scenario.routing_units == 1 and override(scenario, routing_units=8).routing_units == 8
    for bad in (0, 1025):
        with pytest.raises(ConfigError, match="--routing-units must be 1 to 1024"):
            override(scenario, routing_units=bad)


def test_repeated_runs_take_each_batchs_median_time():
    def run(times):
        batches = [BatchFigures(i, 10, t, t / 4, 1, 5, 1.0, 1.0, 1.0, 0, 0, 3) for i, t in enumerate(times)]
        return RunResult("s", Strategy("agrid", "off", 2), batches, {}, sum(times), routing_units=3)

    combined = median_run([run([1.0, 9.0]), run([3.0, 1.0]), run([2.0, 2.0])])
    assert [b.parallel_seconds for b in combined.batches] == [2.0, 2.0]
    assert [b.routing_unit_seconds for b in combined.batches] == [0.5, 0.5] and combined.routing_unit_share == 0.25
    assert combined.routing_units == 3
    assert combined.throughput == 20 / 4.0 and combined.total_workload == 10
    with pytest.raises(ValueError):
        median_run([run([1.0]), run([1.0, 2.0])])
    with pytest.raises(ValueError):
        median_run([])
    assert main(["simulate", "q1", "--repeat", "0"]) == 2


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    scenario = root / "tiny.json"
    scenario.write_text(json.dumps(TINY))
    out = root / "report"
    assert main(["simulate", str(scenario), "--output", str(out), "--routing-units", "3"]) == 0
    return out


def test_the_parse_is_shared_by_the_routing_units_and_the_rest_is_not():
    from collections import Counter

    from skpub.app.summary import BatchReport, parallel_seconds, routing_unit_seconds

    report = BatchReport(batch_id=0)
    report.stage_cpu = Counter({"parse": 6.0, "sequencer": 1.0, "balancer": 0.75})
    report.evaluator_cpu = {0: 2.0, 1: 3.0}
    report.evaluator_balancer_cpu = {0: 1.5, 1: 0.25}  # evaluator 0 is the slowest with its balancer steps
    assert routing_unit_seconds(report, 3) == 6.0 / 3 + 1.0 + 0.0  # no decision: the steps were the evaluators'
    assert parallel_seconds(report, 3) == 3.0 + 3.5
    report.stage_cpu["balancer"] = 2.0  # the decision: balancer CPU less the evaluators' steps
    assert routing_unit_seconds(report) == 7.0 + 0.25 and parallel_seconds(report) == 7.25 + 3.5


@pytest.mark.slow
def test_simulate_writes_every_figure_and_routing_never_changes_results(report):
    strategies = list(csv.DictReader((report / "strategies.csv").open()))
    batches = list(csv.DictReader((report / "batches.csv").open()))
    assert len(strategies) == 20
    assert {row["routing_units"] for row in strategies} == {"3"}
    assert all(0 < float(row["routing_unit_share"]) < 1 for row in strategies)
    assert sum(row["recommended"] == "True" for row in strategies) == 1
    per_run = defaultdict(dict)
    for row in batches:
        per_run[(row["router"], row["balancer"], row["evaluators"])][int(row["batch"])] = row
    assert len(per_run) == 20
    # every strategy delivers the same number of results in every batch (exactness), accepts the same objects,
    # ships each object to at most one evaluator when routing by space (and no text split by the balancer made a
    # rectangle text-partitioned), and registers every range subscription
    reference = next(iter(per_run.values()))
    for (router, balancer, _), run in per_run.items():
        assert {b: r["deliveries"] for b, r in run.items()} == {b: r["deliveries"] for b, r in reference.items()}
        assert {b: r["objects"] for b, r in run.items()} == {b: r["objects"] for b, r in reference.items()}
        assert all(float(r["replication"]) >= 1.0 for r in run.values())
        if router in ("agrid", "kdtree", "uniform") and balancer == "off":
            assert all(float(r["shipping"]) <= 1.0 for r in run.values())
    assert sum(int(r["deliveries"]) for r in reference.values()) > 100
    chaos = [r for r in strategies if r["balancer"] == "chaos" and r["router"] in ("agrid", "kdtree", "uniform")]
    assert all(int(row["operations"]) > 0 for row in chaos)
    assert all(int(row["operations"]) == 0 for row in strategies if row["balancer"] == "off")
    assert json.loads((report / "_skpub_report.json").read_text())["state"] == "complete"
    assert (report / "tiny-figures.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (report / "tiny-maps.png").stat().st_size > 10_000
    page = (report / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Recommended:" in page
    assert "3 routing units share the parse" in page


@pytest.mark.slow
def test_a_report_directory_is_never_clobbered(report, tmp_path):
    # a second report over the first needs --overwrite; foreign files are never touched
    assert main(["simulate", "q1", "--output", str(report), "--objects", "100"]) == 2
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert main(["simulate", "q1", "--output", str(foreign), "--objects", "100"]) == 2
    assert (foreign / "notes.txt").read_text() == "keep" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (.ci/run installs Debian's package)")
def test_the_report_opens_in_headless_chromium_with_every_image_loaded(report, tmp_path):
    command = [
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000", "--dump-dom", (report / "index.html").as_uri(),
    ]  # fmt: skip
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    assert 'data-images-loaded="2/2"' in dom
    assert "Recommended:" in dom
