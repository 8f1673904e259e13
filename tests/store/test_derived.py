"""Training from a store this process may not write: its statistics and banks go to a cache
store of their own (fgscale.store._derived), the store stays byte for byte as it was, and the
model is the one a writable copy gives.

A store is made read-only three ways (the fixture ``locked``): ``chmod -R a-w``, which binds
every user but root (skipped where it does not bind: root, unless run without CAP_DAC_OVERRIDE,
e.g. under ``setpriv --bounding-set=-dac_override,-dac_read_search``); a tmpfs of its own
remounted read-only, which binds root too (skipped where this process may not mount one, as
tests/test_faults_disk.py does); and ``FGSCALE_DERIVED=cache`` on a writable store, the setting
for a store one may write but should not, which runs everywhere. CI runs as root: there the last
two run, the first is skipped.
"""

import hashlib
import logging
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from faults import mount_small_disk, unmount
from helpers import smooth_cohort, synthetic_store

from fgscale import FeatureGroupingClassifier
from fgscale._utils.files import can_write
from fgscale.cli import main
from fgscale.grouping._bank import make_bank, resolve_n_clusters
from fgscale.grouping._dask_bank import build_bank
from fgscale.store import StoreError, bank_key, list_banks, open_store, stats_key, write_store
from fgscale.store._derived import (
    CACHE_DIR_ENV,
    DERIVED_ENV,
    cache_dir,
    cache_path,
    read_locations,
    write_location,
)

PARAMS = dict(n_clusters=0.1, n_groupings=4, n_bootstrap=12, max_epochs=3, batch_size=16,
              learning_rate=0.05, random_state=5, standardize=True)


class Locked:
    """A folder to write a store into, and :meth:`lock`, which makes it read-only for this
    process in one of the three ways of the module's docstring."""

    def __init__(self, how: str, folder: Path, monkeypatch):
        self.how, self.folder, self.monkeypatch = how, folder, monkeypatch
        self.disk = None

    def lock(self) -> None:
        if self.how == "chmod":
            for p in [self.folder, *self.folder.rglob("*")]:
                p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        elif self.how == "mount":
            self.disk.read_only()
        else:
            self.monkeypatch.setenv(DERIVED_ENV, "cache")

    def unlock(self) -> None:
        if self.how == "chmod":
            for p in [self.folder, *self.folder.rglob("*")]:
                p.chmod(p.stat().st_mode | stat.S_IWUSR)
        elif self.how == "mount":
            self.disk.writable()
        else:
            self.monkeypatch.delenv(DERIVED_ENV, raising=False)


def _mode_bits_bind(folder: Path) -> bool:
    """Whether a folder made read-only by its mode bits refuses this process a new file."""
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "file").touch()
    except PermissionError:
        return True
    finally:
        folder.chmod(0o755)
    return False


