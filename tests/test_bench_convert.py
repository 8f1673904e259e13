"""scripts/bench_convert.py --end-to-end: the plain nibabel loop and `fgscale convert` as
subprocesses on copies of one real map, through the script itself (--quick)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.scripts

ROOT = Path(__file__).resolve().parents[1]


def test_end_to_end_quick_writes_one_row_per_kind_and_count(tmp_path):
    out = tmp_path / "x.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "scripts/bench_convert.py", "--end-to-end", "--quick",
                          "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert out.is_file() and not out.with_name("x.md.tmp").exists()
    report = out.read_text()
    assert "COPIES OF ONE REAL MAP" in report and "COPIES OF ONE REAL MAP" in run.stdout
    lines = [line for line in report.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[1:]]
    assert [(r["cohort kind"], int(r["files"])) for r in rows] == [("small", 8), ("small", 16)]
    for r in rows:
        loop, convert, ratio = float(r["loop s"]), float(r["convert s"]), float(r["ratio"])
        assert loop > 0 and convert > 0
        assert ratio == pytest.approx(loop / convert, rel=0.005, abs=0.002)  # 3 decimals each
        assert float(r["MB/file"]) > 0.1  # the real 187 KB map
        assert r["goal"] == ">= 1.0" and r["verdict"] == ("ok" if ratio >= 1.0 else "MISS")
