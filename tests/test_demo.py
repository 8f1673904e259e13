"""``fgscale demo`` end to end on a tiny SYNTHETIC grid (slow: a LocalCluster, a bank, two runs)."""

import pytest
from helpers import TINY_GRID, assert_weight_map, dashboard_port_may_be_taken

from fgscale import demo
from fgscale.store import open_store

# The demo's cohort and training, cut down to seconds: 48 volumes on the tiny grid, few epochs.
TINY_DEMO = dict(n_samples=48, n_classes=4, grid=TINY_GRID, snr_db=0.0, n_subjects=8)
TINY_TRAINING = dict(n_groupings=4, n_bootstrap=10, batch_size=8, max_epochs=3)


def _table(lines):
    """The rows of the printed result table, as lists of cells (header and rule left out)."""
    table = [line for line in lines if line.startswith("|")]
    assert table[0].startswith("| model | regularizer | test accuracy |")
    assert set(table[1]) <= {"|", "-"}
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]


def _mtimes(folder, pattern="*"):
    return {f: f.stat().st_mtime_ns for f in folder.rglob(pattern) if f.is_file()}


@pytest.mark.slow
@dashboard_port_may_be_taken
def test_demo_on_a_tiny_grid_then_again_reusing_its_steps(tmp_path, monkeypatch, capsys):
    for key, value in TINY_DEMO.items():
        monkeypatch.setitem(demo.DEMO, key, value)
    for key, value in TINY_TRAINING.items():
        monkeypatch.setitem(demo.TRAINING, key, value)
    out = tmp_path / "demo"

    first_lines = []
    rows = demo.run_demo(out, n_workers=1, echo=first_lines.append)
    # one row per regularizer, then scikit-learn's LogisticRegression() on the same rows
    assert [r["regularizer"] for r in rows] == [*demo.BASELINES, "l2 (C=1)"]
    table = _table(first_lines)
    assert [cells[1] for cells in table] == [r["regularizer"] for r in rows]
    for cells, row in zip(table, rows, strict=True):
        accuracy = float(cells[2])
        assert 0.0 <= accuracy <= 1.0
        assert accuracy == pytest.approx(row["test"]["accuracy"], abs=5e-4)
        if "epochs" in row:
            assert cells[3] == f"{row['epochs']} + {row['refit_epochs']} refit"
            assert cells[5] == row["maps"]
    verdict = [line for line in first_lines if line.startswith("Feature grouping")]
    assert len(verdict) == 1 and ("is ahead" in verdict[0]) == (
        rows[0]["test"]["accuracy"] > max(r["test"]["accuracy"] for r in rows[1:]))
    rows = rows[: len(demo.BASELINES)]

    store = open_store(out / "cohort.zarr")
    assert store.n_samples == TINY_DEMO["n_samples"] and store.mask.shape == TINY_GRID
    assert len(store.classes) == TINY_DEMO["n_classes"]
    for row in rows:  # loads with nibabel: a volume per class on the store's grid
        assert_weight_map(row["maps"], store)

    # Again: the cohort, the store with its bank, and both finished runs are reused.
    store_files = _mtimes(out / "cohort.zarr")
    checkpoints = _mtimes(out / "runs", "*.pt")  # written after each epoch trained
    finals = _mtimes(out / "runs", "final.json")
    assert checkpoints and len(finals) == len(demo.BASELINES)
    second_lines = []
    capsys.readouterr()
    # without progress bars: runs that differ only in that are finished runs all the same
    again = demo.run_demo(out, n_workers=1, echo=second_lines.append, progress=False)
    err = capsys.readouterr().err
    # nothing left to do: no cluster started (it started two, and said their dashboards)
    assert "%|" not in err and "Dask dashboard" not in err
    assert any(line.startswith("1/4 generating") for line in first_lines)
    assert not any(line.startswith("1/4 generating") for line in second_lines)
    assert _mtimes(out / "cohort.zarr") == store_files  # nothing converted nor built again
    assert _mtimes(out / "runs", "*.pt") == checkpoints  # no epoch trained again
    assert _mtimes(out / "runs", "final.json") == finals  # finished runs reused as they are
    again = again[: len(demo.BASELINES)]
    assert [r["test"] for r in again] == [r["test"] for r in rows]
    assert [r["epochs"] for r in again] == [r["epochs"] for r in rows]
    assert [cells[2] for cells in _table(second_lines)] == [cells[2] for cells in table]


def test_a_run_made_with_other_parameters_is_kept_and_the_demo_trains_beside_it(tmp_path):
    import json

    from helpers import synthetic_store

    from fgscale.estimators._factory import make_estimator
    from fgscale.estimators._params import params_to_json

    store = synthetic_store(tmp_path / "s.zarr", 12, 2, seed=0)
    params = dict(demo.TRAINING, regularizer="feature_grouping", random_state=0)
    runs = tmp_path / "runs"
    assert demo._run_folder(runs, "feature_grouping", store, params) == runs / "feature_grouping"
    full = params_to_json(make_estimator(store, params, "auto").get_params())
    (runs / "feature_grouping").mkdir(parents=True)
    older = dict(full, n_clusters=0.1)  # an earlier version's default
    (runs / "feature_grouping" / "config.json").write_text(json.dumps({"params": older}))
    assert demo._run_folder(runs, "feature_grouping", store, params) == (
        runs / "feature_grouping-2")
    (runs / "feature_grouping" / "config.json").write_text(json.dumps({"params": full}))
    assert demo._run_folder(runs, "feature_grouping", store, params) == runs / "feature_grouping"
