"""Issue 14's "Bad input" table: every row is an input and the one clear message it must get.

Each row goes through the command line's entry point (``fgscale.cli.main``), on real files:
NIfTI written with nibabel, cohort tables, real Zarr stores and run folders. A refused input
gives exit status 2 and ``fgscale <cmd>: error: <message>`` on stderr, never a traceback. The
inputs are SYNTHETIC (fgscale.images make_cohort, tests/helpers.py synthetic_store).

The last tests fuzz the readers of cohort tables and NIfTI files with hypothesis: whatever the
bytes, they return or raise ValueError / FileNotFoundError, nothing else.
"""

import csv
import gzip
import io
import os
import re
import shutil
import struct
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
import zarr
from helpers import TINY_GRID, dashboard_port_may_be_taken, refused, synthetic_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fgscale.cli import main
from fgscale.images import load_img, read_cohort, read_header, read_image
from fgscale.images._synthetic import make_cohort

pytestmark = dashboard_port_may_be_taken

P = 605  # in-mask voxels of a TINY_GRID store
FAST = ["--n-workers", "1", "--no-progress", "--n-groupings", "2", "--n-bootstrap", "5",
        "--n-clusters", "20", "--max-epochs", "1", "--batch-size", "8", "--learning-rate",
        "0.05", "--cv", "none"]  # one split: the run folder's checkpoint.pt


