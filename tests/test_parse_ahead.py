"""The local engine's parse worker (skpub.app.engines.parse_ahead): same results, every batch parsed ahead, and a
worker that fails or dies costs speed, never a result."""

import os
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.app.engines import parse_ahead
from skpub.app.engines.local import run_local
from skpub.app.engines.parse_ahead import ParseAhead, pack_lines, unpack_lines, worth_a_worker
from skpub.app.summary import RunObserver, RunSummary
from skpub.kernel.config import BalancerConfig, Window
from skpub.kernel.parts import read_stream
from skpub.kernel.text import Vocabulary
from skpub.router.dispatch import Router
from skpub.router.epoch import RoutingEpoch
from skpub.router.initial import initial_table
from tests.profiles import examples
from tests.test_rebalancing import per_batch
from tests.workloads import assert_outputs_equal_oracle, deployment, random_workload, ranked_workload, write_lines


class Notes(RunObserver):
    def __init__(self, dep):
        super().__init__(RunSummary("local", dep.router, dep.evaluators), stream=None)
        self.notes = []

    def note(self, text):
        self.notes.append(text)


def run(tmp_path, name, lines, dep, ahead):
    source = tmp_path / "in.jsonl"
    write_lines(source, lines)
    observer = Notes(dep)
    run_local(source, tmp_path / name, dep, observer, parse_ahead=ahead)
    return tmp_path / name, observer.notes


def by_pos(letters):
    """Dead letters in position order: they carry no order (SEMANTICS 5), and parsed in runs they come run by run."""
    return sorted(letters, key=lambda d: d.pos)


def decisions_of(out):
    """The balancer log's lines without their measured seconds."""
    return [{k: v for k, v in line.items() if not k.endswith("seconds")} for line in read_stream(out, "balancer")]


def count_parses_here(monkeypatch, claims=None):
    """Record the batch ids the engine's own process parses whole (and in ``claims``, the runs it claims)."""
    here = []
    locate = Router.locate

    def counted(self, lines, batch_id, epoch, first=0):
        if first == 0:
            here.append(batch_id)
        elif claims is not None:
            claims.append((batch_id, first, len(lines)))
        return locate(self, lines, batch_id, epoch, first)

    monkeypatch.setattr(Router, "locate", counted)
    return here


