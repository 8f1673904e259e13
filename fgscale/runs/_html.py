"""A run folder as one static HTML page: training curves, the hyper-parameters chosen among the
candidates, the test scores with the confusion matrix (a regression's: its predictions against the
true targets, from test_predictions.csv), and slices of each class's (or the target's) map.

The page is a single file with its figures embedded as PNG data URIs: it can be mailed,
archived beside the run, or opened from a cluster's file system without a server. It reads the
run folder only (:mod:`fgscale.runs`): config.json, metrics.jsonl (the curves, written after
every epoch, so an unfinished run gets a page too), model.json (a refit's epochs), final.json
(the scores and the choice) and maps.json with the maps (:mod:`fgscale.runs._maps`).

Figures need matplotlib (``pip install 'fgscale[plot]'``). The maps are drawn with
``nilearn.plotting.plot_stat_map`` when nilearn is installed, as a nilearn user knows them;
otherwise with matplotlib alone, in the image's closest RAS orientation. Either way they lie
over a background on the maps' grid (:func:`map_background`): an image given
(``--bg-img``, a T1 or a template, resampled to the grid), else the mean image of the training
rows that the model standardized with, which is what nilearn's decoding examples draw their
weights on, else the mask. The three slices cross at :func:`cut_voxel`, the centre of the
largest cluster of strong values inside the mask, rather than at the single largest value,
which a map often has at the brain's edge; values weaker than that cluster's threshold are
left out, so that the background shows through.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import io
import json
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np

from fgscale._utils.files import atomic_path, check_writable, read_json
from fgscale.estimators._saved_mask import MASK, MODEL_NPZ
from fgscale.images._nifti import load_img, read_data, same_grid
from fgscale.runs._folder import PREDICTIONS
from fgscale.runs._listing import check_not_a_store
from fgscale.runs._maps import read_maps

__all__ = ["cut_voxel", "map_background", "write_report"]

_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222}h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;
text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.banner{background:#fff3cd;border:1px solid #e0c46c;padding:.5em 1em}img{max-width:100%}
figure{margin:1em 0}figcaption{color:#555;font-size:.9em}code{background:#f3f3f3}"""