def write_table(path, header, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """A SYNTHETIC cohort: 12 3D files, 3 classes, 3 subjects; rows [path, label, group, split]
    with absolute paths. Read-only."""
    table = make_cohort(tmp_path_factory.mktemp("cohort"), n_samples=12, n_classes=3,
                        grid=TINY_GRID, n_subjects=3, seed=0)
    with open(table) as f:
        return [[str(table.parent / r["path"]), r["label"], r["group"], r["split"]]
                for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A complete SYNTHETIC store (40 rows, 4 classes, p=605). Read-only: copy it to change it."""
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    return synthetic_store(tmp_path_factory.mktemp("store") / "s.zarr", 40, 4, n_subjects=5,
                           seed=0, split=split, block_rows=8).path


def copy_store(store, tmp_path, name="copy.zarr"):
    out = tmp_path / name
    shutil.copytree(store, out)
    return out


# ------------------------------------------------------------------------- cohort tables

def _no_path(rows, tmp):
    return write_table(tmp / "t.csv", ["file", "label"], [r[:2] for r in rows])


def _no_label(rows, tmp):
    return write_table(tmp / "t.csv", ["path", "group"], [[r[0], r[2]] for r in rows])


def _twice(rows, tmp):
    return write_table(tmp / "t.csv", ["path", "label"], [r[:2] for r in rows] + [rows[0][:2]])


def _bad_split(rows, tmp):
    return write_table(tmp / "t.csv", ["path", "label", "split"],
                       [[*r[:2], "valid"] for r in rows])


def _missing_file(rows, tmp):
    return write_table(tmp / "t.csv", ["path", "label"],
                       [r[:2] for r in rows] + [[str(tmp / "gone.nii.gz"), "class_0"]])


def _text_file(suffix):
    def make(rows, tmp):
        (tmp / f"notes{suffix}").write_text("subject 3 was scanned twice\n")
        return write_table(tmp / "t.csv", ["path", "label"],
                           [r[:2] for r in rows] + [[str(tmp / f"notes{suffix}"), "class_0"]])
    return make


def _truncated(rows, tmp):
    raw = open(rows[0][0], "rb").read()
    (tmp / "cut.nii.gz").write_bytes(raw[:len(raw) // 2])
    return write_table(tmp / "t.csv", ["path", "label"],
                       [r[:2] for r in rows[1:]] + [[str(tmp / "cut.nii.gz"), rows[0][1]]])


def _nan_in_mask(rows, tmp):
    img = nib.load(rows[0][0])
    data = np.asarray(img.dataobj, np.float32).copy()
    data[6, 7, 6] = np.nan
    nib.save(nib.Nifti1Image(data, img.affine), tmp / "nan.nii.gz")
    mask = np.zeros(img.shape[:3], np.uint8)
    mask[4:9, 4:9, 4:9] = 1
    nib.save(nib.Nifti1Image(mask, img.affine), tmp / "mask.nii.gz")
    return write_table(tmp / "t.csv", ["path", "label"],
                       [r[:2] for r in rows[1:]] + [[str(tmp / "nan.nii.gz"), rows[0][1]]])


def _all_zero(rows, tmp):
    img = nib.load(rows[3][0])  # a failed contrast among good ones
    nib.save(nib.Nifti1Image(np.zeros(img.shape, np.float32), img.affine), tmp / "zero.nii.gz")
    return write_table(tmp / "t.csv", ["path", "label"],
                       [r[:2] for r in rows[:3] + rows[4:]] + [[str(tmp / "zero.nii.gz"), rows[3][1]]])


def _odd_voxels(kind):
    def make(rows, tmp):
        img = nib.load(rows[0][0])
        data = np.asarray(img.dataobj, np.float32)
        if kind == "rgb":  # an RGB overlay where a statistical map was meant
            voxels = np.zeros(data.shape, [("R", "u1"), ("G", "u1"), ("B", "u1")])
        else:  # a complex reconstruction: numpy would drop the imaginary part silently
            voxels = data.astype(np.complex64)
        nib.save(nib.Nifti1Image(voxels, img.affine), tmp / "odd.nii.gz")
        return write_table(tmp / "t.csv", ["path", "label"],
                           [r[:2] for r in rows[1:]] + [[str(tmp / "odd.nii.gz"), rows[0][1]]])
    return make


def _zero_voxel_size(rows, tmp):
    """A header whose sform holds zeros (voxel size 0): resampling it raised nibabel's
    'Could not decompose affine' traceback."""
    raw = bytearray(gzip.decompress(open(rows[0][0], "rb").read()))
    struct.pack_into("<hh", raw, 252, 0, 1)  # qform_code 0, sform_code 1
    struct.pack_into("<12f", raw, 280, *[0.0] * 12)  # srow_x, srow_y, srow_z
    (tmp / "flat.nii.gz").write_bytes(gzip.compress(bytes(raw)))
    return write_table(tmp / "t.csv", ["path", "label"],
                       [r[:2] for r in rows[1:]] + [[str(tmp / "flat.nii.gz"), rows[0][1]]])


def _same_file_by_a_link(rows, tmp):
    """A symlink to a listed image, as a test row of another class: the same image trained on
    and tested on, accepted as two files."""
    os.symlink(rows[0][0], tmp / "link.nii.gz")
    return write_table(tmp / "t.csv", ["path", "label", "split"],
                       [[*r[:2], "train"] for r in rows] + [[str(tmp / "link.nii.gz"), "class_1",
                                                             "test"]])


def _same_file_by_dotdot(rows, tmp):
    (tmp / "sub").mkdir()
    again = str(tmp / "sub" / ".." / os.path.relpath(rows[0][0], tmp))
    return write_table(tmp / "t.csv", ["path", "label"], [r[:2] for r in rows] + [[again, "x"]])


def _first_file_moved(rows, tmp):
    """The first image alone on another affine: the message blamed the second, a good file, as
    not matching 'the first image's grid'."""
    img = nib.load(rows[0][0])
    affine = img.affine.copy()
    affine[0, 3] += 4
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj, np.float32), affine), tmp / "moved.nii.gz")
    return write_table(tmp / "t.csv", ["path", "label"],
                       [[str(tmp / "moved.nii.gz"), rows[0][1]]] + [r[:2] for r in rows[1:]])


def _labels_as_float_text(rows, tmp):
    """Labels 1 and 1.0 (a column written as floats in part): two classes, said nowhere."""
    return write_table(tmp / "t.csv", ["path", "label"],
                       [[r[0], "1" if i < 6 else "1.0"] if r[1] == "class_0" else [r[0], "2"]
                        for i, r in enumerate(rows)])


def _no_path_in_a_row(rows, tmp):
    """A row of empty cells (a spreadsheet's trailing ',,'): 'missing label for <folder>'."""
    return write_table(tmp / "t.csv", ["path", "label"], [r[:2] for r in rows] + [["", ""]])