@pytest.fixture(params=["chmod", "mount", "forced"])
def locked(request, tmp_path, monkeypatch):
    """A Locked folder; the cache dir is ``tmp_path / "cache"``, this test's own."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(DERIVED_ENV, raising=False)
    if request.param == "chmod" and not _mode_bits_bind(tmp_path / "probe"):
        pytest.skip("this process writes whatever a folder's mode bits say (root); the 'mount' "
                    "and 'forced' cases make the store read-only for it")
    folder = tmp_path / "locked"
    result = Locked(request.param, folder, monkeypatch)
    if request.param == "mount":
        result.disk = mount_small_disk(folder)
    else:
        folder.mkdir()
    try:
        yield result
    finally:
        result.unlock()
        if result.disk is not None:
            unmount(result.disk)


def tree_digest(path) -> str:
    """SHA-256 of a folder's tree: every folder's and file's relative path, and every file's
    bytes."""
    digest = hashlib.sha256()
    for p in sorted(Path(path).rglob("*")):
        digest.update(str(p.relative_to(path)).encode() + b"\0")
        if p.is_file():
            digest.update(p.read_bytes())
    return digest.hexdigest()


def cohort_store(path):
    X, y, mask, split = smooth_cohort()
    return write_store(path, X, y, mask, np.eye(4), split=split, block_rows=16)


def assert_same_weights(a, b):
    for (name, x), y in zip(a.model_.state_dict().items(), b.model_.state_dict().values(),
                            strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------- where derived data go


def test_cache_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "fgscale"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "fgscale"


def test_the_probe_creates_a_file_and_leaves_none(tmp_path):
    assert can_write(tmp_path) and not list(tmp_path.iterdir())
    assert not can_write(tmp_path / "missing")
    (tmp_path / "file").touch()
    assert not can_write(tmp_path / "file")


def test_the_probe_sees_a_read_only_folder(locked):
    if locked.how == "forced":
        pytest.skip("FGSCALE_DERIVED is no property of the folder")
    assert can_write(locked.folder)
    locked.lock()
    assert not can_write(locked.folder)


def test_a_writable_store_keeps_its_derived_data_and_a_cache_is_made_only_for_writes(
        tiny_store, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = str(tiny_store.path.resolve())
    assert read_locations(tiny_store) == [path]  # no cache store: not looked for
    assert write_location(tiny_store) == path
    monkeypatch.setenv(DERIVED_ENV, "cache")
    cache = write_location(tiny_store)
    assert cache == str(cache_path(tiny_store)) == str(tmp_path / "cache" /
                                                       f"{tiny_store.identity()}.zarr")
    assert zarr.open_group(cache, mode="r").attrs["fgscale_derived_of"] == path
    assert read_locations(tiny_store) == [path, cache]
    monkeypatch.setenv(DERIVED_ENV, "always")
    with pytest.raises(ValueError, match="FGSCALE_DERIVED='always'"):
        write_location(tiny_store)


def test_a_cache_store_is_never_used_for_other_rows_of_the_same_identity(tmp_path, monkeypatch,
                                                                         caplog):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(DERIVED_ENV, "cache")
    X, y, mask, split = smooth_cohort()
    a = write_store(tmp_path / "a.zarr", X, y, mask, np.eye(4), split=split)
    b = write_store(tmp_path / "b.zarr", X + 1, y, mask, np.eye(4), split=split)
    assert a.identity() == b.identity()  # written from arrays: the identity ignores the values
    cache = write_location(a)
    assert read_locations(a) == [str(a.path.resolve()), cache]
    with caplog.at_level(logging.WARNING, logger="fgscale"):
        assert read_locations(b) == [str(b.path.resolve())]
    assert "other rows; not read" in caplog.text
    with pytest.raises(StoreError, match="other rows; remove that folder"):
        write_location(b)


def test_a_store_rewritten_with_other_rows_in_the_same_process_leaves_its_cache(tmp_path,
                                                                                 monkeypatch):
    # the rows' digest is kept per process while their files are unchanged: a rewrite must
    # still be seen
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(DERIVED_ENV, "cache")
    X, y, mask, split = smooth_cohort()
    path = tmp_path / "a.zarr"
    a = write_store(path, X, y, mask, np.eye(4), split=split)
    cache = write_location(a)
    assert read_locations(a) == read_locations(open_store(path)) == [str(path.resolve()), cache]
    shutil.rmtree(path)
    b = write_store(path, X + 1, y, mask, np.eye(4), split=split)
    assert b.identity() == a.identity()
    assert read_locations(b) == [str(path.resolve())]


def test_nowhere_to_write_is_a_clear_error(locked, monkeypatch):
    store = synthetic_store(locked.folder / "s.zarr", 12, 2, seed=0, block_rows=4)
    blocker = locked.folder.parent / "a-file"
    blocker.touch()
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))  # no folder can be made there
    locked.lock()
    with pytest.raises(StoreError) as info:
        build_bank(store.path, n_groupings=1, n_bootstrap=2, n_clusters=3, progress=False)
    message = str(info.value)
    for name in (str(store.path.resolve()), str(blocker / "cache"), CACHE_DIR_ENV):
        assert name in message, message
    assert f"cannot be made ({blocker} is a file, not a folder)" in message
    assert "either" not in message


def test_a_fit_with_nowhere_to_write_is_refused_before_a_cluster_starts(tmp_path, monkeypatch,
                                                                         client):
    store = synthetic_store(tmp_path / "s.zarr", 24, 2, seed=0, block_rows=4)
    blocker = tmp_path / "a-file"
    blocker.touch()
    monkeypatch.setenv(DERIVED_ENV, "cache")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))
    clf = FeatureGroupingClassifier(n_groupings=2, n_bootstrap=4, n_clusters=0.1, max_epochs=1,
                                    random_state=0)
    monkeypatch.setattr("fgscale._dask.client.get_client", None)  # any cluster would fail here
    with pytest.raises(StoreError, match="nowhere to go"):
        clf.fit(store.path)
    # with everything it needs already derived, it does not need to write: it trains
    monkeypatch.undo()
    clf.fit(store.path, client=client)
    monkeypatch.setenv(DERIVED_ENV, "cache")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))
    assert clf.fit(store.path, client=client).n_iter_ >= 1


def test_fgscale_train_with_nowhere_to_write_is_refused_before_a_cluster_starts(
        tmp_path, monkeypatch, capsys):
    """fgscale train started its cluster (its dashboard printed) before the fit's refusal;
    the failed run leaves no folder that would block the corrected command."""
    from fgscale.cli import main

    store = synthetic_store(tmp_path / "s.zarr", 24, 2, seed=0, block_rows=4)
    blocker = tmp_path / "a-file"
    blocker.touch()
    monkeypatch.setenv(DERIVED_ENV, "cache")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))
    train = ["train", str(store.path), "--out", str(tmp_path / "run"), "--n-groupings", "2",
             "--n-bootstrap", "4", "--n-clusters", "0.1", "--max-epochs", "1", "--n-workers",
             "1", "--no-progress"]
    assert main(train) == 2
    err = capsys.readouterr().err
    assert "fgscale train: error: " in err and "nowhere to go" in err
    assert "Dask dashboard" not in err
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    assert main(train) == 0


# ---------------------------------------------------------------- training


def test_fit_from_a_read_only_store_equals_a_fit_from_a_writable_copy(locked, tmp_path, client,
                                                                       monkeypatch, caplog):
    store = cohort_store(locked.folder / "s.zarr")
    copy = cohort_store(tmp_path / "copy.zarr")
    unused = tmp_path / "unused-cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(unused))
    reference = FeatureGroupingClassifier(**PARAMS).fit(copy.path, client=client)
    assert not unused.exists()  # a writable store keeps its derived data
    rows = copy.train_rows()
    key = bank_key(resolve_n_clusters(PARAMS["n_clusters"], copy.n_features),
                   PARAMS["n_bootstrap"], PARAMS["random_state"], rows)
    assert [b["key"] for b in list_banks(copy.path)] == [key]

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    locked.lock()
    before = tree_digest(store.path)
    with caplog.at_level(logging.INFO, logger="fgscale"):
        fitted = FeatureGroupingClassifier(**PARAMS).fit(store.path, client=client)
    assert tree_digest(store.path) == before
    cache = tmp_path / "cache" / f"{store.identity()}.zarr"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [cache.name]
    group = zarr.open_group(str(cache), mode="r")
    assert list(group["stats"].group_keys()) == [stats_key(rows)]
    assert list(group["banks"].group_keys()) == [key]
    why = "store read-only" if locked.how != "forced" else f"{DERIVED_ENV}=cache"
    said = [r for r in caplog.records if "stats and banks go" in r.getMessage()]
    assert len(said) == 1 and why in said[0].getMessage() and str(cache) in said[0].getMessage()
    # a read-only store's derived data in a home folder is said without -v; a chosen cache not
    assert said[0].levelno == (logging.WARNING if locked.how != "forced" else logging.INFO)
    np.testing.assert_array_equal(fitted.bank_, reference.bank_)
    np.testing.assert_array_equal(fitted.mean_, reference.mean_)
    assert_same_weights(fitted, reference)

    again = FeatureGroupingClassifier(**PARAMS).fit(store.path, client=client)  # all reused
    assert_same_weights(again, reference)
    assert tree_digest(store.path) == before


def test_a_read_only_store_that_holds_its_bank_is_read_not_copied(locked, tmp_path, client):
    store = cohort_store(locked.folder / "s.zarr")
    params = dict(PARAMS, standardize=False)
    first = FeatureGroupingClassifier(**params).fit(store.path, client=client)  # the bank: in it
    locked.lock()
    before = tree_digest(store.path)
    again = FeatureGroupingClassifier(**params).fit(store.path, client=client)
    assert_same_weights(again, first)
    assert not (tmp_path / "cache").exists() and tree_digest(store.path) == before
    # statistics it lacks go to the cache; the bank is still read from the store
    standardized = FeatureGroupingClassifier(**PARAMS).fit(store.path, client=client)
    [cache] = (tmp_path / "cache").iterdir()
    assert list(zarr.open_group(str(cache), mode="r").group_keys()) == ["stats"]
    np.testing.assert_array_equal(standardized.bank_, first.bank_)
    assert tree_digest(store.path) == before


def test_a_bank_in_the_cache_is_resumed_and_extended_there(locked, client):
    store = synthetic_store(locked.folder / "s.zarr", 24, 2, seed=0, block_rows=4)
    locked.lock()
    before = tree_digest(store.path)
    kw = dict(n_bootstrap=4, n_clusters=20, client=client, progress=False, return_info=True)
    _, info = build_bank(store.path, n_groupings=3, **kw)
    cache = str(cache_path(store))
    assert (info["location"], info["built"]) == (cache, 3)
    done = zarr.open_group(cache, mode="r+")[f"banks/{info['key']}/done"]
    done[1] = False  # as a run killed before grouping 1 was written
    bank, info = build_bank(store.path, n_groupings=5, **kw)
    assert (info["location"], info["built"], info["reused"]) == (cache, 3, 2)
    expected = make_bank(store.X[:], store.mask, 20, n_groupings=5, n_bootstrap=4,
                         rows=store.train_rows(), seed=0)
    np.testing.assert_array_equal(bank, expected)
    assert tree_digest(store.path) == before


# ---------------------------------------------------------------- the command line


def test_cli_bank_lists_both_places_and_refuses_to_shadow_the_store(locked, tmp_path, capsys):
    store = synthetic_store(locked.folder / "s.zarr", 24, 2, seed=0, block_rows=4)
    bank = ["bank", str(store.path), "--n-groupings", "2", "--n-bootstrap", "4", "--n-workers",
            "1", "--no-progress"]
    assert main([*bank, "--n-clusters", "20"]) == 0
    locked.lock()
    before = tree_digest(store.path)
    assert main([*bank, "--n-clusters", "30"]) == 0
    cache = cache_path(open_store(store.path))
    assert f"(in its cache store {cache})" in capsys.readouterr().out
    assert main([*bank, "--n-clusters", "20"]) == 0  # found in the store: nothing to build
    assert "already complete" in capsys.readouterr().out
    assert main(["bank", str(store.path), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "in"
    assert [(line.split()[1], line.split()[-1]) for line in lines[1:3]] == [
        ("20", "store"), ("30", "cache")]
    assert lines[3].startswith(f"cache: {cache}")
    assert main([*bank, "--n-clusters", "20", "--overwrite"]) == 2
    assert "cannot be rebuilt" in capsys.readouterr().err
    assert main([*bank, "--n-clusters", "30", "--overwrite"]) == 0  # in the cache: rebuilt there
    capsys.readouterr()
    assert main(["export", str(store.path), "--omega", "--out", str(tmp_path / "o.nii.gz")]) == 2
    assert f"{store.path}: 2 banks in the store and its cache store, choose one (--bank KEY): " \
        in capsys.readouterr().err
    assert main(["export", str(store.path), "--omega", "--bank", list_banks(store.path)[1]["key"],
                 "--out", str(tmp_path / "omega.nii.gz")]) == 0
    assert tree_digest(store.path) == before
    capsys.readouterr()
    kept, cached = (b["key"] for b in list_banks(store.path))
    # the store's bank may not be removed (read-only, or kept by FGSCALE_DERIVED=cache): said
    # with the store and the bank, before the cache's is removed
    assert main(["bank", str(store.path), "--remove", cached, kept]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fgscale bank: error: {store.path}: bank {kept} lies in the store")
    assert err.rstrip().endswith("nothing removed") and "Errno" not in err
    assert len(list_banks(store.path)) == 2
    # removed from the cache; the store left as it is
    assert main(["bank", str(store.path), "--remove", cached]) == 0
    assert capsys.readouterr().out.startswith(f"removed bank {cached} (k=30, 2/2 groupings) "
                                              f"from the cache {cache}: ")
    assert [b["n_clusters"] for b in list_banks(store.path)] == [20]
    assert tree_digest(store.path) == before


@pytest.mark.parametrize("locked", ["chmod", "mount"], indirect=True)
def test_cli_train_and_cv_from_a_read_only_store(locked, tmp_path, capsys):
    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    store = synthetic_store(locked.folder / "s.zarr", 40, 4, n_subjects=5, seed=0, split=split,
                            block_rows=8)
    locked.lock()
    before = tree_digest(store.path)
    train = ["--n-groupings", "4", "--n-bootstrap", "10", "--n-clusters", "0.1", "--batch-size",
             "8", "--max-epochs", "2", "--n-workers", "1", "--no-progress"]
    assert main(["train", str(store.path), "--out", str(tmp_path / "run"), *train]) == 0
    assert main(["cv", str(store.path), *train, "--folds", "2"]) == 0
    assert "2-fold cross-validation" in capsys.readouterr().out
    assert tree_digest(store.path) == before
    cached = list_banks(store.path)  # the run's bank, then a bank per fold: all in the cache
    assert len(cached) == 3 and {b["location"] for b in cached} == {str(cache_path(store))}
