"""What fgscale writes reaches the disk before anything claims it: the system calls of real
commands, traced with strace (a machine's crash, power lost, cannot be made in a test; what
survives one is what was flushed, and in which order).

The order checked, for every file fgscale writes whole and every part of a store that a flag
claims: the bytes are flushed (``fsync``) before the rename that puts them in place, the folder
after it, and a ``done`` or ``complete`` flag only after the data it claims, then flushed
itself. Skipped where strace is missing or cannot trace (a container without ptrace).
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zarr

from fgscale.store import open_store

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

_CALL = re.compile(r"^(\d+) +(fsync|rename|renameat|renameat2)\((.*)")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD_PATH = re.compile(r"^\d+<(.*?)>")


def traced(command: list[str], log: Path, cwd: Path) -> list[tuple[str, str, str]]:
    """Run ``command`` under strace; its fsync and rename calls in the order they began, each
    ``("fsync", path, "")`` or ``("rename", source, destination)``, paths made absolute."""
    strace = ["strace", "-f", "-qq", "-y", "-s", "4096", "-e", "signal=none",
              "-e", "trace=fsync,rename,renameat,renameat2", "-o", str(log)]
    probe = subprocess.run([*strace, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.strip()[-300:]}")
    done = subprocess.run([*strace, *command], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = []
    for line in log.read_text().splitlines():
        match = _CALL.match(line)
        if match is None:  # the rest of a call another thread interrupted ("<... resumed>")
            continue
        name, args = match.group(2), match.group(3)
        if name == "fsync":
            path = _FD_PATH.match(args)
            if path:
                calls.append(("fsync", path.group(1), ""))
        else:
            source, destination = _QUOTED.findall(args)[:2]
            calls.append(("rename", str(cwd / source), str(cwd / destination)))
    return calls


def first(calls, kind: str, path, start: int = 0) -> int:
    """Index of the first call ``kind`` on ``path`` (an fsync's file, a rename's destination)
    from ``start``; -1 if none."""
    key = 1 if kind == "fsync" else 2
    return next((i for i in range(start, len(calls))
                 if calls[i][0] == kind and calls[i][key] == str(path)), -1)


def check_renames(calls, under: Path, ours: re.Pattern) -> int:
    """Every rename of a temporary name of ours (``ours`` matches its file name) into ``under``
    follows an fsync of that temporary file and precedes an fsync of its folder; the count."""
    n = 0
    for i, (kind, source, destination) in enumerate(calls):
        if kind != "rename" or not destination.startswith(str(under)):
            continue
        if not ours.search(Path(source).name):
            continue  # zarr's own (".<uuid>.partial"): flushed by fgscale once renamed
        n += 1
        assert any(c == ("fsync", source, "") for c in calls[:i]), \
            f"{destination}: renamed into place from {source} before its bytes were flushed"
        assert first(calls, "fsync", Path(destination).parent, i) > i, \
            f"{destination}: its folder not flushed after the rename"
    return n


def check_flags(calls, flags: Path, data, by: str = "fsync") -> int:
    """Every flag chunk of the ``done`` array ``flags`` is flushed, after the data it claims:
    ``data(i)``, the path flushed (zarr's chunks), or with ``by="rename"`` renamed into place
    (a shard, flushed under its temporary name: :func:`check_renames`); the count."""
    n = 0
    for i, (kind, path, _) in enumerate(calls):
        if kind != "fsync" or Path(path).parent != flags / "c":
            continue
        n += 1
        written = data(int(Path(path).name))
        assert 0 <= first(calls, by, written) < i, \
            f"{path}: flag flushed before {written} was written and flushed"
    return n


def n_flags(group: Path) -> int:
    return zarr.open_array(str(group / "done"), mode="r").shape[0]


def test_conversion_training_and_saves_flush_before_they_claim(tiny_cohort, tmp_path):
    store, run = tmp_path / "s.zarr", tmp_path / "run"
    fgscale = [sys.executable, "-m", "fgscale"]
    calls = traced([*fgscale, "convert", str(tiny_cohort), "--out", str(store), "--block-rows",
                    "8", "--n-workers", "1", "--no-progress"], tmp_path / "convert.log", tmp_path)
    n_blocks = 3  # 24 images, 8 a block
    # the empty store, created under a temporary name, flushed whole before its rename
    created = first(calls, "rename", store)
    assert created >= 0 and ".creating." in calls[created][1]
    assert first(calls, "fsync", Path(calls[created][1]) / "zarr.json") in range(created)
    assert first(calls, "fsync", tmp_path, created) > created
    # each shard flushed, renamed, its folder flushed; then its flag; "complete" last
    assert check_renames(calls, store / "X", re.compile(r"^\..*\.tmp$")) == n_blocks
    assert check_flags(calls, store / "done", lambda b: store / "X" / "c" / str(b) / "0",
                       by="rename") == n_blocks
    last_flag = max(first(calls, "fsync", store / "done" / "c" / str(b)) for b in range(n_blocks))
    assert first(calls, "fsync", store / "zarr.json", last_flag) > last_flag
    assert open_store(store).attrs["complete"]

    # training: the feature statistics and the bank in the store, flags after their rows; the
    # run folder's files (config, checkpoints, metrics, model) flushed before their renames
    calls = traced([*fgscale, "train", str(store), "--out", str(run), "--max-epochs", "2",
                    "--n-groupings", "3", "--n-bootstrap", "5", "--n-clusters", "0.2",
                    "--early-stopping", "false", "--batch-size", "8", "--n-workers", "1",
                    "--no-progress", "--seed", "0"], tmp_path / "train.log", tmp_path)
    [stats] = [p for p in (store / "stats").iterdir() if p.is_dir()]
    assert check_flags(calls, stats / "done",
                       lambda i: stats / "partial_mean" / "c" / str(i) / "0") == n_flags(stats)
    # "complete" (stats/<key>/zarr.json) flushed once more, after the result it claims
    result = max(first(calls, "fsync", stats / name / "c" / "0") for name in ("mean", "std"))
    assert result >= 0 and first(calls, "fsync", stats / "zarr.json", result) > result
    [bank] = [p for p in (store / "banks").iterdir() if p.is_dir()]
    assert check_flags(calls, bank / "done",
                       lambda i: bank / "labels" / "c" / str(i) / "0") == n_flags(bank) == 3
    tmp_name = re.compile(r"^\.tmp-\d+@\w+-")
    assert check_renames(calls, run, tmp_name) >= 5
    for name in ("config.json", "model.json", "model.npz", "metrics.jsonl"):
        assert first(calls, "rename", run / name) >= 0, f"{name} not written whole"

    # a model saved by the Python API: every file of its folder
    saved = tmp_path / "model"
    script = ("import numpy as np; from fgscale import FeatureGroupingClassifier, save_model; "
              "rng = np.random.default_rng(0); X = rng.normal(size=(40, 30)); y = np.arange(40) % 2; "
              f"save_model(FeatureGroupingClassifier(max_epochs=2).fit(X, y), {str(saved)!r})")
    calls = traced([sys.executable, "-c", script], tmp_path / "save.log", tmp_path)
    assert check_renames(calls, saved, tmp_name) >= 2


def test_an_append_flushes_its_state_before_the_store_grows(tiny_cohort, tmp_path):
    """``--append``: the store marked as appending is on the disk before its arrays grow, each
    new shard before its flag, and ``complete`` after the last flag."""
    from fgscale.store import convert

    folder = tmp_path / "cohort"  # the tables beside the images
    shutil.copytree(Path(tiny_cohort).parent, folder)
    lines = Path(tiny_cohort).read_text().splitlines(keepends=True)
    part, whole = folder / "part.csv", folder / "whole.csv"
    part.write_text("".join(lines[:17]))  # the header and 16 of the 24 images: 2 blocks of 8
    whole.write_text("".join(lines))
    store = tmp_path / "s.zarr"
    convert(part, store, block_rows=8, progress=False)
    calls = traced([sys.executable, "-m", "fgscale", "convert", str(whole), "--out", str(store),
                    "--append", "--block-rows", "8", "--n-workers", "1", "--no-progress"],
                   tmp_path / "append.log", tmp_path)
    appending = first(calls, "fsync", store / "zarr.json")
    assert 0 <= appending < first(calls, "rename", store / "X" / "zarr.json")
    assert check_renames(calls, store / "X", re.compile(r"^\..*\.tmp$")) == 1
    # the grown records before the new block, the new block before its flag
    shard = first(calls, "rename", store / "X" / "c" / "2" / "0")
    assert 0 <= first(calls, "fsync", store / "source" / "zarr.json") < shard
    assert shard < first(calls, "fsync", store / "done" / "c" / "2")
    flag = first(calls, "fsync", store / "done" / "c" / "2")
    assert first(calls, "fsync", store / "zarr.json", flag) > flag
    assert open_store(store).n_samples == 24 and open_store(store).attrs["complete"]


def test_blocks_reopened_for_a_changed_file_are_flushed_before_its_new_record(tmp_path, rng):
    """A file rewritten before an unfinished conversion resumes: the flags of its blocks, set
    back to not done, reach the disk before the store's record of the files as they are now,
    and that record before the block is written again (else a crash between them would leave
    the new record over a block flagged done with the file's former rows)."""
    import nibabel as nib
    import numpy as np

    from fgscale.store._convert import convert

    shape, folder = (6, 7, 5), tmp_path / "cohort"
    folder.mkdir()
    series = [(rng.standard_normal((*shape, 2)) + 5).astype(np.float32) for _ in range(6)]
    series[5][1, 2, 3, 1] = np.nan  # stops the first conversion after blocks 0 and 1
    for i, data in enumerate(series):
        nib.save(nib.Nifti1Image(data, np.eye(4)), folder / f"sub{i}.nii.gz")
    (folder / "cohort.csv").write_text("path,label\n" + "".join(
        f"sub{i}.nii.gz,c{i % 2}\n" for i in range(6)))
    mask = tmp_path / "mask.nii.gz"
    nib.save(nib.Nifti1Image(np.ones(shape, np.uint8), np.eye(4)), mask)
    store = tmp_path / "s.zarr"
    with pytest.raises(ValueError, match="NaN/inf"):
        convert(folder / "cohort.csv", store, mask=mask, block_rows=4, progress=False)
    nib.save(nib.Nifti1Image(series[3] + 1, np.eye(4)), folder / "sub3.nii.gz")  # block 1
    calls = traced([sys.executable, "-m", "fgscale", "convert", str(folder / "cohort.csv"),
                    "--out", str(store), "--mask", str(mask), "--nan", "zero", "--block-rows",
                    "4", "--n-workers", "1", "--no-progress"], tmp_path / "resume.log", tmp_path)
    # a flag set back to 0, zarr's fill value, removes its chunk file: its folder is flushed
    reopened = first(calls, "fsync", store / "done" / "c")
    record = first(calls, "fsync", store / "inputs" / "c" / "0" / "0")
    assert 0 <= reopened < record < first(calls, "rename", store / "X" / "c" / "1" / "0")
    assert first(calls, "rename", store / "X" / "c" / "0" / "0") == -1  # block 0 kept
    assert open_store(store).attrs["complete"]