COHORT_ROWS = {  # name: (the table, the message)
    "no path column": (_no_path, r"t\.csv: cohort table lacks column\(s\) \['path'\]; expected "
                                 r"path,label"),
    "neither label nor target": (_no_label, r"t\.csv: cohort table has neither a 'label' nor a "
                                            r"'target' column"),
    "a file listed twice": (_twice, r"t\.csv:14: .*synthetic_00000\.nii\.gz is listed again "
                                    r"\(first at .*t\.csv:2\)"),
    "a symlink to a listed file": (_same_file_by_a_link, r"t\.csv:14: .*link\.nii\.gz is listed "
                                   r"again \(the same file as .*synthetic_00000\.nii\.gz\) "
                                   r"\(first at .*t\.csv:2\)"),
    "a listed file through ..": (_same_file_by_dotdot, r"t\.csv:14: .*sub/\.\./.* is listed "
                                                       r"again \(the same file as "),
    "the first image on another grid": (_first_file_moved, r"t\.csv:2: .*moved\.nii\.gz: grid "
                                        r".* does not match the majority's grid .* \(11 of 12 "
                                        r"images, e\.g\. .*synthetic_00001\.nii\.gz; "),
    "labels 1 and 1.0": (_labels_as_float_text, r"t\.csv:\d+: label '1\.0' and label '1' \(at "
                                                r".*t\.csv:2\) are one number written two ways"),
    "a row without a path": (_no_path_in_a_row, r"t\.csv:14: missing path; expected the NIfTI "
                                                r"file of the row"),
    "unknown split": (_bad_split, r"t\.csv:2: split 'valid' for .*; expected 'train', 'test' "
                                  r"or empty"),
    "missing file": (_missing_file, r"gone\.nii\.gz: no such NIfTI file"),
    "text file as .nii.gz": (_text_file(".nii.gz"), r"notes\.nii\.gz: not a readable NIfTI "
                                                    r"image"),
    "text file as .nii": (_text_file(".nii"), r"notes\.nii: not a readable NIfTI image"),
    "truncated .nii.gz": (_truncated, r"cut\.nii\.gz: cannot read the image data, the file is "
                                      r"truncated or corrupt"),
    "NaN inside the mask (--nan error, the default)": (
        _nan_in_mask, r"nan\.nii\.gz \(volume 0\): 1 NaN/inf values inside the mask; fix the "
                      r"file or convert with --nan zero"),
    "an all-zero image": (_all_zero, r"zero\.nii\.gz \(volume 0\): no voxel is finite and "
                                     r"non-zero \(all zero or NaN\), so no voxel is in every image: "
                                     r"drop it, or give --mask"),
    "RGB voxels": (_odd_voxels("rgb"), r"t\.csv:13: .*odd\.nii\.gz: voxels of type .*\(not one "
                                       r"number\); expected one real number per voxel"),
    "complex voxels": (_odd_voxels("complex"), r"odd\.nii\.gz: voxels of type complex64 "
                                               r"\(complex numbers\)"),
    "voxel size 0": (_zero_voxel_size, r"flat\.nii\.gz: affine .* is not an invertible "
                                       r"voxel-to-world matrix"),
}


@pytest.mark.parametrize("row", COHORT_ROWS)
def test_convert_refuses_a_bad_cohort(row, cohort, tmp_path, capsys):
    make, message = COHORT_ROWS[row]
    table = make(cohort, tmp_path)
    extra = ["--mask", tmp_path / "mask.nii.gz"] if (tmp_path / "mask.nii.gz").exists() else []
    refused(["convert", table, "--out", tmp_path / "s.zarr", "--n-workers", "1",
             "--no-progress", *extra], capsys, message)
    assert not (tmp_path / "s.zarr" / "zarr.json").exists() or not zarr.open_group(
        str(tmp_path / "s.zarr")).attrs.get("complete")


@pytest.mark.parametrize("option, message", [
    (["--block-rows", "0"], r"argument --block-rows: expected a positive integer, got '0'"),
    (["--block-rows", "-5"], r"argument --block-rows: expected a positive integer, got '-5'"),
    (["--resample", "abc"], r"argument --resample: expected a voxel size in mm \(a positive "
                            r"number\) or 'mask', got 'abc'"),
    (["--resample", "-1"], r"argument --resample: expected a voxel size in mm"),
    (["--timeout", "-1"], r"argument --timeout: expected a positive number, got '-1'"),
    (["--n-workers", "0"], r"argument --n-workers: expected a positive integer, got '0'"),
    (["--intersect-mask"], r"intersect_mask \(--intersect-mask\) intersects a given mask "
                           r"\(--mask\) with the computed one: give the mask"),
], ids=["block-rows 0", "block-rows -5", "resample abc", "resample -1", "timeout -1",
        "n-workers 0", "intersect-mask without a mask"])
