"""The report of ``skpub simulate``: one self-contained HTML page, its plots and CSVs.

A report directory holds

- ``index.html``: per scenario its description, how its routing units
  counted, the recommended strategy and why
  (:func:`skpub.app.simulate.recommend`), the strategies side by side (the
  routing unit's share of the simulated time among the columns), the
  per-batch plots and the partitions on the map; the images are
  embedded (``data:`` URIs), so the page is one file that can be mailed;
- ``<scenario>-figures.png`` and ``<scenario>-maps.png``, the same images;
- ``strategies.csv`` (one row per run) and ``batches.csv`` (one row per
  micro-batch of every run): every figure the plots show;
- ``workload/<scenario>/``: the streams the runs read (reused by a later
  report of the same scenario);
- ``_skpub_report.json``, the marker that says skpub wrote the directory.

skpub writes a report only into an absent or empty directory, or one holding
a report (with ``overwrite``), and never removes a file it did not write.
Plots are drawn with matplotlib's object API (no pyplot state, no display).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, fields
from datetime import UTC, datetime
from pathlib import Path

from skpub.app.output import WORKLOAD_RE
from skpub.app.simulate import BatchFigures, RunResult, Scenario, figures_json, recommend
from skpub.kernel.errors import OutputError
from skpub.kernel.geometry import Rect
from skpub.kernel.storage import atomic_write_bytes, atomic_write_text, entries, own_files

MARKER = "_skpub_report.json"
WORKLOAD = "workload"
_IMAGE = r"[A-Za-z0-9_-]+-(?:figures|maps)\.png"
REPORT_RE = own_files(rf"index\.html|strategies\.csv|batches\.csv|{re.escape(MARKER)}|{_IMAGE}")
IMAGE_RE = re.compile(_IMAGE)

PLOTS = (
    ("parallel_seconds", "simulated parallel s per batch"),
    ("imbalance", "imbalance max / mean evaluator cost"),
    ("total_workload", "total workload (cost units, replication included)"),
    ("replication", "range subscription parts per range subscription"),
    ("shipping", "object rows forwarded per object"),
    ("operations", "balancer operations (cumulative)"),
)
"""The per-batch plots: a :class:`~skpub.app.simulate.BatchFigures` field and its axis title."""


def claim_report_dir(root: Path, overwrite: bool) -> Path:
    """Make ``root`` a report directory; return it.

    Raises
    ------
    OutputError
        If ``root`` is not a directory, holds anything skpub's report does
        not write (the message names up to five entries), or holds a report
        and ``overwrite`` is false.
    """
    if root.exists() and not root.is_dir():
        raise OutputError(f"{root} is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    foreign = []
    for entry, kind in entries(root):
        if entry.name == WORKLOAD and kind == "dir":
            for sub, sub_kind in entries(entry):
                if sub_kind != "dir":
                    foreign.append(f"{WORKLOAD}/{sub.name}")
                    continue
                foreign += [
                    f"{WORKLOAD}/{sub.name}/{f.name}"
                    for f, k in entries(sub)
                    if k != "file" or not WORKLOAD_RE.fullmatch(f.name)
                ]
        elif kind != "file" or not REPORT_RE.fullmatch(entry.name):
            foreign.append(entry.name)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise OutputError(f"{root} holds files skpub did not write ({shown}); choose an empty or new directory")
    if (root / MARKER).exists() and not overwrite:
        raise OutputError(f"{root} holds a report; pass --overwrite to replace it")
    for entry, kind in entries(root):
        if kind == "file" and IMAGE_RE.fullmatch(entry.name):
            entry.unlink()
    atomic_write_text(root / MARKER, json.dumps({"format": 1, "state": "running"}))
    return root


def _png(figure) -> bytes:  # noqa: ANN001 - a matplotlib Figure
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return buffer.getvalue()


def figures_png(scenario: Scenario, results: Sequence[RunResult]) -> bytes:
    """Draw the per-batch figures of every strategy (:data:`PLOTS`), one line per strategy; return PNG bytes."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 10.5), layout="constrained")
    axes = figure.subplots(3, 2).ravel()
    for ax, (name, title) in zip(axes, PLOTS, strict=True):
        for r in results:
            values = [getattr(b, name) for b in r.batches]
            if name == "operations":
                values = [sum(values[: i + 1]) for i in range(len(values))]
            style = "-" if r.strategy.balancer != "off" else "--"
            ax.plot([b.batch for b in r.batches], values, style, label=r.strategy.label, linewidth=1.3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("micro-batch")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncols=2)
    figure.suptitle(f"{scenario.name}: {scenario.title}")
    return _png(figure)


