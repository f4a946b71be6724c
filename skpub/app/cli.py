"""The ``skpub`` command line.

``skpub run`` runs a stream through an engine and writes the output layout of
SEMANTICS section 5; with no ``--input`` it generates and runs the GeoNames
default workload. ``skpub workload geonames`` writes a replayable workload.
``skpub serve`` runs the daemon; ``publish``, ``subscribe``, ``unsubscribe``,
``subscriptions``, ``follow`` and ``targets`` talk to a running one (:mod:`skpub.app.remote`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from skpub.app.metrics import Metrics
from skpub.app.output import WORKLOAD_DIR, check_output
from skpub.app.remote import VERBS, add_verbs, run_verb
from skpub.app.summary import RunObserver, RunSummary
from skpub.kernel.config import BALANCER_MODES, ROUTERS, Window, load_deployment
from skpub.kernel.errors import ConfigError, SkpubError
from skpub.kernel.inputs import input_size, skipped_entries
from skpub.sims import shipped_scenarios


def _workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=7, help="random seed of the workload (default 7)")
    parser.add_argument("--live", type=int, default=10_000, help="live subscriptions (default 10000)")
    parser.add_argument("--objects", type=int, default=None, help="objects to emit (default: all ~235k)")
    parser.add_argument(
        "--keyword-percentile",
        type=float,
        default=99.0,
        help="keywords come from terms below this frequency percentile (default 99)",
    )
    parser.add_argument("--topk-fraction", type=float, default=0.1, help="share of topk subscriptions (default 0.1)")
    parser.add_argument("--knn-fraction", type=float, default=0.1, help="share of knn subscriptions (default 0.1)")
    parser.add_argument(
        "--window", type=int, default=100_000, help="count window the workload runs with, 0 for none (default 100000)"
    )
    parser.add_argument(
        "--drift-scale",
        type=float,
        default=1.0,
        help="a drifting hot spot: the stream shrunk to this share of the space's sides (default 1: no drift)",
    )
    parser.add_argument(
        "--drift-phases", type=int, default=4, help="phases of the stream: places the hot spot visits (default 4)"
    )
    parser.add_argument(
        "--burst-regions",
        type=float,
        default=0.0,
        help="a keyword burst: this share of 10 x 10 regions takes frequent keywords, new ones each phase (default 0)",
    )
    parser.add_argument(
        "--shift-at",
        type=float,
        default=0.0,
        help="a shift: after this share of the objects the stream is condensed to --drift-scale and stays (default 0)",
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``skpub`` command."""
    parser = argparse.ArgumentParser(prog="skpub", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a stream through an engine")
    run.add_argument("--engine", choices=("spark", "local"), default="spark", help="default: spark")
    run.add_argument(
        "--input",
        help="JSON-lines file, directory of *.jsonl, or - for standard input (default: the GeoNames workload)",
    )
    run.add_argument("--output", default="out", help="output directory (default: out)")
    run.add_argument("--evaluators", type=int, help="number of evaluators (default 4)")
    run.add_argument("--router", choices=ROUTERS, help="routing table (default agrid)")
    run.add_argument("--config", help="deployment JSON file")
    run.add_argument("--batch-size", type=int, help="records per micro-batch (default 100000)")
    run.add_argument("--vocabulary", help="vocabulary JSON file {N, df}")
    run.add_argument(
        "--balancer",
        choices=BALANCER_MODES,
        help="rebalancing: adaptive, off or chaos (default the deployment's, adaptive)",
    )
    run.add_argument("--balancer-seed", type=int, help="seed of --balancer chaos (default 0)")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    run.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    run.add_argument("--checkpoint", help="Spark checkpoint directory (default OUTPUT/_checkpoint)")
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace skpub's own finished output (never files skpub did not write)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    _workload_args(run)

    serve = sub.add_parser("serve", help="run the routing daemon: HTTP API, durable ingest, the data plane")
    serve.add_argument("--data", required=True, help="data directory (created; reused on restart)")
    serve.add_argument(
        "--engine", choices=("local", "spark"), default="local", help="data plane engine (default local)"
    )
    serve.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    serve.add_argument(
        "--checkpoint-seconds", type=float, default=60.0,
        help="local engine: checkpoint the pipeline this often, seconds (default 60; a restart replays what follows)",
    )  # fmt: skip
    serve.add_argument(
        "--retention-bytes", type=int, default=1 << 30,
        help="keep about this many bytes of each output log and of the balancer's log (default 1 GiB); "
        "older offsets get 410",
    )  # fmt: skip
    serve.add_argument(
        "--segment-bytes", type=int, default=64 << 20,
        help="start a new segment file of a log past this many bytes (default 64 MiB; retention removes whole ones)",
    )  # fmt: skip
    serve.add_argument(
        "--compact-commits", type=int, default=10_000,
        help="compact the commit log after this many commits (default 10000; more with many live subscriptions)",
    )  # fmt: skip
    serve.add_argument(
        "--listen", default="127.0.0.1:8750",
        help="HOST:PORT to listen on (default 127.0.0.1:8750; port 0: a free one, named in the serving log line)",
    )  # fmt: skip
    serve.add_argument("--token-file", help="file holding the bearer token (default $SKPUB_TOKEN; none: no token)")
    serve.add_argument(
        "--targets", help='JSON file {"name": {"kind": "webhook", "url": ...}, ...}: delivery targets defined at start'
    )
    serve.add_argument(
        "--config", help="deployment JSON file (default: the one --data was made with, or the defaults; flags on top)"
    )
    serve.add_argument("--evaluators", type=int, help="number of evaluators (default 4)")
    serve.add_argument("--batch-size", type=int, help="most records per micro-batch")
    serve.add_argument("--vocabulary", help="vocabulary JSON file {N, df}")
    serve.add_argument("--balancer", choices=BALANCER_MODES, help="rebalancing: adaptive, off or chaos")

    sim = sub.add_parser(
        "simulate",
        help="compare routers, balancer modes and evaluator counts on workload-skew scenarios; write an HTML report",
    )
    sim.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO",
        help=f"shipped scenario names ({', '.join(shipped_scenarios())}) or scenario JSON files (default: all shipped)",
    )  # fmt: skip
    sim.add_argument("--output", default="simulation", help="report directory (default: simulation)")
    sim.add_argument("--overwrite", action="store_true", help="replace a report skpub wrote there before")
    sim.add_argument("--routers", nargs="+", choices=ROUTERS, help="routers to compare (default: the scenario's)")
    sim.add_argument("--balancers", nargs="+", choices=BALANCER_MODES, help="balancer modes (default: the scenario's)")
    sim.add_argument("--evaluators", nargs="+", type=int, help="evaluator counts (default: the scenario's)")
    sim.add_argument("--objects", type=int, help="objects per workload (default: the scenario's)")
    sim.add_argument(
        "--routing-units", type=int, help="routing units sharing the parse stage (default: the scenario's, 1)"
    )
    sim.add_argument(
        "--repeat", type=int, default=1, help="runs per strategy; each batch takes their median time (default 1)"
    )

    add_verbs(sub)

    workload = sub.add_parser("workload", help="write a replayable workload")
    wsub = workload.add_subparsers(dest="workload", required=True)
    geonames = wsub.add_parser("geonames", help="GeoNames places with sampled range, topk and knn subscriptions")
    geonames.add_argument("--output", required=True, help="directory for stream.jsonl and vocabulary.json")
    _workload_args(geonames)
    return parser