def test_convert_refuses_a_bad_option_value_and_makes_nothing(option, message, cohort, tmp_path,
                                                              capsys):
    """Named by their option: --block-rows 0 was taken as the default, -5 failed in zarr and
    left a half-made store, --resample abc said only "could not convert string to float",
    --intersect-mask without --mask was ignored."""
    table = write_table(tmp_path / "t.csv", ["path", "label"], [r[:2] for r in cohort])
    refused(["convert", table, "--out", tmp_path / "s.zarr", "--no-progress", *option], capsys,
            message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_a_cohort_table_with_labels_or_files_is_refused_as_a_table(cohort, tmp_path, capsys):
    """A table given with --labels, or beside image files, was read as one more image, its
    labels counted against it ("got 12 labels for 1 files")."""
    table = write_table(tmp_path / "t.csv", ["path", "label"], [r[:2] for r in cohort])
    (tmp_path / "labels.txt").write_text("\n".join(r[1] for r in cohort) + "\n")
    message = (r"t\.csv: a cohort table is given alone, its labels in its own column; labels "
               r"\(--labels\) go with a list of NIfTI files or globs")
    for extra in (["--labels", tmp_path / "labels.txt"], [cohort[0][0]]):
        refused(["convert", table, *extra, "--out", tmp_path / "s.zarr", "--no-progress"],
                capsys, message)
    refused(["convert", cohort[0][0], cohort[1][0], "--out", tmp_path / "s.zarr"], capsys,
            r"a list of files or globs needs labels \(--labels FILE: one per line")
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("block_rows", [0, -5, 2.5])
def test_convert_in_python_refuses_a_bad_block_rows(block_rows, cohort, tmp_path):
    from fgscale.store import convert

    table = write_table(tmp_path / "t.csv", ["path", "label"], [r[:2] for r in cohort])
    with pytest.raises(ValueError, match="block_rows must be a positive integer"):
        convert(table, tmp_path / "s.zarr", block_rows=block_rows, n_workers=1, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.parametrize("make", [_truncated, _nan_in_mask], ids=["truncated", "NaN"])
def test_a_failed_conversion_task_prints_no_worker_traceback(make, cohort, tmp_path):
    """In a process of its own (the workers' logs reach its stderr, which capsys cannot see): a
    task that fails on a worker is reported once by fgscale, not logged with its traceback."""
    table = make(cohort, tmp_path)
    extra = ["--mask", str(tmp_path / "mask.nii.gz")] if make is _nan_in_mask else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    done = subprocess.run([sys.executable, "-m", "fgscale", "convert", str(table), "--out",
                           str(tmp_path / "s.zarr"), "--n-workers", "1", "--no-progress", *extra],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Compute Failed" not in done.stderr, done.stderr
    assert re.search(r"fgscale convert: error: .*(cut|nan)\.nii\.gz", done.stderr), done.stderr


def test_nan_zero_converts_what_nan_error_refuses(cohort, tmp_path, capsys):
    table = _nan_in_mask(cohort, tmp_path)
    args = ["convert", table, "--out", tmp_path / "s.zarr", "--n-workers", "1", "--no-progress",
            "--mask", tmp_path / "mask.nii.gz"]
    refused(args, capsys, "NaN/inf values inside the mask")
    assert main([str(a) for a in args] + ["--nan", "zero"]) == 0


@pytest.mark.parametrize("labels, message", [
    (lambda r: "same", r"the training rows hold 1 class \(\['same'\]\); classification needs at "
                       "least 2"),
    # class_2 only on test rows: the training rows miss a class the store has
    (lambda r: "class_2" if r[3] == "test" else r[1].replace("class_2", "class_0"),
     r"s\.zarr: no training row of class\(es\) \['class_2'\], which the store has: the model "
     "could never predict them"),
    # every row held out: it said "the training rows hold 0 class ([])"
    (lambda r: r[1], r"s\.zarr: no training rows, every row's split is 'test'; expected some "
                     r"rows of split 'train' \(or empty\)"),
], ids=["a single class", "a class on test rows only", "no training row"])
def test_train_refuses_a_store_whose_training_rows_lack_classes(labels, message, cohort, tmp_path,
                                                                 capsys):
    every_test = "every row's split" in message
    table = write_table(tmp_path / "t.csv", ["path", "label", "group", "split"],
                        [[r[0], labels(r), r[2], "test" if every_test else r[3]]
                         for r in cohort])
    out = tmp_path / "s.zarr"
    # the store converts: nothing is wrong with the images
    assert main(["convert", str(table), "--out", str(out), "--n-workers", "1",
                 "--no-progress"]) == 0
    refused(["train", out, "--out", tmp_path / "run", *FAST], capsys, message)
    assert not (tmp_path / "run" / "config.json").exists()


# ------------------------------------------------------------------ estimator parameters

@pytest.mark.parametrize("option, message", [
    (["--n-clusters", str(P + 1)], rf"n_clusters must be at most the number of features, {P}, "
                                   rf"got {P + 1}"),
    (["--n-clusters", "0"], r"argument --n-clusters: expected an int >= 1 .* got '0'"),
    (["--n-groupings", "0"], r"argument --n-groupings: expected an int in the range \[1, inf\), "
                             "got '0'"),
    (["--max-epochs", "0"], r"argument --max-epochs: expected an int in the range \[1, inf\), "
                            "got '0'"),
    (["--device", "mps"], r"device='mps': this torch .* cannot hold a model there \(use "
                          r"device='cpu'"),
    (["--device", "tpu"], r"device must name a torch device \('cpu', 'cuda', 'cuda:1'\), got "
                          "'tpu'"),
], ids=["k > p", "k = 0", "b = 0", "max-epochs 0", "mps", "tpu"])
def test_train_refuses_a_bad_parameter(option, message, store, tmp_path, capsys):
    refused(["train", store, "--out", tmp_path / "run", *FAST, *option], capsys, message)
    assert not (tmp_path / "run" / "config.json").exists()


def test_more_bootstrap_rows_than_training_rows_is_accepted(store, tmp_path, capsys):
    """r draws training rows WITH replacement: r above the 32 training rows is legitimate."""
    assert main([str(a) for a in ["train", store, "--out", tmp_path / "run", *FAST,
                                  "--n-bootstrap", "1000"]]) == 0
    assert (tmp_path / "run" / "model.json").exists()
    assert "test accuracy" in capsys.readouterr().out


# ------------------------------------------------------------------------------- stores

def test_a_store_of_a_newer_format_is_refused(store, tmp_path, capsys):
    newer = copy_store(store, tmp_path)
    zarr.open_group(str(newer), mode="r+").attrs["fgscale_format_version"] = 99
    message = (r"copy\.zarr: store format version 99 was written by a newer fgscale; this one "
               "reads version 1: upgrade fgscale")
    refused(["train", newer, "--out", tmp_path / "run", *FAST], capsys, message)
    refused(["export", newer, "--out", tmp_path / "o.nii.gz", "--omega"], capsys, message)


@pytest.mark.parametrize("what", ["folder", "file", "missing"])
def test_a_path_that_is_not_a_store_is_refused(what, tmp_path, capsys):
    path = tmp_path / "notes"
    if what == "folder":
        path.mkdir()
        (path / "a.txt").write_text("x")
    elif what == "file":
        path.write_text("x")
    message = {"folder": r"notes: not a Zarr group", "file": r"notes: a file, not a store folder",
               "missing": r"notes: no such store \(create one with fgscale convert\)"}[what]
    refused(["train", path, "--out", tmp_path / "run", *FAST], capsys, message)


def test_a_string_X_is_refused_never_decoded(store, tmp_path, capsys):
    """zarr 3 has no object dtype; its variable-length strings are the nearest: X of strings."""
    odd = copy_store(store, tmp_path)
    g = zarr.open_group(str(odd), mode="r+")
    n, p = g["X"].shape
    del g["X"]
    g.create_array("X", shape=(n, p), dtype=str)[:] = np.full((n, p), "x")
    message = r"copy\.zarr: array X has dtype .* expected float32 of shape \(n_samples, n_feat"
    refused(["train", odd, "--out", tmp_path / "run", *FAST], capsys, message)
    np.save(tmp_path / "v.npy", np.ones(p, np.float32))
    refused(["export", odd, "--out", tmp_path / "o.nii.gz", "--npy", tmp_path / "v.npy"],
            capsys, message)


def test_a_bank_of_another_p_is_refused(store, tmp_path, capsys):
    """A bank folder copied from a store of another grid (same rows, same parameters, so the
    same key) into this one."""
    other = synthetic_store(tmp_path / "other.zarr", 40, 4, grid=(10, 12, 10), n_subjects=5,
                            seed=0, split=np.where(np.arange(40) % 5 == 0, "test", "train"),
                            block_rows=8).path
    bank = ["--n-groupings", "2", "--n-bootstrap", "5", "--n-clusters", "20", "--n-workers",
            "1", "--no-progress"]
    assert main(["bank", str(other), *bank]) == 0
    target = copy_store(store, tmp_path)
    for bank_folder in (other / "banks").iterdir():
        if bank_folder.is_dir():
            shutil.rmtree(target / "banks" / bank_folder.name, ignore_errors=True)
            shutil.copytree(bank_folder, target / "banks" / bank_folder.name)
    refused(["bank", target, *bank], capsys,
            rf"bank '.*' holds .* on \d+ features, asked .* on {P}; rebuild it with overwrite")


def test_a_npy_of_objects_is_refused_never_unpickled(store, tmp_path, capsys):
    np.save(tmp_path / "v.npy", np.array([{"a": 1}] * P, dtype=object), allow_pickle=True)
    line = refused(["export", store, "--out", tmp_path / "o.nii.gz", "--npy", tmp_path / "v.npy"],
                   capsys, r"v\.npy: not a \.npy array of numbers \(an array of objects, never "
                           r"unpickled\)$")
    # a table, an .npz: not .npy files, said so, never numpy's advice to unpickle "unsafely"
    (tmp_path / "t.npy").write_text("path,label\n")
    np.savez(tmp_path / "v.npz", values=np.zeros(P))
    for name in ("t.npy", "v.npz"):
        line += refused(["export", store, "--out", tmp_path / "o.nii.gz", "--npy", tmp_path / name],
                        capsys, rf"{name}: not a \.npy file \(numpy\.save's format\); expected "
                                r"an array of shape \(p,\) or \(n, p\)$")
    assert "unsafe" not in line and "allow_pickle" not in line


@pytest.mark.parametrize("name", ["x.png", "x", "x.nii.zip"])
def test_export_refuses_a_non_nifti_output_name(name, store, tmp_path, capsys):
    np.save(tmp_path / "v.npy", np.ones(P, np.float32))
    refused(["export", store, "--out", tmp_path / name, "--npy", tmp_path / "v.npy"], capsys,
            rf"{re.escape(name)}: expected a NIfTI file name ending in \.nii or \.nii\.gz")
    assert not (tmp_path / name).exists()
    assert main(["export", str(store), "--out", str(tmp_path / "x.nii.gz"), "--npy",
                 str(tmp_path / "v.npy")]) == 0
    assert nib.load(tmp_path / "x.nii.gz").shape == TINY_GRID


def test_an_output_whose_folder_is_a_file_is_refused_first(cohort, store, tmp_path, capsys):
    """--out under a path that is a file: convert said so only after its header pass and mask,
    naming its temporary folder ('[Errno 20] Not a directory: s.zarr.creating'); export and
    report with a bare OSError ('[Errno 17] File exists: taken')."""
    taken = tmp_path / "taken"
    taken.write_text("a file where a folder was meant")
    table = write_table(tmp_path / "t.csv", ["path", "label"], [r[:2] for r in cohort])
    refused(["convert", table, "--out", taken / "s.zarr", "--no-progress"], capsys,
            r"taken/s\.zarr: its folder .*taken cannot be created or written; choose another "
            r"--out; nothing converted$")
    refused(["export", store, "--out", taken / "o.nii.gz", "--omega"], capsys,
            r"taken/o\.nii\.gz: its folder .*taken cannot be created or written; choose "
            r"another --out; nothing exported$")
    assert taken.read_text() == "a file where a folder was meant"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "taken"]


# ---------------------------------------------------------------------------- run folders

def test_resume_on_an_edited_config_is_refused_by_name(store, tmp_path, capsys):
    """A config.json that is JSON but not fgscale's (edited by hand): KeyError: 'params'."""
    run = tmp_path / "run"
    assert main([str(a) for a in ["train", store, "--out", run, *FAST]]) == 0
    (run / "config.json").write_text('{"a": 1}')
    refused(["train", store, "--out", run, *FAST, "--resume"], capsys,
            r"run/config\.json: not a valid run configuration \(no field 'params'\); it was "
            r"edited or is not fgscale's")


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_folder_that_is_not_a_run_is_refused(command, store, tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    extra = ["--out", tmp_path / "p.csv"] if command == "predict" else ["--n-workers", "1"]
    refused([command, tmp_path / "notes", store, *extra, "--no-progress"], capsys,
            r"notes: not a run folder \(no config\.json or model\.json\); expected the --out "
            "folder of fgscale train")


def test_resume_with_other_parameters_or_a_foreign_checkpoint_is_refused(store, tmp_path,
                                                                         capsys):
    run = tmp_path / "run"
    assert main(["train", str(store), "--out", str(run), *FAST]) == 0
    changed = [*FAST[:-8], "--n-clusters", "30", *FAST[-6:]]
    refused(["train", store, "--out", run, *changed, "--resume"], capsys,
            r"run: --resume with other parameters than the saved run \(n_clusters: saved 20, "
            r"given 30; see .*config\.json\)")
    refused(["train", store, "--out", run, *FAST], capsys,
            r"run: a finished run already exists there; choose another --out \(--resume "
            r"with a larger --max-epochs trains it further\)")
    # another store (other rows, here another split) is refused before anything is rewritten;
    # a copy of the run's own store resumes (a moved store keeps its identity)
    config = (run / "config.json").read_text()
    other_split = synthetic_store(tmp_path / "o.zarr", 40, 4, n_subjects=5, seed=0,
                                  split=np.where(np.arange(40) % 4 == 0, "test", "train")).path
    refused(["train", other_split, "--out", run, *FAST, "--resume"], capsys,
            r"run: --resume on another store than the run's \(.*s\.zarr\): give that store, "
            "or another --out")
    assert (run / "config.json").read_text() == config
    assert main(["train", str(copy_store(store, tmp_path)), "--out", str(run), *FAST,
                 "--resume"]) == 0
    assert "already complete" in capsys.readouterr().out
    # the run's own store path, converted again with another split: it named that same path as
    # "another store than the run's (...again.zarr): give that store"
    reconverted = copy_store(store, tmp_path, "again.zarr")
    assert main(["train", str(reconverted), "--out", str(tmp_path / "run2"), *FAST]) == 0
    shutil.rmtree(reconverted)
    shutil.copytree(other_split, reconverted)
    refused(["train", reconverted, "--out", tmp_path / "run2", *FAST, "--resume"], capsys,
            r"run2: --resume on .*again\.zarr, which no longer holds the run's rows, labels, "
            r"split, groups and mask \(it was converted again since\)")
    # a checkpoint of another run (other k) in a run folder whose run never finished
    other = tmp_path / "other"
    assert main(["train", str(store), "--out", str(other), *changed]) == 0
    for name in ("final.json", "model.json", "model.npz"):
        (other / name).unlink()
    refused(["train", store, "--out", other, *changed], capsys,
            r"other: an unfinished run exists there; pass --resume to continue it")
    shutil.copy(run / "checkpoint.pt", other / "checkpoint.pt")
    refused(["train", store, "--out", other, *changed, "--resume"], capsys,
            r"other/checkpoint\.pt: saved with other parameters \(n_clusters\); use a new run "
            "folder")
    # a checkpoint holding something else than tensors and numbers: refused, never unpickled
    import pathlib

    import torch

    torch.save({"epoch": 1, "model": pathlib.PurePosixPath("/etc")}, other / "checkpoint.pt")
    refused(["train", store, "--out", other, *changed, "--resume"], capsys,
            r"other/checkpoint\.pt: the checkpoint holds objects other than plain tensors and "
            r"numbers: refused unread")
    # one cut short (a run killed while the disk was full) is said to be damaged, not foreign
    raw = (run / "checkpoint.pt").read_bytes()
    (other / "checkpoint.pt").write_bytes(raw[:len(raw) // 2])
    refused(["train", store, "--out", other, *changed, "--resume"], capsys,
            r"other/checkpoint\.pt: the checkpoint is cut short or damaged: unreadable "
            r"\(\w+\); delete it to restart the run")


# ---------------------------------------------------------------------------------- fuzz

CELLS = st.one_of(st.text(max_size=12), st.sampled_from(
    ["path", "label", "target", "group", "split", "train", "test", "TEST", "", " ", "nan", "inf",
     "-1e308", "1e999", "3.5", '"', '""', "a,b", "é", "\u2028", "\x00", "\ufeffpath", "\t"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(header=st.lists(CELLS, max_size=6), rows=st.lists(st.lists(CELLS, max_size=7), max_size=6),
       quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
       blank_lines=st.booleans(), suffix=st.sampled_from([".csv", ".tsv"]),
       raw=st.one_of(st.none(), st.binary(max_size=200)))
def test_fuzz_cohort_tables_give_entries_or_a_value_error(tmp_path, header, rows, quoting,
                                                          blank_lines, suffix, raw):
    table = tmp_path / f"fuzz{suffix}"
    if raw is not None:
        table.write_bytes(raw)
    else:
        text = io.StringIO()
        writer = csv.writer(text, delimiter="\t" if suffix == ".tsv" else ",", quoting=quoting)
        for row in [header, *rows]:
            writer.writerow(row)
            if blank_lines:
                text.write("\r\n")
        table.write_text(text.getvalue(), encoding="utf-8")
    try:
        entries = read_cohort(table)
    except (ValueError, FileNotFoundError) as exc:
        assert str(table) in str(exc)  # the message names the table
        return
    assert entries and all(set(e) >= {"path", "label", "target", "group", "split", "where"}
                           for e in entries)


# NIfTI-1 header fields (byte offset, struct format): sizeof_hdr, dims, datatype, bitpix,
# vox_offset, scl_slope, scl_inter, qform and sform codes, srow_x
FIELDS = {"sizeof_hdr": (0, "<i"), "dim0": (40, "<h"), "dim1": (42, "<h"), "dim3": (46, "<h"),
          "dim5": (50, "<h"), "datatype": (70, "<h"), "bitpix": (72, "<h"),
          "pixdim1": (80, "<f"), "vox_offset": (108, "<f"), "scl_slope": (112, "<f"),
          "scl_inter": (116, "<f"), "qform_code": (252, "<h"), "sform_code": (254, "<h"),
          "srow_x0": (280, "<f")}


def _valid_nifti(shape, dtype, affine):
    data = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape).astype(dtype)
    img = nib.Nifti1Image(data, affine)
    return img.to_bytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=5),
       dtype=st.sampled_from([np.uint8, np.int16, np.int32, np.float32, np.float64, np.complex64]),
       affine_nan=st.booleans(), cut=st.one_of(st.none(), st.floats(0, 1)),
       flip=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.integers(0, 255))),
       gz=st.booleans(), junk=st.one_of(st.none(), st.binary(max_size=400)),
       poke=st.one_of(st.none(), st.tuples(st.sampled_from(sorted(FIELDS)), st.integers(-2**31, 2**31 - 1),
                                           st.sampled_from([0.0, -1.0, 1e30, np.nan, np.inf]))))
def test_fuzz_nifti_files_load_or_give_a_value_error(tmp_path, shape, dtype, affine_nan, cut, flip,
                                                     gz, junk, poke):
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    if affine_nan:
        affine[0, 3] = np.nan
    raw = junk if junk is not None else _valid_nifti(tuple(shape), dtype, affine)
    if poke is not None and junk is None:  # one header field set to an odd value
        offset, fmt = FIELDS[poke[0]]
        value = poke[2] if fmt == "<f" else int(np.clip(poke[1], *({"<h": (-2**15, 2**15 - 1)}.get(
            fmt, (-2**31, 2**31 - 1)))))
        raw = raw[:offset] + struct.pack(fmt, value) + raw[offset + struct.calcsize(fmt):]
    if flip is not None and flip[0] < len(raw):  # one byte of the header or data changed
        raw = raw[:flip[0]] + bytes([flip[1]]) + raw[flip[0] + 1:]
    if gz:
        raw = gzip.compress(raw)
    if cut is not None:
        raw = raw[:int(len(raw) * cut)]
    path = tmp_path / ("fuzz.nii.gz" if gz else "fuzz.nii")
    path.write_bytes(raw)
    for read in (read_header, read_image, load_img):
        try:
            read(path)
        except (ValueError, FileNotFoundError) as exc:
            assert str(exc)


def test_a_npy_of_another_shape_is_refused_naming_it_and_the_store(store, tmp_path, capsys):
    """A weight array saved from another model (other voxels), or with an extra axis."""
    np.save(tmp_path / "w.npy", np.ones((3, P - 1), np.float32))
    refused(["export", store, "--out", tmp_path / "o.nii.gz", "--npy", tmp_path / "w.npy"],
            capsys, rf"w\.npy: an array of shape \(3, {P - 1}\); expected \({P},\) or \(n, {P}\), "
                    rf"a value per voxel of the mask of .*s\.zarr \({P} voxels\)$")
    assert not (tmp_path / "o.nii.gz").exists()
