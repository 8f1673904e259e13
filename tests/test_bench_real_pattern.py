"""scripts/bench_real_pattern.py: its data hold the real map and keep test subjects apart, and
a quick run on the 8 mm grid prints a table per task (SYNTHETIC variability: the scores mean
nothing, the data's structure and the report's shape do)."""

import numpy as np
import pytest
from helpers import load_script

pytestmark = pytest.mark.scripts


@pytest.fixture(scope="module")
def bench():
    with load_script("bench_real_pattern") as module:
        yield module


@pytest.fixture(scope="module")
def templates(bench):
    return bench.templates(8)


def test_the_templates_are_nilearns_on_the_grid(bench, templates):
    mask, affine, motor, grey = templates
    assert affine[0, 0] == 8 and mask.shape == motor.shape == grey.shape
    # the MNI152 brain at 8 mm: about 1/64 of its 2 mm voxels (235,375)
    assert 235_375 / 64 * 0.95 < mask.sum() < 235_375 / 64 * 1.05
    # the motor map is a real map with both signs inside the brain, grey matter within [0, 1]
    assert (motor[mask] > 0).any() and (motor[mask] < 0).any()
    assert 0 <= grey.min() and grey.max() <= 1.0 + 1e-6


def test_regression_rows_follow_the_target_along_the_map(bench, templates):
    mask, _, motor, _ = templates
    X_tr, y_tr, groups, X_te, y_te = bench.regression_data(0, 0.0, templates)
    assert groups is None and X_tr.shape == (bench.N_TRAIN, mask.sum())
    assert X_te.shape == (bench.N_TEST, mask.sum()) and X_tr.dtype == np.float32
    pattern = motor[mask]
    along = np.concatenate([X_tr, X_te]) @ pattern
    assert np.corrcoef(along, np.concatenate([y_tr, y_te]))[0, 1] > 0.9
    # each study's variability is its own: no two of the first ten maps are alike
    assert np.corrcoef(X_tr[:10])[np.triu_indices(10, 1)].max() < 0.9


def test_classification_keeps_test_subjects_apart_and_holds_both_maps(bench, templates):
    mask, _, motor, _ = templates
    X_tr, y_tr, groups, X_te, y_te = bench.classification_data(0, 2.0, -15.0, templates)
    n_train, n_test = bench.N_SUBJECTS_TRAIN, bench.N_SUBJECTS_TEST
    assert X_tr.shape == (2 * n_train, mask.sum()) and X_te.shape == (2 * n_test, mask.sum())
    # every training subject gives one map of each task, and no test map is among them
    assert sorted(set(groups)) == list(range(n_train))
    assert all(sorted(y_tr[groups == g]) == [0, 1] for g in range(n_train))
    assert np.bincount(y_te).tolist() == [n_test, n_test]
    assert not any((X_te[i] == X_tr).all(axis=1).any() for i in range(len(X_te)))
    # the tasks differ by the map against its mirror
    contrast = X_tr[y_tr == 0].mean(axis=0) - X_tr[y_tr == 1].mean(axis=0)
    assert np.corrcoef(contrast, motor[mask] - motor[::-1][mask])[0, 1] > 0.5


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_quick_run_prints_a_table_per_task(bench, tmp_path, capsys):
    out = tmp_path / "report.md"
    bench.main(["--quick", "--voxel-mm", "8", "--n-clusters", "0.1,0.2", "--out", str(out)])
    text = capsys.readouterr().out
    assert text.rstrip() == out.read_text().rstrip()
    assert text.startswith("SYNTHETIC variability around a real map") and "8 mm" in text
    for task, baseline, unit in (("regression", "RidgeCV", "R²"),
                                 ("classification", "LogisticRegressionCV", "accuracy (%)")):
        block = text.split(f"**{task}**")[1].split("\n\n")[1].splitlines()
        assert block[0].startswith(f"| method | test {unit} |")
        rows = [row.strip("| ").split(" | ") for row in block[2:]]
        assert [r[0] for r in rows] == ["fgscale default", "fgscale, n_clusters 0.1,0.2",
                                        f"{baseline} + standardization"]
        # the fgscale rows name the k they chose, and its clusters are of the grid's voxels
        assert all(r[4].endswith(": 1") for r in rows[:2]) and len(rows[2]) == 4
        assert rows[0][2] == ""  # the anchor has no difference with itself


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "ranking"], "--tasks: 'ranking' is not regression or classification"),
    (["--voxel-mm", "3"], "--voxel-mm: 3 is not 2, 4 or 8"),
])
def test_bad_options_are_named(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
