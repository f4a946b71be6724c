"""Benchmark: this tree against another commit's, on the same stream, through the ``skpub`` command.

Issue 43's default-workload target is a ratio to the commit the issue starts
from, measured in one run. This runs ``skpub run`` from this tree and from
``--base`` (a checkout of the other commit, e.g. ``git worktree add
/tmp/base cdbefbf``; its code is put first on ``PYTHONPATH``, for Spark's
workers too) on the GeoNames default workload (range, top-k and kNN
subscriptions, a count window; ``skpub workload geonames`` with its
defaults and ``--live``), on each ``--engines`` engine, alternating the
trees ``--repeat`` times, and prints objects/s after the first micro-batch
(the median of the repeats) and the ratio, and checks that both trees wrote
the same deliveries.

Run::

    git worktree add /tmp/base cdbefbf
    .venv/bin/python -m benchmarks.versus --base /tmp/base [--live 10000] [--engines local spark] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from skpub.kernel.parts import read_stream

_STEADY = re.compile(r"; ([\d,]+)/s after the first batch\)")


def run(tree: Path | None, args: list[str]) -> str:
    """Run ``python -m skpub.app.cli ARGS`` with ``tree`` first on the path (None: this tree); return stdout."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-m", "skpub.app.cli", *args], capture_output=True, text=True, env=env, cwd=tree or None
    )
    if proc.returncode != 0:
        raise RuntimeError(f"skpub {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def matches(out: Path) -> list[tuple]:
    """Return the run's deliveries as sorted tuples (range matches and ranked events alike)."""
    return sorted(tuple(sorted(d.items())) for d in read_stream(out, "deliveries"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="a checkout of the commit to compare with")
    parser.add_argument("--live", type=int, default=10_000)
    parser.add_argument("--engines", nargs="+", default=["local", "spark"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=100_000)
    args = parser.parse_args()
    base = args.base.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run(None, ["workload", "geonames", "--output", str(work / "w"), "--live", str(args.live)])
        names = ("stream.jsonl", "vocabulary.json", "deployment.json")
        stream, vocabulary, config = (work / "w" / name for name in names)
        print(f"GeoNames default workload, {args.live:,} live, batches of {args.batch_size:,}; objects/s after the"
              f" first batch, median of {args.repeat}")  # fmt: skip
        for engine in args.engines:
            rates: dict[str, list[float]] = {"this": [], "base": []}
            outputs = {}
            for attempt in range(args.repeat):
                for name in ("this", "base") if attempt % 2 == 0 else ("base", "this"):
                    out = work / f"out-{engine}-{name}"
                    text = run(None if name == "this" else base, [
                        "run", "--engine", engine, "--input", str(stream), "--vocabulary", str(vocabulary),
                        "--config", str(config), "--output", str(out), "--batch-size", str(args.batch_size),
                        "--overwrite",
                    ])  # fmt: skip
                    rates[name].append(float(_STEADY.search(text).group(1).replace(",", "")))
                    outputs[name] = out
            this, other = statistics.median(rates["this"]), statistics.median(rates["base"])
            same = matches(outputs["this"]) == matches(outputs["base"])
            print(f"  {engine:>5}: this {this:9,.0f}/s  base {other:9,.0f}/s  {this / other:5.2f}x"
                  f"  same deliveries: {'yes' if same else 'NO'}")  # fmt: skip


if __name__ == "__main__":
    main()
