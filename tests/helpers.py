"""Helpers shared by the tests: small SYNTHETIC data, stores, groupings, files (import them with
``from helpers import ...``; tests/conftest.py puts this folder on sys.path).

Fixtures live in tests/conftest.py; the ``cuda`` marker (skipped where torch sees no GPU) too.
"""

import contextlib
import csv
import gzip
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from fgscale.images._synthetic import make_classification_volumes
from fgscale.store import write_store

TINY_GRID = (12, 14, 12)  # 605 in-mask voxels: a whole synthetic cohort in milliseconds

# A GPU sums its scatters in no fixed order: equal to float tolerance there.
TOLERANCE = {"cpu": dict(rtol=1e-6, atol=1e-7), "cuda": dict(rtol=1e-4, atol=1e-5)}

# A LocalCluster of our own starts its dashboard on 8787, which another one may hold.
dashboard_port_may_be_taken = pytest.mark.filterwarnings("ignore:Port 8787 is already in use")


# ----------------------------------------------------------------------------- groupings


def random_labels(rng, p, k):
    """A grouping of p features into k clusters, every cluster used, in random order (int32)."""
    return rng.permutation(np.concatenate([np.arange(k), rng.integers(0, k, p - k)])).astype(np.int32)


def dense_phi(labels):
    """The k x p matrix of a grouping, as the method defines it."""
    labels = np.asarray(labels)
    k = labels.max() + 1
    phi = np.zeros((k, labels.size))
    phi[labels, np.arange(labels.size)] = 1.0
    return phi / np.sqrt(phi.sum(1, keepdims=True))


# ------------------------------------------------------------------- smooth synthetic data


def gaussian_blob(shape, centre, width):
    """exp(-|v - centre|^2 / width) at every voxel v of a grid of ``shape``."""
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1)
    return np.exp(-((grid - centre) ** 2).sum(-1) / width)


def smooth_problem(rng, shape=(6, 7, 5), n=120, noise=1.0, width=4.0):
    """Two classes whose difference is a smooth blob, plus white noise (synthetic).

    Returns X (n, p) float32, y ("face" / "house") and the mask (all but one edge of voxels).
    """
    mask = np.ones(shape, bool)
    mask[0, 0, :] = False  # a non-trivial mask
    blob = gaussian_blob(shape, np.array(shape) / 2, width)[mask]
    y = rng.integers(0, 2, n)
    X = np.outer(2 * y - 1, blob) + noise * rng.standard_normal((n, mask.sum()))
    return X.astype(np.float32), np.where(y == 1, "face", "house"), mask


def smooth_cohort(n=90, shape=(8, 9, 7), seed=0):
    """Synthetic: 3 classes of smooth blobs plus white noise on a small grid.

    Returns X (n, p) float32, y ("a" / "b" / "c"), the mask and a random train/test split.
    """
    rng = np.random.default_rng(seed)
    mask = np.ones(shape, bool)
    mask[:2, :2, :] = False
    centres = rng.uniform(0, np.array(shape), size=(3, 3))
    blobs = np.stack([gaussian_blob(shape, c, 8.0)[mask] for c in centres])
    y = rng.integers(0, 3, n)
    X = (2 * blobs[y] + rng.standard_normal((n, mask.sum()))).astype(np.float32)
    split = np.where(rng.random(n) < 0.25, "test", "train")
    return X, np.array(["a", "b", "c"])[y], mask, split


def smooth_samples(mask, n, seed, sigma=1.5, noise=0.3):
    """(n, p) masked samples: white noise smoothed by a Gaussian, unit variance, + white noise."""
    rng = np.random.default_rng(seed)
    vols = [ndimage.gaussian_filter(rng.standard_normal(mask.shape), sigma) for _ in range(n)]
    X = np.stack([v[mask] / v.std() for v in vols])
    return X + noise * rng.standard_normal(X.shape)


# --------------------------------------------------------------------------- stores, files


def synthetic_store(path, n_samples=40, n_classes=4, *, grid=TINY_GRID, n_subjects=None, seed=0,
                    **write_kw):
    """A complete store written from a SYNTHETIC in-memory cohort (make_classification_volumes).

    ``write_kw`` go to :func:`fgscale.store.write_store` (split, classes, groups, attrs,
    block_rows). Returns the Store.
    """
    X, y, mask, affine = make_classification_volumes(n_samples, n_classes, grid=grid,
                                                     n_subjects=n_subjects, seed=seed)
    return write_store(path, X, y, mask, affine, **write_kw)


