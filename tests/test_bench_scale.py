"""scripts/bench_scale.py: its log-log slope, and its whole pipeline once on two tiny grids."""

import math
import re

import numpy as np
import pytest
from helpers import load_script

pytestmark = pytest.mark.scripts


@pytest.fixture(scope="module")
def bench():
    with load_script("bench_scale") as module:
        yield module


@pytest.mark.parametrize("exponent", [0.5, 1.0, 1.1, 2.0])
def test_slope_recovers_a_known_exponent(bench, exponent):
    p = np.array([33_854, 270_806, 1_827_243])
    assert bench.loglog_slope(p, 3e-5 * p**exponent) == pytest.approx(exponent, rel=1e-9)
    # multiplicative noise of +-1% moves it by little
    noisy = 3e-5 * p**exponent * np.array([1.01, 0.99, 1.01])
    assert bench.loglog_slope(p, noisy) == pytest.approx(exponent, abs=0.02)


def test_slope_is_nan_when_undefined(bench):
    assert math.isnan(bench.loglog_slope([10, 10], [1.0, 2.0]))  # one distinct p
    assert math.isnan(bench.loglog_slope([10, 100], [1.0, 0.0]))  # log of 0
    assert math.isnan(bench.loglog_slope([10, 100], [1.0, math.nan]))


def test_parse_grid(bench):
    assert bench.parse_grid("2mm") == "2mm"
    assert bench.parse_grid("12x14x12") == (12, 14, 12)


def test_pipeline_on_two_tiny_grids(bench, tmp_path, capsys):
    out = tmp_path / "scale.md"
    run = bench.main(["--grids", "12x14x12,16x18x16", "--n", "4", "--no-warm-up",
                      "--workdir", str(tmp_path / "work"), "--out", str(out)])
    results = run["results"]
    assert [r["p"] for r in results.values()] == [605, 1382]
    for r in results.values():
        for stage in bench.STAGES:
            wall, cpu, peak = r[stage]
            assert math.isfinite(wall) and wall > 0 and math.isfinite(cpu) and peak >= 0
    text = out.read_text()
    assert text.startswith("# Cost against p") and "SYNTHETIC" in text
    body = text.split("\n\n", 1)[1].strip()
    assert body in capsys.readouterr().out  # printed and written alike
    tables = [block.splitlines() for block in text.split("\n\n") if block.startswith("| ")]
    assert len(tables) == 2  # time, then memory
    rows = {line.split(" | ")[0][2:]: line for line in tables[0][2:]}
    assert set(rows) == set(bench.STAGES)
    memory = {line.split(" | ")[0][2:] for line in tables[1][2:]}
    assert memory == set(bench.STAGES) - {"whole fit"}
    for stage in bench.STAGES:
        cells = rows[stage].strip("| ").split(" | ")
        times = [float(x) for c in cells[1:3] for x in re.findall(r"[\d.]+(?:e-?\d+)?", c)]
        assert len(times) == 4 and all(math.isfinite(t) and t >= 0 for t in times)
        assert math.isfinite(float(cells[4]))  # the wall-time slope
    assert not (tmp_path / "work" / "store-12x14x12.zarr").exists()  # stores are not kept
    assert not (tmp_path / "work" / "cohort-12x14x12-n4-seed0").exists()  # no --keep