def _spec(args: argparse.Namespace):
    from skpub.sims.geonames import WorkloadSpec

    return WorkloadSpec(
        seed=args.seed, live=args.live, objects=args.objects, keyword_percentile=args.keyword_percentile,
        topk_fraction=args.topk_fraction, knn_fraction=args.knn_fraction, window=args.window,
        drift_scale=args.drift_scale, drift_phases=args.drift_phases, burst_regions=args.burst_regions,
        shift_at=args.shift_at,
    )  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    deployment = load_deployment(args.config).replace(
        evaluators=args.evaluators, router=args.router, batch_size=args.batch_size, vocabulary=args.vocabulary
    )
    if args.balancer is not None or args.balancer_seed is not None:
        balancer = dataclasses.replace(
            deployment.balancer,
            **{k: v for k, v in (("mode", args.balancer), ("seed", args.balancer_seed)) if v is not None},
        )
        deployment = deployment.replace(balancer=balancer)
    if args.engine == "spark":
        from skpub.app.engines.spark import require_java

        require_java()
    output = Path(args.output)
    check_output(output, args.overwrite)
    metrics = Metrics()
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port)
        print(f"[skpub] metrics on http://127.0.0.1:{args.metrics_port}/metrics", file=sys.stderr, flush=True)
    input_path = args.input
    if input_path is None:
        from skpub.sims.geonames import write_workload

        print(
            "[skpub] no --input: generating the GeoNames default workload (about 30 s the first time)",
            file=sys.stderr,
            flush=True,
        )
        spec = _spec(args)
        input_path, vocabulary = write_workload(spec, output / WORKLOAD_DIR)
        print(f"[skpub] workload: {input_path}", file=sys.stderr, flush=True)
        deployment = deployment.replace(vocabulary=deployment.vocabulary or str(vocabulary))
        if args.config is None:
            window = Window("count", spec.window) if spec.window else Window()
            deployment = deployment.replace(window=window)
    summary = RunSummary(args.engine, deployment.router, deployment.evaluators)
    summary.balancer_mode = deployment.balancer.mode
    summary.skipped_inputs = skipped_entries(input_path)
    summary.output = str(output)
    total = input_size(input_path)
    observer = RunObserver(summary, metrics, stream=None if args.quiet else sys.stderr, total_bytes=total)
    if summary.skipped_inputs:
        observer.note(f"input: skipping {len(summary.skipped_inputs)} entries that are not *.jsonl files")
    try:
        if args.engine == "local":
            from skpub.app.engines.local import run_local

            result = run_local(input_path, output, deployment, observer, overwrite=args.overwrite)
        else:
            from skpub.app.engines.spark import run_spark

            checkpoint = Path(args.checkpoint) if args.checkpoint else None
            result = run_spark(
                input_path, output, deployment, observer, master=args.master, checkpoint=checkpoint,
                overwrite=args.overwrite,
            )  # fmt: skip
    finally:
        observer.close()
    print(result.format())
    return 0


