"""Benchmark (e): top-k and kNN subscriptions on GeoNames with a count window.

Workloads are ``skpub workload geonames`` streams whose subscriptions are
half topk, half knn (Skype section 8, DkM-SKS and CkQST set-ups: k uniform in
1..``max_k``, alpha uniform in [0, 1], keywords or tf-idf weights, ``any`` or
``all``, from the window or from registration), ``--live`` of them live,
over a count window of ``--window`` objects. Every run goes through the
``skpub`` command as a user runs it; the tables are:

1. throughput: objects/s (overall, and after the first micro-batch, which
   registers the live subscriptions) of the local engine and of Spark on
   each ``--spark`` master, per live count, k, subscription churn
   (``inserts``: new subscriptions per object, each living ``live``
   insertions; PS2Stream's set-up, 0 is Skype's static set) and number of
   evaluators (every topk/knn subscription is held by each of them);
2. buffers: re-evaluations per expired object, candidates they scored and
   their CPU per expired object, evaluator CPU, for the three buffer policies (``cskyband``, ``kmax``,
   ``topk``) on the same stream, and kmax / cSkyband (the issue's target:
   at least 4x fewer re-evaluations). The stream (``--buffers``) is the
   regime the policies differ in: a static set of subscriptions on frequent
   keywords (so buffers hold many candidates) and small micro-batches (a
   re-evaluation is decided at every mark, so large batches hide expiries
   behind the arrivals of the same batch);
3. placement: evaluators per subscription and objects shipped per object
   (from the routed rows), and evaluator balance (max / mean cost and CPU)
   under the A-Grid and the uniform router.

Run::

    .venv/bin/python -m benchmarks.ranked [--live 20000] [--max-k 20] [--inserts 0.1 0.02] \\
        [--evaluators 4 2] [--window 100000] [--spark 'local[2]'] [--work bench-out/ranked]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from itertools import islice, product
from pathlib import Path

import numpy as np

from benchmarks.baselines import _skpub
from skpub.kernel.config import SKYBANDS, load_deployment
from skpub.kernel.inputs import batches, iter_lines
from skpub.kernel.parts import read_stream
from skpub.kernel.text import load_vocabulary
from skpub.kernel.wire import OBJECT, SUBSCRIBE
from skpub.router.dispatch import Router
from skpub.router.epoch import RoutingEpoch
from skpub.router.initial import initial_table
from skpub.sims.geonames import WorkloadSpec, write_workload

_RATES = re.compile(r"objects\s+\d+ \(([\d,]+) objects/s .*?; ([\d,]+)/s after the first batch\)")
_RANKED = re.compile(
    r"top-k/kNN\s+(\d+) re-evaluations \((\d+) candidates scored, ([\d.]+) s CPU\) · (\d+) buffer fills"
    r" · (\d+) unproven"
)
_COST = re.compile(r"evaluator cost\s+max \d+ / mean [\d.]+ = ([\d.]+)")
_CPU = re.compile(r"evaluator cpu\s+max ([\d.]+) s / mean ([\d.]+) s = ([\d.]+)")
_OBJECTS = re.compile(r"objects\s+(\d+) ")


def make_workload(
    root: Path, live: int, max_k: int, inserts: float, window: int, percentile: float = 99.0, objects: int | None = None
) -> Path:
    """Write (or reuse) a GeoNames workload of ``live`` topk+knn subscriptions; return its directory."""
    directory = root / f"workload-{live}-k{max_k}-i{inserts}-w{window}-p{percentile}-o{objects}"
    spec = WorkloadSpec(
        live=live, topk_fraction=0.5, knn_fraction=0.5, max_k=max_k, inserts_per_object=inserts, window=window,
        keyword_percentile=percentile, objects=objects,
    )  # fmt: skip
    write_workload(spec, directory)
    return directory


def run(directory: Path, work: Path, *args: str, config: dict | None = None) -> dict:
    """Run ``skpub run`` on a workload directory; return the figures its summary reports."""
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        deployment = json.loads((directory / "deployment.json").read_text())
        deployment.update(config or {})
        (Path(tmp) / "deployment.json").write_text(json.dumps(deployment))
        text = _skpub(
            "run", *args, "--input", str(directory / "stream.jsonl"),
            "--vocabulary", str(directory / "vocabulary.json"),
            "--config", str(Path(tmp) / "deployment.json"), "--output", str(Path(tmp) / "out"), "--quiet",
        )  # fmt: skip
        events = sum(1 for d in read_stream(Path(tmp) / "out", "deliveries") if d["event"] != "match")
    overall, steady = (float(v.replace(",", "")) for v in _RATES.search(text).groups())
    ranked = _RANKED.search(text).groups()
    reevaluations, scored, fills, unproven = (int(ranked[i]) for i in (0, 1, 3, 4))
    cpu_max, cpu_mean, cpu_ratio = map(float, _CPU.search(text).groups())
    return {
        "overall": overall,
        "steady": steady,
        "reevaluations": reevaluations,
        "reevaluated": scored,
        "reevaluation_cpu_seconds": float(ranked[2]),
        "fills": fills,
        "unproven": unproven,
        "cost_ratio": float(_COST.search(text).group(1)),
        "cpu_ratio": cpu_ratio,
        "evaluator_cpu": cpu_mean * deployment.get("evaluators", 4),
        "objects": int(_OBJECTS.search(text).group(1)),
        "events": events,
    }


def placement(directory: Path, router: str) -> tuple[float, float, float]:
    """Route the stream (no evaluation); return evaluators per range subscription, per ranked one, objects shipped.

    Objects shipped per object counts routed object rows per accepted object.
    """
    deployment = load_deployment(directory / "deployment.json").replace(
        router=router, vocabulary=str(directory / "vocabulary.json")
    )
    vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
    lines = iter_lines(directory / "stream.jsonl")
    sample = list(islice(iter_lines(directory / "stream.jsonl"), deployment.sample_size))
    epoch = RoutingEpoch(0, 0, initial_table(deployment, vocabulary, sample))
    router_ = Router(deployment, vocabulary)
    range_rows = range_subs = ranked_rows = ranked_subs = object_rows = objects = 0
    for batch_id, batch in enumerate(batches(lines, deployment.batch_size)):
        routed = router_.route_many(batch, batch_id, epoch)
        table = routed.table
        kinds = table.column("kind").to_numpy()
        ranked = np.asarray(table.column("spec").is_valid())
        subscribe = kinds == SUBSCRIBE
        positions = table.column("pos").to_numpy()
        range_rows += int((subscribe & ~ranked).sum())
        ranked_rows += int((subscribe & ranked).sum())
        range_subs += len(set(positions[subscribe & ~ranked].tolist()))
        ranked_subs += len(set(positions[subscribe & ranked].tolist()))
        object_rows += int((kinds == OBJECT).sum())
        objects += routed.objects
    return range_rows / max(range_subs, 1), ranked_rows / max(ranked_subs, 1), object_rows / max(objects, 1)


def main(argv: list[str] | None = None) -> None:
    """Run the three tables and print them (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, nargs="+", default=[20_000], help="live topk+knn subscriptions")
    parser.add_argument("--max-k", type=int, nargs="+", default=[20])
    parser.add_argument("--inserts", type=float, nargs="+", default=[0.1, 0.02], help="new subscriptions per object")
    parser.add_argument("--window", type=int, default=100_000)
    parser.add_argument("--evaluators", type=int, nargs="+", default=[4, 2], help="evaluator counts to run")
    parser.add_argument("--spark", nargs="*", default=["local[2]"], help="Spark masters to run")
    parser.add_argument("--work", default="bench-out/ranked")
    parser.add_argument(
        "--buffers", type=int, nargs=4, default=[1000, 60_000, 10_000, 500],
        metavar=("LIVE", "OBJECTS", "WINDOW", "BATCH"),
        help="the buffer-policy stream: static subscriptions on frequent keywords, small batches",
    )  # fmt: skip
    parser.add_argument("--parts", nargs="+", choices=("throughput", "buffers", "placement"),
                        default=["throughput", "buffers", "placement"])  # fmt: skip
    args = parser.parse_args(argv)
    root = Path(args.work)
    throughput, buffers, balance = [], [], []
    for live, max_k, inserts, evaluators in product(
        args.live if "throughput" in args.parts else [], args.max_k, args.inserts, args.evaluators
    ):
        name = f"live {live:,}, k 1-{max_k}, inserts {inserts}, {evaluators} evaluators"
        directory = make_workload(root, live, max_k, inserts, args.window)
        print(f"[{name}] local", file=sys.stderr, flush=True)
        flags = ("--evaluators", str(evaluators))
        local = run(directory, root, "--engine", "local", *flags)
        row = f"| {live:,} | 1-{max_k} | {inserts} | {evaluators} | {local['objects']:,} | {local['events']:,} "
        row += f"| {local['overall']:,.0f} | {local['steady']:,.0f} "
        for master in args.spark:
            print(f"[{name}] spark {master}", file=sys.stderr, flush=True)
            spark = run(directory, root, "--engine", "spark", "--master", master, *flags)
            row += f"| {spark['overall']:,.0f} | {spark['steady']:,.0f} "
            if spark["events"] != local["events"]:
                row += "(events differ!) "
        throughput.append(row + f"| {local['unproven']} |")
    live, objects, window, batch = args.buffers
    reevaluations, expired = {}, 0
    buffer_stream = None
    if "buffers" in args.parts:
        buffer_stream = make_workload(root, live, args.max_k[0], 0.0, window, percentile=100.0, objects=objects)
    for policy in SKYBANDS if buffer_stream is not None else []:
        print(f"[buffers] {policy}", file=sys.stderr, flush=True)
        r = run(buffer_stream, root, "--engine", "local", config={"skyband": policy, "batch_size": batch})
        expired = max(r["objects"] - window, 1)
        reevaluations[policy] = r["reevaluations"]
        per_expired = (
            f"{r['reevaluations'] / expired:.3f} | {r['reevaluated'] / expired:.1f}"
            f" | {r['reevaluation_cpu_seconds'] / expired * 1e6:.2f}"
        )
        buffers.append(
            f"| {policy} | {r['reevaluations']:,} | {per_expired} "
            f"| {r['fills']:,} | {r['evaluator_cpu']:.1f} | {r['steady']:,.0f} | {r['events']:,} |"
        )
    directory = None
    if "placement" in args.parts:
        directory = make_workload(root, args.live[0], args.max_k[0], args.inserts[-1], args.window)
    for router in ("agrid", "uniform") if directory is not None else []:
        print(f"[placement] {router}", file=sys.stderr, flush=True)
        per_range, per_ranked, shipped = placement(directory, router)
        r = run(directory, root, "--engine", "local", "--router", router)
        balance.append(
            f"| {router} | {per_range:.2f} | {per_ranked:.2f} | {shipped:.2f} | {r['cost_ratio']:.2f} "
            f"| {r['cpu_ratio']:.2f} | {r['steady']:,.0f} |"
        )
    if throughput:
        masters = "".join(f" spark {m} | spark {m} after first |" for m in args.spark)
        print(
            "\n| live topk+knn | k | inserts/object | evaluators | objects | events | local | local after first |"
            f"{masters} unproven |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(args.spark) + "---:|")
        print("\n".join(throughput))
    if buffers:
        ratio = reevaluations.get("kmax", 0) / max(reevaluations.get("cskyband", 0), 1)
        topk_ratio = reevaluations.get("topk", 0) / max(reevaluations.get("cskyband", 0), 1)
        print(f"\nBuffers ({buffer_stream.name}, micro-batches of {batch}; expired objects = objects - window"
              f" = {expired:,}):\n")  # fmt: skip
        print("| policy | re-evaluations | per expired object | candidates scored per expired object "
              "| re-evaluation CPU per expired object (us) | buffer fills | evaluator CPU s | objects/s after first "
              "| events |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(buffers))
        print(f"\nkmax / cSkyband re-evaluations: {ratio:.2f}x; first-k-only / cSkyband: {topk_ratio:.2f}x")
    if balance:
        print(f"\nPlacement and balance ({directory.name}):\n")
        print("| router | evaluators per range subscription | evaluators per topk/knn subscription "
              "| objects shipped per object | evaluator cost max/mean | evaluator CPU max/mean "
              "| objects/s after first |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        print("\n".join(balance))


if __name__ == "__main__":
    main()