def maps_png(scenario: Scenario, results: Sequence[RunResult], space: Rect) -> bytes:
    """Draw the partitions in force at the scenario's map batches; one row per strategy with maps; PNG bytes.

    Each rectangle of the partitioning is filled in its evaluator's colour
    and labelled with its number when it is large enough to read; a
    text-partitioned one is hatched, in its primary's colour, and labelled
    with all its evaluators.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    palette = colormaps["tab20"]

    rows = [r for r in results if r.maps]
    columns = max((len(r.maps) for r in rows), default=1)
    figure = Figure(figsize=(4.2 * columns, 2.4 * max(1, len(rows))), layout="constrained")
    axes = figure.subplots(max(1, len(rows)), columns, squeeze=False)
    for row, r in zip(axes, rows, strict=False):
        for ax, (batch, part) in zip(row, sorted(r.maps.items()), strict=False):
            cw, ch = space.width / part.size, space.height / part.size
            cells = zip(part.boxes.tolist(), part.owners.tolist(), part.texts, strict=True)
            for (x0, y0, x1, y1), owner, text in cells:
                left, bottom = space.xmin + x0 * cw, space.ymin + y0 * ch
                width, height = (x1 - x0 + 1) * cw, (y1 - y0 + 1) * ch
                ax.add_patch(Rectangle((left, bottom), width, height, facecolor=palette(owner % 20), alpha=0.75,
                                       edgecolor="white" if text is None else "black", linewidth=0.4,
                                       hatch=None if text is None else "////"))  # fmt: skip
                if width > space.width / 25 and height > space.height / 25:
                    label = str(owner) if text is None else "t:" + ",".join(map(str, sorted(text.evaluators)))
                    ax.text(left + width / 2, bottom + height / 2, label, ha="center", va="center", fontsize=7)
            ax.set_xlim(space.xmin, space.xmax)
            ax.set_ylim(space.ymin, space.ymax)
            ax.set_aspect("equal")
            ax.tick_params(labelsize=6)
            ax.set_title(f"{r.strategy.label}, batch {batch}", fontsize=8)
        for ax in row[len(r.maps) :]:
            ax.set_visible(False)
    figure.suptitle(f"{scenario.name}: who owns which cells (hatched: partitioned by text)")
    return _png(figure)


def _csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def _routing_note(scenario: Scenario) -> str:
    """Say how the scenario's routing units count in the simulated time."""
    units = scenario.routing_units
    spread = "one routing unit parses" if units == 1 else f"{units} routing units share the parse"
    return (
        f"Simulated with {spread} (<code>--routing-units</code>); the sequencer is serial. The routing unit "
        "share is its part of the simulated parallel seconds (parse, sequencer, balancing decision): near 100%, "
        "more evaluators or a better balance buy little."
    )


