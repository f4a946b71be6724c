"""Local-engine checkpoints: a pipeline restored after any batch continues exactly as the uninterrupted one."""

import pytest

from skpub.app.engines import local_checkpoint
from skpub.app.engines.local import LocalPipeline
from skpub.kernel.config import BalancerConfig, Window
from skpub.kernel.errors import CheckpointError
from skpub.kernel.inputs import batches
from skpub.kernel.text import Vocabulary
from tests.workloads import deployment, random_workload, ranked_workload


def capture(outputs):
    """A pipeline sink that records each batch's outputs in their order."""

    def sink(batch_id, deliveries, dead_letters, statistics, report, events, snapshots):  # noqa: ARG001
        letters = sorted((d.pos, d.line, d.reason) for d in dead_letters)
        outputs.append((batch_id, [part.rows() for part in deliveries], letters, events, snapshots))

    return sink


def run(pipeline, chunks, first, outputs):
    epochs = []
    for batch_id in range(first, len(chunks)):
        report = pipeline.step(batch_id, chunks[batch_id], capture(outputs))
        epochs.append(report.epoch)
    return epochs


@pytest.mark.parametrize("window", [Window(), Window("count", 40), Window("seconds", 20.0)], ids=str)
@pytest.mark.parametrize("mode", ["off", "chaos", "adaptive"])
def test_a_pipeline_restored_after_any_batch_continues_exactly(tmp_path, window, mode):
    lines = [line.encode() for line in ranked_workload(seed=5, n=260) + random_workload(seed=6, n=260)]
    dep = deployment(evaluators=3, batch_size=23).replace(window=window, balancer=BalancerConfig(mode=mode, seed=3))
    chunks = list(batches(iter(lines), dep.batch_size))
    vocabulary = Vocabulary()
    whole: list = []
    whole_epochs = run(LocalPipeline.new(tmp_path / "a", dep, vocabulary, lines[:200]), chunks, 0, whole)
    assert any(events for *_, events, _ in whole) and any(any(part) for _, part, *_ in whole)
    transfers = 0
    for cut in (0, 3, 7, len(chunks) - 2):
        pipeline, seen = LocalPipeline.new(tmp_path / "b", dep, vocabulary, lines[:200]), []
        run(pipeline, chunks[: cut + 1], 0, seen)
        in_transfer = pipeline.balancing is not None and pipeline.balancing.plan is not None
        path = local_checkpoint.save(pipeline, tmp_path / "ckpt", cut)
        restored, batch_id = local_checkpoint.load(path, tmp_path / "b", dep, vocabulary)
        assert batch_id == cut
        epochs = run(restored, chunks, cut + 1, seen)
        assert seen == whole, f"restored after batch {cut}"  # the same outputs in the same order
        assert epochs == whole_epochs[cut + 1 :]  # the balancer decides as it did (cost units, exact floats)
        transfers += in_transfer
    assert transfers >= (2 if mode == "chaos" else 0)  # restored with a rebalancing in flight too
    assert sorted(local_checkpoint.checkpoints(tmp_path / "ckpt")) == [7, len(chunks) - 2][-local_checkpoint.KEEP :]


def test_a_damaged_or_foreign_checkpoint_is_refused_not_run(tmp_path):
    dep = deployment(evaluators=2, batch_size=10)
    lines = [line.encode() for line in random_workload(seed=1, n=40)]
    pipeline = LocalPipeline.new(tmp_path, dep, Vocabulary(), lines)
    pipeline.step(0, lines[:10], capture([]))
    path = local_checkpoint.save(pipeline, tmp_path / "ckpt", 0)
    data = path.read_bytes()
    for damaged in (
        data[: len(data) // 2],
        b'{"format": 99}\n',
        b"\x80\x04pickle",
        data.replace(b'"format":1', b'"format":2'),
    ):
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError):
            local_checkpoint.load(path, tmp_path, dep, Vocabulary())
    (tmp_path / "ckpt" / "notes.skpub").write_text("mine")
    assert list(local_checkpoint.checkpoints(tmp_path / "ckpt")) == [0]


def test_a_save_removes_what_killed_saves_left_and_nothing_else(tmp_path, monkeypatch):
    """Even when the disk refuses the save itself (which those leftovers may have filled)."""
    dep = deployment(evaluators=2, batch_size=10)
    lines = [line.encode() for line in random_workload(seed=1, n=40)]
    pipeline = LocalPipeline.new(tmp_path, dep, Vocabulary(), lines)
    pipeline.step(0, lines[:10], capture([]))
    folder = tmp_path / "ckpt"
    local_checkpoint.save(pipeline, folder, 2)  # a real checkpoint of an earlier batch: never swept
    killed = [folder / ".checkpoint-00000002.skpub.k1ll_3d.tmp", folder / ".checkpoint-00000003.skpub.abc.tmp"]
    later = folder / ".checkpoint-00000004.skpub.x9.tmp"  # a newer batch's: not this save's to judge
    foreign = [folder / ".checkpoint-00000002.skpub.tmp", folder / "checkpoint-3.skpub.old.tmp", folder / "notes.tmp"]
    for path in [*killed, later, *foreign]:
        path.write_text("x")
    with monkeypatch.context() as patched:
        patched.setattr(local_checkpoint, "atomic_write_bytes", lambda *a: (_ for _ in ()).throw(OSError(28, "full")))
        with pytest.raises(OSError):
            local_checkpoint.save(pipeline, folder, 3)
    assert not any(p.exists() for p in killed) and list(local_checkpoint.checkpoints(folder)) == [2]
    local_checkpoint.save(pipeline, folder, 3)
    assert later.exists() and all(p.exists() for p in foreign)
    assert sorted(local_checkpoint.checkpoints(folder)) == [2, 3]
