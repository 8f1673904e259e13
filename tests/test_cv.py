"""fgscale cv: grouped K-fold on a store, each fold streamed, against in-memory fits."""

import numpy as np
import pytest
from sklearn.model_selection import GroupKFold

from fgscale import FeatureGroupingClassifier
from fgscale.cli import main
from fgscale.crossval import cross_validate
from fgscale.images import make_classification_volumes
from fgscale.store import list_banks, write_store

PARAMS = dict(regularizer="none", max_epochs=20, random_state=0)


@pytest.fixture(scope="module")
def grouped_store(tmp_path_factory):
    """A SYNTHETIC store of 60 rows from 6 subjects, the last 12 rows held out as test."""
    X, y, mask, affine = make_classification_volumes(60, 3, grid=(10, 12, 10), n_subjects=6,
                                                     snr_db=-3.0, seed=1)
    groups = [f"sub-{(i // 3) % 6}" for i in range(60)]  # every subject has every class
    split = ["train"] * 48 + ["test"] * 12
    return write_store(tmp_path_factory.mktemp("cv") / "cv.zarr", X, y, mask, affine,
                       groups=groups, split=split, block_rows=16)


def test_each_fold_equals_an_in_memory_fit_on_its_rows(grouped_store, client):
    store = grouped_store
    scores = cross_validate(store.path, params=PARAMS, n_folds=3, client=client)
    assert scores["grouped"] and len(scores["folds"]) == 3
    rows = store.train_rows()
    X, y, groups = store.read_rows(rows), store.y[rows], store.groups[rows]
    splits = list(GroupKFold(n_splits=3).split(rows, groups=groups))
    for fold, (train, test) in zip(scores["folds"], splits, strict=True):
        assert not set(groups[train]) & set(groups[test])  # no subject on both sides
        memory = FeatureGroupingClassifier(**PARAMS).fit(X[train], y[train])
        assert fold["n"] == test.size and fold["n_train"] == train.size
        assert fold["accuracy"] == pytest.approx(memory.score(X[test], y[test]))
    accuracy = [f["accuracy"] for f in scores["folds"]]
    assert scores["mean_accuracy"] == pytest.approx(np.mean(accuracy))


def test_feature_grouping_folds_build_their_own_banks(grouped_store, client, tmp_path):
    store = write_store(tmp_path / "copy.zarr", grouped_store.read_rows(np.arange(60)),
                        grouped_store.y, grouped_store.mask, grouped_store.affine,
                        groups=grouped_store.groups, split=grouped_store.split,
                        classes=grouped_store.classes)
    cross_validate(store.path, params=dict(n_groupings=3, n_bootstrap=8, max_epochs=5,
                                           n_clusters=0.1, random_state=0),
                   n_folds=2, client=client)
    banks = list_banks(store.path)
    assert len(banks) == 2 and {b["n_rows"] for b in banks} == {24}  # one per fold's rows


def test_cli(grouped_store, client, capsys):
    assert main(["cv", str(grouped_store.path), "--folds", "3", "--regularizer", "none",
                 "--max-epochs", "5", "--scheduler", client.scheduler.address]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert sum(line.startswith("fold ") for line in lines) == 3
    assert "3-fold cross-validation, grouped by subject" in lines[-1]


def test_more_folds_than_subjects_or_rows_partly_grouped_are_refused(grouped_store, tmp_path,
                                                                     capsys):
    """Refused before any fold trains, not split into folds that share a subject."""
    for folds, most in ((7, "6 training subjects"), (1, "6 training subjects")):
        assert main(["cv", str(grouped_store.path), "--folds", str(folds)]) == 2
        err = capsys.readouterr().err
        assert (f"fgscale cv: error: {grouped_store.path}: {folds} folds; give 2 or more, and at "
                f"most the {most} (rows of a subject never straddle folds)") in err, err
        assert "dashboard" not in err.lower()
    groups = grouped_store.groups.copy()
    groups[:3] = ""
    partly = write_store(tmp_path / "partly.zarr", grouped_store.read_rows(np.arange(60)),
                         grouped_store.y, grouped_store.mask, grouped_store.affine,
                         groups=groups, split=grouped_store.split, classes=grouped_store.classes)
    with pytest.raises(ValueError, match=r"partly\.zarr: 3 of the 48 training rows have no "
                                         "group: give each row its subject, or none of them"):
        cross_validate(partly.path, params=PARAMS, n_folds=3)
