"""The package layout: every import name under ``skpub``, layers kept by import-linter."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_layer_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout and "3 kept" in done.stdout


def test_only_skpub_is_importable_outside_the_repository(tmp_path):
    code = (
        "import importlib.util, skpub.router.agrid, skpub.evaluators.gi2, skpub.sims.geonames, skpub.app.cli\n"
        "import skpub.balancer.policy\n"
        "names = ('router', 'evaluators', 'sims', 'balancer', 'kernel', 'app')\n"
        "print([n for n in names if importlib.util.find_spec(n)])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_wheel_installs_only_the_skpub_package(tmp_path):
    source = tmp_path / "source"
    keep = ("pyproject.toml", "README.md", "skpub", "router", "evaluators", "sims", "balancer")
    shutil.copytree(
        ROOT, source, symlinks=True, ignore=lambda d, names: [n for n in names if d == str(ROOT) and n not in keep]
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("skpub-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert all(t == "skpub" or t.endswith(".dist-info") for t in tops), tops
    assert "skpub/router/agrid.py" in names and "skpub/evaluators/gi2.py" in names
    assert "skpub/balancer/policy.py" in names
    assert "skpub/kernel/records.py" in names and "skpub/app/engines/spark.py" in names
