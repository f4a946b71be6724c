"""The Spark engine's routing tasks without Spark: staging, stream order, completeness, rejections."""

import json
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skpub.app.checkpoint import Checkpoint
from skpub.app.engines.spark_tasks import (
    _check_complete,
    _in_stream_order,
    _rejected_letters,
    _with_report,
    split_part,
    stage_parts,
)
from skpub.kernel.errors import CheckpointError
from skpub.kernel.text import Vocabulary
from skpub.router.initial import initial_table
from skpub.router.locate import Locator, located_table
from skpub.router.sequencer import Decisions
from skpub.router.summary import TextualSummaries
from tests.workloads import deployment, random_workload

LINES = st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=30)


@settings(max_examples=100, deadline=None)
@given(lines=LINES, parts=st.integers(1, 5))
def test_staged_parts_give_back_every_line_once_in_order(tmp_path_factory, lines, parts):
    directory = tmp_path_factory.mktemp("source")
    stage_parts(lines, 7, parts, directory)
    files = sorted(directory.glob("chunk-00000007-*.raw"))
    assert len(files) == parts
    got, expected_first = [], 0
    for k, path in enumerate(files):
        batch, part, first, part_lines = split_part(path.read_bytes(), str(path))
        assert (batch, part, first) == (7, k, expected_first)
        got += part_lines
        expected_first += len(part_lines)
    assert got == lines


def _located(lines, batch_id=0, parts=3):
    dep = deployment(evaluators=3)
    locator = Locator(dep, Vocabulary(), initial_table(dep, Vocabulary(), lines))
    raw = [line.encode() for line in lines]
    size = -(-len(raw) // parts)
    runs = []
    for part in range(parts):
        first = part * size
        located = locator.locate_lines(raw[first : first + size], batch_id, first)
        report = {"part": part, "first": first, "lines": len(raw[first : first + size]), "dead_letters": {},
                  "cpu_seconds": 0.0}  # fmt: skip
        runs.append(_with_report(located_table(located), json.dumps(report)))
    return runs


def test_parse_runs_arriving_in_any_order_are_put_in_stream_order():
    runs = _located(random_workload(seed=3, n=300))
    random.Random(1).shuffle(runs)
    items, reports = _in_stream_order(pa.Table.from_batches(runs))
    positions = items.column("pos").to_numpy()
    assert (np.diff(positions) > 0).all() and len(positions) > 200
    assert sorted(r["part"] for r in reports) == [0, 1, 2]
    _check_complete(reports, 3, 0)
    with pytest.raises(CheckpointError, match="parts"):
        _check_complete(reports[:2], 3, 0)
    gap = [dict(r, first=r["first"] + 1) if r["part"] == 2 else r for r in reports]
    with pytest.raises(CheckpointError, match="starts at line"):
        _check_complete(gap, 3, 0)


def test_rows_after_the_last_report_are_refused_not_dropped():
    runs = _located(random_workload(seed=3, n=60))
    table = pa.Table.from_batches(runs)
    with pytest.raises(CheckpointError, match="after the last parse report"):
        _in_stream_order(table.slice(0, table.num_rows - 1))


def test_rejections_get_their_own_input_line_from_the_staged_parts(tmp_path):
    lines = [f'{{"type": "unsubscribe", "id": "u{i}"}}' for i in range(10)]
    checkpoint = Checkpoint(tmp_path / "ck")
    checkpoint.source.mkdir(parents=True)
    stage_parts([line.encode() for line in lines], 0, 3, checkpoint.source)
    items, _ = _in_stream_order(pa.Table.from_batches(_located(lines)))
    decisions = Decisions(rejected=[(i, "unknown_id", "no") for i in (0, 4, 9)])
    letters = _rejected_letters(checkpoint, 0, items, decisions)
    assert [d.line for d in letters] == [lines[0], lines[4], lines[9]]


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
