"""The routing daemon (``skpub serve``): durable logs, the HTTP API over real loopback HTTP, kill -9 and restart."""

import gc
import itertools
import json
import math
import random
import re
import signal
import time
from collections import Counter

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from skpub.app.api import create_app, split_lines
from skpub.app.cli import main
from skpub.app.commits import LOGS, Base, Commit, read_base, write_base
from skpub.app.daemon import BatchEnds, Daemon, Limits, _positioned
from skpub.app.engines import local_checkpoint
from skpub.app.engines.local import run_local
from skpub.app.journal import MAGIC, STRIDE, LineLog, SegmentedLog
from skpub.app.summary import RunObserver, RunSummary
from skpub.kernel.errors import ConfigError, OutputError
from skpub.kernel.parts import read_stream
from skpub.kernel.records import stream_position
from skpub.kernel.runtime import FullCollections, collector_pauses
from tests.profiles import examples
from tests.served import Served
from tests.workloads import deployment, random_workload, ranked_workload, write_lines

# --- the durable log ------------------------------------------------------------------------------------


@examples(0.3)
@given(st.lists(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=40), max_size=12))
def test_a_line_log_reads_back_every_append_by_index_and_after_reopening(tmp_path_factory, appends):
    path = tmp_path_factory.mktemp("log") / "x.log"
    log = LineLog(path)
    everything = []
    for lines in appends:
        first, end = log.append(lines)
        assert (first, end) == (len(everything), len(everything) + len(lines))
        everything += lines
    for start in (0, 1, len(everything) // 2, len(everything)):
        assert log.read(start, 7) == everything[start : start + 7]
    log.close()
    again = LineLog(path)
    assert again.count == len(everything) and again.read(0, len(everything) + 1) == everything


def test_a_torn_last_line_is_cut_off_and_the_sparse_index_spans_strides(tmp_path):
    path = tmp_path / "x.log"
    log = LineLog(path)
    lines = [b"%d" % i for i in range(3 * STRIDE + 5)]
    log.append(lines)
    log.close()
    with path.open("ab") as fh:
        fh.write(b'{"torn')  # a crash in the middle of an append: never acknowledged
    log = LineLog(path)
    assert log.count == len(lines)
    assert log.read(2 * STRIDE - 1, 3) == lines[2 * STRIDE - 1 : 2 * STRIDE + 2]
    log.append([b"next"])
    assert log.read(len(lines), 5) == [b"next"]
    assert path.read_bytes().endswith(b"%d\nnext\n" % (len(lines) - 1))


def test_a_file_skpub_did_not_write_is_never_taken_for_a_log(tmp_path):
    path = tmp_path / "ingest.log"
    path.write_bytes(b"precious\n")
    with pytest.raises(OutputError):
        LineLog(path)
    assert path.read_bytes() == b"precious\n"
    assert LineLog(tmp_path / "new.log").path.read_bytes() == MAGIC


def test_a_segmented_log_past_its_trillionth_entry_keeps_its_thirteen_digit_segments(tmp_path):
    """Segments are named by their first entry (12 digits): the segments after entry 10**12 are the log's too,
    in entry order (by name, deliveries-1000000000000 sorts before deliveries-999999999990)."""
    log = SegmentedLog(tmp_path, "deliveries", 10**6)
    log.append([b"a", b"b"])
    log.close()
    start = 10**12 - 2
    (tmp_path / "deliveries-000000000000.log").rename(tmp_path / f"deliveries-{start:012d}.log")
    again = SegmentedLog(tmp_path, "deliveries", 40)  # small segments: the next appends roll to new files
    assert (again.first, again.count) == (start, 10**12)
    for k in range(4):
        again.append([b"x%d" % k * 20])
    names = sorted(p.name for p in tmp_path.glob("deliveries-*.log"))
    assert any(len(name) == len("deliveries-.log") + 13 for name in names)
    again.close()
    last = SegmentedLog(tmp_path, "deliveries", 40)
    assert (last.first, last.count) == (start, 10**12 + 4)
    assert last.read(start, 10) == [b"a", b"b", *(b"x%d" % k * 20 for k in range(4))]


@examples(0.4)
@given(
    st.lists(
        st.lists(st.binary(min_size=1, max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=9), max_size=14
    ),
    st.integers(20, 200),
    st.integers(0, 400),
    st.integers(0, 13),
)
def test_a_segmented_log_reads_back_what_it_keeps_across_rolls_retention_cuts_and_reopening(
    tmp_path_factory, appends, segment_bytes, retention_bytes, cut_at
):
    directory = tmp_path_factory.mktemp("log")
    log = SegmentedLog(directory, "deliveries", segment_bytes, retention_bytes)
    everything = []
    for k, lines in enumerate(appends):
        first, end = log.append(lines)
        assert (first, end) == (len(everything), len(everything) + len(lines))
        everything += lines
        if k == cut_at and everything:  # a commit cut short: back to an earlier count
            keep = max(log.first, len(everything) - len(lines))
            log.truncate(keep)
            everything = everything[:keep]
        log.retain()
    kept = log.first
    assert log.count == len(everything) and kept <= len(everything)
    assert log.nbytes <= retention_bytes or len(list(directory.glob("deliveries-*.log"))) == 1
    for start in (kept, (kept + len(everything)) // 2, len(everything)):
        assert log.read(start, 5) == everything[start : start + 5]
    assert log.read(kept, len(everything)) == everything[kept:]
    log.close()
    again = SegmentedLog(directory, "deliveries", segment_bytes, retention_bytes)
    assert (again.first, again.count) == (kept, len(everything))
    assert again.read(kept, len(everything)) == everything[kept:]


@examples(0.4)
@given(
    st.lists(
        st.lists(st.binary(min_size=1, max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=9), max_size=14
    ),
    st.integers(20, 200),
    st.integers(0, 120),
)
def test_a_segmented_log_locates_batch_ends_in_its_files_and_releases_only_whole_segments_before_what_is_needed(
    tmp_path_factory, appends, segment_bytes, needed
):
    directory = tmp_path_factory.mktemp("log")
    log = SegmentedLog(directory, "ingest", segment_bytes)
    everything = [line for lines in appends for line in lines]
    for lines in appends:
        log.append(lines)
    for i, line in enumerate(everything):
        end = log.segment_end(i)
        segment, byte = log.end_position(i + 1)
        held = log.files()[segment].read_bytes()[len(MAGIC) : byte].split(b"\n")[:-1]
        assert held[-1] == line and segment + len(held) == i + 1  # the file holds entries segment .. i
        assert i < end <= len(everything) and log.end_position(end)[0] == segment  # a batch to `end` stays in it
    first = log.release(needed)
    kept = sorted(directory.glob("ingest-*.log"))
    assert first <= min(needed, len(everything)) and first == int(kept[0].stem.split("-")[1])
    assert len(kept) == 1 or int(kept[1].stem.split("-")[1]) > needed  # only segments wholly before it went
    assert log.read(first, len(everything)) == everything[first:]
    log.close()
    again = SegmentedLog(directory, "ingest", segment_bytes)
    assert (again.first, again.count) == (first, len(everything))


def test_a_segment_roll_the_disk_refuses_leaves_no_file_and_the_log_goes_on_once_it_takes_writes(tmp_path, monkeypatch):
    import os

    log = SegmentedLog(tmp_path, "ingest", 40)
    log.append([b"x" * 50])

    def full_disk(*_):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", full_disk)  # the new segment's header is never put in place
        with pytest.raises(OSError):
            log.append([b"lost"])  # never acknowledged
    assert [p.name for p in tmp_path.iterdir()] == ["ingest-000000000000.log"]  # no header-less file, no temporary
    assert log.append([b"kept"]) == (1, 2)
    log.close()
    again = SegmentedLog(tmp_path, "ingest", 40)
    assert again.read(0, 5) == [b"x" * 50, b"kept"] and again.first == 0


def test_a_batchs_dead_letters_get_their_ingest_positions_in_order_and_one_without_a_position_goes_last():
    letters = [
        orjson.dumps({"pos": stream_position(7, 5), "line": "b", "reason": "r", "message": "m"}),
        orjson.dumps({"line": "old", "reason": "r", "message": "m"}),  # an earlier skpub's part file
        orjson.dumps({"pos": stream_position(7, 0), "line": "a", "reason": "r", "message": "m"}),
    ]
    assert [orjson.loads(line) for line in _positioned(letters, 1000)] == [
        {"position": 1000, "line": "a", "reason": "r", "message": "m"},
        {"position": 1005, "line": "b", "reason": "r", "message": "m"},
        {"position": None, "line": "old", "reason": "r", "message": "m"},
    ]


def test_batch_ends_know_what_a_replay_can_start_from_and_forget_only_before_it():
    ends = BatchEnds()
    for end in (3, 5, 9, 12):
        ends.append(end)
    assert [ends.start(b) for b in range(5)] == [0, 3, 5, 9, 12] and ends.known(0) and ends.known(4)
    ends.forget(2)
    assert (ends.first, ends.count, ends.start(3), ends.end(2)) == (2, 4, 9, 9)
    assert not ends.known(0) and not ends.known(2) and ends.known(3) and not ends.known(5)
    with pytest.raises(IndexError):
        ends.end(1)
    ends.forget(10)  # the newest is kept: the next batch starts after it
    assert (ends.first, ends.count, ends.start(4)) == (3, 4, 12)


def test_a_commit_log_base_never_removes_a_file_skpub_did_not_write(tmp_path):
    foreign = tmp_path / "commits-000000000000.base"
    foreign.write_bytes(b"precious\n")
    older = write_base(tmp_path, Base(Commit(1, 4, dict.fromkeys(LOGS, 0))))
    newest = write_base(tmp_path, Base(Commit(7, 20, dict.fromkeys(LOGS, 2)), {"s": b'{"id":"s"}'}, {"p": (0, 2)}))
    assert foreign.read_bytes() == b"precious\n" and not older.exists() and newest.exists()
    base = read_base(tmp_path)
    assert (base.commit.batch, base.definitions, base.snapshots) == (7, {"s": b'{"id":"s"}'}, {"p": (0, 2)})


def test_full_collections_free_a_cycle_at_most_once_per_period_stretched_by_their_duration():
    """The daemon's timed full collection: the first call collects, the next once ``seconds`` or 100 times the last
    collection's duration have passed; a negative or infinite period is refused."""
    import weakref

    class Node:
        pass

    def cycle() -> weakref.ref:
        node = Node()
        node.me = node
        return weakref.ref(node)

    readings = iter([100.0, 100.0, 103.0, 350.0, 404.0, 404.0, 404.001, 410.0, 414.2, 414.2, 414.2])
    collect = FullCollections(10.0, clock=lambda: next(readings))
    enabled = gc.isenabled()
    gc.disable()  # only the calls below may collect
    try:
        first = cycle()
        assert collect() and first() is None  # took 3 s: the next waits 300 s
        second = cycle()
        assert not collect() and second() is not None  # 247 s later
        assert collect() and second() is None  # 301 s later; took 1 ms: the next waits 10 s
        assert not collect()  # 6 s later
        assert collect()  # 10.2 s later
    finally:
        if enabled:
            gc.enable()
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="full collection period"):
            FullCollections(bad)


def test_the_collector_pauses_are_timed_per_generation_by_one_hook():
    pauses = collector_pauses()
    assert collector_pauses() is pauses and sum(hook is pauses for hook in gc.callbacks) == 1
    big = [[i] for i in range(200_000)]  # a heap worth walking
    enabled = gc.isenabled()
    gc.disable()  # only the calls below may collect
    try:
        before = list(pauses.seconds)
        gc.collect()
        assert pauses.seconds[2] > before[2] and pauses.seconds[:2] == before[:2]
        gc.collect(0)
        assert pauses.seconds[0] > before[0]
    finally:
        if enabled:
            gc.enable()
    del big


def test_the_logs_keep_what_a_restart_needs_and_a_restart_after_their_segments_went_equals_one_run(
    tmp_path, monkeypatch
):
    """Ingest and journal segments behind the oldest checkpoint are removed, the commit log behind its base;
    definitions whose lines went are still served; a restart reads the base and replays from a kept checkpoint;
    batches never cross a segment; the outputs are one run's."""
    lines = random_workload(seed=71, n=900) + ranked_workload(seed=72, n=300)
    dep = deployment(evaluators=3, batch_size=25)
    limits = Limits(checkpoint_seconds=0.0, trigger=0.01, segment_bytes=1000, compact_commits=4)
    import skpub.app.engines.local_plane

    tuned = []  # the collector tuned as `skpub run` does, once the pipeline exists
    monkeypatch.setattr(
        skpub.app.engines.local_plane, "tune_gc", lambda: tuned.append(first._plane.pipeline is not None)
    )
    first = Daemon(tmp_path / "data", dep, limits)
    first.start()
    for start in range(0, 700, 50):
        first.post([line.encode() for line in lines[start : start + 50]])
    while not first.ready:
        first.stopping.wait(0.01)
    assert tuned and all(tuned) and first._plane.collect.last > -math.inf  # and collected in full
    gone = first.ingest.first
    oldest = min(local_checkpoint.checkpoints(tmp_path / "data" / "checkpoints"))
    assert 0 < gone <= first.ends.start(oldest + 1)  # released, and nothing a restart needs
    definitions = dict(first._state.definitions)
    released = [sid for sid, line in definitions.items() if lines.index(line.decode()) < gone]
    assert released and all(json.loads(first.definition(sid))["id"] == sid for sid in released)
    assert first.batches.first > 0 and first.commits.first > 0 and first.ends.first > 0
    assert list((tmp_path / "data").glob("commits-*.base"))
    first.stop()
    gone = first.ingest.first  # a checkpoint between the reads above and the stop may have released more
    again = Daemon(tmp_path / "data", dep, limits)
    assert again.ingest.first == gone and again._state.definitions == definitions
    again.start()
    for start in range(700, len(lines), 50):
        again.post([line.encode() for line in lines[start : start + 50]])
    while not again.ready:
        again.stopping.wait(0.01)
    deliveries = [orjson.loads(x) for x in again.read_committed("deliveries", 0, 10**6)]
    journal = [orjson.loads(x) for x in again.batches.read(again.batches.first, again.batches.count)]
    again.stop()
    assert all(entry["segment"] <= before["end"] < entry["end"] for before, entry in itertools.pairwise(journal))
    expected, _ = file_run(tmp_path, lines, dep)
    got = Counter(json.dumps({k: v for k, v in d.items() if k != "offset"}, sort_keys=True) for d in deliveries)
    assert got == expected and [d["offset"] for d in deliveries] == list(range(1, len(deliveries) + 1))


def test_the_spark_source_reads_each_journaled_batch_from_its_ingest_segment_across_rolls_and_releases(tmp_path):
    """The Spark source in journal mode (driven directly, as Spark's driver calls it): batch by batch its slices
    hold exactly the journaled lines, across ingest and journal segment rolls and after old segments went."""
    from skpub.app.engines.source import LineReader
    from skpub.kernel.slices import Slice, slice_lines

    lines = random_workload(seed=91, n=600, invalid=False)
    daemon = Daemon(tmp_path / "data", deployment(evaluators=2, batch_size=17), Limits(trigger=0.01, segment_bytes=700))
    daemon.start()
    for start in range(0, len(lines), 40):
        daemon.post([line.encode() for line in lines[start : start + 40]])
    while not daemon.ready:
        daemon.stopping.wait(0.01)
    daemon.stop()
    ingest, journal = daemon.ingest.files(), daemon.batches.files()
    assert len(list((tmp_path / "data").glob("batches-*.log"))) > 2  # the journal rolled
    options = {"journal": json.dumps([journal.directory, journal.name]), "batch_size": "17", "max_bytes": "9999"}
    reader = LineReader({**options, "segments": json.dumps([ingest.directory, ingest.name]), "parts": "3"})
    offset, seen = reader.initialOffset(), []
    while (end := reader.latestOffset(offset, reader.getDefaultReadLimit())) != offset:
        assert end["batch"] == offset["batch"] + 1
        pieces = [Slice.from_json(p.value) for p in reader.partitions(offset, end)]
        seen.append(b"".join(line + b"\n" for piece in pieces for line in slice_lines(ingest, piece, entries=True)))
        if end["batch"] == daemon.ends.count // 2:  # old segments go: the source goes on from where it is
            daemon.batches.release(end["batch"])
            daemon.ingest.release(daemon.ends.end(end["batch"] - 1))
            assert not journal[0].exists() and not ingest[0].exists()
        offset = end
    assert len(seen) == daemon.ends.count
    assert b"".join(seen) == b"".join(line.encode() + b"\n" for line in lines)
    with pytest.raises(ValueError, match="no longer keeps batch 0"):  # a Spark checkpoint older than the journal
        reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())


def test_a_data_directory_of_an_earlier_skpub_is_read_as_it_was_and_compacted_before_its_ingest_log_goes(tmp_path):
    """One ``ingest.log``, ``batches.log`` and ``commits.log``, commits without the definitions' lines, journal
    entries without segments: its definitions come from the ingest log, which is released only once a commit log
    base holds them."""
    data, dep = tmp_path / "data", deployment(evaluators=2, batch_size=20)
    lines = random_workload(seed=81, n=300, invalid=False)
    old = Daemon(data, dep, Limits(trigger=0.01))
    old.start()
    old.post([line.encode() for line in lines[:200]])
    while not old.ready:
        old.stopping.wait(0.01)
    definitions = dict(old._state.definitions)
    old.stop()
    assert not list(data.glob("commits-*.base"))
    for name in ("ingest", "batches", "commits"):
        (data / f"{name}-000000000000.log").rename(data / f"{name}.log")
    for name, drop in (("commits.log", "definitions"), ("batches.log", "segment")):
        entries = LineLog(data / name).read(0, 10**6)
        stripped = [orjson.dumps({k: v for k, v in orjson.loads(e).items() if k != drop}) for e in entries]
        (data / name).write_bytes(MAGIC + b"".join(e + b"\n" for e in stripped))
    assert definitions
    limits = Limits(trigger=0.01, checkpoint_seconds=0.0, segment_bytes=2000)
    again = Daemon(data, dep, limits)
    assert again._pinned and again._state.definitions == definitions
    assert again.ingest.release(10**6) == 0  # the ingest log is one segment until new lines come
    again.start()
    again.post([line.encode() for line in lines[200:]])
    while not again.ready:
        again.stopping.wait(0.01)
    assert not again._pinned and list(data.glob("commits-*.base")) and again.ingest.first > 0
    now = dict(again._state.definitions)
    assert all(now[sid] == line for sid, line in definitions.items() if sid in now)
    again.stop()
    assert Daemon(data, dep, limits)._state.definitions == now


def test_a_read_older_than_retention_gets_410_with_the_earliest_offset_kept(tmp_path):
    daemon = Daemon(
        tmp_path / "data",
        deployment(evaluators=2, batch_size=40),
        Limits(trigger=0.01, segment_bytes=2000, retention_bytes=5000),
    )
    client = TestClient(create_app(daemon, None))
    daemon.start()
    lines = random_workload(seed=61, n=800, invalid=False)
    daemon.post([line.encode() for line in lines])
    while not daemon.ready:
        daemon.stopping.wait(0.01)
    earliest = daemon.earliest("deliveries")
    assert earliest > 0 and daemon.committed("deliveries") > earliest
    gone = client.get("/v1/deliveries", params={"after": earliest - 1})
    assert gone.status_code == 410 and gone.json()["earliest"] == earliest + 1
    page = client.get("/v1/deliveries", params={"after": earliest}).json()
    assert page["deliveries"][0]["offset"] == earliest + 1
    stream = client.get("/v1/deliveries/stream", headers={"Last-Event-ID": "0"})
    assert stream.status_code == 410
    daemon.stop()


def test_the_balancer_log_keeps_its_newest_parts_within_the_retention_and_touches_nothing_else(tmp_path, monkeypatch):
    from pathlib import Path

    from skpub.app.output import PartRetention
    from skpub.kernel.parts import part_path

    def name(batch, writer=""):  # noqa: ANN001, ANN202
        return part_path(tmp_path, "balancer", batch, writer).name

    folder = tmp_path / "balancer"
    folder.mkdir()
    for batch in range(1, 11):  # one part of 100 bytes a batch, two for batch 7
        for writer in ("a", "b") if batch == 7 else ("",):
            part_path(tmp_path, "balancer", batch, writer).write_bytes(b"x" * 100)
    foreign = [folder / "notes.txt", folder / ".part-00000001.jsonl.abc.tmp", folder / "part-1.jsonl"]
    for path in foreign:
        path.write_bytes(b"y" * 10_000)
    (folder / "part-00000000.jsonl").symlink_to(tmp_path / "elsewhere")
    weight = PartRetention(tmp_path, "balancer", 0).total / 11  # a part's disk use: a whole block at least
    assert weight >= 100
    log = PartRetention(tmp_path, "balancer", int(3.5 * weight))
    assert log.retain() == 8  # batches 1-7 go (7: both parts); 8-10 fit
    newest = [name(b) for b in (8, 9, 10)]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*(p.name for p in foreign), "part-00000000.jsonl", *newest]
    )
    part_path(tmp_path, "balancer", 12, "d").write_bytes(b"x" * 100)  # batch 11 rebalanced nothing
    log.add(-1)  # before the first batch: nothing
    log.add(12)
    assert log.retain() == 1 and sorted(p.name for p in folder.glob("part-0*")) == sorted(
        ["part-00000000.jsonl", name(9), name(10), name(12, "d")]
    )
    (folder / name(9)).unlink()  # gone meanwhile: its removal is not an error
    log.keep_bytes = 0
    assert log.retain() == 2 and sorted(p.name for p in folder.glob("part-0*")) == sorted(
        ["part-00000000.jsonl", name(12, "d")]  # the newest batch stays
    )
    assert log.total == weight
    for writer in ("a", "b"):  # a batch of two parts, one of whose removals the disk refuses once
        part_path(tmp_path / "two", "balancer", 1, writer).parent.mkdir(parents=True, exist_ok=True)
        part_path(tmp_path / "two", "balancer", 1, writer).write_bytes(b"x" * 100)
    part_path(tmp_path / "two", "balancer", 2).write_bytes(b"x" * 100)
    two = PartRetention(tmp_path / "two", "balancer", 0)
    refused = {name(1, "b")}
    real_unlink = Path.unlink

    def unlink(path, missing_ok=False):
        if path.name in refused:
            refused.clear()
            raise PermissionError(path)
        return real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(PermissionError):
        two.retain()
    two.retain()  # tried again: each part is counted off once
    assert two.total == weight and [p.name for p in (tmp_path / "two" / "balancer").iterdir()] == [name(2)]
    assert PartRetention(tmp_path, "balancer", 0).retain() == 0 and (folder / name(12, "d")).exists()
    assert PartRetention(tmp_path / "none", "balancer", 0).retain() == 0


