"""``fgscale report``: one HTML file whose figures decode, for finished and unfinished runs;
rendered by a real headless Chromium in the slow test."""

import base64
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import nibabel as nib
import numpy as np
import pytest
from helpers import TINY_GRID, assert_png_not_blank, cohort_rows
from scipy import ndimage
from sklearn import metrics

from fgscale.cli import main
from fgscale.images import make_classification_volumes
from fgscale.runs import train_run
from fgscale.runs._html import (
    _curves_figure,
    _matplotlib_slices,
    _nilearn_slices,
    _peak,
    cut_voxel,
    map_background,
    write_report,
)
from fgscale.runs._maps import read_maps
from fgscale.store import write_store

_VOID = {"meta", "img", "br", "hr", "link", "input", "col", "source", "area", "base", "wbr"}


class _Checker(HTMLParser):
    """Every element closed, in order: the page is well formed."""

    def __init__(self):
        super().__init__()
        self.open, self.images = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in _VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()


def _check_page(path) -> tuple[str, list[dict]]:
    """The page's text and its images; asserts it is well formed and every image a PNG data
    URI that decodes and is not blank."""
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    checker = _Checker()
    checker.feed(text)
    checker.close()
    assert checker.open == []
    for img in checker.images:
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix) and img["alt"]
        assert_png_not_blank(base64.b64decode(img["src"][len(prefix):], validate=True))
    return text, checker.images


@pytest.mark.parametrize("name, nilearn", [("logreg", True), ("mlp", False)])
def test_report_of_a_finished_run(tiny_runs, tmp_path, name, nilearn):
    out = write_report(tiny_runs[name], tmp_path / "report.html", nilearn=nilearn)
    text, images = _check_page(out)
    classes = list(tiny_runs["store"].classes)
    # the confusion matrix, the curves, then a map per class
    assert len(images) == 2 + len(classes)
    for section in ("Test scores", "Training", "Hyper-parameters", "Maps", "SYNTHETIC data"):
        assert section in text
    assert "house/home: maps/house_home.nii.gz" in text  # the class and its file, escaped safely
    assert ("nilearn.plotting.plot_stat_map" if nilearn else "drawn with matplotlib") in text
    # 40 rows, every fifth a test row
    assert "<tr><td>training rows</td><td>32</td></tr>" in text
    assert "<tr><td>test rows</td><td>8</td></tr>" in text
    y_test = tiny_runs["store"].y[tiny_runs["store"].split == "test"]  # beside the accuracy
    chance = np.bincount(y_test).max() / y_test.size
    assert re.search(rf"<tr><td>chance \(the most frequent class alone\)</td><td>{chance:.4g}", text)
    if name == "mlp":  # two candidates in a table, the one selected marked
        final = json.loads((tiny_runs[name] / "final.json").read_text())
        rows = re.findall(r"<tr><td>(✓?)</td><td>([0-9.]+)</td>", text)
        assert len(rows) == 2 and [mark for mark, _ in rows].count("✓") == 1
        assert float(next(alpha for mark, alpha in rows if mark)) == final["selected"]["alpha"]


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory, client):
    """A finished regression run on a SYNTHETIC store whose target is ages (20 to 80)."""
    root = tmp_path_factory.mktemp("regression_run")
    X, _, mask, affine = make_classification_volumes(40, 2, grid=TINY_GRID, seed=0)
    target = 50.0 + 30.0 * np.tanh(X[:, :40].mean(axis=1) / X[:, :40].mean(axis=1).std())
    split = np.where(np.arange(40) % 4 == 0, "test", "train")
    store = write_store(root / "ages.zarr", X, None, mask, affine, target=target, split=split,
                        block_rows=8)
    train_run(store.path, root / "run", client=client,
              params=dict(n_groupings=4, n_bootstrap=10, n_clusters=0.1, batch_size=8,
                          random_state=0, max_epochs=5))
    return root / "run"


