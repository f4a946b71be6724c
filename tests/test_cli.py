import io
import json

import pytest

from skpub.app import progress
from skpub.app.cli import main
from skpub.kernel.oracle import replay
from skpub.kernel.parts import read_stream
from skpub.sims.geonames import WorkloadSpec, generate
from tests.workloads import canonical, deployment, random_workload, results_from_events, write_lines


def test_run_local_writes_outputs_and_prints_summary(tmp_path, capsys):
    lines = random_workload(seed=3, n=400)
    write_lines(tmp_path / "in.jsonl", lines)
    (tmp_path / "dep.json").write_text(json.dumps(deployment(evaluators=3, batch_size=64).to_json()))
    code = main([
        "run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"),
        "--config", str(tmp_path / "dep.json"), "--router", "uniform",
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    assert "uniform router, 3 evaluators" in captured.out
    assert "objects/s" in captured.out and "dead letters" in captured.out
    assert "[skpub] batch 0: 64 records" in captured.err  # the first batch's line, warm-up done
    assert "[skpub] done: " in captured.err and "100% of" in captured.err
    assert f"outputs           {tmp_path / 'out'}/" in captured.out
    expected = replay(lines, deployment(evaluators=3, batch_size=64))
    assert canonical(read_stream(tmp_path / "out", "deliveries")) == canonical(expected.deliveries)


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    code = main(["run", "--engine", "local", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_bad_config_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "dep.json").write_text('{"evaluators": 0}')
    code = main(["run", "--engine", "local", "--input", str(tmp_path), "--config", str(tmp_path / "dep.json")])
    assert code == 2
    assert "evaluators must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("evaluators", "grid", "layout"), [(7, 4, "7 x 1"), (7, 7, None), (10, 4, "5 x 2"), (10, 5, None)]
)
def test_a_uniform_layout_the_grid_cannot_hold_is_refused_with_the_deployment(evaluators, grid, layout):
    """Uni-Space-Rout lays n evaluators out as the squarest columns x rows: 7 as 7 x 1, 10 as 5 x 2."""
    from skpub.kernel.config import Deployment
    from skpub.kernel.errors import ConfigError

    if layout:
        with pytest.raises(ConfigError, match=f"as {layout} ranges, more than a {grid} x {grid} grid holds"):
            Deployment(router="uniform", evaluators=evaluators, grid_size=grid)
    else:
        assert Deployment(router="uniform", evaluators=evaluators, grid_size=grid).evaluators == evaluators
    assert Deployment(router="agrid", evaluators=evaluators, grid_size=grid).router == "agrid"  # uniform's layout only


def test_spark_without_java_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    code = main(["run", "--engine", "spark", "--output", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "needs Java 17" in err and "--engine local" in err


@pytest.mark.slow
def test_geonames_workload_is_reproducible_by_seed(tmp_path):
    spec = WorkloadSpec(seed=5, live=50, objects=300)
    first, second = list(generate(spec)), list(generate(spec))
    assert first == second
    assert first != list(generate(WorkloadSpec(seed=6, live=50, objects=300)))
    records = [json.loads(line) for line in first]
    kinds = {r["type"] for r in records}
    assert kinds == {"object", "subscribe", "unsubscribe"}
    assert sum(r["type"] == "object" for r in records) == 300
    subs = [r for r in records if r["type"] == "subscribe"]
    assert {s["kind"] for s in subs} == {"range", "topk", "knn"}
    ranges = [s for s in subs if s["kind"] == "range"]
    assert any("expr" in s for s in ranges) and any("keywords" in s for s in ranges)
    for s in ranges:
        w, h = s["rect"][2] - s["rect"][0], s["rect"][3] - s["rect"][1]
        assert 0.0001 * 360 <= w <= 0.015 * 360 and 0.0001 * 180 <= h <= 0.015 * 180
    for s in subs:
        if s["kind"] != "range":
            assert 1 <= s["k"] <= 20 and len(s["point"]) == 2
        if s["kind"] == "topk":
            assert 0 <= s["alpha"] <= 1 and ("keywords" in s or "weights" in s)
        if s["kind"] == "knn":
            assert s["match"] in ("any", "all") and s["from"] in ("window", "registration")


@pytest.mark.slow
def test_geonames_workload_without_ranked_fractions_is_range_only():
    spec = WorkloadSpec(seed=5, live=50, objects=300, topk_fraction=0, knn_fraction=0)
    kinds = {json.loads(line).get("kind") for line in generate(spec)}
    assert kinds == {None, "range"}


@pytest.mark.slow
def test_a_keyword_burst_gives_bursting_regions_frequent_keywords_and_moves_each_phase():
    from skpub.sims.geonames import bursting, document_frequencies, load_places, region_of

    spec = WorkloadSpec(seed=5, live=0, objects=4000, topk_fraction=0, knn_fraction=0, or_fraction=0, burst_regions=0.3)
    phases = [bursting(spec, p) for p in range(spec.drift_phases)]
    assert all(len(regions) == 30 for regions in phases) and len(set(phases)) == spec.drift_phases
    assert bursting(WorkloadSpec(), 0) == frozenset()
    df = document_frequencies(load_places())
    records = [json.loads(line) for line in generate(spec)]
    per_phase, objects, hot, cold = 1000, 0, [], []
    for r in records:
        if r["type"] == "object":
            objects += 1
        elif r["type"] == "subscribe":
            x, y = (r["rect"][0] + r["rect"][2]) / 2, (r["rect"][1] + r["rect"][3]) / 2
            phase = max(0, objects - 1) // per_phase
            (hot if region_of(x, y) in phases[phase] else cold).append(min(df[k] for k in r["keywords"]))
    assert hot and cold
    assert sorted(hot)[len(hot) // 2] > 50 * sorted(cold)[len(cold) // 2], "bursting keywords are the frequent ones"


@pytest.mark.slow
def test_workload_command_writes_stream_and_vocabulary(tmp_path, capsys):
    code = main(["workload", "geonames", "--output", str(tmp_path), "--objects", "200", "--live", "20"])
    assert code == 0
    vocab = json.loads((tmp_path / "vocabulary.json").read_text())
    assert vocab["N"] > 200_000 and all(df > 1 for df in vocab["df"].values())
    assert sum(1 for _ in (tmp_path / "stream.jsonl").open()) >= 220


@pytest.mark.slow
def test_default_run_shows_all_three_kinds(tmp_path, capsys):
    """Without --input the GeoNames default runs with its window: range matches and topk/knn events."""
    out = tmp_path / "out"
    code = main([
        "run", "--engine", "local", "--output", str(out), "--live", "300", "--objects", "3000",
        "--window", "1000", "--batch-size", "700", "--keyword-percentile", "100", "--quiet",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    deliveries = read_stream(out, "deliveries")
    assert {d["event"] for d in deliveries} == {"match", "enter", "exit"}
    assert any("score" in d for d in deliveries) and any("dist" in d for d in deliveries)
    results = results_from_events([d for d in deliveries if d["event"] != "match"])
    assert results and all(sum(objs.values()) <= 20 for objs in results.values())


def test_a_shift_workload_is_normal_then_condensed_in_one_corner_and_stays():
    """Objects before ``shift_at`` spread over the space; after it, all lie in the south-west 0.4 x 0.4 corner, and so
    do the subscriptions registered after it (fails if the shift moved on, or never came)."""
    from skpub.sims.geonames import SPACE

    spec = WorkloadSpec(objects=2000, live=50, drift_scale=0.4, shift_at=0.5, topk_fraction=0, knn_fraction=0)
    docs = [json.loads(line) for line in generate(spec)]
    objects = [d for d in docs if d["type"] == "object"]
    corner = (SPACE.xmin, SPACE.ymin, SPACE.xmin + 0.4 * SPACE.width, SPACE.ymin + 0.4 * SPACE.height)

    def inside(x, y):
        return corner[0] - 1e-9 <= x <= corner[2] + 1e-9 and corner[1] - 1e-9 <= y <= corner[3] + 1e-9

    assert all(inside(o["x"], o["y"]) for o in objects[1000:])
    assert sum(inside(o["x"], o["y"]) for o in objects[:1000]) < 900
    first_after = next(i for i, d in enumerate(docs) if d is objects[1000])
    late = [d for d in docs[first_after:] if d["type"] == "subscribe"]
    assert late and all(inside(*d["rect"][:2]) and inside(*d["rect"][2:]) for d in late)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_live_bar_on_a_terminal_and_sparse_plain_lines_elsewhere(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    plain = io.StringIO()
    display = progress.ProgressDisplay(plain, total=1000, every_seconds=5)
    for second in range(12):
        clock[0] = float(second)
        display.update(second * 50, f"batch {second}", "figures")
    display.update(1000, "done", "all", force=True)
    lines = plain.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "[skpub] batch 0",
        "[skpub] batch 5",
        "[skpub] batch 10",
        "[skpub] done",
    ]
    assert lines[1].endswith("25% of 1.0 kB, ETA 15 s") and lines[-1].endswith("100% of 1.0 kB")
    assert not display.live
    unknown = io.StringIO()
    progress.ProgressDisplay(unknown, total=None).update(5, "batch 0", "figures", force=True)
    assert unknown.getvalue() == "[skpub] batch 0: figures\n"  # standard input: no share, no ETA
    screen = Terminal()
    live = progress.ProgressDisplay(screen, total=3, unit=progress.RUNS)
    assert live.live
    live.update(2, "drift", "adaptive")
    live.note("a note")
    live.close()
    assert "drift" in screen.getvalue() and "2/3" in screen.getvalue() and "[skpub] a note" in screen.getvalue()


def test_a_token_is_one_printable_ascii_word_from_its_file_or_the_environment(tmp_path, monkeypatch):
    """load_token: the file's one token (surrounding blanks dropped), else $SKPUB_TOKEN, else None; an empty,
    non-ASCII, spaced or oversized file is a ConfigError naming the flag."""
    from skpub.app.bearer import MAX_TOKEN_BYTES, TOKEN_ENV, load_token
    from skpub.kernel.errors import ConfigError

    good = tmp_path / "good"
    good.write_bytes(b"  s3cr3t-token\n")
    assert load_token(str(good)) == "s3cr3t-token"
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert load_token(None) == "from-env"
    monkeypatch.delenv(TOKEN_ENV)
    assert load_token(None) is None
    for name, content in [("empty", b"\n"), ("accent", "caf\u00e9".encode()), ("two", b"a b"),
                          ("huge", b"x" * (MAX_TOKEN_BYTES + 1))]:  # fmt: skip
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ConfigError, match="--token-file"):
            load_token(str(path))


def test_the_cli_starts_without_the_daemon_the_engines_or_the_balancer():
    """Importing the CLI (every command's start, ``--help`` included) loads none of the daemon's, engines' or
    balancer's modules: a client verb needs none of them (fails if a top-level import pulls them in again)."""
    import subprocess
    import sys

    code = (
        "import sys, skpub.app.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('skpub.app.daemon', 'skpub.app.serve', "
        "'skpub.app.engines', 'skpub.balancer', 'scipy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
