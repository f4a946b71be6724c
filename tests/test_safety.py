"""Never stop, never lose, never trust: outputs, checkpoints, internal errors, the id horizon, bad invocations."""

import io
import json
import os
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import skpub.router.locate
from skpub.app.checkpoint import Checkpoint, checkpoint_foreign_entries
from skpub.app.cli import main
from skpub.app.engines.local import run_local
from skpub.app.summary import RunObserver, RunSummary
from skpub.evaluators.durable import state_document
from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.evaluator import BLOCK_KEY, decode_block
from skpub.evaluators.gi2 import GI2Index
from skpub.evaluators.window import decode_segment, encode_segment
from skpub.kernel.errors import CheckpointError, OutputError
from skpub.kernel.grid import FineGrid
from skpub.kernel.oracle import replay
from skpub.kernel.parts import read_stream
from skpub.kernel.records import stream_position
from skpub.kernel.registry import IdRegistry
from skpub.router.state import decode_journal, decode_registry, encode_registry
from tests.profiles import examples
from tests.workloads import canonical, deployment, letters, random_workload, ranked_workload, write_lines


def observer(dep):
    return RunObserver(RunSummary("local", dep.router, dep.evaluators), stream=None)


def local(tmp_path, lines, dep, out=None, overwrite=False):
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    out = out or tmp_path / "out"
    return out, run_local(source, out, dep, observer(dep), overwrite=overwrite)


def tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- outputs never destroy


@pytest.mark.parametrize(
    "foreign",
    ["notes.txt", "deliveries/mine.jsonl", "dead_letters/part-1.jsonl", "statistics/sub/x", "_checkpoint/mine.bin"],
)
def test_output_with_foreign_files_is_refused_and_they_survive(tmp_path, foreign):
    out = tmp_path / "out"
    path = out / foreign
    path.parent.mkdir(parents=True)
    path.write_text("not skpub's")
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="did not write"):
            local(tmp_path, random_workload(seed=1, n=50), deployment(), out=out, overwrite=overwrite)
    assert path.read_text() == "not skpub's"


def test_cli_refuses_foreign_output_with_exit_code_2(tmp_path, capsys):
    write_lines(tmp_path / "in.jsonl", random_workload(seed=1, n=50))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("precious")
    code = main(["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out")])
    assert code == 2
    assert "thesis.tex" in capsys.readouterr().err
    assert (tmp_path / "out" / "thesis.tex").read_text() == "precious"


def test_overwrite_never_follows_symlinks(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "part-00000000.jsonl").write_text("someone else's part file\n")
    dep = deployment(batch_size=40)
    out, _ = local(tmp_path, random_workload(seed=2, n=100), dep)
    os.symlink(outside, out / "snapshots" / "linked")
    with pytest.raises(OutputError, match="snapshots/linked"):
        local(tmp_path, random_workload(seed=2, n=100), dep, overwrite=True)
    (out / "snapshots" / "linked").unlink()
    os.symlink(outside / "part-00000000.jsonl", out / "snapshots" / "part-00000009.jsonl")
    with pytest.raises(OutputError, match="part-00000009"):
        local(tmp_path, random_workload(seed=2, n=100), dep, overwrite=True)
    assert (outside / "part-00000000.jsonl").read_text() == "someone else's part file\n"


