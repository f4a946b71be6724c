"""The source's planning of micro-batches as byte ranges: the same records as reading the input line by line."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.kernel import slices
from skpub.kernel.inputs import BOM, batches, iter_lines
from skpub.kernel.slices import Slice, Span, cut, file_sizes, slice_lines, split
from tests.profiles import examples

PIECES = st.sampled_from([b"a", b"{}", b"\r", b"\n", b"\r\n", BOM, b"\xff", b" x "])
FILE = st.lists(PIECES, max_size=25).map(b"".join)


def _plan(files, sizes, batch_size, max_bytes, parts):
    """Every micro-batch of the input as its slices, as the source plans them."""
    start, batches = (0, 0), []
    while (end := cut(files, sizes, start, batch_size, max_bytes)) != start:
        batches.append(split(files, sizes, start, end, parts))
        start = end
    return batches


@examples(3)
@given(
    contents=st.lists(FILE, min_size=1, max_size=4),
    batch_size=st.integers(1, 7),
    max_bytes=st.integers(1, 40),
    parts=st.integers(1, 4),
    block=st.sampled_from([1, 2, 3, 1 << 20]),
)
def test_slices_give_every_record_once_in_order(tmp_path_factory, contents, batch_size, max_bytes, parts, block):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slices, "BLOCK", block)
        _check_plan(tmp_path_factory, contents, batch_size, max_bytes, parts)


def _check_plan(tmp_path_factory, contents, batch_size, max_bytes, parts):
    directory = tmp_path_factory.mktemp("input")
    files = []
    for i, content in enumerate(contents):
        path = directory / f"part-{i}.jsonl"
        path.write_bytes(content)
        files.append(path)
    sizes = file_sizes(files)
    got = []
    for batch in _plan(files, sizes, batch_size, max_bytes, parts):
        assert [s.part for s in batch] == list(range(parts))
        records = 0
        for piece in batch:
            assert piece.first == records  # the slices tile the batch
            assert Slice.from_json(piece.to_json()) == piece
            lines = slice_lines(files, piece)
            records += len(lines)
            got += lines
        assert 1 <= records <= batch_size
    assert got == list(iter_lines(directory))


def test_a_batch_stops_at_the_record_that_reaches_the_byte_bound(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"aaaa\nbb\ncccccc\nd")
    sizes = file_sizes([path])
    assert cut([path], sizes, (0, 0), 10, 6) == (0, 8)  # "aaaa\n" is 5 bytes; "bb\n" reaches 6
    assert cut([path], sizes, (0, 8), 10, 1) == (0, 15)
    assert cut([path], sizes, (0, 15), 10, 1) == (1, 0)  # a last record without newline, then the end
    assert cut([path], sizes, (1, 0), 10, 1) == (1, 0)


def test_a_changed_input_is_an_error_not_other_records(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a\nb\n")
    piece = Slice(0, 0, 2, (Span(0, 0, 4),), (1, 0))
    assert slice_lines([path], piece) == [b"a", b"b"]
    path.write_bytes(b"a\n")
    with pytest.raises(ValueError, match="shorter"):
        slice_lines([path], piece)
    path.write_bytes(b"abc\n")
    with pytest.raises(ValueError, match="planned"):
        slice_lines([path], piece)
    with pytest.raises(ValueError, match="not a slice"):
        Slice.from_json(b'{"part": 0}')


def test_files_are_never_read_whole(tmp_path, monkeypatch):
    """Planning reads block by block: a batch of 2 records from a large file touches about a block."""
    monkeypatch.setattr(slices, "BLOCK", 64)
    path = Path(tmp_path / "in.jsonl")
    path.write_bytes(b"x" * 10 + b"\n" + b"y" * 10 + b"\n" + b"z" * 100_000 + b"\n")
    reads = []
    real_open = open

    def counting_open(*args, **kwargs):
        fh = real_open(*args, **kwargs)
        real_read = fh.read
        fh.read = lambda n=-1: reads.append(n) or real_read(n)  # noqa: E731 - records every read size
        return fh

    monkeypatch.setattr("builtins.open", counting_open)
    assert cut([path], file_sizes([path]), (0, 0), 2, 1 << 30) == (0, 22)
    assert all(0 < n <= 64 for n in reads) and sum(reads) <= 128


@examples(3)
@given(
    lines=st.lists(st.lists(st.sampled_from([b"a", b"{}", b" x ", b"\xff"]), max_size=6).map(b"".join), max_size=30),
    batch_size=st.integers(1, 7),
    max_bytes=st.integers(1, 40),
)
def test_the_embedded_engine_cuts_batches_where_the_spark_source_does(tmp_path_factory, lines, batch_size, max_bytes):
    """On lines ended by a newline alone, the embedded engine's batches end where the Spark source's do for the
    same budget, by lines and by bytes (a line and its newline), and a batch of long lines stays within its bytes.
    Fails if the local engine ignores the byte budget or counts it otherwise."""
    path = tmp_path_factory.mktemp("input") / "in.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    sizes = file_sizes([path])
    spark, start = [], (0, 0)
    while (end := cut([path], sizes, start, batch_size, max_bytes)) != start:
        spark.append(sum(len(piece) for piece in (slice_lines([path], p) for p in split([path], sizes, start, end, 1))))
        start = end
    local = [len(batch) for batch in batches(iter(lines), batch_size, max_bytes)]
    assert local == spark
    assert [line for batch in batches(iter(lines), batch_size, max_bytes) for line in batch] == lines


@pytest.mark.parametrize(
    ("content", "records"),
    [
        (BOM, []),
        (BOM + b"\n", [b""]),
        (BOM + b"{}", [b"{}"]),
        (b"", []),
        (b"{}\r", [b"{}\r"]),
        (b"a\r\n\n", [b"a", b""]),
    ],  # fmt: skip
)
def test_a_file_of_a_byte_order_mark_alone_holds_no_record(tmp_path, content, records):
    """The mark is skipped and what is left is an empty file: no record, not one empty line (a malformed_json dead
    letter before), on the local engine's reader, the Spark source's plan and a request body alike; a last \r with
    no newline after it is data in all three (a request body dropped it)."""
    from skpub.app.api import split_lines

    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    assert list(iter_lines(path)) == records == split_lines(content)
    sizes = file_sizes([path])
    got = [line for batch in _plan([path], sizes, 5, 100, 2) for piece in batch for line in slice_lines([path], piece)]
    assert got == records
