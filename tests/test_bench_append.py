"""scripts/bench_append.py runs end to end on a tiny cohort and prints its table, the whole
table converted afresh as the reference, and the appended store checked equal to it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.scripts

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_append.py"


def test_quick_run_prints_its_table(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "appended store equal to the fresh one: True" in done.stdout, done.stdout
    assert re.search(r"\| the whole table afresh \| 24 \| [0-9.]+ \| 1\.00 \| \d+ \| 1\.00 \|",
                     done.stdout), done.stdout
    assert re.search(r"\| --append of the new rows \| 5 \| [0-9.]+ \| [0-9.]+ \| \d+ \| [0-9.]+ \|",
                     done.stdout), done.stdout
    assert open_rows(tmp_path / "grown.zarr") == 24


def open_rows(path) -> int:
    from fgscale.store import open_store

    return open_store(path).n_samples