def _serve(args: argparse.Namespace) -> int:
    from skpub.app.bearer import load_token
    from skpub.app.daemon import Limits, recorded_deployment
    from skpub.app.serve import load_targets, serve

    recorded = recorded_deployment(args.data) if args.config is None else None  # a restart: flags apply to it
    deployment = (recorded or load_deployment(args.config)).replace(
        evaluators=args.evaluators, batch_size=args.batch_size, vocabulary=args.vocabulary
    )
    if args.balancer is not None:
        deployment = deployment.replace(balancer=dataclasses.replace(deployment.balancer, mode=args.balancer))
    if not 0 <= args.checkpoint_seconds < float("inf"):
        raise ConfigError("--checkpoint-seconds is a finite number of seconds, 0 or more")
    if args.retention_bytes < 1:
        raise ConfigError("--retention-bytes is a positive number of bytes")
    if args.segment_bytes < 1:
        raise ConfigError("--segment-bytes is a positive number of bytes")
    if args.compact_commits < 1:
        raise ConfigError("--compact-commits is a positive number of commits")
    limits = Limits(
        checkpoint_seconds=args.checkpoint_seconds,
        retention_bytes=args.retention_bytes,
        segment_bytes=args.segment_bytes,
        compact_commits=args.compact_commits,
    )
    targets = load_targets(args.targets) if args.targets else []
    token = load_token(args.token_file)
    return serve(args.data, deployment, args.listen, token, limits, args.engine, args.master, targets)


def _simulate(args: argparse.Namespace, argv: list[str]) -> int:
    from skpub.app.report import WORKLOAD, claim_report_dir, write_report
    from skpub.app.simulate import load_scenario, override, progress_display, recommend, simulate
    from skpub.sims.geonames import SPACE

    scenarios = [
        override(
            load_scenario(ref),
            routers=args.routers,
            balancers=args.balancers,
            evaluators=args.evaluators,
            objects=args.objects,
            routing_units=args.routing_units,
        )  # fmt: skip
        for ref in (args.scenarios or shipped_scenarios())
    ]
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise ConfigError(f"two scenarios share a name: {sorted(n for n in set(names) if names.count(n) > 1)}")
    if not 1 <= args.repeat <= 9:
        raise ConfigError("--repeat must be 1 to 9")
    root = claim_report_dir(Path(args.output), args.overwrite)
    runs = sum(len(s.strategies()) for s in scenarios)
    display, progress = progress_display(runs)
    display.note(f"simulate: {len(scenarios)} scenario(s), {runs} runs, report in {root}")
    try:
        outcome = simulate(scenarios, root / WORKLOAD, progress, args.repeat)
    finally:
        display.close()
    page = write_report(root, outcome, "skpub " + " ".join(argv), SPACE)
    for scenario, results in outcome:
        print(f"{scenario.name}: {recommend(results).reason}")
    print(f"report: {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``skpub`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "simulate":
            return _simulate(args, argv)
        if args.command in VERBS:
            return run_verb(args)
        from skpub.sims.geonames import write_workload

        stream, vocabulary = write_workload(_spec(args), args.output)
        print(f"wrote {stream} and {vocabulary}; run it with --config {Path(args.output) / 'deployment.json'}")
        return 0
    except SkpubError as exc:
        print(f"skpub: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"skpub: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("skpub: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
