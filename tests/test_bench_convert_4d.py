"""scripts/bench_convert_4d.py runs end to end on tiny runs and prints its table, the loop as
the reference of both ratios."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.scripts

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_convert_4d.py"


def test_quick_run_prints_its_table(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\| loop: each run read whole once \(nibabel\) \| [0-9.]+ \| 1\.00 \| \d+ "
                     r"\| 1\.00 \|", done.stdout), done.stdout
    assert re.search(r"\| fgscale convert --n-workers 2 \| [0-9.]+ \| [0-9.]+ \| \d+ \| [0-9.]+ \|",
                     done.stdout), done.stdout
    assert (tmp_path / "s.zarr" / "zarr.json").is_file()  # the last conversion's store
