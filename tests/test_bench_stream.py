"""scripts/bench_stream.py runs end to end on a tiny store: every table it prints, its worker
task called as the streamed source calls it."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_stream.py"


def test_tiny_run_prints_its_tables(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--rows", "80", "--p", "2000",
                           "--dir", str(tmp_path), "--n-groupings", "2", "--batch-size", "20"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for kind in ("processes", "threads"):
        for epoch in ("first", "second"):
            assert re.search(rf"\| streamed FG, 2 worker {kind}, {epoch} epoch \| 80 \| \d+ \|", out)
    # the compute bound is its own reference
    assert re.search(r"\| compute bound: .* \| 20 \| \d+ \| [0-9.]+ \| [0-9.]+ \| 1\.00 \|", out)
    assert "worker task" in out and "central step" in out
    rss = re.findall(r"\| epoch over \| (?:processes|threads)[^|]* \| (20|80) \| \d+ \| 0 \|", out)
    assert sorted(rss) == ["20", "20", "80", "80"]  # no key spilled to disk