def mask_img(mask, affine=None):
    """A boolean mask as a uint8 NIfTI image (identity affine unless given)."""
    return nib.Nifti1Image(np.asarray(mask).astype(np.uint8), np.eye(4) if affine is None else affine)


def save_mask(path, mask, affine=None):
    """Save :func:`mask_img` of ``mask`` to ``path``; return the path."""
    nib.save(mask_img(mask, affine), path)
    return path


def assert_weight_map(path, store):
    """``path`` is a weight map of ``store``: a volume per class on its grid, with its affine,
    zero outside the mask and not all zero inside."""
    img = nib.load(path)
    assert img.shape == (*store.mask.shape, len(store.classes))
    np.testing.assert_array_equal(img.affine, store.affine)
    w = np.asarray(img.dataobj)
    assert np.all(w[~store.mask] == 0) and np.any(w[store.mask] != 0)


def cohort_rows(csv_path):
    """The rows of a cohort table, as dicts."""
    with open(csv_path) as f:
        return list(csv.DictReader(f))


def assert_png_not_blank(png) -> np.ndarray:
    """``png`` (a path or the bytes of a file) decodes as a PNG of more than one colour;
    returns its pixels."""
    import io

    from matplotlib import image

    pixels = image.imread(io.BytesIO(png) if isinstance(png, bytes) else png, format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 10 and pixels.shape[1] > 10, pixels.shape
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 1, "a blank image: one colour only"
    return pixels


# ------------------------------------------------------------------------------- scripts

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def assert_same_search(got, want, rtol: float) -> None:
    """Two fitted searches (a parallel one and the sequential one) made the same choice with
    the same numbers: the chosen values, ``cv_results_``, ``cv_scores_``, ``cv_params_``, the
    history's losses, and the weights, floats to ``rtol``."""
    assert (got.alpha_, got.dropout_, got.n_clusters_, got.n_iter_) == (
        want.alpha_, want.dropout_, want.n_clusters_, want.n_iter_)
    assert len(got.cv_results_) == len(want.cv_results_)
    for mine, theirs in zip(got.cv_results_, want.cv_results_, strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            if isinstance(value, float) or (isinstance(value, list) and value
                                             and isinstance(value[0], float)):
                np.testing.assert_allclose(mine[key], value, rtol=rtol, err_msg=key)
            else:
                assert mine[key] == value, key
    assert got.cv_scores_.keys() == want.cv_scores_.keys()
    for key, scores in want.cv_scores_.items():
        np.testing.assert_allclose(got.cv_scores_[key], scores, rtol=rtol, err_msg=key)
    assert got.cv_params_ == want.cv_params_
    assert [{k for k in h if k != "seconds"} for h in got.history_] == [
        {k for k in h if k != "seconds"} for h in want.history_]
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose([h.get(key, np.nan) for h in got.history_],
                                   [h.get(key, np.nan) for h in want.history_],
                                   rtol=rtol, err_msg=key)
    np.testing.assert_allclose(got.coef_, want.coef_, rtol=10 * rtol, atol=1e-6)
    np.testing.assert_allclose(got.intercept_, want.intercept_, rtol=10 * rtol, atol=1e-6)


@contextlib.contextmanager
def load_script(name: str):
    """``scripts/<name>.py`` as a module, as ``python scripts/<name>.py`` runs it: the scripts
    folder on sys.path (for ``import benchlib``, ``import bench_accuracy``) and the module in
    sys.modules (dataclasses look their module up there); both undone on exit."""
    before = set(sys.modules)
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPTS))
        for added in set(sys.modules) - before:  # the script and the scripts it imported
            path = getattr(sys.modules[added], "__file__", None)
            if path and Path(path).parent == SCRIPTS:
                sys.modules.pop(added)


