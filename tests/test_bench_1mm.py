"""scripts/bench_1mm.py: the process-tree memory monitor of benchlib, and every stage once on a tiny
grid through the real commands."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_script

pytestmark = pytest.mark.scripts

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def benchlib():
    with load_script("benchlib") as module:
        yield module


def test_monitor_sees_the_command_and_its_children(benchlib):
    """400 MB in the command, 200 MB in a process it starts: both peaks are found, by role."""
    child = "import numpy as np, time; a = np.ones(25_000_000); time.sleep(0.5)"
    code = (f"import subprocess, sys, time, numpy as np; a = np.ones(50_000_000); "
            f"subprocess.run([sys.executable, '-c', {child!r}], check=True); time.sleep(0.3)")
    seconds, info = benchlib.run_monitored([sys.executable, "-c", code])
    assert seconds > 0.5
    by_role = {}
    for role, mb in info["peaks_mb"].values():
        by_role[role] = max(mb, by_role.get(role, 0.0))
    assert 380 < by_role["command"] < 600
    assert 190 < by_role["child"] < 380


def test_monitor_raises_with_the_output(benchlib):
    with pytest.raises(subprocess.CalledProcessError) as caught:
        benchlib.run_monitored([sys.executable, "-c", "print('said'); raise SystemExit(3)"])
    assert caught.value.returncode == 3 and "said" in caught.value.output


def test_every_stage_on_a_tiny_grid(tmp_path):
    out = tmp_path / "report.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "scripts/bench_1mm.py", "--quick", "--workdir",
                    str(tmp_path / "work"), "--out", str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, text=True, timeout=300)
    report = out.read_text()
    assert "SYNTHETIC" in report
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| ([^|]+?) \| (.*)\|$", report, re.M)}
    for stage in ("convert", "standardization", "bank", "train logreg + FG", "evaluate logreg",
                  "train mlp + FG", "evaluate mlp", "predict (test NIfTI files)",
                  "ReNA alone, fgscale", "ReNA alone, nilearn"):
        assert stage in rows, stage
        cells = [c.strip() for c in rows[stage].split("|")]
        assert float(cells[0]) > 0 and float(cells[1].replace(",", "")) > 0  # seconds, MB
        assert cells[3] == "ok"
    p = int(re.search(r"p = ([\d,]+) voxels", report).group(1).replace(",", ""))
    for library in ("fgscale", "nilearn"):  # both give exactly k = p // 10 clusters
        assert f"{p // 10:,} clusters" in rows[f"ReNA alone, {library}"]
    accuracy = float(re.search(r"test accuracy ([\d.]+)", rows["evaluate logreg"]).group(1))
    assert 0 <= accuracy <= 1
    assert "run_logreg/maps.nii.gz" in report and "run_mlp/maps.nii.gz" in report
    assert (tmp_path / "work" / "predictions.csv").is_file()