def test_a_daemon_that_rebalances_every_other_batch_keeps_its_balancer_log_within_the_retention(tmp_path):
    from skpub.kernel.config import BalancerConfig

    dep = deployment(evaluators=3, batch_size=20).replace(balancer=BalancerConfig(mode="chaos", seed=4))
    daemon = Daemon(tmp_path / "data", dep, Limits(trigger=0.01, retention_bytes=20_000))
    daemon.start()
    daemon.post([line.encode() for line in random_workload(seed=62, n=1000, invalid=False)])
    while not daemon.ready:
        daemon.stopping.wait(0.01)
    daemon.stop()
    parts = sorted((tmp_path / "data" / "output" / "balancer").glob("part-*.jsonl"))
    operations = daemon.metrics.rebalance_operations
    done = sum(s.value for m in operations.collect() for s in m.samples if s.name.endswith("_total"))
    assert done >= 20 > len(parts) >= 2  # a chaos operation every other batch; the oldest parts went
    weights = [max(p.stat().st_size, p.stat().st_blocks * 512) for p in parts]  # disk use: a block at least
    assert sum(weights[:-1]) <= 20_000 < sum(weights) + 2 * max(weights)  # the last batch's is counted after it


def test_request_bodies_split_into_records_as_files_do():
    assert split_lines(b"") == []
    assert split_lines(b"\xef\xbb\xbfa\r\nb\n\nc") == [b"a", b"b", b"", b"c"]
    assert split_lines(b"a\n") == [b"a"]


