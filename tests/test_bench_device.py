"""scripts/bench_device.sh, the device machine's measurements as one command: each of them runs
(``QUICK=1``, on this machine's CPU and Python) into its own file, and a budget that runs out
names what it left out instead of starting it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.scripts

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_device.sh"
STEPS = ("speeds", "replicas", "feed", "speeds_cpu")


def run_script(tmp_path, *args, **env):
    """The script with this Python, its output in ``tmp_path / "out"``."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "BENCH_DIR": str(tmp_path / "store"), "WHEELS": str(tmp_path / "no-wheels"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_every_measurement_runs_into_its_file(tmp_path):
    done = run_script(tmp_path, "run", QUICK="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert not (out / "failed.txt").exists() and not (out / "skipped.txt").exists(), done.stdout
    assert "fgscale 0.1.0" in (out / "versions.txt").read_text()
    speeds = (out / "speeds.md").read_text()
    for w in (1, 2):  # worker processes only, each against the read limit of as many threads
        assert f"| streamed FG, {w} worker processes, second epoch | {w} |" in speeds
        assert "worker threads" not in speeds
    assert "Where the central process's time goes" not in speeds  # --no-feed
    assert "| 2 replicas | 2 |" in (out / "replicas.md").read_text()
    feed = (out / "feed.md").read_text()
    assert "| logreg | cpu | after |" in feed and "| mlp | cpu | after |" in feed
    assert "| streamed FG, 2 worker processes, second epoch | 2 |" in \
        (out / "speeds_cpu.md").read_text()
    assert not list(out.glob("*.err"))  # a step that went well leaves no log to bring back


def test_a_spent_budget_skips_and_names_each_step(tmp_path):
    done = run_script(tmp_path, "run", QUICK="1", BUDGET="0")
    assert done.returncode == 0, done.stderr
    skipped = (tmp_path / "out" / "skipped.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in skipped] == list(STEPS)
    assert not any((tmp_path / "out" / f"{name}.md").exists() for name in STEPS)


def test_an_unknown_verb_says_how_to_call_it(tmp_path):
    done = run_script(tmp_path, "measure")
    assert done.returncode == 2
    assert "usage: bash scripts/bench_device.sh wheels|run" in done.stderr