def test_unwritable_output_is_a_sentence(tmp_path, capsys):
    write_lines(tmp_path / "in.jsonl", random_workload(seed=1, n=20))
    (tmp_path / "file").write_text("x")
    code = main(["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "file")])
    assert code == 2
    assert "is not a directory" in capsys.readouterr().err
    code = main(["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", "/proc/skpub-out"])
    assert code == 2
    assert "cannot write output directory" in capsys.readouterr().err


@pytest.mark.slow
def test_killed_local_run_leaves_no_success_and_its_rerun_equals_a_clean_run(tmp_path):
    """Kill the local engine mid-stream with SIGKILL, rerun the same command: same bytes as a clean run."""
    lines = random_workload(seed=4, n=3000)
    write_lines(tmp_path / "in.jsonl", lines)
    (tmp_path / "dep.json").write_text(json.dumps(deployment(evaluators=3, batch_size=2).to_json()))
    base = [sys.executable, "-m", "skpub.app.cli", "run", "--engine", "local", "--input", str(tmp_path / "in.jsonl")]
    base += ["--config", str(tmp_path / "dep.json"), "--quiet"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*base, "--output", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = killed / "statistics"
    while proc.poll() is None and len(list(parts.glob("part-*.jsonl")) if parts.is_dir() else []) < 200:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert len(list(parts.glob("part-*.jsonl"))) < -(-len(lines) // 2), "the run finished before the kill"
    assert not (killed / "_SUCCESS").exists()
    subprocess.run([*base, "--output", str(killed)], check=True)
    clean = tmp_path / "clean"
    subprocess.run([*base, "--output", str(clean)], check=True)
    assert (killed / "_SUCCESS").exists()
    skip = ("statistics/", "_skpub_run.json")  # CPU seconds differ between runs

    def timeless(path: str, data: bytes):
        if not path.startswith("balancer/"):
            return data
        return [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")} for line in data.splitlines()]

    assert {k: timeless(k, v) for k, v in tree(killed).items() if not k.startswith(skip)} == {
        k: timeless(k, v) for k, v in tree(clean).items() if not k.startswith(skip)
    }
    assert sorted(tree(killed)) == sorted(tree(clean))


@pytest.mark.parametrize("foreign", ["query/reports/q.sql", "manifest.json", "source/holiday.jpg"])
@pytest.mark.parametrize("marked", [False, True])
def test_checkpoint_with_foreign_files_is_never_cleared(tmp_path, foreign, marked):
    """A directory skpub did not create (no marker) is never cleared, even where skpub's names appear."""
    root = tmp_path / "ckpt"
    if marked:
        Checkpoint(root).create()
    path = root / foreign
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("precious")
    if marked and foreign != "source/holiday.jpg":
        Checkpoint(root).clear()  # skpub's own checkpoint: its query/ and manifest are skpub's to clear
        assert not path.exists()
        return
    with pytest.raises(CheckpointError, match="did not write"):
        Checkpoint(root).clear()
    with pytest.raises(CheckpointError, match="did not write"):
        Checkpoint(root).create()
    assert path.read_text() == "precious"


def test_a_checkpoint_of_the_old_base_name_still_resumes_from_its_bases(tmp_path):
    """Bases were named ``snapshot-<b>.json`` before 2026-11-27: still skpub's, read as bases (the new name wins),
    and pruned as bases: what a replay needs stays, an old name another base supersedes goes."""
    checkpoint = Checkpoint(tmp_path / "ckpt")
    checkpoint.create()
    names = ["snapshot-00000015.json", "snapshot-00000031.json", "base-00000031.json", "base-00000047.json"]
    names += [f"delta-{b:08d}.json" for b in (16, 32, 40, 48)]
    for folder in (checkpoint.router, checkpoint.merge):
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).write_text("{}")
    checkpoint.epochs.mkdir(parents=True, exist_ok=True)
    for number in (999_999, 1_000_000):  # the millionth epoch of a long run is still skpub's
        (checkpoint.epochs / f"epoch-{number:06d}.json").write_text("{}")
    assert checkpoint_foreign_entries(checkpoint.root) == []
    (checkpoint.epochs / "epoch-0000001.json").write_text("{}")  # a name skpub never writes
    assert checkpoint_foreign_entries(checkpoint.root) == ["epochs/epoch-0000001.json"]
    (checkpoint.epochs / "epoch-0000001.json").unlink()
    for files, folder in ((checkpoint.router_files, checkpoint.router), (checkpoint.merge_files, checkpoint.merge)):
        assert files("base") == {
            15: folder / "snapshot-00000015.json",
            31: folder / "base-00000031.json",
            47: folder / "base-00000047.json",
        }
        assert sorted(files("delta")) == [16, 32, 40, 48]
    checkpoint.prune_states(40)  # a replay of 40 reads base 31 and deltas 32 to 39
    for folder in (checkpoint.router, checkpoint.merge):
        left = ["base-00000031.json", "base-00000047.json", "delta-00000032.json", "delta-00000040.json"]
        assert sorted(p.name for p in folder.iterdir()) == [*left, "delta-00000048.json"]
    checkpoint.prune_states(48)
    for folder in (checkpoint.router, checkpoint.merge):
        assert sorted(p.name for p in folder.iterdir()) == ["base-00000047.json", "delta-00000048.json"]


def test_batch_ids_past_eight_digits_keep_their_files_and_their_order(tmp_path):
    """Batch 100,000,000 of a long-running daemon writes nine-digit checkpoint names: still skpub's, read and pruned
    in batch order (by name, ``base-100000000`` sorts before ``base-99999999``); ``000000001`` is a name skpub never
    writes."""
    from skpub.app.engines.local_checkpoint import checkpoints
    from skpub.kernel.parts import write_lines

    last, first = 99_999_999, 100_000_000
    checkpoint = Checkpoint(tmp_path / "ckpt")
    checkpoint.create()
    for folder in (checkpoint.router, checkpoint.merge, checkpoint.routed, checkpoint.balancer):
        folder.mkdir(parents=True, exist_ok=True)
    for b in (last, first):
        (checkpoint.router / f"base-{b:08d}.json").write_text("{}")
        (checkpoint.router / f"delta-{b + 1:08d}.json").write_text("{}")
        checkpoint.routed_file(b, 0).write_text("")
        (checkpoint.balancer / f"handoff-{b:08d}-002.json").write_text("{}")
    killed = [  # what writes killed mid-way leave, nine digits too
        checkpoint.routed / f".rows-{first}-001.arrow.k1ll3d.tmp",
        checkpoint.balancer / f".handoff-{first}-003.json.k1ll3d.tmp",
    ]
    for path in killed:
        path.write_text("")
    assert checkpoint_foreign_entries(checkpoint.root) == []
    assert killed[0] in checkpoint.row_files()[first] and killed[1] in checkpoint.balancer_files()[first]
    assert list(checkpoint.router_files("base")) == [last, first]
    assert sorted(checkpoint.row_files()) == [last, first] == sorted(checkpoint.balancer_files())
    (checkpoint.router / "delta-000000001.json").write_text("{}")
    assert checkpoint_foreign_entries(checkpoint.root) == ["router/delta-000000001.json"]
    (checkpoint.router / "delta-000000001.json").unlink()
    checkpoint.prune_states(first + 1)  # a replay of first + 1 reads base first: base last goes
    assert sorted(checkpoint.router_files("base")) == [first]

    out = tmp_path / "out"
    for b in (first, last):
        write_lines(out, "deliveries", b, json.dumps({"batch": b}).encode() + b"\n")
    (out / "deliveries" / f".part-{first}.jsonl.k1ll3d.tmp").write_text("{}\n")  # a killed write: not read
    assert [row["batch"] for row in read_stream(out, "deliveries")] == [last, first]
    (tmp_path / "local").mkdir()
    for b in (last, first):
        (tmp_path / "local" / f"checkpoint-{b:08d}.skpub").write_text("")
    assert sorted(checkpoints(tmp_path / "local")) == [last, first]


@examples(2)
@given(batches=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8, unique=True), data=st.data())
def test_output_part_names_sort_in_batch_order_and_replace_their_eight_digit_names(batches, data):
    """Output parts are named so that name order is batch order for any 64-bit batch id (``ls``, ``cat part-*``
    and a consumer's sort see the batches in order: eight digits broke at batch 100,000,000), writers after a
    batch's one-writer part as before; parts an older skpub wrote with eight digits are read in their place, and a
    batch written again replaces them, so nothing is read twice."""
    from skpub.kernel.parts import PART_RE, batch_parts, part_path, rename_eight_digit_parts, write_lines, write_part

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for b in batches:
            write_part(out, "deliveries", b, [{"batch": b, "writer": "m"}], "m")
            write_part(out, "deliveries", b, [{"batch": b, "writer": ""}])
        names = sorted(p.name for p in (out / "deliveries").iterdir())
        assert [int(PART_RE.fullmatch(name)["batch"]) for name in names] == sorted(batches * 2)
        assert [row["batch"] for row in read_stream(out, "deliveries")] == sorted(batches * 2)
        assert [p.name for p in batch_parts(out, "deliveries", batches[0])] == [
            part_path(out, "deliveries", batches[0]).name,
            part_path(out, "deliveries", batches[0], "m").name,
        ]
        older = data.draw(st.sampled_from(batches))  # its parts as skpub before 2026-11-29 named them
        for writer in ("", "m"):
            suffix = f"-{writer}" if writer else ""
            part_path(out, "deliveries", older, writer).rename(out / "deliveries" / f"part-{older:08d}{suffix}.jsonl")
        assert [row["batch"] for row in read_stream(out, "deliveries")] == sorted(batches * 2)
        write_lines(out, "deliveries", older, b'{"batch": %d, "writer": "m"}\n' % older, "m")  # a replay of it
        assert [row["batch"] for row in read_stream(out, "deliveries")] == sorted(batches * 2)
        assert len(batch_parts(out, "deliveries", older)) == 2
        assert not (out / "deliveries" / f"part-{older:08d}-m.jsonl").exists() or len(f"{older:08d}") == 20
        assert rename_eight_digit_parts(out) == (len(f"{older:08d}") < 20)  # a resume renames the one left
        names = sorted(p.name for p in (out / "deliveries").iterdir())
        assert [int(PART_RE.fullmatch(name)["batch"]) for name in names] == sorted(batches * 2)
        assert [row["batch"] for row in read_stream(out, "deliveries")] == sorted(batches * 2)
        assert rename_eight_digit_parts(out) == 0


@examples(2)
@given(
    batch=st.integers(0, 10**12),
    random=st.text(alphabet=string.ascii_letters + string.digits + "_", min_size=1, max_size=12),
)
def test_own_names_and_their_temporary_names_carry_the_same_named_groups(batch, random):
    """own_files: a name and the temporary name a killed write leaves of it both match, with the same batch group;
    half of a temporary name (the dot without the suffix, or the suffix without the dot) is not skpub's."""
    from skpub.kernel.storage import BATCH, own_files

    pattern = own_files(rf"part-(?P<batch>{BATCH})(-[a-z]\d{{0,4}})?\.jsonl")  # PART_RE before it named its writer
    name = f"part-{batch:08d}-t3.jsonl"
    plain, temporary = pattern.fullmatch(name), pattern.fullmatch(f".{name}.{random}.tmp")
    assert plain and temporary
    assert int(plain["batch"]) == int(temporary["batch"]) == batch
    assert plain["temporary"] is None and temporary["temporary"] == "."
    assert plain.group(3) == temporary.group(3) == "-t3"  # positional groups too: the pattern's follow temporary
    for half in (f".{name}", f"{name}.{random}.tmp", f".{name}.{random}", f"..{name}.{random}.tmp"):
        assert pattern.fullmatch(half) is None


_BASE_NAMES = st.sampled_from([("snapshot",), ("base",), ("snapshot", "base")])


@examples(1.5)
@given(batch=st.integers(0, 40), bases=st.dictionaries(st.integers(0, 40), _BASE_NAMES, max_size=6))
def test_pruning_keeps_what_every_later_replay_reads(tmp_path_factory, batch, bases):
    """After the prune at ``batch`` (its own files written), a replay of ``batch`` or any later one still finds
    the newest base before it, under either name, and every delta after that base; nothing else is kept but the
    batch's own routing report."""
    checkpoint = Checkpoint(tmp_path_factory.mktemp("ckpt") / "c")
    checkpoint.create()
    checkpoint.router.mkdir(parents=True, exist_ok=True)
    checkpoint.merge.mkdir(parents=True, exist_ok=True)
    for b in range(batch + 1):
        checkpoint.router_report(b).write_text("{}")
    for folder in (checkpoint.router, checkpoint.merge):
        for b in range(batch + 1):
            (folder / f"delta-{b:08d}.json").write_text("{}")
        for b, names in bases.items():
            if b <= batch:
                for name in names:
                    (folder / f"{name}-{b:08d}.json").write_text("{}")
    checkpoint.prune_states(batch)
    written = [b for b in bases if b <= batch]
    for folder, files in ((checkpoint.router, checkpoint.router_files), (checkpoint.merge, checkpoint.merge_files)):
        kept_bases, kept_deltas = files("base"), files("delta")
        for again in range(batch, batch + 3):  # later batches' own files are not written yet
            base = max((b for b in kept_bases if b < again), default=-1)
            assert base == max((b for b in written if b < again), default=-1)
            assert all(d in kept_deltas for d in range(base + 1, min(again, batch + 1)))
        keep = max((b for b in written if b < batch), default=-1)
        assert sorted(kept_bases) == sorted(b for b in written if b >= keep)
        assert sorted(kept_deltas) == list(range(keep + 1, batch + 1))
        for b, path in kept_bases.items():  # one file per base, under the new name where both were written
            assert path.name.startswith("base-" if "base" in bases[b] else "snapshot-")
        reports = [checkpoint.router_report(batch)] if folder == checkpoint.router else []  # the batch's own only
        assert sorted(folder.iterdir()) == sorted([*kept_bases.values(), *kept_deltas.values(), *reports])


def test_many_evaluators_on_a_grid_that_has_room_are_refused_before_any_output(tmp_path, capsys):
    """900,000 evaluators fit a 1000 x 1000 grid; the deployment's bound (1,024) refuses them with a sentence."""
    write_lines(tmp_path / "in.jsonl", random_workload(seed=1, n=20))
    args = ["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o")]
    assert main([*args, "--evaluators", "900000"]) == 2
    assert "evaluators must be at most 1,024" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_unwritable_default_workload_location_is_a_sentence(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["run", "--engine", "local", "--output", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err
    assert "skpub: error:" in err and "Traceback" not in err


# --------------------------------------------------------------------------- a record cannot stop a run


def fail_matching(monkeypatch, lines, victims, batch_size):
    """Make ``GI2Index.match_many`` fail for any batch holding an object of ``victims``: in bulk, then alone."""
    ids = [json.loads(line).get("id") for line in lines]
    doomed = {stream_position(i // batch_size, i % batch_size) for i, oid in enumerate(ids) if oid in victims}
    real = GI2Index.match_many

    def match_many(self, objects):
        if doomed & set(objects.pos.tolist()):
            raise ValueError("injected failure")
        return real(self, objects)

    monkeypatch.setattr(GI2Index, "match_many", match_many)


@pytest.mark.parametrize("where", ["monitor", "window", "match"])
def test_an_object_that_fails_in_its_evaluator_is_a_dead_letter_and_nothing_else(tmp_path, monkeypatch, where):
    """An object whose scoring (``monitor``), keeping in the window (``window``: the batch's objects are then kept
    one by one) or lone range match (``match``) fails becomes one ``internal_error`` dead letter and is delivered to
    no subscription, range or ranked: the range matches are the oracle's less the victims', and no ranked result
    ever names a victim (fails if the object is still matched or kept in the window after its line became a dead
    letter, or if a batch's other objects are lost with it)."""
    from skpub.evaluators.monitor import RankedMonitor
    from skpub.kernel.config import Window

    lines = ranked_workload(seed=6, n=300)
    dep = deployment(evaluators=3, batch_size=25).replace(window=Window("count", 60))
    expected = replay(lines, dep).deliveries
    ranked = {d["obj"] for d in expected if d["event"] == "enter"}
    victims = sorted({d["obj"] for d in expected if d["event"] == "match"} & ranked)  # in both kinds of result
    assert victims
    if where == "monitor":
        real = RankedMonitor.arrive

        def arrive(self, obj, accepted, watermark):
            if obj.id in victims:
                raise ValueError(f"injected failure on {obj.id}")
            return real(self, obj, accepted, watermark)

        monkeypatch.setattr(RankedMonitor, "arrive", arrive)
    elif where == "window":
        receive = RankedMonitor.receive

        def failing(self, objects, accepted, watermark, keywords=()):
            if set(objects.ids.to_pylist()) & set(victims):
                raise ValueError("injected failure")
            return receive(self, objects, accepted, watermark, keywords)

        monkeypatch.setattr(RankedMonitor, "receive", failing)
    else:
        fail_matching(monkeypatch, lines, victims, batch_size=25)
    out, _ = local(tmp_path, lines, dep)
    internal = read_stream(out, "dead_letters")
    assert sorted(json.loads(d["line"])["id"] for d in internal) == sorted(victims)
    deliveries = read_stream(out, "deliveries")
    got = [d for d in deliveries if d["event"] == "match"]
    assert canonical(got) == canonical([d for d in expected if d["event"] == "match" and d["obj"] not in victims])
    entered = {d["obj"] for d in deliveries if d["event"] == "enter"}
    in_results = {r[0] for s in read_stream(out, "snapshots") for r in s["results"]}
    assert len(entered) > 20 and not (entered | in_results) & set(victims)


def test_a_subscription_that_fails_to_be_counted_is_a_dead_letter_and_never_matches(tmp_path, monkeypatch):
    """A range subscribe whose load-statistics step fails is undone everywhere: one dead letter, no match of it,
    and its unsubscribe is a dead letter too (fails if GI^2 kept it after the failure: it would still deliver)."""
    from skpub.evaluators.load import CellLoad
    from skpub.kernel.config import BalancerConfig

    lines = random_workload(seed=6, n=300, invalid=False)
    dep = deployment(evaluators=3, batch_size=25).replace(balancer=BalancerConfig(mode="adaptive"))
    expected = replay(lines, dep).deliveries
    victim = next(d["sub"] for d in expected if d["event"] == "match")
    real_insert, real_count, inserted = GI2Index.insert_many, CellLoad.add_subscriptions, []

    def insert_many(self, subs, boxes):
        inserted[:] = [sub.id for sub in subs]
        return real_insert(self, subs, boxes)

    def add_subscriptions(self, boxes):  # counting the victim fails, after GI^2 indexed it (with a batch's others)
        if victim in inserted:
            raise ValueError("injected failure")
        return real_count(self, boxes)

    monkeypatch.setattr(GI2Index, "insert_many", insert_many)
    monkeypatch.setattr(CellLoad, "add_subscriptions", add_subscriptions)
    out, _ = local(tmp_path, lines, dep)
    letters = read_stream(out, "dead_letters")
    assert letters and {json.loads(d["line"])["id"] for d in letters} == {victim}
    kept = [d for d in expected if d["event"] == "match" and d["sub"] != victim]
    assert canonical(read_stream(out, "deliveries")) == canonical(kept)


def test_an_unsubscribe_that_fails_is_a_dead_letter_and_the_other_unsubscribes_apply(tmp_path, monkeypatch):
    """Should a batch's unsubscribes fail to be applied at once, each is applied alone: only the failing one is a
    dead letter, and every other subscription delivers exactly what the oracle does (fails if the others were lost
    with it, or applied twice)."""
    from skpub.kernel.config import BalancerConfig

    lines = random_workload(seed=6, n=300, invalid=False)
    dep = deployment(evaluators=3, batch_size=25).replace(balancer=BalancerConfig(mode="adaptive"))
    expected = replay(lines, dep).deliveries
    unsubscribed = [json.loads(line)["id"] for line in lines if '"unsubscribe"' in line]
    matched = {d["sub"] for d in expected if d["event"] == "match"}
    victim = next(sid for sid in unsubscribed if sid in matched)
    real = GI2Index.delete_many

    def delete_many(self, sub_ids, positions):
        if victim in sub_ids:
            raise ValueError("injected failure")
        return real(self, sub_ids, positions)

    monkeypatch.setattr(GI2Index, "delete_many", delete_many)
    out, _ = local(tmp_path, lines, dep)
    letters = read_stream(out, "dead_letters")
    assert [json.loads(d["line"]) for d in letters] == [{"record": "Unsubscribe", "id": victim}]
    got = [d for d in read_stream(out, "deliveries") if d["sub"] != victim]
    assert canonical(got) == canonical([d for d in expected if d["sub"] != victim])


def test_an_evaluator_failure_on_one_object_becomes_internal_error(tmp_path, monkeypatch):
    """Inject a failure for chosen objects inside GI^2; every other record's output is untouched."""
    lines = random_workload(seed=6, n=300, invalid=False)
    dep = deployment(evaluators=3, batch_size=25)
    expected = replay(lines, dep).deliveries
    victims = list(dict.fromkeys(d["obj"] for d in expected))[:2]
    fail_matching(monkeypatch, lines, victims, batch_size=25)
    out, summary = local(tmp_path, lines, dep)
    internal = read_stream(out, "dead_letters")
    assert sorted(json.loads(d["line"])["id"] for d in internal) == sorted(victims)
    assert {d["reason"] for d in internal} == {"internal_error"}
    assert all("ValueError: injected failure" in d["message"] for d in internal)
    kept = [d for d in expected if d["obj"] not in victims]
    assert canonical(read_stream(out, "deliveries")) == canonical(kept)
    assert summary.dead_letters["internal_error"] == 2
    assert (out / "_SUCCESS").exists()


def assert_only_the_poison_is_lost(tmp_path, lines, dep, poison):
    """Run locally: ``poison`` alone is an internal_error letter, every other line's output equals the oracle."""
    out, _ = local(tmp_path, lines, dep)
    dead = read_stream(out, "dead_letters")
    assert dead == [{"line": poison, "reason": "internal_error", "message": "MemoryError: injected"}]
    expected = replay([line for line in lines if line != poison], dep)
    assert canonical(read_stream(out, "deliveries")) == canonical(expected.deliveries)


def test_a_router_failure_on_one_line_keeps_the_batch(tmp_path, monkeypatch):
    lines = random_workload(seed=7, n=200, invalid=False)
    dep = deployment(evaluators=2, batch_size=50)
    poison = '{"type": "subscribe", "id": "poison", "kind": "range", "rect": [0, 0, 60, 60], "keywords": ["sushi"]}'
    lines.insert(77, poison)
    real = skpub.router.locate.parse_line

    def parse_line(line, *args):
        if line == poison.encode():
            raise MemoryError("injected")
        return real(line, *args)

    monkeypatch.setattr(skpub.router.locate, "parse_line", parse_line)
    assert_only_the_poison_is_lost(tmp_path, lines, dep, poison)


def test_a_range_subscription_that_fails_to_locate_is_the_only_one_lost(tmp_path, monkeypatch):
    """Should locating a batch's range subscriptions at once fail, each is located alone: only the one that fails
    is a dead letter (fails if the batch's other subscriptions were lost with it)."""
    from skpub.router.locate import Locator

    lines = random_workload(seed=7, n=200, invalid=False)
    dep = deployment(evaluators=2, batch_size=50)
    poison = '{"type": "subscribe", "id": "poison", "kind": "range", "rect": [0, 0, 60, 60], "keywords": ["sushi"]}'
    lines.insert(77, poison)
    real = Locator._locate

    def locate_batch(self, subs):
        if any(sub.id == "poison" for sub in subs):
            raise MemoryError("injected")
        return [real(self, sub) for sub in subs]

    def locate(self, record):
        if record.id == "poison":
            raise MemoryError("injected")
        return real(self, record)

    monkeypatch.setattr(Locator, "_locate_range_batch", locate_batch)
    monkeypatch.setattr(Locator, "_locate", locate)
    assert_only_the_poison_is_lost(tmp_path, lines, dep, poison)


def test_an_object_that_fails_to_locate_is_the_only_one_lost(tmp_path, monkeypatch):
    lines = random_workload(seed=7, n=400, invalid=False)
    dep = deployment(evaluators=2, batch_size=50)
    poison = '{"type": "object", "id": "poison", "x": 50.123, "y": 50.321, "terms": ["sushi"]}'
    lines.insert(dep.sample_size + 77, poison)  # after the partitioning sample, which locates cells too
    real = FineGrid.cell_of

    def cells_of(self, xs, ys):
        raise MemoryError("injected in bulk")

    def cell_of(self, x, y):
        if (x, y) == (50.123, 50.321):
            raise MemoryError("injected")
        return real(self, x, y)

    monkeypatch.setattr(FineGrid, "cells_of", cells_of)
    monkeypatch.setattr(FineGrid, "cell_of", cell_of)
    assert_only_the_poison_is_lost(tmp_path, lines, dep, poison)


def test_a_failing_bulk_object_decoder_sends_every_line_the_line_by_line_way(tmp_path, monkeypatch):
    lines = random_workload(seed=8, n=300)
    dep = deployment(evaluators=3, batch_size=40)
    expected = replay(lines, dep)

    def decode_objects(*args):
        raise MemoryError("injected")

    monkeypatch.setattr(skpub.router.locate, "decode_objects", decode_objects)
    out, _ = local(tmp_path, lines, dep)
    assert canonical(read_stream(out, "deliveries")) == canonical(expected.deliveries)

    assert letters(read_stream(out, "dead_letters")) == letters(expected.dead_letters)


# --------------------------------------------------------------------------- the object-id horizon


@pytest.mark.parametrize("horizon", [1, 3, 50])
def test_object_ids_are_unique_only_within_the_horizon(tmp_path, horizon):
    sub = '{"type": "subscribe", "id": "s", "kind": "range", "rect": [0, 0, 100, 100], "keywords": ["a"]}'
    ids = ["a", "b", "a", "c", "d", "a", "b", "e", "a"] * 3
    lines = [sub] + [json.dumps({"type": "object", "id": i, "x": 1, "y": 1, "terms": ["a"]}) for i in ids]
    dep = deployment(batch_size=4).replace(object_id_horizon=horizon)
    accepted: list[str] = []
    expected_dead = 0
    for i in ids:
        if i in accepted[-horizon:]:
            expected_dead += 1
        else:
            accepted.append(i)
    result = replay(lines, dep)
    assert [d["obj"] for d in result.deliveries] == accepted
    assert len(result.dead_letters) == expected_dead
    out, _ = local(tmp_path, lines, dep)
    assert canonical(read_stream(out, "deliveries")) == canonical(result.deliveries)


def test_registry_memory_is_bounded_by_the_horizon():
    registry = IdRegistry(object_id_horizon=100)
    for n in range(10_000):
        registry.accept_id("object", f"o{n}")
    assert len(registry.objects) == 100
    assert registry.objects.ages(["o9899", "o9900", "o9999"]).tolist() == [-1, 99, 0]


# --------------------------------------------------------------------------- durable state never executes


def test_durable_state_is_versioned_json_and_refuses_anything_else():
    import pickle

    from skpub.evaluators.evaluator import Evaluator
    from skpub.kernel.text import Vocabulary
    from skpub.router.sequencer import Placement
    from skpub.router.state import FORMAT, encode_journal

    registry = IdRegistry(3)
    registry.replay([("object", "o1", None), ("subscribe", "s", Placement.of((0, 2), {"k"}))])
    assert decode_registry(encode_registry(registry)).active == registry.active
    assert encode_registry(registry).startswith(b"{")
    assert json.loads(encode_registry(registry).split(b"\n")[0])["registry"]["objects"]["count"] == 1
    with pytest.raises(CheckpointError, match="hashes"):
        decode_registry(encode_registry(registry).split(b"\n")[0])
    with pytest.raises(CheckpointError, match="damaged"):
        decode_registry(encode_registry(registry)[:-1])
    for decode, kind in ((decode_registry, "registry"), (decode_journal, "journal")):
        with pytest.raises(CheckpointError):
            decode(pickle.dumps({"format": 1, "kind": kind}))
        with pytest.raises(CheckpointError, match="format"):
            decode(json.dumps({"format": 99, "kind": kind}).encode())
    with pytest.raises(CheckpointError, match="damaged"):
        decode_registry(
            json.dumps({"format": FORMAT, "kind": "registry", "registry": {"objects": [1]}}).encode() + b"\n"
        )
    with pytest.raises(CheckpointError, match="damaged"):
        decode_journal(encode_journal([("subscribe", "s", None)]).replace(b"subscribe", b"explode"))
    _, damaged_unsubscribe = decode_journal(encode_journal([("unsubscribe", "never", None)]))
    with pytest.raises(CheckpointError, match="not active"):
        IdRegistry().replay(damaged_unsubscribe)
    with pytest.raises(EvaluatorError):
        decode_block(pickle.dumps({}))
    with pytest.raises(EvaluatorError, match="format"):
        decode_block(b'{"format": 2, "subscriptions": []}')
    with pytest.raises(EvaluatorError, match="damaged"):
        decode_block(b'{"format": 1, "subscriptions": [["s", 1, [0, 0, 1, 1], [[7]], [0, 0, 1, 1]]]}')
    assert decode_block(state_document([], BLOCK_KEY)) == {}
    wide = [[f"t{i}"] for i in range(300)]  # so many keywords that GI^2 files it in the wide cell, not by cells
    for dnf, box in [
        ([["a"]], [10**6, 0, 10**6, 0]),  # past the grid and GI^2's index cells
        (wide, [0, 0, 10**6, 10**6]),  # wide: never split into index cells, checked all the same
        ([["a"]], [-1, 0, 3, 3]),
        ([["a"]], [5, 0, 3, 3]),  # inverted
    ]:
        damaged = state_document([["s", 1, [0.0, 0.0, 1.0, 1.0], dnf, box]], BLOCK_KEY)
        with pytest.raises(EvaluatorError, match="damaged.*not within the fine grid"):
            Evaluator.restore(0, deployment(evaluators=1), Vocabulary(), {0: damaged})
    with pytest.raises(EvaluatorError, match="damaged"):  # a position past int64, which GI^2's arrays cannot hold
        decode_block(state_document([["s", 2**63, [0.0, 0.0, 1.0, 1.0], [["a"]], [0, 0, 1, 1]]], BLOCK_KEY))
    with pytest.raises(EvaluatorError, match="damaged"):  # a clause without a term
        decode_block(state_document([["s", 1, [0.0, 0.0, 1.0, 1.0], [["a"], []], [0, 0, 1, 1]]], BLOCK_KEY))
    twice = [state_document([["s", 1, [0.0, 0.0, 1.0, 1.0], [["a"]], [0, 0, 1, 1]]], BLOCK_KEY)] * 2
    with pytest.raises(EvaluatorError, match="damaged.*indexed here already"):  # one subscription in two blocks
        Evaluator.restore(0, deployment(evaluators=1), Vocabulary(), dict(enumerate(twice)))
    fine = state_document([["s", 1, [0.0, 0.0, 1.0, 1.0], wide, [0, 0, 99, 99]]], BLOCK_KEY)
    assert "s" in Evaluator.restore(0, deployment(evaluators=1, grid_size=100), Vocabulary(), {0: fine}).index
    with pytest.raises(EvaluatorError, match="damaged window"):
        decode_segment(b'{"format": 2, "objects": []}')
    assert len(decode_segment(encode_segment(decode_segment(b'{"format": 1, "objects": []}')))) == 0


def test_a_registry_of_the_ids_format_still_reads_and_a_horizon_too_large_for_the_machine_is_damaged():
    old = {"object_id_horizon": 2, "objects_accepted": 3, "watermark": None, "objects": ["a", "b"],
           "subscriptions": [], "snapshots": [], "active": {}}  # fmt: skip
    registry = decode_registry(json.dumps({"format": 3, "kind": "registry", "registry": old}).encode())
    assert registry.objects.ages(["a", "b", "c"]).tolist() == [1, 0, -1] and registry.objects_accepted == 3
    assert json.loads(encode_registry(registry).split(b"\n")[0])["format"] == 5
    with pytest.raises(CheckpointError, match="other bytes"):
        decode_registry(json.dumps({"format": 3, "kind": "registry", "registry": old}).encode() + b"\nmore")
    huge = {**old, "object_id_horizon": 10**15}
    with pytest.raises(CheckpointError, match="damaged"):
        decode_registry(json.dumps({"format": 4, "kind": "registry", "registry": huge}).encode())


# --------------------------------------------------------------------------- bad invocations


def test_metrics_port_in_use_or_out_of_range_is_a_sentence(tmp_path, capsys):
    write_lines(tmp_path / "in.jsonl", random_workload(seed=1, n=20))
    args = ["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o")]
    assert main([*args, "--metrics-port", "70000"]) == 2
    assert "outside 1-65535" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main([*args, "--metrics-port", str(busy.getsockname()[1])]) == 2
    assert "cannot serve metrics" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--evaluators", "1000000000"], ["--config", "GRID"], ["--config", "HORIZON"]])
def test_deployments_beyond_memory_are_refused_before_allocating(tmp_path, capsys, flags):
    (tmp_path / "grid.json").write_text('{"grid_size": 2000000}')
    (tmp_path / "horizon.json").write_text('{"object_id_horizon": 1000000000000}')
    configs = {"GRID": str(tmp_path / "grid.json"), "HORIZON": str(tmp_path / "horizon.json")}
    flags = [configs.get(f, f) for f in flags]
    write_lines(tmp_path / "in.jsonl", random_workload(seed=1, n=20))
    args = ["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "p")]
    assert main([*args, *flags]) == 2
    said = "evaluators must be at most 1,024" if flags[0] == "--evaluators" else "GiB"
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "config", "said"),
    [
        (["--batch-size", "99999999999999999999"], None, "batch_size must be at most 10,000,000"),
        ([], {"batch_size": 10**20}, "batch_size must be at most 10,000,000"),
        ([], {"sample_size": 10**8}, "sample_size must be at most 10,000,000"),
        ([], {"max_record_bytes": 1 << 30}, "max_record_bytes must be at most"),
        ([], {"evaluators": 10_000}, "evaluators must be at most 1,024"),
        ([], {"vocabulary": ["a"]}, "vocabulary must be the path of a vocabulary file"),
        ([], {"vocabulary": "/dev/zero"}, "larger than 256 MiB"),
        ([], {"vocabulary": "SPARSE"}, "larger than 256 MiB"),
    ],
)
def test_configs_that_would_crash_or_exhaust_a_run_are_refused_with_a_sentence(tmp_path, capsys, flags, config, said):
    """A batch size beyond what a batch can hold crashed the local engine (islice) with a traceback; a vocabulary
    given as a list crashed it too; /dev/zero as the vocabulary was read until memory ran out; 10,000 evaluators
    took minutes for a hundred records. Each is now a sentence and exit status 2, before any output is written."""
    write_lines(tmp_path / "in.jsonl", random_workload(seed=1, n=20))
    args = ["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o")]
    if config is not None:
        if config.get("vocabulary") == "SPARSE":  # a regular file beyond the bound, refused by its size, unread
            with (tmp_path / "big.json").open("wb") as f:
                f.truncate((256 << 20) + 1)
            config = {"vocabulary": str(tmp_path / "big.json")}
        (tmp_path / "dep.json").write_text(json.dumps(config))
        args += ["--config", str(tmp_path / "dep.json")]
    assert main([*args, *flags]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"space": "0123"}', "space must be a list of four numbers"),
        ('{"space": [0, 0, true, 1]}', "space must be a list of four numbers"),
        ('{"window": {"kind": "count", "size": 10, "slide": 5}}', "unknown window keys: ['slide']"),
        ('{"window": {"kind": "count", "size": true}}', "window kind must be a string and size a number"),
        ('{"window": "count"}', "window must be an object"),
        ('{"evaluators": 2, "evaluators": 3}', "keys given twice in one object: ['evaluators']"),
        ('{"balancer": {"mode": "off", "mode": "chaos"}}', "keys given twice in one object: ['mode']"),
        ('{"balancer": {"mode": "off", "sigmaa": 2}}', "unknown balancer keys: ['sigmaa']"),
        ('{"balancer": {"sigma": "2"}}', "balancer sigma, beta and decay must be numbers"),
        ('{"balancer": [1]}', "balancer must be an object"),
        ('{"window": {"kind": "count", "size": 1' + "0" * 400 + "}}", "window kind must be a string and size a number"),
        ('{"balancer": {"sigma": 1' + "0" * 400 + "}}", "balancer sigma, beta and decay must be numbers"),
        ("[]", "must be a JSON object"),
    ],
)
def test_config_shapes_json_would_bend_are_refused(tmp_path, capsys, text, said):
    """A space given as the string "0123" was read as the rectangle [0, 1, 2, 3], a window key the code does not
    know (a typo, or a sliding window skpub lacks) was ignored, ``true`` was a window size of 1, and a key given twice
    kept its last value silently. Each is now a sentence and exit status 2."""
    write_lines(tmp_path / "in.jsonl", random_workload(seed=1, n=20))
    (tmp_path / "dep.json").write_text(text)
    args = ["run", "--engine", "local", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o")]
    assert main([*args, "--config", str(tmp_path / "dep.json")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("raw", [[], "", None, 3])
def test_a_recorded_deployment_that_is_not_an_object_is_refused(raw):
    """A damaged data directory's deployment.json of [] was read as the default deployment (the daemon resumed with
    other evaluators and another grid); it is refused."""
    from skpub.kernel.config import deployment_from_json
    from skpub.kernel.errors import ConfigError

    with pytest.raises(ConfigError, match="a deployment is a JSON object"):
        deployment_from_json(raw)


def test_directory_input_skips_and_names_non_jsonl_files(tmp_path, capsys):
    lines = random_workload(seed=9, n=120)
    folder = tmp_path / "in"
    folder.mkdir()
    write_lines(folder / "a.jsonl", lines[:60])
    write_lines(folder / "b.jsonl", lines[60:])
    (folder / "README.md").write_text("# not input\n")
    (folder / "c.jsonl.gz").write_bytes(b"\x1f\x8b")
    dep = deployment(evaluators=2, batch_size=30)
    (tmp_path / "dep.json").write_text(json.dumps(dep.to_json()))
    args = ["run", "--engine", "local", "--input", str(folder), "--output", str(tmp_path / "o")]
    assert main([*args, "--config", str(tmp_path / "dep.json")]) == 0
    captured = capsys.readouterr()
    assert "skipped inputs    2 not *.jsonl: README.md, c.jsonl.gz" in captured.out
    assert canonical(read_stream(tmp_path / "o", "deliveries")) == canonical(replay(lines, dep).deliveries)


def test_standard_input_feeds_the_local_engine(tmp_path, monkeypatch, capsys):
    lines = random_workload(seed=10, n=200)
    dep = deployment(evaluators=2, batch_size=30)
    (tmp_path / "dep.json").write_text(json.dumps(dep.to_json()))
    data = b"\xef\xbb\xbf" + b"".join(line.encode() + b"\r\n" for line in lines)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    args = ["run", "--engine", "local", "--input", "-", "--output", str(tmp_path / "o")]
    assert main([*args, "--config", str(tmp_path / "dep.json")]) == 0
    expected = replay(lines, dep)
    assert canonical(read_stream(tmp_path / "o", "deliveries")) == canonical(expected.deliveries)
    assert letters(read_stream(tmp_path / "o", "dead_letters")) == letters(expected.dead_letters)


def test_success_is_refused_when_another_run_took_over_the_output(tmp_path):
    from skpub.app.output import claim_output, mark_success

    claim_output(tmp_path / "out", "first", overwrite=False)
    claim_output(tmp_path / "out", "second", overwrite=False)
    with pytest.raises(OutputError, match="took over"):
        mark_success(tmp_path / "out", "first")
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    mark_success(tmp_path / "out", "second")
    assert (tmp_path / "out" / "_SUCCESS").exists()


def test_only_the_temporaries_a_killed_spark_left_in_its_logs_are_removed(tmp_path):
    """A kill while Spark planned the first micro-batch leaves ``.0.<uuid>.tmp`` in its offset log, and Spark
    then refuses every restart (SPARK-53103); those temporaries go, entries and anything else stay."""
    ckpt = Checkpoint(tmp_path / "ckpt")
    offsets, commits = ckpt.query / "offsets", ckpt.query / "commits"
    offsets.mkdir(parents=True)
    commits.mkdir()
    uuid = "1c3b8d50-47d1-463a-a85c-1ca4247ebbb4"
    kept = [offsets / "0", offsets / ".0.crc", commits / "notes.txt", commits / f".0.{uuid}.tmp.bak"]
    dropped = [offsets / f".1.{uuid}.tmp", offsets / f"..1.{uuid}.tmp.crc", commits / f".0.{uuid}.tmp"]
    for path in kept + dropped:
        path.write_text("x")
    assert sorted(ckpt.drop_interrupted_writes()) == sorted(f"{p.parent.name}/{p.name}" for p in dropped)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in dropped)


_ids = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)


@examples(1)
@given(
    st.lists(
        st.tuples(_ids, st.lists(st.lists(_ids, min_size=1, max_size=3), min_size=1, max_size=3), st.integers(0, 40)),
        max_size=12,
    ),
    st.lists(st.tuples(st.sampled_from(["unsubscribe", "drop", "widen"]), st.integers(0, 11)), max_size=8),
)
def test_state_blocks_built_from_the_index_read_back_as_the_subscriptions_held(subs, changes):
    """No row is kept per subscription: the state blocks, built from GI^2's arrays, hold exactly the live
    subscriptions, each in the block of its box's first cell; the dirty blocks a state store takes batch by batch
    (subscribes, unsubscribes, drops after a move, parts carried in that widen a box into another block) end equal
    to every block built at once (an emptied block is None), and an evaluator restored from that store and changed
    further keeps it so."""
    from skpub.evaluators import window

    window.STATE_BLOCK, default = 4, window.STATE_BLOCK  # 4 x 4 cells: a widened box starts in another block
    try:
        _state_blocks_script(subs, changes)
    finally:
        window.STATE_BLOCK = default


def _state_blocks_script(subs, changes):
    from skpub.evaluators.evaluator import Evaluator, state_block
    from skpub.kernel.geometry import Rect
    from skpub.kernel.grid import union_boxes
    from skpub.kernel.records import RangeSubscription
    from skpub.kernel.text import Vocabulary
    from tests.workloads import deployment

    dep = deployment(evaluators=1, grid_size=64)
    ev = Evaluator(0, dep, Vocabulary())
    live, store = {}, {}

    def take(evaluator):
        for key, data in evaluator.take_dirty_blocks().items():
            if data is None:
                store.pop(key, None)
            else:
                store[key] = data

    def check(evaluator):
        take(evaluator)
        built = {key: decode_block(data) for key, data in evaluator.encode_blocks().items()}
        assert {key: decode_block(data) for key, data in store.items()} == built
        assert {sid: held for block in built.values() for sid, held in block.items()} == live
        assert all(state_block(box) == key for key, block in built.items() for _, box in block.values())

    for pos, (sid, clauses, cell) in enumerate(subs):
        if sid not in live:
            sub = RangeSubscription(pos, sid, Rect(0, -1.5, 2, 1e300), tuple(frozenset(c) for c in clauses))
            box = (cell, cell // 2, cell + 3, 40)
            ev._insert(sub, box)
            live[sid] = (sub, box)
        if pos % 3 == 0:
            take(ev)
    check(ev)
    ev = Evaluator.restore(0, dep, Vocabulary(), store)
    for step, (change, k) in enumerate(changes):
        if k >= len(live):
            continue
        sid = sorted(live)[k]
        sub, box = live[sid]
        if change == "unsubscribe":
            ev._delete(sid, 100 + step)
            del live[sid]
        elif change == "drop":
            ev._drop_many([sid])
            del live[sid]
        else:  # a part carried in over cells further down and left: the union starts in another block
            part = (max(0, box[0] - 5), max(0, box[1] - 5), box[0], box[1])
            ev.import_subscriptions([(sub, part)])
            live[sid] = (sub, union_boxes(box, part))
        if step % 2:
            take(ev)
    check(ev)