# --- the API in process --------------------------------------------------------------------------------


@pytest.fixture
def client(tmp_path):
    daemon = Daemon(
        tmp_path / "data", deployment(evaluators=3, batch_size=20), Limits(max_body_bytes=4096, max_backlog=50)
    )
    with TestClient(create_app(daemon, token="s3cret")) as c:
        c.daemon = daemon
        yield c
    daemon.stop()


def test_every_route_but_healthz_wants_the_token(client):
    assert client.get("/healthz").status_code == 200
    for method, url in [("post", "/v1/records"), ("get", "/v1/deliveries"), ("get", "/readyz"), ("get", "/metrics"),
                        ("delete", "/v1/subscriptions/a")]:  # fmt: skip
        assert client.request(method, url).status_code == 401
        assert client.request(method, url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/deliveries", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def _post_records_raw(app, messages: list[dict], content_length: int) -> list[dict]:
    """Call the ASGI app with ``POST /v1/records`` whose body arrives as ``messages`` (then nothing more)."""
    import asyncio

    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(5)  # a client that stops sending (then goes: 400, should the 408 not come first)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/records", "raw_path": b"/v1/records", "query_string": b"", "root_path": "",
             "headers": [(b"authorization", b"Bearer s3cret"), (b"content-length", str(content_length).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}  # fmt: skip
    asyncio.run(app(scope, receive, send))
    return sent


def test_a_body_cut_short_slow_or_declared_too_large_is_refused_with_a_status_and_appends_nothing(client, monkeypatch):
    """A client that goes away inside its body gets 400 (Starlette's ``ClientDisconnect`` escaped before, an
    error-level traceback), one that stops sending 408 after ``BODY_SECONDS``, and a ``Content-Length`` over the
    limit (or of over 20 digits) 413 before any byte is read; each answer closes the connection."""
    from skpub.app import api

    line = b'{"type":"object","id":"o","x":1,"y":1,"terms":["a"]}\n'
    gone = [{"type": "http.request", "body": line, "more_body": True}, {"type": "http.disconnect"}]
    monkeypatch.setattr(api, "BODY_SECONDS", 0.2)
    slow = [{"type": "http.request", "body": line, "more_body": True}]
    for messages, length, status in ((gone, 500, 400), (slow, 500, 408), ([], 10**9, 413), ([], 10**30, 413)):
        start = _post_records_raw(client.app, messages, length)[0]
        assert start["status"] == status
        assert (b"connection", b"close") in start["headers"]
    assert client.daemon.ingest.count == 0


def test_limits_answer_with_a_clear_status_and_lose_nothing(client):
    auth = {"Authorization": "Bearer s3cret"}
    assert client.post("/v1/records", content=b"x" * 5000, headers=auth).status_code == 413
    assert client.daemon.ingest.count == 0
    assert client.put("/v1/subscriptions/" + "a" * 300, json={}, headers=auth).status_code == 400
    assert client.put("/v1/subscriptions/a", content=b"[1]", headers=auth).status_code == 400
    assert client.get("/v1/deliveries?limit=0", headers=auth).status_code == 422
    assert client.get("/v1/deliveries?wait=1e308", headers=auth).status_code == 422
    # the data plane is not started here: the backlog grows to its bound
    definition = {"kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"]}
    assert client.put("/v1/subscriptions/a", json=definition, headers=auth).status_code == 202
    ok = client.post("/v1/records", content=b"{}\n" * 49, headers=auth)
    assert ok.status_code == 202 and ok.json() == {"accepted": 49, "first": 1, "last": 49}
    full = client.post("/v1/records", content=b"{}\n", headers=auth)
    assert full.status_code == 429 and full.headers["retry-after"] == "1" and client.daemon.ingest.count == 50
    # a full backlog refuses appends only: a subscription request is answered as it would be otherwise
    assert client.put("/v1/subscriptions/b", json=definition, headers=auth).status_code == 429
    assert client.put("/v1/subscriptions/a", json=definition, headers=auth).status_code == 200  # identical
    assert client.put("/v1/subscriptions/c", json={**definition, "kind": "circle"}, headers=auth).status_code == 422
    assert client.delete("/v1/subscriptions/zz", headers=auth).status_code == 404
    assert client.daemon.ingest.count == 50
    client.daemon.stopping.set()
    assert client.delete("/v1/subscriptions/a", headers=auth).status_code == 503


# --- the daemon over real HTTP, against a file run ------------------------------------------------------


def file_run(tmp_path, lines, dep):
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    out = tmp_path / "file-run"
    run_local(source, out, dep, RunObserver(RunSummary("local", dep.router, dep.evaluators), stream=None))
    dead = Counter((d["line"], d["reason"]) for d in read_stream(out, "dead_letters"))
    return Counter(json.dumps(d, sort_keys=True) for d in read_stream(out, "deliveries")), dead


def served_outputs(served, lines):
    """The daemon's deliveries and dead letters, as :func:`file_run` counts them, after checking their offsets and
    that each dead letter names the ingest position of its line (``lines`` were posted in order from position 0)."""
    deliveries = served.read("deliveries")
    assert [d["offset"] for d in deliveries] == list(range(1, len(deliveries) + 1))  # no gap, no duplicate
    dead = served.read("dead_letters")
    assert [d["offset"] for d in dead] == list(range(1, len(dead) + 1))
    assert [lines[d["position"]] for d in dead] == [d["line"] for d in dead]
    assert len({d["position"] for d in dead}) == len(dead)
    strip = [{k: v for k, v in d.items() if k != "offset"} for d in deliveries]
    return Counter(json.dumps(d, sort_keys=True) for d in strip), Counter((d["line"], d["reason"]) for d in dead)


def stream_events(served, params, count, headers=None):
    """Read ``count`` deliveries from ``/v1/deliveries/stream`` (SSE), checking each ``id:`` is its offset."""
    out = []
    with served.http.stream("GET", "/v1/deliveries/stream", params=params, headers=headers or {}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        event_id = None
        for line in response.iter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                out.append(json.loads(line[6:]))
                assert out[-1]["offset"] == event_id
                if len(out) == count:
                    return out
    return out


ENGINES = ["local", pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.slow])]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_records_posted_in_many_requests_equal_a_file_run_of_the_same_lines(tmp_path, engine):
    lines = random_workload(seed=21, n=700) + ranked_workload(seed=22, n=300)
    dep = deployment(evaluators=3, batch_size=40 if engine == "local" else 150)
    (tmp_path / "dep.json").write_text(json.dumps(dep.to_json()))
    served = Served(tmp_path / "data", tmp_path / "dep.json", engine=engine)
    try:
        start, sizes = 0, [1, 7, 130, 3, 64]
        while start < len(lines):
            size = sizes[start % len(sizes)]
            reply = served.post(lines[start : start + size])
            assert reply["first"] == start and reply["accepted"] == len(lines[start : start + size])
            start += size
        served.wait_ready()
        assert served_outputs(served, lines) == file_run(tmp_path, lines, dep)
        snapshots = [{k: v for k, v in line.items() if k != "offset"} for line in served.read("snapshots")]
        assert snapshots == read_stream(tmp_path / "file-run", "snapshots")  # in order, as the oracle's
        taken = {line["snapshot"] for line in snapshots}
        for sid in sorted(taken)[:3]:
            lines = served.http.get(f"/v1/snapshots/{sid}").json()["lines"]
            assert [{k: v for k, v in x.items() if k != "offset"} for x in lines] == [
                x for x in snapshots if x["snapshot"] == sid
            ]
        posted = served.http.post("/v1/snapshots", json={"id": "late"})
        assert posted.status_code == 202 and posted.json() == {"id": "late", "position": len(lines)}
        again = served.http.post("/v1/snapshots").json()  # an id is made
        served.wait_ready()
        late = served.http.get("/v1/snapshots/late").json()["lines"]
        assert late == [x for x in served.read("snapshots") if x["snapshot"] == "late"]
        assert served.http.get(f"/v1/snapshots/{again['id']}").status_code == 200
        assert served.http.get("/v1/snapshots/never").status_code == 404
        duplicate = served.http.post("/v1/snapshots", json={"id": "late"}).json()
        served.wait_ready()
        letters = served.read("dead_letters")
        assert letters[-1]["reason"] == "duplicate_id" and '"late"' in letters[-1]["line"], duplicate
        deliveries = served.read("deliveries")
        assert stream_events(served, {"after": 0}, len(deliveries)) == deliveries
        # a subscription read back: its definition, and a ranked one's result as a snapshot says
        ranked = {"near": {"kind": "knn"}, "best": {"kind": "topk", "alpha": 0.5}}
        for sid, fields in ranked.items():
            served.http.put(f"/v1/subscriptions/{sid}", json={**fields, "point": [50, 50], "k": 3, "keywords": ["a"]})
        served.post([json.dumps({"type": "object", "id": f"late{i}", "x": 40 + i, "y": 50, "terms": ["a", "b"]})
                     for i in range(5)])  # fmt: skip
        taken = served.http.post("/v1/snapshots").json()["id"]
        served.wait_ready()
        last = [x for x in served.read("snapshots") if x["snapshot"] == taken]
        assert {x["sub"] for x in last} >= {"near", "best"}
        for line in last[:5]:
            got = served.http.get(f"/v1/subscriptions/{line['sub']}").json()
            assert got["subscription"]["id"] == line["sub"] and got["result"] == line["results"]
        served.http.put("/v1/subscriptions/fresh", json={"kind": "range", "rect": [0, 0, 5, 5], "keywords": ["a"]})
        served.wait_ready()
        fresh = {"type": "subscribe", "id": "fresh", "kind": "range", "rect": [0, 0, 5, 5], "keywords": ["a"]}
        assert served.http.get("/v1/subscriptions/fresh").json() == {"subscription": fresh}
        served.http.delete("/v1/subscriptions/fresh")
        served.wait_ready()
        assert served.http.get("/v1/subscriptions/fresh").status_code == 404
        middle = deliveries[len(deliveries) // 2]["offset"]
        resumed = stream_events(served, {}, 3, headers={"Last-Event-ID": str(middle)})
        assert resumed == deliveries[middle : middle + 3]
    finally:
        served.proc.terminate()
        assert served.proc.wait(60) == 0  # SIGTERM: finish the batch in flight, exit 0


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_a_consumer_following_deliveries_across_kill_9_sees_each_once(tmp_path, engine):
    lines = random_workload(seed=31, n=1500, invalid=False)
    dep = deployment(evaluators=4, batch_size=5 if engine == "local" else 120)
    (tmp_path / "dep.json").write_text(json.dumps(dep.to_json()))
    # local: a checkpoint after every batch, restored after the kill; small segments: the ingest log is released
    extra = ("--checkpoint-seconds", "0", "--segment-bytes", "4096")
    served = Served(tmp_path / "data", tmp_path / "dep.json", engine=engine, extra=extra)
    for start in range(0, len(lines), 100):
        served.post(lines[start : start + 100])  # acknowledged: must survive the kill
    seen = []
    while len(seen) < 50:
        seen += served.http.get("/v1/deliveries", params={"after": len(seen), "wait": 5}).json()["deliveries"]
    served.proc.send_signal(signal.SIGKILL)
    served.proc.wait()
    assert not served.http.close()
    if engine == "local":
        assert local_checkpoint.checkpoints(tmp_path / "data" / "checkpoints")
    restarted = Served(tmp_path / "data", tmp_path / "dep.json", engine=engine, extra=extra)
    try:
        restarted.wait_ready()
        rest = restarted.read("deliveries", after=seen[-1]["offset"])
        everything = seen + rest
        assert [d["offset"] for d in everything] == list(range(1, len(everything) + 1))
        assert served_outputs(restarted, lines)[0] == file_run(tmp_path, lines, dep)[0]
        assert not (tmp_path / "data" / "ingest-000000000000.log").exists()
    finally:
        restarted.proc.terminate()
        restarted.proc.wait(60)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_kill_9_at_random_moments_with_small_segments_and_compaction_loses_and_repeats_nothing(tmp_path, engine):
    """Several kill -9s at random moments of the data plane (rolls, releases, compactions and checkpoints under
    way), a restart after each: every acknowledged record is processed once, offsets have no gap or repeat."""
    rng = random.Random(2026)
    lines = random_workload(seed=101, n=1600) + ranked_workload(seed=102, n=400)
    dep = deployment(evaluators=3, batch_size=4 if engine == "local" else 60)
    (tmp_path / "dep.json").write_text(json.dumps(dep.to_json()))
    extra = ("--checkpoint-seconds", "0", "--segment-bytes", "2000", "--compact-commits", "3")
    posted = 0
    for _ in range(4):
        served = Served(tmp_path / "data", tmp_path / "dep.json", engine=engine, extra=extra)
        share = rng.randint(200, 600)
        for start in range(posted, min(posted + share, len(lines)), 50):
            served.post(lines[start : min(start + 50, posted + share, len(lines))])  # acknowledged: must survive
        posted = min(posted + share, len(lines))
        time.sleep(rng.uniform(0.05, 1.5) * (1 if engine == "local" else 8))  # somewhere in its backlog
        served.proc.send_signal(signal.SIGKILL)
        served.proc.wait()
        served.http.close()
    served = Served(tmp_path / "data", tmp_path / "dep.json", engine=engine, extra=extra)
    try:
        served.post(lines[posted:])
        served.wait_ready()
        assert served_outputs(served, lines) == file_run(tmp_path, lines, dep)
        data = tmp_path / "data"
        assert not (data / "ingest-000000000000.log").exists()
        assert engine == "spark" or list(data.glob("commits-*.base"))  # Spark's fewer batches: no compaction due
    finally:
        served.proc.terminate()
        served.proc.wait(60)


def test_a_spark_checkpoint_older_than_what_the_logs_keep_is_refused_with_the_reason(tmp_path):
    """A directory run on the local engine after Spark released what Spark's checkpoint would resume from."""
    from skpub.app.checkpoint import Checkpoint
    from skpub.kernel.errors import CheckpointError

    lines = random_workload(seed=121, n=600, invalid=False)
    data = tmp_path / "data"
    daemon = Daemon(data, deployment(evaluators=2, batch_size=10), Limits(trigger=0.01, checkpoint_seconds=0.0,
                    segment_bytes=800))  # fmt: skip
    daemon.start()
    daemon.post([line.encode() for line in lines])
    while not daemon.ready:
        daemon.stopping.wait(0.01)
    daemon.stop()
    spark = Checkpoint(data / "spark")
    spark.create()
    spark.manifest.write_text("{}")
    (spark.query / "commits").mkdir(parents=True)
    (spark.query / "commits" / "2").write_text("v1")  # Spark committed batch 2: it would resume at 3
    assert daemon.batches.first > 3
    with pytest.raises(CheckpointError, match="resumes at batch 3"):
        daemon._check_spark_resume()
    (spark.query / "commits" / str(daemon.ends.count - 1)).write_text("v1")  # up to date: resumes
    daemon._check_spark_resume()


def test_a_data_directory_serves_one_daemon_at_a_time(tmp_path):
    first = Daemon(tmp_path, deployment(evaluators=3))
    with pytest.raises(ConfigError, match="in use by another skpub serve"):
        Daemon(tmp_path, deployment(evaluators=3))
    first.stop()
    first.stop()  # twice: nothing else is closed
    Daemon(tmp_path, deployment(evaluators=3)).stop()  # free again


def test_a_segment_being_created_when_a_kill_came_is_removed_at_open_and_nothing_else(tmp_path):
    log = SegmentedLog(tmp_path, "ingest", 40)
    log.append([b"x"])
    log.close()
    stale = tmp_path / ".ingest-000000000001.log.k3j_x9.tmp"
    stale.write_bytes(b'{"skpub')
    foreign = [tmp_path / ".ingest-notes.tmp", tmp_path / ".deliveries-000000000001.log.ab.tmp"]
    for path in foreign:
        path.write_bytes(b"keep")
    again = SegmentedLog(tmp_path, "ingest", 40)
    assert not stale.exists() and all(p.read_bytes() == b"keep" for p in foreign) and again.read(0, 2) == [b"x"]


def test_a_refused_journal_append_stalls_the_cut_and_it_is_tried_again(tmp_path, monkeypatch):
    lines = random_workload(seed=111, n=200, invalid=False)
    dep = deployment(evaluators=2, batch_size=50)
    daemon = Daemon(tmp_path / "data", dep, Limits(trigger=0.01, retry_seconds=0.01))
    real_append, refusals = daemon.batches.append, []

    def full_disk_twice(entries):
        if len(refusals) < 2:
            refusals.append(daemon.stalled)
            raise OSError(28, "No space left on device")
        return real_append(entries)

    monkeypatch.setattr(daemon.batches, "append", full_disk_twice)
    daemon.start()
    daemon.post([line.encode() for line in lines])
    while not daemon.ready:
        daemon.stopping.wait(0.01)
    deliveries = [orjson.loads(x) for x in daemon.read_committed("deliveries", 0, 10**6)]
    daemon.stop()
    assert len(refusals) == 2 and refusals[1] is not None and "journal refuses" in refusals[1]
    expected, _ = file_run(tmp_path, lines, dep)
    got = Counter(json.dumps({k: v for k, v in d.items() if k != "offset"}, sort_keys=True) for d in deliveries)
    assert got == expected


def test_a_data_directory_refuses_another_deployment_naming_what_differs_and_resumes_with_its_own(
    tmp_path, monkeypatch
):
    """The refusal names each differing key with both values (a default changed by an upgrade shows there), and
    ``skpub serve`` given no deployment options resumes with the recorded deployment."""
    import dataclasses

    from skpub.app.daemon import recorded_deployment

    assert recorded_deployment(tmp_path) is None
    made = deployment(evaluators=3)
    made = made.replace(balancer=dataclasses.replace(made.balancer, decay=0.5))
    Daemon(tmp_path, made).stop()
    later = deployment(evaluators=4)
    with pytest.raises(ConfigError, match=r"balancer\.decay: recorded 0\.5, now 0\.25; evaluators: recorded 3, now 4"):
        Daemon(tmp_path, later)
    assert recorded_deployment(tmp_path).to_json() == made.to_json()
    Daemon(tmp_path, recorded_deployment(tmp_path)).stop()

    import skpub.app.serve

    started = []
    monkeypatch.setattr(skpub.app.serve, "serve", lambda data, dep, *rest: started.append(dep) or 0)
    assert main(["serve", "--data", str(tmp_path), "--batch-size", "17"]) == 0  # a restart with a flag
    assert started[0].to_json() == made.replace(batch_size=17).to_json()  # the recorded deployment, the flag on top

    older = orjson.loads((tmp_path / "deployment.json").read_bytes())
    del older["balancer"]["horizon"]  # a key missing from the record takes its default
    (tmp_path / "deployment.json").write_bytes(orjson.dumps(older))
    Daemon(tmp_path, made).stop()
    del older["balancer"]["object_cost"], older["balancer"]["global_period"]  # keys of KEYS_ADDED: skpub before them
    (tmp_path / "deployment.json").write_bytes(orjson.dumps(older))
    then = recorded_deployment(tmp_path).balancer
    assert (then.object_cost, then.global_period) == (1, 0)
    with pytest.raises(
        ConfigError, match=r"balancer\.global_period: recorded 0, now 50; balancer\.object_cost: recorded 1"
    ):
        Daemon(tmp_path, made)
    Daemon(tmp_path, recorded_deployment(tmp_path)).stop()
    for damaged in ("[1, 2]", '{"foo": 1}', "{"):
        (tmp_path / "deployment.json").write_text(damaged)
        for read in (recorded_deployment, lambda d: Daemon(d, made)):
            with pytest.raises(ConfigError, match="deployment.json is not a deployment skpub can read"):
                read(tmp_path)


def test_a_recorded_deployment_without_an_added_key_reads_as_the_skpub_before_it():
    """``recorded_json`` fills a key of ``KEYS_ADDED`` the record lacks with its earlier value, keeps one it has,
    leaves what is not an object as it is, and never changes its argument."""
    from skpub.kernel.config import KEYS_ADDED, deployment_from_json, recorded_json

    assert KEYS_ADDED[("balancer", "object_cost")] == 1
    raw = deployment(evaluators=2).to_json()
    del raw["balancer"]["object_cost"]
    kept = orjson.dumps(raw)
    assert deployment_from_json(recorded_json(raw)).balancer.object_cost == 1
    assert deployment_from_json(raw).balancer.object_cost == 10  # a new deployment takes the default
    assert orjson.dumps(raw) == kept
    raw["balancer"]["object_cost"] = 7
    assert recorded_json(raw)["balancer"]["object_cost"] == 7
    for odd in ([1], None, "x", {"balancer": 3}, {}):
        assert recorded_json(odd) == odd


def spark_manifest(tmp_path, opener: str, recorded: dict):
    """Write a Spark checkpoint whose manifest records deployment JSON ``recorded``, as the daemon (``opener``
    ``daemon``) or ``skpub run --checkpoint`` (``run``) writes it; return the manifest and its opener, which
    resumes it with a deployment (no Spark session is needed to resume)."""
    from skpub.app.checkpoint import Checkpoint
    from skpub.app.engines.spark import MANIFEST_FORMAT, _input_fingerprint, _open_checkpoint, _open_daemon_checkpoint
    from skpub.app.output import claim_output
    from skpub.app.summary import RunObserver, RunSummary

    ckpt = Checkpoint(tmp_path / "checkpoint")
    ckpt.create()
    manifest = {"format": MANIFEST_FORMAT, "deployment": recorded, "run_id": "r"}
    if opener == "daemon":
        manifest["daemon"] = True
        open_ = lambda dep: _open_daemon_checkpoint(ckpt, dep, None, list)  # noqa: E731
    else:
        source, out = tmp_path / "in.jsonl", tmp_path / "out"
        source.write_text('{"type": "object", "id": "o", "x": 1, "y": 1, "terms": ["a"]}\n')
        claim_output(out, "r", False)
        manifest |= {"input": _input_fingerprint(source), "output": str(out)}
        observer = RunObserver(RunSummary("spark", "agrid", 2), stream=None)
        open_ = lambda dep: _open_checkpoint(ckpt, source, dep, out, None, observer, False)  # noqa: E731
    ckpt.manifest.write_text(json.dumps(manifest))
    return ckpt, manifest, open_


@pytest.mark.parametrize("opener", ["daemon", "run"])
def test_a_spark_manifest_written_before_an_added_key_resumes_with_the_earlier_behaviour(tmp_path, opener):
    """The Spark checkpoint's manifest (the daemon's, and ``skpub run --checkpoint``'s) is compared as recorded: a
    deployment written before ``object_cost`` resumes with 1 (what that run counted), and one with the new default
    is refused, recorded 1, now 10; no Spark session is needed to resume."""
    import dataclasses

    from skpub.kernel.errors import CheckpointError

    now = deployment(evaluators=2)
    old = now.to_json()
    del old["balancer"]["object_cost"]
    then = now.replace(balancer=dataclasses.replace(now.balancer, object_cost=1))
    _, manifest, open_ = spark_manifest(tmp_path, opener, old)
    assert open_(then) == manifest
    with pytest.raises(CheckpointError, match=r"balancer\.object_cost: recorded 1, now 10"):
        open_(now)


def test_a_vocabulary_edited_since_the_data_directory_recorded_it_is_refused_with_a_sentence(tmp_path):
    """The data directory records the vocabulary file's SHA-256: a restart on an edited file is refused (with
    ``--config``, and resumed from the record), a record made before digests resumes unchecked as before, and the
    file restored opens again."""
    from skpub.app.daemon import recorded_deployment

    words = tmp_path / "vocabulary.json"
    words.write_text('{"N": 100, "df": {"cafe": 40, "jazz": 2}}')
    data = tmp_path / "data"
    made = deployment(evaluators=2).replace(vocabulary=str(words))
    Daemon(data, made).stop()
    original = words.read_bytes()
    assert recorded_deployment(data).vocabulary_digest == recorded_digest(original)
    words.write_text('{"N": 100, "df": {"cafe": 2, "jazz": 40}}')  # edited: the least frequent keywords swap
    with pytest.raises(ConfigError, match=r"vocabulary_digest: the vocabulary file's content is not the one recorded"):
        Daemon(data, made)
    with pytest.raises(ConfigError, match=r"vocabulary\.json is not the one this deployment recorded"):
        Daemon(data, recorded_deployment(data))
    older = orjson.loads((data / "deployment.json").read_bytes())
    del older["vocabulary_digest"]  # recorded by an skpub before digests: resumed as then, unchecked
    (data / "deployment.json").write_bytes(orjson.dumps(older))
    Daemon(data, made).stop()
    Daemon(data, recorded_deployment(data)).stop()
    (data / "deployment.json").write_bytes(orjson.dumps({**older, "vocabulary_digest": recorded_digest(original)}))
    words.write_bytes(original)  # restored
    Daemon(data, made).stop()
    Daemon(data, recorded_deployment(data)).stop()


def recorded_digest(content: bytes) -> str:
    """The SHA-256 of ``content`` in hex, computed here apart from skpub's code."""
    import hashlib

    return hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize("opener", ["daemon", "run"])
def test_a_spark_manifest_refuses_a_vocabulary_edited_since_and_every_task_checks_the_file(tmp_path, opener):
    """The Spark checkpoint's manifest records the vocabulary's SHA-256 (a manifest without one resumes as
    before), and a task loading the file on any host checks it: an evaluator restored over an edited file, or a
    file that differs on its host, refuses with a sentence instead of choosing other least frequent keywords."""
    from skpub.evaluators.state import restore_evaluator
    from skpub.kernel.errors import CheckpointError
    from skpub.kernel.text import load_vocabulary, pin_vocabulary

    words = tmp_path / "vocabulary.json"
    words.write_text('{"N": 100, "df": {"cafe": 40, "jazz": 2}}')
    original = words.read_bytes()
    then = pin_vocabulary(deployment(evaluators=2).replace(vocabulary=str(words)))
    assert then.vocabulary_digest == recorded_digest(original)
    ckpt, manifest, open_ = spark_manifest(tmp_path, opener, json.loads(json.dumps(then.to_json())))
    assert open_(then) == manifest
    words.write_text('{"N": 100, "df": {"cafe": 2, "jazz": 40}}')
    now = pin_vocabulary(deployment(evaluators=2).replace(vocabulary=str(words)))
    with pytest.raises(CheckpointError, match=r"vocabulary_digest: the vocabulary file's content is not the one"):
        open_(now)
    with pytest.raises(ConfigError, match="is not the one this deployment recorded"):
        restore_evaluator(0, json.dumps(then.to_json()), None)  # a task shipped the recorded deployment
    with pytest.raises(ConfigError, match="is not the one this deployment recorded"):
        load_vocabulary(str(words), then.vocabulary_digest)
    del manifest["deployment"]["vocabulary_digest"]  # written before digests: resumed as then
    ckpt.manifest.write_text(json.dumps(manifest))
    assert open_(now) == manifest


@pytest.mark.parametrize("digest", ["", "ABC", "0" * 63, "g" * 64, 7, "0" * 64 + "\n"])
def test_a_vocabulary_digest_is_a_sha256_in_hex_given_with_a_vocabulary(digest):
    from skpub.kernel.config import deployment_from_json

    with pytest.raises(ConfigError, match="vocabulary_digest must be a SHA-256 in lowercase hex"):
        deployment_from_json({"vocabulary": "v.json", "vocabulary_digest": digest})
    with pytest.raises(ConfigError, match="vocabulary_digest is given without a vocabulary"):
        deployment_from_json({"vocabulary_digest": "0" * 64})


def test_deployment_changes_name_every_differing_leaf():
    from skpub.kernel.config import changes_text, deployment_changes

    recorded = {"a": 1, "b": {"c": 2, "d": [1]}, "gone": True}
    assert deployment_changes(recorded, {"a": 1, "b": {"c": 3, "d": [1]}, "new": "x"}) == [
        "b.c: recorded 2, now 3",
        "gone: recorded true, now null",
        'new: recorded null, now "x"',
    ]
    assert deployment_changes(recorded, recorded) == []
    long = deployment_changes({"input": ["a" * 200]}, {"input": ["b"]})
    assert long == [f'input: recorded ["{"a" * 75}..., now ["b"]']  # a fingerprint of many files is cut
    assert changes_text([f"k{i}" for i in range(7)], 5) == "k0; k1; k2; k3; k4; and 2 more"


def test_a_non_loopback_listen_without_a_token_is_refused(tmp_path):
    from skpub.app.serve import parse_listen, serve

    with pytest.raises(ConfigError):
        serve(tmp_path, deployment(), "0.0.0.0:8750", token=None)
    with pytest.raises(ConfigError):
        parse_listen("localhost:80")
    assert parse_listen("[::1]:9") == ("::1", 9)
    with pytest.raises(ConfigError, match="give the IPv4 one, 127.0.0.1"):
        parse_listen("[::ffff:127.0.0.1]:9")


def test_listen_port_zero_listens_on_a_free_port_and_an_address_in_use_is_refused_before_the_daemon_starts(
    tmp_path, monkeypatch
):
    import re
    import socket

    from skpub.app import serve as served_module
    from skpub.app.serve import bind_listener, listener_url, serve

    def no_daemon(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the daemon was built although the address is in use")

    monkeypatch.setattr(served_module, "Daemon", no_daemon)
    with bind_listener("127.0.0.1:0") as sock:
        port = sock.getsockname()[1]
        assert port > 0 and listener_url(sock) == f"http://127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens from the start: the kernel queues a connection before anything accepts it
        refused = re.escape(f"--listen 127.0.0.1:{port}: cannot listen there: Address already in use")
        with pytest.raises(ConfigError, match=refused):  # a second daemon, while the first builds its data plane
            serve(tmp_path / "data", deployment(), f"127.0.0.1:{port}", token=None)
    assert not (tmp_path / "data").exists()  # refused before the daemon made its data directory
    with pytest.raises(ConfigError, match="cannot listen there"):
        bind_listener("192.0.2.1:0")  # TEST-NET-1: not an address of this host
    try:
        six = bind_listener("[::1]:0")
    except ConfigError:
        return  # no IPv6 loopback on this host
    with six:
        assert listener_url(six) == f"http://[::1]:{six.getsockname()[1]}"
        assert six.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1


def test_a_restarted_local_daemon_resumes_from_its_checkpoint_not_from_the_start(tmp_path, monkeypatch):
    """With checkpoints after every batch, a restart builds no new pipeline and replays no batch it had committed;
    its outputs continue the first run's as one run would."""
    from skpub.app.engines.local import LocalPipeline

    lines = random_workload(seed=41, n=400) + ranked_workload(seed=42, n=200)
    dep = deployment(evaluators=3, batch_size=30)
    limits = Limits(checkpoint_seconds=0.0, trigger=0.01)
    first = Daemon(tmp_path / "data", dep, limits)
    first.start()
    first.post([line.encode() for line in lines[:300]])
    while not first.ready:
        first.stopping.wait(0.01)
    first.stop()
    steps = []
    real_step = LocalPipeline.step
    monkeypatch.setattr(LocalPipeline, "new", lambda *a: pytest.fail("a restart must restore, not start anew"))
    monkeypatch.setattr(LocalPipeline, "step", lambda self, b, *a: steps.append(b) or real_step(self, b, *a))
    again = Daemon(tmp_path / "data", dep, limits)
    committed = again.processed
    again.start()
    again.post([line.encode() for line in lines[300:]])
    while not again.ready:
        again.stopping.wait(0.01)
    assert committed == 300 and steps and min(steps) == again.ends.count - len(steps)  # only new batches ran
    deliveries = [orjson.loads(x) for x in again.read_committed("deliveries", 0, 10**6)]
    again.stop()
    monkeypatch.undo()
    expected, _ = file_run(tmp_path, lines, dep)
    got = Counter(json.dumps({k: v for k, v in d.items() if k != "offset"}, sort_keys=True) for d in deliveries)
    assert got == expected and [d["offset"] for d in deliveries] == list(range(1, len(deliveries) + 1))


def test_readiness_reports_the_phase_and_the_progress_a_client_waits_on(tmp_path):
    """/readyz says what the data plane does (starting and its step, running) and the batches it committed and
    ran, so a client waits while they move instead of on a fixed clock: a restart replaying journaled batches
    moves ``run_batch``; it is not ready before its data plane runs, even with nothing to process."""
    lines = [line.encode() for line in random_workload(seed=53, n=200, invalid=False)]
    dep = deployment(evaluators=2, batch_size=8)
    data = tmp_path / "data"
    daemon = Daemon(data, dep, Limits(trigger=0.01, checkpoint_seconds=3600.0))
    client = TestClient(create_app(daemon, None))
    reply = client.get("/readyz")
    assert reply.status_code == 503
    assert reply.json() == {"ready": False, "phase": "starting", "starting": "opening", "acknowledged": 0,
                            "processed": 0, "committed_batch": -1, "run_batch": -1}  # fmt: skip
    daemon.start()
    daemon.post(lines)
    while not daemon.ready:
        daemon.stopping.wait(0.01)
    reply = client.get("/readyz")
    last = daemon.committed_batch
    assert reply.status_code == 200 and last >= 24  # 200 lines in batches of at most 8: a replay of 25 batches
    assert reply.json() == {"ready": True, "phase": "running", "starting": None, "acknowledged": 200, "processed": 200,
                            "committed_batch": last, "run_batch": last}  # fmt: skip
    daemon.stop()
    restarted = Daemon(data, dep, Limits(trigger=0.01))  # no checkpoint was taken: every journaled batch replays
    assert (restarted.phase, restarted.ready, restarted.committed_batch, restarted.run_batch) == (
        "starting",
        False,
        last,
        -1,
    )
    more = [line.encode() for line in random_workload(seed=54, n=40, invalid=False)]
    seen = set()
    restarted.start()
    restarted.post(more)  # processed once the replay is done
    while not restarted.ready:
        seen.add(restarted.run_batch)
        time.sleep(0.001)
    restarted.stop()
    assert restarted.run_batch == restarted.committed_batch > last
    assert len({b for b in seen if 0 <= b < last}) > 1  # the replay was seen moving


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the data plane's failure
def test_a_new_spark_daemon_with_nothing_posted_is_ready_and_starts_spark_on_its_first_record(tmp_path, monkeypatch):
    """A readiness probe must see an idle new daemon ready (else it never gets the record that starts Spark); the
    first record starts the data plane, and it is not ready until that record is processed."""
    import skpub.app.engines.spark as spark_engine

    started = []

    class NoSpark:  # the plane the first record starts (no JVM in this test)
        def __init__(self, daemon, sample):  # noqa: ANN001
            daemon.starting = "starting Spark"
            started.append(daemon.starting)
            raise RuntimeError("no Spark in this test")

    monkeypatch.setattr(spark_engine, "SparkPlane", NoSpark)
    daemon = Daemon(tmp_path / "data", deployment(evaluators=2, batch_size=10), Limits(trigger=0.01), engine="spark")
    client = TestClient(create_app(daemon, None))
    daemon.start()
    while daemon.phase == "starting":
        daemon.stopping.wait(0.01)
    reply = client.get("/readyz")
    assert reply.status_code == 200 and reply.json()["phase"] == "running" and reply.json()["starting"] is None
    daemon.post([b'{"type": "object", "id": "o1", "x": 1, "y": 1, "terms": ["a"]}'])
    while daemon.failure is None:
        daemon.stopping.wait(0.01)
    assert started == ["starting Spark"] and not daemon.ready and client.get("/readyz").json()["phase"] == "failed"
    daemon.stop()


def test_a_disk_that_refuses_the_outputs_stalls_the_commit_and_it_is_tried_again(tmp_path, monkeypatch):
    """A full disk while appending a batch's outputs: nothing of the batch is served, /readyz says why, the
    commit is tried again and lands once, whole."""
    lines = random_workload(seed=51, n=300, invalid=False)
    dep = deployment(evaluators=2, batch_size=50)
    daemon = Daemon(tmp_path / "data", dep, Limits(trigger=0.01, retry_seconds=0.01))
    log = daemon.logs["deliveries"]
    real_append, refusals = log.append, []

    def full_disk_twice(entries):
        if len(refusals) < 2 and len(entries) > 3:
            real_append(entries[:2])  # a write cut short by the full disk
            refusals.append(daemon.stalled)
            raise OSError(28, "No space left on device")
        return real_append(entries)

    monkeypatch.setattr(log, "append", full_disk_twice)
    daemon.start()
    daemon.post([line.encode() for line in lines])
    while not daemon.ready:
        daemon.stopping.wait(0.01)
    deliveries = [orjson.loads(x) for x in daemon.read_committed("deliveries", 0, 10**6)]
    metrics = generate_latest(daemon.metrics.registry).decode()
    daemon.stop()
    assert len(refusals) == 2 and refusals[1] is not None and "No space left" in refusals[1]
    assert "skpub_commit_retries_total 2.0" in metrics
    expected, _ = file_run(tmp_path, lines, dep)
    got = Counter(json.dumps({k: v for k, v in d.items() if k != "offset"}, sort_keys=True) for d in deliveries)
    assert got == expected and [d["offset"] for d in deliveries] == list(range(1, len(deliveries) + 1))


def test_a_local_daemon_collects_in_full_after_its_batches_and_while_idle_and_exports_the_collections(
    tmp_path, monkeypatch
):
    """A full collection never runs inside a batch's wall time (from its start to the observation the batch
    histogram takes at its commit), runs after batches and while no record waits, and the collections per
    generation are in the daemon's metrics."""
    import skpub.app.engines.local_plane as plane_module
    from skpub.kernel import runtime

    runtime.tune_gc()  # as any run before in this process did: its one collection before freezing is not timed
    monkeypatch.setattr(plane_module, "FULL_COLLECTION_SECONDS", 0.0)  # every call collects,
    monkeypatch.setattr(runtime, "STRETCH", 0.0)  # however long the last one took
    timing = {"open": False, "started": 0.0, "observed": 0}
    calls = []  # (inside a batch's wall time, batches observed)

    def set_started(daemon, value):  # noqa: ANN001, ANN202
        timing.update(open=True, started=value)

    def observe(daemon, report, produced):  # noqa: ANN001, ANN202
        real_observe(daemon, report, produced)
        timing.update(open=False, observed=timing["observed"] + 1)

    real_collect, real_observe = gc.collect, Daemon._observe
    monkeypatch.setattr(Daemon, "batch_started", property(lambda d: timing["started"], set_started), raising=False)
    monkeypatch.setattr(Daemon, "_observe", observe)

    def collect(*args):  # noqa: ANN002, ANN202
        calls.append((timing["open"], timing["observed"]))
        return real_collect(*args)

    monkeypatch.setattr(gc, "collect", collect)
    daemon = Daemon(tmp_path / "data", deployment(evaluators=2, batch_size=30), Limits(trigger=0.01))
    timing["open"] = False  # __init__ sets it: no batch yet
    paused = collector_pauses().seconds[2]  # the counter is the process's: earlier tests collected too
    daemon.start()
    try:
        daemon.post([line.encode() for line in random_workload(seed=3, n=90)])
        deadline = time.monotonic() + 120
        while daemon.failure is None and time.monotonic() < deadline:  # until every batch journaled has run
            if daemon.ready and timing["observed"] == daemon.ends.count:
                break
            daemon.stopping.wait(0.01)
        assert daemon.failure is None and daemon.ready and timing["observed"] == daemon.ends.count
        batches, seen = timing["observed"], len(calls)
        deadline = time.monotonic() + 60
        while len(calls) < seen + 3 and time.monotonic() < deadline:
            daemon.stopping.wait(0.01)
        assert len(calls) >= seen + 3 and timing["observed"] == batches  # idle: collections, no batch
        assert batches >= 3 and not any(inside for inside, _ in calls)
        assert {b for _, b in calls} >= set(range(1, batches + 1))  # after each batch
        text = generate_latest(daemon.metrics.registry).decode()
        assert 'python_gc_collections_total{generation="2"}' in text
        scraped = re.search(r'skpub_gc_pause_seconds_total\{generation="2"\} (\S+)', text)
        assert scraped and float(scraped[1]) > paused  # the collections after each batch took some time
    finally:
        daemon.stop()