@pytest.mark.parametrize("router", ["agrid", "kdt", "text", "uniform"])
def test_a_worker_parses_every_batch_after_the_first_under_chaos_and_changes_no_result(tmp_path, monkeypatch, router):
    """Under the chaos balancer (an epoch change every other batch) every batch from the second on is parsed by
    the worker under its own epoch, and the output is the oracle's and, batch by batch, that of a run without."""
    lines = random_workload(seed=41, n=400)
    dep = deployment(evaluators=3, router=router, batch_size=9).replace(balancer=BalancerConfig(mode="chaos", seed=2))
    here = count_parses_here(monkeypatch)
    ahead, notes = run(tmp_path, "ahead", lines, dep, ahead=True)
    assert here == [0] and notes == []
    assert_outputs_equal_oracle(ahead, lines, dep)
    inline, _ = run(tmp_path, "inline", lines, dep, ahead=False)
    assert here[1:] == list(range(-(-len(lines) // 9)))
    assert per_batch(ahead) == per_batch(inline)
    assert per_batch(ahead, "dead_letters") == per_batch(inline, "dead_letters")
    decisions = [decisions_of(out) for out in (ahead, inline)]
    assert decisions[0] == decisions[1]
    assert decisions[0], "the balancer must have changed epochs for this test to mean anything"


def test_ranked_results_with_a_window_are_the_oracles_when_parsed_ahead(tmp_path, monkeypatch):
    lines = ranked_workload(seed=8, n=300)
    dep = deployment(evaluators=4, batch_size=11).replace(
        window=Window("count", 40), balancer=BalancerConfig(mode="chaos", seed=5)
    )
    here = count_parses_here(monkeypatch)
    out, _ = run(tmp_path, "ahead", lines, dep, ahead=True)
    assert here == [0]
    assert_outputs_equal_oracle(out, lines, dep)


def test_a_worker_killed_mid_run_costs_no_result(tmp_path, monkeypatch):
    """The worker is killed after it took batch 3: that batch and the rest are parsed in the engine, with a note."""
    submit = ParseAhead.submit

    def submit_then_kill(self, batch_id, lines, epoch):
        submit(self, batch_id, lines, epoch)
        if batch_id == 3:
            os.kill(self._process.pid, signal.SIGKILL)

    monkeypatch.setattr(ParseAhead, "submit", submit_then_kill)
    here = count_parses_here(monkeypatch)
    lines = random_workload(seed=42, n=300)
    dep = deployment(evaluators=3, batch_size=25)
    out, notes = run(tmp_path, "killed", lines, dep, ahead=True)
    assert here == [0, *range(3, -(-len(lines) // 25))]
    assert len(notes) == 1 and "parse worker stopped" in notes[0] and "batch 3" in notes[0]
    assert_outputs_equal_oracle(out, lines, dep)


def test_a_worker_without_the_epoch_answers_an_error_and_is_stopped():
    """The epoch is sent with the first batch routed by it; a request naming another one is refused, the worker
    stopped, and nothing more is sent to it."""
    dep = deployment(evaluators=3, batch_size=50)
    lines = [line.encode() for line in random_workload(seed=43, n=100)]
    vocabulary = Vocabulary()
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, lines))
    with ParseAhead(dep, Router(dep, vocabulary).locate) as ahead:
        ahead.submit(1, lines, epoch)
        located = ahead.take(1)
        expected = Router(dep, vocabulary).locate(lines, 1, epoch)
        assert located.items.equals(expected.items)
        assert located.dead_letters == expected.dead_letters and located.epoch == 0 and located.cpu_seconds > 0
        ahead._epoch_sent = 7  # as if epoch 7 had been sent: the next request carries no epoch
        ahead.submit(2, lines, RoutingEpoch(7, 2, epoch.table))
        assert ahead.take(2) is None
        assert "no routing epoch 7" in ahead.failure and ahead._process is None
        ahead.submit(3, lines, epoch)
        assert ahead.take(3) is None


def test_an_answer_not_taken_is_dropped_before_the_next_request():
    dep = deployment(evaluators=2, batch_size=50)
    lines = [line.encode() for line in random_workload(seed=44, n=60)]
    epoch = RoutingEpoch(0, 0, initial_table(dep, Vocabulary(), lines))
    with ParseAhead(dep, Router(dep, Vocabulary()).locate) as ahead:
        ahead.submit(1, lines, epoch)
        ahead.submit(2, lines[:30], epoch)
        assert ahead.take(1) is None
        assert ahead.take(2).items.num_rows == len(Router(dep, Vocabulary()).locate(lines[:30], 2, epoch).items)
        assert ahead.failure is None


@examples(3)
@given(st.lists(st.binary(max_size=40), max_size=30))
def test_lines_unpack_as_packed_whatever_bytes_they_hold(lines):
    """Newlines inside a line (never in lines as read) and empty batches take the lengths; the rest newlines."""
    cut, blobs = pack_lines(lines)
    assert cut == ("newline" if lines and not any(b"\n" in line for line in lines) else "lengths")
    assert unpack_lines(cut, blobs) == lines


def test_unpack_lines_refuses_lengths_that_do_not_cut_the_bytes():
    import numpy as np

    with pytest.raises(ValueError, match="do not cut"):
        unpack_lines("lengths", [np.array([3, 4], np.int64).tobytes(), b"abcdef"])
    with pytest.raises(ValueError, match="do not cut"):
        unpack_lines("lengths", [np.array([-1, 7], np.int64).tobytes(), b"abcdef"])
    with pytest.raises(ValueError, match="unknown cut"):
        unpack_lines("commas", [b"a,b"])


def test_a_worker_is_worth_it_only_with_two_cpus_and_large_batches_unless_turned_off(monkeypatch):
    big = parse_ahead.MIN_BATCH_LINES
    monkeypatch.delenv(parse_ahead.PARSE_WORKER_ENV, raising=False)
    assert worth_a_worker(big, cpus=2)
    assert not worth_a_worker(big, cpus=1)
    assert not worth_a_worker(big - 1, cpus=8)
    monkeypatch.setenv(parse_ahead.PARSE_WORKER_ENV, "0")
    assert not worth_a_worker(big, cpus=8)


def test_the_engine_claims_the_lines_the_worker_has_not_reached_and_the_result_is_one_parse(monkeypatch):
    """Taken at once, a batch is split: the worker parses runs until the engine's claim, the engine the rest, and
    the joined result is exactly what one parse of the whole batch gives (rows, dead letters)."""
    monkeypatch.setattr(parse_ahead, "RUN_LINES", 16)
    monkeypatch.setattr(parse_ahead, "MIN_CLAIM_LINES", 8)
    dep = deployment(evaluators=3, batch_size=1000)
    lines = [line.encode() for line in random_workload(seed=45, n=600)]
    vocabulary = Vocabulary()
    router = Router(dep, vocabulary)
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, lines))
    whole = router.locate(lines, 5, epoch)
    assert whole.dead_letters, "the workload must hold invalid lines for this test to mean anything"
    claims = []
    count_parses_here(monkeypatch, claims)
    with ParseAhead(dep, router.locate) as ahead:
        for batch_id in (5, 6):  # the second with the worker started: it may have gone past the claim
            ahead.submit(batch_id, lines, epoch)
            located = ahead.take(batch_id)
            expected = whole if batch_id == 5 else router.locate(lines, 6, epoch)
            assert (located.batch_id, located.first, located.lines) == (batch_id, 0, len(lines))
            assert located.items.equals(expected.items)
            assert by_pos(located.dead_letters) == by_pos(expected.dead_letters)
        assert ahead.failure is None
    assert claims and claims[0][0] == 5 and claims[0][1] + claims[0][2] == len(lines)
    assert ahead.claimed == sum(n for _, _, n in claims)


def test_a_run_with_claims_in_most_batches_equals_the_oracle(tmp_path, monkeypatch):
    monkeypatch.setattr(parse_ahead, "RUN_LINES", 2)
    monkeypatch.setattr(parse_ahead, "MIN_CLAIM_LINES", 1)
    lines = random_workload(seed=46, n=500)
    dep = deployment(evaluators=3, batch_size=60).replace(balancer=BalancerConfig(mode="chaos", seed=4))
    claims = []
    here = count_parses_here(monkeypatch, claims)
    out, notes = run(tmp_path, "claims", lines, dep, ahead=True)
    assert here == [0] and notes == [] and claims
    assert_outputs_equal_oracle(out, lines, dep)


def test_since_keeps_the_rows_and_dead_letters_of_the_lines_from_there():
    from skpub.router.locate import LocatedItems

    dep = deployment(evaluators=3)
    lines = [line.encode() for line in random_workload(seed=47, n=300)]
    router = Router(dep, Vocabulary())
    epoch = RoutingEpoch(0, 0, initial_table(dep, Vocabulary(), lines))
    whole = router.locate(lines, 2, epoch)
    for cut in (0, 1, 77, 150, len(lines) - 1, len(lines)):
        tail = router.locate(lines[cut:], 2, epoch, cut)
        since = whole.since(cut)
        assert (since.first, since.lines) == (cut, len(lines) - cut)
        assert since.items.equals(tail.items) and since.dead_letters == tail.dead_letters
        joined = LocatedItems.concat([router.locate(lines[:cut], 2, epoch), tail])
        assert joined.items.equals(whole.items) and joined.dead_letters == whole.dead_letters
    with pytest.raises(ValueError, match="not in lines"):
        whole.since(len(lines) + 1)
    with pytest.raises(ValueError, match="not consecutive"):
        LocatedItems.concat([router.locate(lines[:10], 2, epoch), router.locate(lines[11:], 2, epoch, 11)])


def test_a_run_the_worker_began_before_the_claim_is_kept_once(monkeypatch):
    """The claim lands behind the worker: it stops past it, and the engine keeps its own rows only from there."""
    import time

    from skpub.router.locate import LocatedItems

    monkeypatch.setattr(parse_ahead, "RUN_LINES", 2)  # thousands of runs: the claim lands long before the end
    dep = deployment(evaluators=3, batch_size=10_000)
    lines = [line.encode() for line in random_workload(seed=48, n=6000)]
    vocabulary = Vocabulary()
    router = Router(dep, vocabulary)
    epoch = RoutingEpoch(0, 0, initial_table(dep, vocabulary, lines))

    def late_claim(self, pending):
        deadline = time.monotonic() + 60
        while self._words.words[0] < 200 and time.monotonic() < deadline:  # the worker is past line 200
            time.sleep(0.001)
        self._words.words[1] = 100
        return self._locate(pending.lines[100:], pending.batch_id, pending.epoch, 100)

    kept_from = []
    since = LocatedItems.since

    def recorded(self, first):
        kept_from.append((self.first, first))
        return since(self, first)

    monkeypatch.setattr(ParseAhead, "_claim", late_claim)
    monkeypatch.setattr(LocatedItems, "since", recorded)
    with ParseAhead(dep, router.locate) as ahead:
        ahead.submit(3, lines, epoch)
        located = ahead.take(3)
        assert ahead.failure is None
    expected = router.locate(lines, 3, epoch)
    assert located.items.equals(expected.items)
    assert by_pos(located.dead_letters) == by_pos(expected.dead_letters)
    assert len(kept_from) == 1 and kept_from[0][0] == 100 and 200 <= kept_from[0][1] < len(lines)


def submitted(seed):
    """A parse worker sent a batch of about 3,000 lines (a few hundred KB of answer): (ParseAhead, lines, epoch)."""
    dep = deployment(evaluators=3, batch_size=10_000)
    lines = [line.encode() for line in random_workload(seed=seed, n=3000)]
    epoch = RoutingEpoch(0, 0, initial_table(dep, Vocabulary(), lines))
    ahead = ParseAhead(dep, Router(dep, Vocabulary()).locate)
    ahead.submit(1, lines, epoch)
    return ahead, lines, epoch


def test_closing_with_a_batch_in_flight_lets_the_worker_end_by_itself():
    """An interrupt or an error closes the engine's side mid-batch: the worker sees it (its answer cannot be sent,
    its next read ends) and exits by itself, not killed after the grace period."""
    ahead, lines, epoch = submitted(seed=49)
    worker = ahead._process
    ahead.close()
    assert worker.returncode == 0
    assert ahead.take(1) is None


def test_a_read_that_fails_holding_the_socket_open_still_lets_the_worker_end_by_itself(monkeypatch):
    """A read that fails while something still holds the socket's descriptor (a traceback keeping a file object
    made from it, as an interrupt leaves): closing shuts the socket down, so the worker is not left blocked."""
    held = []

    def failing_read(sock):
        held.append(sock.makefile("rb"))
        raise OSError("the read failed")

    monkeypatch.setattr(parse_ahead, "recv_message", failing_read)
    ahead, lines, epoch = submitted(seed=50)
    worker = ahead._process
    assert ahead.take(1) is None and "the read failed" in ahead.failure
    assert worker.returncode == 0  # ended by itself, not killed after the grace period


def test_closing_with_the_answer_unread_lets_the_worker_end_by_itself():
    """The worker answered and the engine closes without reading it (an error in the batch being routed): the
    worker's next read is a reset, which ends it quietly; nothing is sent to a closed one."""
    import select

    ahead, lines, epoch = submitted(seed=51)
    worker = ahead._process
    poller = select.poll()
    poller.register(ahead._socket, select.POLLIN)
    assert poller.poll(60_000), "the worker must answer for this test to mean anything"
    ahead.close()
    assert worker.returncode == 0
    ahead.submit(2, lines, epoch)
    assert ahead._process is None and ahead.take(2) is None


def test_batches_are_read_ahead_only_while_the_worker_works():
    from skpub.app.engines.local import _with_next

    read = []

    def items():
        for i in range(6):
            read.append(i)
            yield [str(i).encode()]

    working = [True]
    seen = []
    for batch, upcoming in _with_next(items(), lambda: working[0]):
        seen.append((batch, upcoming, len(read)))
        if batch == [b"2"]:
            working[0] = False  # the worker failed while batch 2 was routed
    assert [n for *_, n in seen] == [2, 3, 4, 4, 5, 6]  # lines read when each batch is routed
    assert [u for _, u, _ in seen] == [[b"1"], [b"2"], [b"3"], None, None, None]


def test_a_batch_too_large_to_send_is_parsed_in_the_engine_and_the_worker_goes_on(tmp_path, monkeypatch):
    """Batches over MAX_SENT_BYTES stay in the engine (no failure, no note); the others still go to the worker."""
    lines = random_workload(seed=52, n=300)
    dep = deployment(evaluators=3, batch_size=25)
    sizes = [sum(len(line.encode()) + 1 for line in lines[i : i + 25]) for i in range(0, len(lines), 25)]
    monkeypatch.setattr(parse_ahead, "MAX_SENT_BYTES", sorted(sizes)[len(sizes) // 2])
    here = count_parses_here(monkeypatch)
    out, notes = run(tmp_path, "large", lines, dep, ahead=True)
    too_large = [b for b, size in enumerate(sizes) if size > parse_ahead.MAX_SENT_BYTES and b > 0]
    assert too_large and here == [0, *too_large] and notes == []
    assert_outputs_equal_oracle(out, lines, dep)