def _table(results: Sequence[RunResult], pick: RunResult) -> str:
    head = ("router", "balancer", "evaluators", "objects / simulated s", "simulated parallel s",
            "routing unit share", "total workload", "imbalance", "replication", "shipping", "operations",
            "parts moved", "wall s")  # fmt: skip
    ordered = sorted(results, key=lambda r: (r.strategy.evaluators, -r.throughput))
    rows = []
    for r in ordered:
        cells = (r.strategy.router, r.strategy.balancer, r.strategy.evaluators, f"{r.throughput:,.0f}",
                 f"{r.parallel_seconds:.2f}", f"{r.routing_unit_share:.0%}", f"{r.total_workload:,}",
                 f"{r.imbalance:.2f}", f"{r.replication:.2f}",
                 f"{r.shipping:.2f}", r.operations, r.parts_moved, f"{r.wall_seconds:.1f}")  # fmt: skip
        mark = ' class="pick"' if r is pick else ""
        rows.append(f"<tr{mark}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}tr.pick td{background:#e6f4e6;font-weight:600}img{max-width:100%;display:block;margin:1em 0}
.pick-note{background:#e6f4e6;padding:.6em 1em;border-left:4px solid #3a3}code{background:#f3f3f3;padding:0 3px}"""

_IMAGES_LOADED = """window.addEventListener('load', () => {
  const images = Array.from(document.images);
  const ok = images.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.imagesLoaded = ok + '/' + images.length;
});"""
"""Marks on ``<body>`` how many images decoded, for the report's own test in headless Chromium."""


def write_report(root: Path, outcome: Sequence[tuple[Scenario, list[RunResult]]], command: str, space: Rect) -> Path:
    """Write the report of :func:`skpub.app.simulate.simulate`'s ``outcome`` into ``root`` (claimed); return the page.

    Raises
    ------
    OSError
        If a file cannot be written.
    """
    sections, strategy_rows, batch_rows = [], [], []
    batch_fields = [f.name for f in fields(BatchFigures)]
    for scenario, results in outcome:
        pick = recommend(results)
        for r in results:
            strategy_rows.append({**figures_json(r), "recommended": r is pick.result})
            for b in r.batches:
                batch_rows.append({"scenario": scenario.name, **asdict(r.strategy),
                                   **{k: getattr(b, k) for k in batch_fields}})  # fmt: skip
        images = []
        for kind, data in (("figures", figures_png(scenario, results)), ("maps", maps_png(scenario, results, space))):
            name = f"{scenario.name}-{kind}.png"
            atomic_write_bytes(root / name, data)
            encoded = base64.b64encode(data).decode("ascii")
            images.append(f'<img alt="{html.escape(scenario.name)} {kind}" src="data:image/png;base64,{encoded}">')
        sections.append(
            f'<section id="{html.escape(scenario.name)}"><h2>{html.escape(scenario.name)}: '
            f"{html.escape(scenario.title)}</h2><p>{html.escape(scenario.description)}</p>"
            f"<p>{_routing_note(scenario)}</p>"
            f'<p class="pick-note">Recommended: {html.escape(pick.reason)}</p>'
            f"{_table(results, pick.result)}{''.join(images)}</section>"
        )
    atomic_write_text(root / "strategies.csv", _csv(strategy_rows))
    atomic_write_text(root / "batches.csv", _csv(batch_rows))
    created = datetime.now(UTC).isoformat(timespec="seconds")
    contents = "".join(
        f'<li><a href="#{html.escape(s.name)}">{html.escape(s.name)}</a>: {html.escape(s.title)}</li>'
        for s, _ in outcome
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>skpub simulate</title>'
        f"<style>{_STYLE}</style></head><body><h1>skpub simulate</h1>"
        f"<p>Made {created} by <code>{html.escape(command)}</code>. Simulated parallel seconds are thread CPU: "
        'routing, the slowest evaluator and the balancer per micro-batch (docs/DESIGN.md, "Measuring load '
        "honestly\"); cost units are the candidate subscriptions each object meets (Tornado's Eq. 1) plus "
        "the deployment's object_cost per object. Every figure is in "
        '<a href="strategies.csv">strategies.csv</a> and <a href="batches.csv">batches.csv</a>.</p>'
        f"<ul>{contents}</ul>{''.join(sections)}<script>{_IMAGES_LOADED}</script></body></html>"
    )
    page_path = root / "index.html"
    atomic_write_text(page_path, page)
    atomic_write_text(
        root / MARKER,
        json.dumps({"format": 1, "state": "complete", "created": created, "scenarios": [s.name for s, _ in outcome]}),
    )
    return page_path