def write_report(run_dir, out=None, *, nilearn: bool | None = None, bg_img=None) -> Path:
    """Write the HTML report of a run folder.

    Parameters
    ----------
    run_dir : str or Path
        A run folder of :func:`fgscale.runs.train_run` (finished or not).
    out : str or Path, optional
        The HTML file; default ``run_dir/report.html``. Written under a temporary name,
        then renamed.
    nilearn : bool, optional
        Draw the maps with ``nilearn.plotting.plot_stat_map`` (True) or with matplotlib
        alone (False); default nilearn when it is installed.
    bg_img : str, Path or nibabel image, optional
        The background of the maps (a T1 image, a template in the maps' space), 3D,
        resampled linearly to the maps' grid when it lies on another; default the mean
        image of the training rows (see :func:`map_background`).

    Returns
    -------
    path : Path
        The report written.

    Raises
    ------
    FileNotFoundError
        If ``run_dir`` is not a run folder (no config.json), or ``bg_img`` is not a file.
    ValueError
        If ``bg_img`` is not a 3D image or does not overlap the maps' grid, or a file of the
        run folder is damaged.
    ModuleNotFoundError
        If matplotlib (or nilearn, with ``nilearn=True``) is not installed.
    """
    run = Path(run_dir)
    check_not_a_store(run)
    if not (run / "config.json").is_file():
        raise FileNotFoundError(f"{run / 'config.json'}: no such file; {run} is not a run "
                                "folder (fgscale train --out RUN writes one)")
    path = run / "report.html" if out is None else Path(out)
    if path.suffix.lower() not in (".html", ".htm"):  # r.pdf would hold HTML under its name
        raise ValueError(f"{path}: the report is one HTML file; expected a name ending in "
                         f".html, got {repr(path.suffix) if path.suffix else 'none'}")
    check_writable(path, "; choose another --out; no report written")  # before the drawing
    if bg_img is not None:  # a wrong path is named before anything is drawn
        bg_img = load_img(bg_img)
    _require("matplotlib", "pip install 'fgscale[plot]'")
    if nilearn is None:
        nilearn = importlib.util.find_spec("nilearn") is not None
    elif nilearn:
        _require("nilearn", "pip install nilearn, or draw the maps with matplotlib alone")
    config = read_json(run / "config.json", "run configuration", ("params",))
    final = _read_json(run / "final.json", "run summary")
    parts = [_header(run, config, final)]
    if final is not None:
        parts.append(_scores(final["test"], run))
    parts.append(_training(_history(run), final))
    if final is not None:
        parts.append(_choice(final))
        parts.append(_maps(run, nilearn, regression="r2" in final["test"], bg_img=bg_img))
    parts.append(_table_section("All parameters", config["params"], open_=False))
    title = f"fgscale run {run.resolve().name}"
    page = (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path


def _require(module: str, fix: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"fgscale report needs {module}: {fix}", name=module)


def _read_json(path: Path, what: str):
    return read_json(path, what) if path.is_file() else None


def _history(run: Path) -> list[dict]:
    """Per-epoch metrics: metrics.jsonl (each epoch of a fit of one candidate, kept up to date
    while it trains), else model.json's (a search writes each candidate's epochs to its own
    metrics-candidate-<i>.jsonl), then the refit's epochs, from model.json."""
    metrics = run / "metrics.jsonl"
    try:
        rows = ([json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
                if metrics.is_file() else [])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{metrics}: not one JSON object per line ({exc}); it was edited or "
                         "cut short: move it away to draw the report without it") from None
    saved = (_read_json(run / "model.json", "saved model") or {}).get("history_", [])
    if not rows:
        rows = [h for h in saved if h.get("phase") != "refit"]
    return rows + [h for h in saved if h.get("phase") == "refit"]


# ------------------------------------------------------------------------------ sections

def _header(run: Path, config: dict, final: dict | None) -> str:
    params = config["params"]
    lines = [f"<h1>fgscale run <code>{_esc(run.resolve().name)}</code></h1>"]
    if config.get("synthetic"):
        lines.append('<p class="banner"><strong>SYNTHETIC data</strong>: the store was '
                     "converted from a generated cohort, not from real images.</p>")
    if final is None:
        lines.append('<p class="banner">This run has not finished (no final.json): the page '
                     "shows its epochs so far; scores and maps come when it ends.</p>")
    facts = {"run folder": str(run.resolve()), "store": config.get("store"),
             "model": params.get("model"), "regularizer": params.get("regularizer"),
             "random_state": params.get("random_state"),
             **{f"{k} version": v for k, v in config.get("versions", {}).items()}}
    if final is not None:
        facts.update({"training rows": final.get("n_train"),
                      "test rows": final.get("test", {}).get("n"),
                      "epochs": final.get("epochs"), "refit epochs": final.get("refit_epochs"),
                      "seconds": final.get("seconds")})
    return "\n".join(lines) + "\n" + _kv_table(facts)


# the scores' names on the page; a regression's errors are in the target's units
_SCORE_NAMES = {"n": "rows", "r2": "R²", "mae": "mean absolute error", "rmse": "root mean "
                "squared error", "correlation": "Pearson's correlation", "loss": "loss "
                "(cross-entropy)", "balanced_accuracy": "balanced accuracy",
                "chance": "chance (the most frequent class alone)",
                "mae_of_mean": "mean absolute error of predicting the mean"}


_NA = "n/a"


def _scores(test: dict, run: Path) -> str:
    out = ["<h2>Test scores</h2>"]
    if not test.get("n"):
        return out[0] + "\n<p>The store has no test rows: no scores.</p>"
    # a score without rows to define it is n/a, as fgscale evaluate prints it
    scalars = {_SCORE_NAMES.get(k, k): _NA if v is None else v for k, v in test.items()
               if not isinstance(v, (dict, list))}
    out.append(_kv_table(scalars))
    if "r2" in test:
        target = test.get("target", "target")  # the cohort table's column
        units = "the target's units" if target == "target" else f"the units of {_esc(target)}"
        out.append(f"<p>Errors in {units}; R² is not defined (n/a) where the test targets do "
                   "not vary.</p>")
        table = run / PREDICTIONS
        if table.is_file():
            out.append(_figure(_predictions_figure(table, target),
                               f"Predicted against true {target} of each test row "
                               f"({PREDICTIONS}); the line is a perfect prediction"))
    if test.get("per_class"):
        header = ["class", "precision", "recall", "f1", "support"]
        rows = [[c, *(_NA if test["per_class"][c][k] is None else test["per_class"][c][k]
                      for k in header[1:])] for c in test["classes"]]
        out.append(_table(header, rows))
        if any(_NA in row for row in rows):
            out.append("<p>n/a: undefined, the class has no true row among the test rows "
                       "(recall) or is never predicted (precision).</p>")
    if test.get("confusion_matrix"):
        out.append(_figure(_confusion_figure(test["classes"], test["confusion_matrix"]),
                           "Confusion matrix of the test rows (rows: true class, columns: "
                           "predicted)"))
    return "\n".join(out)


def _training(history: list[dict], final: dict | None) -> str:
    out = ["<h2>Training</h2>"]
    if not history:
        return out[0] + "\n<p>No epoch recorded yet.</p>"
    best = None if final is None else final.get("n_iter")
    regression = (any("val_r2" in h for h in history)
                  or final is not None and "r2" in final.get("test", {}))
    loss = (" (half the mean squared error of the target standardized by the training rows' "
            "mean and standard deviation: 0.5 is a constant prediction of the mean)"
            if regression else "")
    out.append(_figure(_curves_figure(history, best),
                       f"Loss per epoch{loss} on the training rows (mean over its minibatches) "
                       "and on the validation rows, and the validation score; the dashed line "
                       "is the epoch kept. A refit trains again on all training rows."))
    return "\n".join(out)


def _choice(final: dict) -> str:
    out = ["<h2>Hyper-parameters</h2>", "<p>In effect (chosen on the validation rows when "
           "there were several candidates; 0 or None where this model and regularizer do not "
           "use the parameter, whatever its value among all parameters below):</p>",
           _kv_table(final.get("selected", {}))]
    candidates = final.get("candidates") or []
    if candidates:
        header = list(dict.fromkeys(k for c in candidates for k in c))
        chosen = final.get("selected", {})
        rows = [["✓" if all(c.get(k) == v for k, v in chosen.items()) else "",
                 *(c.get(k) for k in header)] for c in candidates]
        out += [f"<p>{len(candidates)} candidate(s), ✓ the one selected (val_loss: the "
                "validation loss of the curves above, at the candidate's best epoch):</p>",
                _table(["selected", *header], rows)]
    return "\n".join(out)


def _maps(run: Path, use_nilearn: bool, *, regression: bool = False, bg_img=None) -> str:
    out = ["<h2>Maps</h2>"]
    try:
        sidecar, paths = read_maps(run)
    except FileNotFoundError as exc:
        return out[0] + f"\n<p>No maps: {_esc(str(exc))}</p>"
    files = ("One 3D NIfTI, the target's, in <code>maps/</code> (the same as "
             f"<code>{_esc(sidecar['image'])}</code>)" if regression else
             "One 3D NIfTI per class in <code>maps/</code> (all of them as the 4D "
             f"<code>{_esc(sidecar['image'])}</code>, volumes in the order below)")
    mask = _image(run / MASK) if (run / MASK).is_file() else None
    images = {name: _image(path) for name, path in paths.items()}
    grid = next(iter(images.values()), None)
    background, about = (None, "") if grid is None else map_background(run, grid, mask, bg_img)
    out.append(f"<p>{_esc(sidecar['values'])}. {files}; drawn with "
               f"{'nilearn.plotting.plot_stat_map' if use_nilearn else 'matplotlib'} over "
               f"{_esc(about)}. The slices cross at the centre of the largest cluster of "
               f"values whose absolute value is in the top {100 - _TOP_PERCENTILE:g}% of the "
               "map's, inside the mask and off its border; weaker values are not drawn.</p>")
    draw = _nilearn_slices if use_nilearn else _matplotlib_slices
    for name, img in images.items():
        out.append(_figure(draw(img, mask, name, background),
                           f"{name}: {paths[name].relative_to(run)}"))
    return "\n".join(out)


def map_background(run_dir, grid_img, mask_img=None,
                   bg_img=None) -> tuple[nib.Nifti1Image | None, str]:
    """The image that a run's maps are drawn over, on the maps' grid.

    Parameters
    ----------
    run_dir : str or Path
        A finished run folder.
    grid_img : nibabel.Nifti1Image
        An image on the maps' grid (one of the maps).
    mask_img : nibabel.Nifti1Image, optional
        The run's mask (``mask.nii.gz``), on that grid; default none.
    bg_img : str, Path or nibabel image, optional
        A background to use instead (a T1, a template), 3D or 4D of one volume; resampled
        linearly to the grid when it lies on another. Default None: the mean image of the
        training rows, saved with the model as the mean of its standardization (``mean_`` in
        ``model.npz``), else the mask.

    Returns
    -------
    background : nibabel.Nifti1Image or None
        On ``grid_img``'s grid, float32; None when the run has neither a mean image nor a
        mask and no ``bg_img`` is given.
    about : str
        What it is, in words, for the page.

    Raises
    ------
    ValueError
        If ``bg_img`` is not 3D, or holds no finite non-zero voxel on the maps' grid; if
        ``model.npz`` is damaged or its mean does not fit the mask.
    """
    run = Path(run_dir)
    shape, affine = grid_img.shape[:3], grid_img.affine
    if bg_img is not None:
        return _given_background(load_img(bg_img), shape, affine)
    if mask_img is None:
        return None, "no background (the run folder has no mask.nii.gz)"
    mask = np.asarray(mask_img.dataobj) != 0
    mean = _saved_mean(run / MODEL_NPZ, int(mask.sum()))
    if mean is None:
        return (nib.Nifti1Image(mask.astype(np.float32), affine),
                "the mask (the model holds no mean image: it was trained with "
                "standardize=False)")
    values = np.zeros(shape, np.float32)
    values[mask] = mean
    return (nib.Nifti1Image(values, affine),
            "the mean image of the training rows (the mean the model standardized with)")


def _given_background(img, shape, affine):
    """A background given by the user on the maps' grid, resampled there if needed."""
    from nibabel.processing import resample_from_to

    name = str(img.get_filename() or "the background image")
    if img.ndim != 3 and img.shape[3:] != (1,):
        raise ValueError(f"{name}: a background image must be 3D (or 4D of one volume), got "
                         f"shape {img.shape}")
    data = np.nan_to_num(read_data(img).reshape(img.shape[:3]).astype(np.float32))
    about = name
    if not same_grid(data.shape, img.affine, (shape, affine)):
        data = resample_from_to(nib.Nifti1Image(data, img.affine), (tuple(shape), affine),
                                order=1).get_fdata(dtype=np.float32)
        about = f"{name} (resampled linearly to the maps' grid)"
    if not np.any(data):
        raise ValueError(f"{name}: no non-zero voxel on the maps' grid {tuple(shape)} (it lies "
                         "elsewhere in space, or is empty); give a background in the maps' space")
    return nib.Nifti1Image(data, affine), about


def _saved_mean(path: Path, n_features: int) -> np.ndarray | None:
    """The mean of the model's standardization (``mean_`` of model.npz), or None without it."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            mean = npz["mean_"] if "mean_" in npz.files else None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path}: not a plain numeric .npz ({exc})") from None
    if mean is not None and mean.shape != (n_features,):
        raise ValueError(f"{path}: its mean_ has shape {mean.shape}, where {MASK} holds "
                         f"{n_features} voxels: the two files come from different runs")
    return mean


def _image(path: Path) -> nib.Nifti1Image:
    """A run's NIfTI file read whole, with an error naming it (truncated, not NIfTI)."""
    from fgscale.images import read_image

    img, data = read_image(path)
    return nib.Nifti1Image(np.array(data), img.affine)


def _table_section(title: str, values: dict, *, open_: bool = True) -> str:
    return (f"<details{' open' if open_ else ''}><summary>{_esc(title)}</summary>\n"
            f"{_kv_table(values)}\n</details>")


# -------------------------------------------------------------------------------- figures

def _new_figure(width: float, height: float, layout: str | None = "constrained"):
    from matplotlib.figure import Figure  # not pyplot: no global state, no GUI backend

    return Figure(figsize=(width, height), layout=layout)


def _curves_figure(history: list[dict], best: int | None):
    from matplotlib.ticker import MaxNLocator

    fig = _new_figure(10, 3.4)
    loss, score = fig.subplots(1, 2)
    main = [h for h in history if h.get("phase") != "refit"]
    refit = [h for h in history if h.get("phase") == "refit"]
    epochs = [h["epoch"] for h in main]
    loss.plot(epochs, [h["train_loss"] for h in main], label="training")
    if any("val_loss" in h for h in main):
        loss.plot(epochs, [h.get("val_loss", np.nan) for h in main], label="validation")
    if refit:  # a refit of one epoch is a single point, which a line alone does not draw
        loss.plot([h["epoch"] for h in refit], [h["train_loss"] for h in refit], ":",
                  marker="o" if len(refit) == 1 else "", label="refit on all training rows")
    name = next((k for k in ("val_accuracy", "val_r2") if any(k in h for h in main)), None)
    if name is not None:
        score.plot(epochs, [h.get(name, np.nan) for h in main], color="C1")
        score.set_ylabel("validation " + ("accuracy" if name == "val_accuracy" else "R²"))
    else:
        score.text(0.5, 0.5, "no validation split", ha="center", va="center",
                   transform=score.transAxes)
    for ax in (loss, score):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if best is not None:
            ax.axvline(best - 1, color="0.5", linestyle="--", linewidth=1)
    loss.set_ylabel("loss")
    loss.legend()
    return fig


def _confusion_figure(classes: list[str], matrix: list[list[int]]):
    counts = np.asarray(matrix)
    size = 1.5 + 0.45 * len(classes)
    fig = _new_figure(size + 1, size)
    ax = fig.subplots()
    shown = ax.imshow(counts, cmap="Blues")
    for (i, j), n in np.ndenumerate(counts):
        ax.text(j, i, str(n), ha="center", va="center",
                color="white" if n > counts.max() / 2 else "black")
    ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right")
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.colorbar(shown, ax=ax, shrink=0.8)
    return fig


def _predictions_figure(table: Path, target: str = "target"):
    import csv

    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    true = np.array([float(r["target"]) for r in rows])
    pred = np.array([float(r["prediction"]) for r in rows])
    fig = _new_figure(4.2, 4)
    ax = fig.subplots()
    ax.scatter(true, pred, s=12, alpha=0.7)
    ends = [min(true.min(), pred.min()), max(true.max(), pred.max())]
    ax.plot(ends, ends, color="0.5", linewidth=1)
    ax.set_xlabel(f"true {target}")
    ax.set_ylabel(f"predicted {target}")
    return fig


_TOP_PERCENTILE = 80.0  # the strong values of a map, as nilearn's find_xyz_cut_coords takes them


def _peak(data: np.ndarray) -> tuple[int, int, int]:
    """The voxel of largest absolute value (the first one on ties)."""
    return tuple(int(i) for i in np.unravel_index(np.argmax(np.abs(data)), data.shape))


def _strong(values: np.ndarray, where: np.ndarray) -> float:
    """The threshold of a map's strong values: the top-percentile of its non-zero absolute
    ``values`` at ``where`` (0 when none is non-zero)."""
    nonzero = values[where & (values > 0)]
    return float(np.percentile(nonzero, _TOP_PERCENTILE)) if nonzero.size else 0.0


def cut_voxel(data, mask=None) -> tuple[int, int, int]:
    """The voxel where the three slices of a map cross: inside its largest cluster.

    The strong values of the map (an absolute value in the top 20% of the mask's) are kept
    where they lie off the mask's border (the mask eroded by one voxel, or the whole mask
    where that leaves none) and grouped into clusters of face-connected voxels; the
    largest cluster (the stronger one on ties) is the one shown, and the cut is its voxel
    nearest its centre of mass weighted by absolute value, which lies in it even when the
    cluster curves. A single strong voxel at the brain's edge, as a map often has, does not
    take the slices there. nilearn's ``find_xyz_cut_coords`` chooses its cut alike.

    Parameters
    ----------
    data : ndarray of shape grid_shape
        The map, 3D.
    mask : ndarray of shape grid_shape, bool, optional
        The voxels the map is defined on; default those where it is non-zero.

    Returns
    -------
    voxel : tuple of 3 int
        In ``data``'s indices; in ``mask``, and off its border where the mask has an interior.
    """
    from scipy import ndimage

    values = np.abs(np.nan_to_num(np.asarray(data, dtype=np.float64)))
    inside = values > 0 if mask is None else np.asarray(mask, dtype=bool)
    if not inside.any():  # an empty map on an empty mask: the grid's centre
        return tuple(int(n // 2) for n in values.shape)
    core = ndimage.binary_erosion(inside)
    if not core.any():
        core = inside
    threshold = _strong(values, inside)  # the threshold of the values drawn
    labels, n = ndimage.label(core & (values >= threshold) & (values > 0))
    if n:
        index = np.arange(1, n + 1)
        sizes = ndimage.sum_labels(np.ones_like(values), labels, index)
        masses = ndimage.sum_labels(values, labels, index)
        region = labels == index[np.lexsort((masses, sizes))[-1]]
        centre = ndimage.center_of_mass(values * region)
    else:  # every strong value lies on the border: the middle of the mask
        region = core
        centre = ndimage.center_of_mass(core)
    voxels = np.argwhere(region)
    nearest = voxels[np.argmin(((voxels - np.asarray(centre)) ** 2).sum(axis=1))]
    return tuple(int(i) for i in nearest)


def _shown_threshold(data: np.ndarray, mask) -> float:
    """The absolute value below which a map is not drawn over its background."""
    values = np.abs(np.nan_to_num(np.asarray(data, dtype=np.float64)))
    return _strong(values, values > 0 if mask is None else np.asarray(mask.dataobj) != 0)


def _grey_range(values: np.ndarray) -> tuple[float, float]:
    """The grey scale of a background: its non-zero values' 2nd to 98th percentiles, so that a
    few bright voxels do not darken the rest; a constant one (a mask) in light grey."""
    nonzero = values[values != 0]
    if not nonzero.size:
        return 0.0, 1.0
    low, high = (float(v) for v in np.percentile(nonzero, [2, 98]))
    return (low, high) if high > low else (0.0, 1.25 * high if high > 0 else 1.0)


def _matplotlib_slices(img, mask, title: str, background=None):
    """Sagittal, coronal and axial slices through :func:`cut_voxel`, in RAS orientation, over
    ``background`` (an image on the map's grid; default the mask); the cut and the peak named as
    the file's voxels and in mm, which hold whatever the file's orientation."""
    in_file = np.asarray(img.dataobj)
    inside = None if mask is None else np.asarray(mask.dataobj) != 0
    cut_in_file, peak = cut_voxel(in_file, inside), _peak(in_file)
    mm = nib.affines.apply_affine(img.affine, cut_in_file)
    peak_mm = nib.affines.apply_affine(img.affine, peak)
    threshold = _shown_threshold(in_file, mask)
    if background is None:
        background = mask
    img = nib.as_closest_canonical(img)
    data = np.asarray(img.dataobj, dtype=np.float64)
    back = (np.zeros(data.shape) if background is None else
            np.asarray(nib.as_closest_canonical(background).dataobj, dtype=np.float64))
    grey = _grey_range(back)
    cut = tuple(int(i) for i in np.rint(nib.affines.apply_affine(np.linalg.inv(img.affine), mm)))
    vmax = float(np.abs(data).max()) or 1.0
    zooms = img.header.get_zooms()[:3]
    fig = _new_figure(10, 3.2)
    axes = fig.subplots(1, 3)
    # each view: the slice's two remaining axes, shown with x to the right and up as up
    for ax, axis, name in zip(axes, range(3), ("sagittal", "coronal", "axial"), strict=True):
        index = [slice(None)] * 3
        index[axis] = cut[axis]
        plane = data[tuple(index)].T
        rest = [a for a in range(3) if a != axis]
        aspect = zooms[rest[1]] / zooms[rest[0]]
        # zero outside the brain stays the page's white, as nilearn leaves it
        ax.imshow(np.ma.masked_equal(back[tuple(index)].T, 0), cmap="gray", vmin=grey[0],
                  vmax=grey[1], origin="lower", aspect=aspect)
        shown = ax.imshow(np.ma.masked_where((np.abs(plane) < threshold) | (plane == 0), plane),
                          cmap="RdBu_r", vmin=-vmax, vmax=vmax, origin="lower", aspect=aspect)
        ax.set_title(f"{name}, {'xyz'[axis]} = {mm[axis]:.3g} mm", fontsize=9)
        ax.set_axis_off()
    fig.colorbar(shown, ax=list(axes), shrink=0.8)
    fig.suptitle(f"{title} (cut at voxel {cut_in_file} of the file; peak |value| {vmax:.3g} "
                 f"at voxel {peak}, ({', '.join(f'{c:.3g}' for c in peak_mm)}) mm; "
                 f"|value| < {threshold:.2g} not drawn)", fontsize=10)
    return fig


def _nilearn_slices(img, mask, title: str, background=None):
    from nilearn import plotting

    data = np.asarray(img.dataobj)
    inside = None if mask is None else np.asarray(mask.dataobj) != 0
    cut = nib.affines.apply_affine(img.affine, cut_voxel(data, inside))
    fig = _new_figure(10, 3.2, layout=None)  # nilearn places its own axes
    # a background on the maps' own grid, whatever space it is in: nilearn's default, the MNI
    # template, would be wrong for data in another space
    plotting.plot_stat_map(img, bg_img=mask if background is None else background,
                           cut_coords=tuple(cut), figure=fig, title=title, colorbar=True,
                           draw_cross=False, black_bg=False,
                           threshold=_shown_threshold(data, mask) or 1e-12)
    return fig


def _figure(fig, caption: str) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f'<figure><img alt="{_esc(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


# ---------------------------------------------------------------------------------- tables

def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple, dict)):
        return _esc(json.dumps(value))
    return _esc(value)


def _table(header: list, rows: list[list]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>\n"
                   for row in rows)
    return f"<table>\n<tr>{head}</tr>\n{body}</table>"


def _kv_table(values: dict) -> str:
    return _table(["", "value"], [[k, v] for k, v in values.items()])
