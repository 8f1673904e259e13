"""The whole path of a nilearn user, on generated (SYNTHETIC) NIfTI files: images in, a run
folder that travels without its store, predictions, maps nilearn draws, and a report."""

import csv
import shutil

import matplotlib
import numpy as np
import pytest
from helpers import TINY_GRID, assert_png_not_blank, cohort_rows

from fgscale import FeatureGroupingClassifier
from fgscale.cli import main
from fgscale.images import make_cohort, mask_images
from fgscale.runs import load_run
from fgscale.runs._maps import read_maps

matplotlib.use("Agg")
FAST = ["--n-groupings", "4", "--n-bootstrap", "10", "--batch-size", "8", "--seed", "0",
        "--max-epochs", "6", "--n-workers", "1", "--no-progress"]


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # nilearn's, on its own defaults
def test_images_in_run_folder_out_predictions_maps_and_report(tmp_path, capsys):
    from nilearn import plotting

    table = make_cohort(tmp_path / "cohort", n_samples=36, n_classes=3, grid=TINY_GRID,
                        n_subjects=6, snr_db=3.0, seed=2)
    rows = cohort_rows(table)
    paths = np.array([str(table.parent / r["path"]) for r in rows])
    labels = np.array([r["label"] for r in rows])
    test = np.array([r["split"] == "test" for r in rows])

    # 1. in Python: fit on paths; predicting new paths equals predicting their masked rows
    clf = FeatureGroupingClassifier(n_groupings=4, n_bootstrap=10, max_epochs=6,
                                    random_state=0).fit(list(paths[~test]), labels[~test])
    rows_test = mask_images(list(paths[test]), clf.mask_img_)
    np.testing.assert_array_equal(clf.predict(list(paths[test])), clf.predict(rows_test))

    # 2. on a store: convert, train, evaluate (the predictions of the test rows)
    store, run = tmp_path / "cohort.zarr", tmp_path / "run"
    assert main(["convert", str(table), "--out", str(store), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert main(["train", str(store), "--out", str(run), *FAST]) == 0
    on_store = tmp_path / "on_store.csv"
    assert main(["evaluate", str(run), str(store), "--n-workers", "1", "--no-progress",
                 "--predictions", str(on_store)]) == 0
    capsys.readouterr()

    # 3. the run folder moved elsewhere, its store deleted: it predicts the images alone
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(run, moved)
    shutil.rmtree(run)
    shutil.rmtree(store)
    from_images = tmp_path / "from_images.csv"
    assert main(["predict", str(moved), *paths[test], "--out", str(from_images),
                 "--no-progress"]) == 0
    expected = {r["path"]: r for r in _read(on_store)}
    got = _read(from_images)
    assert len(got) == len(expected) == test.sum()
    for r in got:
        assert r["prediction"] == expected[r["path"]]["prediction"]
        for c in load_run(moved).classes_:
            assert float(r[f"proba_{c}"]) == pytest.approx(
                float(expected[r["path"]][f"proba_{c}"]), rel=1e-5, abs=1e-7)

    # 4. nilearn draws each class's map, straight from its file
    sidecar, maps = read_maps(moved)
    assert sorted(maps) == sorted(set(labels))
    for name, path in maps.items():
        png = tmp_path / f"{name}.png"
        display = plotting.plot_stat_map(str(path), title=name, display_mode="ortho")
        display.savefig(png)
        display.close()
        assert_png_not_blank(png)

    # 5. the report: one HTML file whose embedded figures decode
    report = tmp_path / "report.html"
    assert main(["report", str(moved), "--out", str(report)]) == 0
    import base64
    import re

    images = re.findall(r'src="data:image/png;base64,([^"]+)"', report.read_text())
    assert len(images) >= 3  # the confusion matrix, the curves, the maps
    for data in images:
        assert_png_not_blank(base64.b64decode(data, validate=True))