def write_idx(path: Path, data: np.ndarray) -> None:
    """A gzipped IDX file (Fashion-MNIST's format) of unsigned bytes."""
    header = bytes([0, 0, 8, data.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in data.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + data.astype(np.uint8).tobytes())


def kill_once_written(cmd, metrics, lines):
    """Run ``cmd`` and kill it (the trainer and its LocalCluster) once ``metrics`` has
    ``lines`` epochs, or once it ended: however long a loaded machine takes, no number of
    seconds (pytest's timeout stops a command that hangs)."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
                break
            time.sleep(0.02)
    finally:  # a test stopped by pytest's timeout leaves no trainer behind
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def refused(argv, capsys, message):
    """Run ``fgscale argv``: exit status 2 (returned, or argparse's SystemExit), ``message``
    (a regex) in its one error line on stderr, and no traceback; returns that line."""
    from fgscale.cli import main

    capsys.readouterr()
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse refuses a bad option value itself
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, f"status {status}, stderr: {err}"
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"fgscale {argv[0]}: error: ")]
    assert len(lines) == 1, err
    assert re.search(message, lines[0]), f"{message!r} not in {lines[0]!r}"
    return lines[0]


def wait_until_blocked_on_a_lock(proc: subprocess.Popen) -> None:
    """Return once ``proc`` waits for a ``flock`` that another process holds (a blocked lock
    of its pid in /proc/locks): however long a loaded machine takes to get there, no number
    of seconds. Fails if it ends first (killing it, if this wait is interrupted); skips where
    there is no /proc/locks (not Linux)."""
    locks = Path("/proc/locks")
    if not locks.exists():
        pytest.skip("no /proc/locks: whether a process waits for a lock cannot be seen")
    with _killed_if_interrupted(proc):
        while True:
            for line in locks.read_text().splitlines():
                fields = line.split()  # "1: -> FLOCK  ADVISORY  WRITE <pid> <dev>:<inode> 0 EOF"
                if fields[1:3] == ["->", "FLOCK"] and int(fields[5]) == proc.pid:
                    return
            assert proc.poll() is None, f"it ended (status {proc.returncode}) without waiting"
            time.sleep(0.01)


@contextlib.contextmanager
def _killed_if_interrupted(proc: subprocess.Popen):
    """Kill ``proc`` if the block raises (pytest's timeout, say): a process waiting for a lock
    that the test holds would otherwise go on once the test lets go."""
    try:
        yield
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _slow_convert_driver(block_rows: int) -> str:
    """A script converting ``argv[1]`` into ``argv[2]`` on a LocalCluster of one slow thread
    worker (0.25 s per task), so that a test can kill the conversion mid-way."""
    return f"""
import sys, time
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin
from fgscale.store._convert import convert

class Slow(WorkerPlugin):
    def transition(self, key, start, finish, **kwargs):
        if finish == "memory":
            time.sleep(0.25)

if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(Slow())
        convert(sys.argv[1], sys.argv[2], client=client, block_rows={block_rows}, progress=False)
"""


def kill_conversion(table, out, *, block_rows: int, after_blocks: int):
    """Convert ``table`` into ``out`` in a child process (:func:`_slow_convert_driver`) and
    kill it once ``after_blocks`` blocks are done, or once it ended (no number of seconds)."""
    import subprocess
    import time

    import zarr

    driver = Path(out).parent / f"{Path(out).name}.driver.py"
    driver.write_text(_slow_convert_driver(block_rows))
    proc = subprocess.Popen([sys.executable, str(driver), str(table), str(out)])
    done = 0
    try:
        while done < after_blocks and proc.poll() is None:
            time.sleep(0.05)
            try:
                done = int(zarr.open_group(out, mode="r")["done"][:].sum())
            except Exception:  # not created yet, or a flag being written
                continue
    finally:
        proc.kill()
        proc.wait()


def assert_replicas_leave(client, timeout: float = 60.0) -> None:
    """Wait until no worker of ``client``'s cluster runs a replica task of
    :mod:`fgscale.training._replicas` (a cancelled one runs until its thread returns) or is in
    a torch.distributed process group; fail after ``timeout`` seconds."""

    def replicas_here(dask_worker) -> list:  # nested: shipped by value to the workers
        from fgscale.training._replicas import in_process_group

        keys = [str(ts.key) for ts in dask_worker.state.tasks.values()
                if str(ts.key).startswith("serve_replica")]
        return keys + (["process group"] if in_process_group() else [])

    deadline = time.monotonic() + timeout
    while left := {w: r for w, r in client.run(replicas_here).items() if r}:
        assert time.monotonic() < deadline, f"replicas still running after {timeout} s: {left}"
        time.sleep(0.1)
