"""scripts/bench_stream.py runs end to end on a tiny store: every table it prints, its worker
task called as the streamed source calls it, each worker count against as many threads reading."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.scripts

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_stream.py"


def test_tiny_run_prints_its_tables(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--rows", "80", "--p", "2000",
                           "--dir", str(tmp_path), "--n-groupings", "2", "--batch-size", "20",
                           "--n-workers", "2,1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for w in (2, 1):
        # each read limit is its own reference: the faster of its two lines is 1.00
        limits = re.findall(rf"\| read limit: [a-z ]+ read by {w} threads \| {w} \| 80 \| \d+ "
                            r"\| ([0-9.]+) \|", out)
        assert len(limits) == 2 and max(map(float, limits)) == 1.0, out
        for kind in ("processes", "threads"):
            for epoch in ("first", "second"):
                assert re.search(rf"\| streamed FG, {w} worker {kind}, {epoch} epoch \| {w} \| 80 "
                                 r"\| \d+ \| [0-9.]+ \|", out), out
    # the n / 4 runs at the first count only
    assert len(re.findall(r"\| streamed FG, 2 worker \w+, \w+ epoch \| 2 \| 20 \|", out)) == 4
    assert not re.search(r"\| streamed FG, 1 worker \w+, \w+ epoch \| 1 \| 20 \|", out)
    # the compute bound is its own reference
    assert re.search(r"\| compute bound: .* \| \d+ \| 20 \| \d+ \| (?:-|[0-9.]+) \| [0-9.]+ \| 1\.00 \|", out)
    assert "worker task" in out and "central step" in out
    rss = re.findall(r"\| epoch over \| 2 (?:processes|threads)[^|]* \| (20|80) \| \d+ \| 0 \|", out)
    assert sorted(rss) == ["20", "20", "80", "80"]  # no key spilled to disk
    assert re.search(r"peak RSS ratio 4n / n with 2 worker threads: [0-9.]+", out)
