"""Benchmark (a): range routing time, as in Tornado Figure 7.

Partitions come from the cost partitioning (Tornado 4.1) of GeoNames place
density on the fine grid; queries are rectangles centred on random GeoNames
places. For each partition count and query side it reports the mean time
per query of

- the A-Grid neighbor search (Algorithm 1),
- a fine-grid scan (the "traditional grid", O(m x n) cells per query),
- an R-tree over the partitions (the ``rtree`` package, libspatialindex),

and the uniform router (Uni-Space-Rout) on its own uniform partitions.
Then the A-Grid at 1024 partitions as the fine grid grows from 100^2 to 2000^2.

Run: python -m benchmarks.routing [--queries 2000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rtree import index as rtree_index

from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.router.agrid import AGrid
from skpub.router.partitioning import cost_partitioning
from skpub.router.uniform import UniformGrid
from skpub.sims.geonames import SPACE, load_places


def density(grid: FineGrid, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    cx, cy = grid.cells_of(xs, ys)
    costs = np.zeros((grid.size, grid.size))
    np.add.at(costs, (cy, cx), 1.0)
    return costs + 1e-3


def queries(rng, xs, ys, side: float, n: int) -> list[Rect]:
    idx = rng.integers(len(xs), size=n)
    w, h = side * SPACE.width / 2, side * SPACE.height / 2
    return [Rect(xs[i] - w, ys[i] - h, xs[i] + w, ys[i] + h) for i in idx]


def per_query_us(fn, boxes) -> float:
    start = time.perf_counter()
    for box in boxes:
        fn(box)
    return (time.perf_counter() - start) / len(boxes) * 1e6


def rtree_of(agrid: AGrid):
    def items():
        for p, (x0, y0, x1, y1) in enumerate(agrid.partitioning.boxes.tolist()):
            yield p, (x0, y0, x1, y1), None

    tree = rtree_index.Index(items())
    return lambda box: list(tree.intersection(box))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    places = load_places()
    xs = np.array([p.x for p in places])
    ys = np.array([p.y for p in places])
    grid = FineGrid(SPACE, 1000)
    costs = density(grid, xs, ys)

    print("## Range routing time per query (microseconds), fine grid 1000 x 1000\n")
    print(
        "| partitions | query side | A-Grid | grid scan | R-tree | uniform router | R-tree / A-Grid | scan / A-Grid |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in (16, 64, 256, 1024, 4096):
        agrid = AGrid(grid, cost_partitioning(costs, n))
        uniform = UniformGrid(grid, n)
        rtree = rtree_of(agrid)
        owner = agrid.partitioning.owner

        def scan(box, owner=owner):
            return np.unique(owner[box[1] : box[3] + 1, box[0] : box[2] + 1])

        for side in (0.01, 0.05, 0.1, 0.2):
            boxes = [grid.cell_box(r) for r in queries(rng, xs, ys, side, args.queries)]
            for box in boxes[:50]:
                assert set(agrid.route_cells(box)) == set(rtree(box)) == set(scan(box).tolist())
            t_agrid = per_query_us(agrid.route_cells, boxes)
            t_scan = per_query_us(scan, boxes)
            t_rtree = per_query_us(rtree, boxes)
            t_uniform = per_query_us(uniform.route_cells, boxes)
            print(
                f"| {n} | {side:.0%} | {t_agrid:.1f} | {t_scan:.1f} | {t_rtree:.1f} | {t_uniform:.1f} "
                f"| {t_rtree / t_agrid:.2f} | {t_scan / t_agrid:.2f} |"
            )

    print("\n## A-Grid at 1024 partitions as the fine grid grows (query side 5%)\n")
    print("| fine grid | A-Grid us/query | partitions visited / query | A-Grid us/partition | grid scan us/query |")
    print("|---:|---:|---:|---:|---:|")
    rects = queries(rng, xs, ys, 0.05, args.queries)
    for size in (100, 250, 500, 1000, 2000):
        g = FineGrid(SPACE, size)
        agrid = AGrid(g, cost_partitioning(density(g, xs, ys), 1024))
        boxes = [g.cell_box(r) for r in rects]
        owner = agrid.partitioning.owner
        visited = np.mean([len(agrid.route_cells(b)) for b in boxes])
        t_scan = per_query_us(lambda b, o=owner: np.unique(o[b[1] : b[3] + 1, b[0] : b[2] + 1]), boxes)
        t_agrid = per_query_us(agrid.route_cells, boxes)
        print(f"| {size} x {size} | {t_agrid:.1f} | {visited:.1f} | {t_agrid / visited:.3f} | {t_scan:.1f} |")


if __name__ == "__main__":
    main()
