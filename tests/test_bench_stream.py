"""scripts/bench_stream.py runs end to end on a tiny store: every table it prints, its worker
task called as the streamed source calls it, each worker count against as many threads reading,
and where the central process's time goes (the feed ratio), by phase, before and after."""

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
    for model in ("logreg", "mlp"):
        for code in ("centre-only", "after"):
            assert re.search(rf"\| {model} \| cpu \| {code} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ "
                             r"\| [0-9.]+ \| in the centre \| \d+ \|", out), out
        check_phases(phase_rows(out, model), ["centre-only", "after"])


def phase_rows(out: str, model: str) -> dict[str, list[float | None]]:
    """The phase table's rows of ``model`` on the CPU: phase -> its cells ("-": None)."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == [model, "cpu"] and cells[2] not in ("before", "centre-only", "after",
                                                         "scheduler apart"):
            rows[cells[2]] = [None if c == "-" else float(c.split()[0]) for c in cells[3:]]
    return rows


def check_phases(rows: dict, codes: list[str]) -> None:
    """Every phase of the training loop and the totals are there; where the code marks its
    phases, they add up to at most their thread's CPU, and that thread and the others to the
    process's."""
    from fgscale.training._profile import PHASES

    assert list(rows) == [*PHASES, "rest of the loop's thread", "the loop's thread",
                          "other threads", "central process"]
    for i, code in enumerate(codes):
        loop, other, total = (rows[name][i] for name in ("the loop's thread", "other threads",
                                                         "central process"))
        assert abs(loop + other - total) <= 0.0015  # three rounded figures
        marked = [rows[name][i] for name in PHASES]
        if None not in marked:
            assert sum(marked) <= loop + 0.0005 * len(marked)
            if code == "after":
                # the workers compute the step sizes: what is left is reading the batch's
                # constant, microseconds a batch, which rounds to 0.000 or 0.001 ms a row
                assert rows["lipschitz"][i] <= 0.001


def test_feed_ratio_before_and_after(tmp_path):
    """``--feed --baseline``: each run with a baseline checkout's code and with this one (here,
    the same code, through the path a baseline takes), and the ratios of their phases; with
    ``--feed-scheduler-apart``, this code again beside a scheduler in its own process, whose
    CPU is counted apart."""
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    (baseline / "fgscale").symlink_to(Path(__file__).parents[1] / "fgscale")
    done = subprocess.run([sys.executable, str(SCRIPT), "--feed", "--rows", "60", "--p", "2000",
                           "--dir", str(tmp_path), "--n-groupings", "2", "--batch-size", "20",
                           "--feed-models", "logreg", "--baseline", str(baseline),
                           "--feed-scheduler-apart"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "read limit" not in out  # the feed table only
    for code in ("before", "centre-only", "after"):
        assert re.search(rf"\| logreg \| cpu \| {code} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|"
                         r" [0-9.]+ \| in the centre \|", out), out
    # the scheduler's own process did work: its CPU per row is a positive figure
    scheduler = re.search(r"\| logreg \| cpu \| scheduler apart \| [0-9.]+ \| [0-9.]+ \| "
                          r"[0-9.]+ \| [0-9.]+ \| ([0-9.]+) \| \d+ \|", out)
    assert scheduler and float(scheduler.group(1)) > 0, out
    rows = phase_rows(out, "logreg")
    check_phases(rows, ["before", "centre-only", "after", "scheduler apart"])
    assert all(len(cells) == 5 for cells in rows.values())  # the four, and after / before