def test_report_of_a_regression_run_speaks_of_a_target(regression_run, tmp_path):
    text, images = _check_page(write_report(regression_run, tmp_path / "r.html", nilearn=False))
    final = json.loads((regression_run / "final.json").read_text())
    # the curves, predicted against true targets, the target's map
    assert len(images) == 3
    test = final["test"]
    for name, key in (("R²", "r2"), ("mean absolute error", "mae"),
                      ("root mean squared error", "rmse"), ("Pearson&#x27;s correlation",
                                                            "correlation")):
        assert f"<tr><td>{name}</td><td>{test[key]:.4g}</td></tr>" in text
    assert "Predicted against true target of each test row" in text
    assert "One 3D NIfTI, the target's, in <code>maps/</code>" in text
    assert "Loss per epoch (half the mean squared error of the target standardized" in text
    page = re.sub(r"<style>.*?</style>|src=\"[^\"]*\"", "", text, flags=re.S)
    assert not re.search(r"\bclass|accuracy|confusion", page, flags=re.I), \
        re.search(r".{40}(\bclass|accuracy|confusion).{40}", page, flags=re.I | re.S)[0]
    # the plotted predictions are the run's test rows, and score as final.json says
    rows = cohort_rows(regression_run / "test_predictions.csv")
    assert len(rows) == test["n"] == 10
    true = [float(r["target"]) for r in rows]
    pred = [float(r["prediction"]) for r in rows]
    assert metrics.r2_score(true, pred) == pytest.approx(test["r2"])
    assert final["predictions"] == str(regression_run / "test_predictions.csv")


def test_a_refit_of_one_epoch_is_drawn(tmp_path):
    history = [{"epoch": e, "train_loss": 1.0 / (e + 1), "val_loss": 0.5} for e in range(5)]
    fig = _curves_figure(history + [{"epoch": 0, "train_loss": 0.7, "phase": "refit"}], 1)
    refit = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("refit")]
    assert len(refit) == 1 and refit[0].get_marker() == "o"


def test_report_of_an_unfinished_run_shows_its_epochs_so_far(tiny_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_runs["logreg"], run)
    for name in ("final.json", "model.json"):  # as a run killed after a few epochs
        (run / name).unlink()
    text, images = _check_page(write_report(run))
    assert (run / "report.html").is_file()
    assert "This run has not finished" in text and len(images) == 1  # the curves only


def test_cli_report_and_its_errors(tiny_runs, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(tiny_runs["logreg"]), "--out", str(out),
                 "--maps-with", "matplotlib"]) == 0
    assert f"report of {tiny_runs['logreg']}: {out}" in capsys.readouterr().out
    _check_page(out)
    assert main(["report", str(tmp_path), "--out", str(out)]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    (tmp_path / "taken").write_text("x")  # a file where the report's folder was meant
    assert main(["report", str(tiny_runs["logreg"]), "--out", str(tmp_path / "taken" / "r.html"),
                 "--maps-with", "matplotlib"]) == 2
    assert "taken/r.html: its folder " in capsys.readouterr().err
    # another format's name would hold HTML: refused before any drawing
    assert main(["report", str(tiny_runs["logreg"]), "--out", str(tmp_path / "r.pdf")]) == 2
    assert ("r.pdf: the report is one HTML file; expected a name ending in .html, got '.pdf'"
            in capsys.readouterr().err)
    assert not (tmp_path / "r.pdf").exists()
    # without matplotlib (None in sys.modules: the import fails as if it were not installed)
    code = ("import sys; sys.modules['matplotlib'] = None; from fgscale.cli import main; "
            f"sys.exit(main(['report', {str(tiny_runs['logreg'])!r}, '--out', "
            f"{str(tmp_path / 'x.html')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "fgscale report needs matplotlib: pip install 'fgscale[plot]'" in done.stderr


@pytest.mark.parametrize("damage, message", [
    (lambda run: (run / "config.json").write_text('{"note": "edited"}'),
     r"config\.json: not a valid run configuration \(no field 'params'\)"),
    (lambda run: (run / "mask.nii.gz").write_bytes((run / "mask.nii.gz").read_bytes()[:50]),
     r"mask\.nii\.gz: "),
    (lambda run: (run / "metrics.jsonl").open("a").write("{cut short\n"),
     r"metrics\.jsonl: not one JSON object per line"),
])
def test_report_of_a_damaged_run_names_the_file(damage, message, tiny_runs, tmp_path, capsys):
    """A config.json without its parameters stopped the report with KeyError: 'params', a
    truncated mask with nibabel's ImageFileError (tracebacks), a damaged metrics.jsonl with
    json's 'Expecting value' that named no file."""
    run = tmp_path / "run"
    shutil.copytree(tiny_runs["logreg"], run)
    damage(run)
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"),
                 "--maps-with", "matplotlib"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_chromium_renders_the_report(tiny_runs, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    page = write_report(tiny_runs["logreg"], tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1200,2400",
                    page.resolve().as_uri()], capture_output=True, timeout=120, check=True)
    pixels = assert_png_not_blank(shot)
    assert pixels.shape[:2] == (2400, 1200)
    # the figures are drawn: more than a few colours, as text on white alone would give
    assert len({tuple(p) for p in pixels[::4, ::4].reshape(-1, pixels.shape[-1])}) > 50


def test_matplotlib_maps_name_the_cut_and_the_peak_as_in_the_file_whatever_its_orientation():
    """The slices are drawn in RAS, but the cut and the peak are given as the map file's voxels
    and in mm, which a reader can find in the file (an LAS image's x index runs the other way)."""
    data = np.zeros((10, 12, 10), np.float32)
    data[3, 6, 2] = -0.5  # the peak of |value|, near the image's low-x side
    data[5, 5, 5] = 0.2
    las = np.array([[-4.0, 0, 0, 90], [0, 4, 0, -126], [0, 0, 4, -72], [0, 0, 0, 1]])
    fig = _matplotlib_slices(nib.Nifti1Image(data, las), None, "class_0")
    title = fig._suptitle.get_text()
    assert "cut at voxel (3, 6, 2)" in title, title
    assert "peak |value| 0.5 at voxel (3, 6, 2), (78, -102, -64) mm" in title, title
    views = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert views == ["sagittal, x = 78 mm", "coronal, y = -102 mm", "axial, z = -64 mm"]
    # the sagittal view is the slice of the cut: it holds the strong value, not the other one
    shown = fig.axes[0].images[1].get_array()
    assert shown.compressed().tolist() == [-0.5]


def _edge_and_blob():
    """A map on a ball-shaped mask: a single strongest voxel on the mask's edge, and a large
    blob of strong values deep inside (at x 9 to 13), over weak noise."""
    grid = np.indices((24, 24, 24)) - 11.5
    mask = (grid ** 2).sum(axis=0) <= 10.5 ** 2
    data = np.where(mask, np.random.default_rng(0).uniform(-0.1, 0.1, mask.shape), 0.0)
    data[9:14, 9:14, 9:14] = 1.0
    edge = (0, 11, 11)
    while not mask[edge]:
        edge = (edge[0] + 1, 11, 11)
    data[edge] = 5.0
    return data.astype(np.float32), mask, edge


def test_cuts_go_through_the_largest_cluster_not_a_lone_peak_on_the_mask_edge():
    data, mask, edge = _edge_and_blob()
    assert _peak(data) == edge  # what the slices went through
    cut = cut_voxel(data, mask)
    assert all(9 <= c <= 13 for c in cut), cut
    assert ndimage.binary_erosion(mask)[cut]  # inside the mask, off its border
    # the figures cross there too, with nilearn or matplotlib alone
    mask_img = nib.Nifti1Image(mask.astype(np.uint8), np.eye(4))
    fig = _matplotlib_slices(nib.Nifti1Image(data, np.eye(4)), mask_img, "class_0")
    views = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert views == [f"sagittal, x = {cut[0]} mm", f"coronal, y = {cut[1]} mm",
                     f"axial, z = {cut[2]} mm"]
    nilearn_fig = _nilearn_slices(nib.Nifti1Image(data, np.eye(4)), mask_img, "class_0")
    annotations = {t.get_text() for ax in nilearn_fig.axes for t in ax.texts}
    assert {f"x={cut[0]}", f"y={cut[1]}", f"z={cut[2]}"} <= annotations, annotations


@pytest.mark.parametrize("mask", [None, "mask"])
def test_a_cut_is_always_inside_the_mask(mask):
    """Strong values only on the border, or nowhere: the cut still lies in the mask."""
    data, ball, _ = _edge_and_blob()
    border = ball & ~ndimage.binary_erosion(ball)
    ring = np.where(border, data + 3.0, np.where(ball, 0.01, 0.0))
    given = ball if mask else None
    assert ball[cut_voxel(ring, given)]
    assert ball[cut_voxel(np.where(ball, 1.0, 0.0), given)]
    assert cut_voxel(np.zeros((4, 5, 6)), None) == (2, 2, 3)


def test_the_maps_are_drawn_over_the_mean_image_of_the_training_rows(tiny_runs, tmp_path):
    run, store = tiny_runs["logreg"], tiny_runs["store"]
    _, paths = read_maps(run)
    img, mask_img = nib.load(next(iter(paths.values()))), nib.load(run / "mask.nii.gz")
    background, about = map_background(run, img, mask_img)
    assert about.startswith("the mean image of the training rows")
    # the oracle: the training rows of the store, averaged
    mean = store.read_rows(store.train_rows()).astype(np.float64).mean(axis=0)
    expected = np.zeros(store.mask.shape)
    expected[store.mask] = mean
    np.testing.assert_allclose(background.get_fdata(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(background.affine, img.affine)
    # drawn under the map: the sagittal view's grey image is that mean's slice, not the mask
    fig = _matplotlib_slices(img, mask_img, "face", background)
    cut = cut_voxel(np.asarray(img.dataobj), store.mask)
    grey = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(grey.filled(0), expected[cut[0]].T, rtol=1e-5, atol=1e-6)
    assert len(np.unique(grey.compressed())) > 10
    text = write_report(run, tmp_path / "r.html", nilearn=False).read_text()
    assert "over the mean image of the training rows" in text


def _linear_image(shape, affine):
    """An image whose value is a linear function of the world coordinates: linear
    resampling reproduces it exactly wherever it interpolates."""
    ijk = np.indices(shape).reshape(3, -1).T
    xyz = nib.affines.apply_affine(affine, ijk)
    values = 100.0 + xyz @ np.array([1.0, 2.0, 3.0])
    return nib.Nifti1Image(values.reshape(shape).astype(np.float32), affine), values


def test_a_background_on_another_grid_is_resampled_to_the_maps(tiny_runs, tmp_path, capsys):
    run = tiny_runs["logreg"]
    _, paths = read_maps(run)
    img = nib.load(next(iter(paths.values())))
    # a finer grid over a larger field of view, as a 1 mm T1 under 2 mm maps
    fine = img.affine @ np.diag([0.5, 0.5, 0.5, 1.0])
    fine[:3, 3] = nib.affines.apply_affine(img.affine, [-2, -2, -2])
    bg, _ = _linear_image(tuple(2 * n + 8 for n in img.shape[:3]), fine)
    bg.to_filename(tmp_path / "t1.nii.gz")
    background, about = map_background(run, img, bg_img=tmp_path / "t1.nii.gz")
    assert about == f"{tmp_path / 't1.nii.gz'} (resampled linearly to the maps' grid)"
    _, expected = _linear_image(img.shape[:3], img.affine)
    np.testing.assert_allclose(background.get_fdata().ravel(), expected, rtol=1e-5)
    out = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(out), "--maps-with", "matplotlib",
                 "--bg-img", str(tmp_path / "t1.nii.gz")]) == 0
    _check_page(out)
    assert "t1.nii.gz (resampled linearly to the maps&#x27; grid)" in out.read_text()


def _elsewhere(img):
    """An image of the maps' shape, a metre away in space."""
    affine = img.affine.copy()
    affine[:3, 3] += 1000.0
    return nib.Nifti1Image(np.ones(img.shape[:3], np.float32), affine)


@pytest.mark.parametrize("make, message", [
    (_elsewhere, "bg.nii.gz: no non-zero voxel on the maps' grid"),
    (lambda img: nib.Nifti1Image(np.ones((*img.shape[:3], 2), np.float32), img.affine),
     "bg.nii.gz: a background image must be 3D (or 4D of one volume), got shape"),
    (None, "bg.nii.gz: no such NIfTI file"),
])
def test_a_background_that_cannot_be_used_is_refused_naming_it(make, message, tiny_runs,
                                                               tmp_path, capsys):
    run = tiny_runs["logreg"]
    img = nib.load(next(iter(read_maps(run)[1].values())))
    if make is not None:
        make(img).to_filename(tmp_path / "bg.nii.gz")
    out = tmp_path / "r.html"
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(out), "--maps-with", "matplotlib",
                 "--bg-img", str(tmp_path / "bg.nii.gz")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
