"""save_model and load_model on the folders a researcher has: a run folder of ``fgscale train``
saved into, estimators with array parameters, and models saved by an older fgscale (SYNTHETIC
data, real folders on disk)."""

import json
import shutil

import numpy as np
import pytest
from helpers import smooth_problem

from fgscale import load_model, save_model
from fgscale.runs import load_run


def _contents(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_saving_into_a_run_folder_is_refused_unless_it_is_replaced_whole(tiny_runs, tmp_path):
    run = tmp_path / "fg"
    shutil.copytree(tiny_runs["logreg"], run)
    before = _contents(run)
    other = load_run(tiny_runs["mlp"])
    # its config.json, maps and scores would describe the logreg beside the MLP's model
    with pytest.raises(FileExistsError, match=rf"^{run}: a run folder of fgscale train .*"
                                              r"overwrite=True"):
        save_model(other, run)
    assert _contents(run) == before
    # a save that fails midway (labels that cannot be saved) loses nothing either
    broken = load_run(tiny_runs["mlp"])
    broken.classes_ = np.array([1.5, "a", None, 2], dtype=object)
    with pytest.raises(ValueError, match="cannot be saved"):
        save_model(broken, run, overwrite=True)
    assert _contents(run) == before and sorted(p.name for p in tmp_path.iterdir()) == ["fg"]

    assert save_model(other, run, overwrite=True) == run / "model.json"
    # the folder is the MLP's model alone: nothing of the logreg's run is left to mislead
    assert sorted(p.name for p in run.iterdir()) == ["mask.nii.gz", "model.json", "model.npz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fg"]
    assert json.loads((run / "model.json").read_text())["params"]["model"] == "mlp"
    X = tiny_runs["store"].read_rows(np.arange(8))
    np.testing.assert_array_equal(load_model(run).predict_proba(X), other.predict_proba(X))
    # a folder of saved models only is replaced file by file, as before
    save_model(load_run(tiny_runs["logreg"]), run)
    assert load_model(run).model == "logreg"


def test_a_run_folder_given_as_the_working_folder_is_replaced_in_place(tiny_runs, tmp_path,
                                                                      monkeypatch):
    run = tmp_path / "fg"
    shutil.copytree(tiny_runs["logreg"], run)
    monkeypatch.chdir(run)
    save_model(load_run(tiny_runs["mlp"]), ".", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fg"]
    assert sorted(p.name for p in run.iterdir()) == ["mask.nii.gz", "model.json", "model.npz"]
    assert load_model(run).model == "mlp"


def _same_params(a: dict, b: dict) -> bool:
    """Equal parameters, of the same types (an array equal to an array of the same dtype)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        if type(a[k]) is not type(b[k]):
            return False
        if isinstance(a[k], np.ndarray):
            if a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k]):
                return False
        elif a[k] != b[k]:
            return False
    return True


def test_array_and_tuple_parameters_come_back_as_they_were_given(tmp_path):
    from sklearn.base import clone

    from fgscale import FeatureGroupingClassifier

    X, y, _ = smooth_problem(np.random.default_rng(0), n=60)
    clf = FeatureGroupingClassifier(alpha=np.logspace(-4, 0, 5), n_clusters=(0.1, 0.2),
                                    n_groupings=4, n_bootstrap=8, max_epochs=3, batch_size=30,
                                    random_state=0).fit(X, y)
    save_model(clf, tmp_path)
    loaded = load_model(tmp_path)
    assert isinstance(loaded.alpha, np.ndarray) and isinstance(loaded.n_clusters, tuple)
    assert _same_params(loaded.get_params(), clf.get_params())
    assert _same_params(clone(loaded).get_params(), clone(clf).get_params())
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))
    # a model.json whose types are edited to anything but plain numbers is refused, named
    doc = json.loads((tmp_path / "model.json").read_text())
    doc["sequences"]["alpha"] = "O"
    (tmp_path / "model.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"model.json: 'sequences' says alpha is an array of 'O'"):
        load_model(tmp_path)


def test_an_array_of_hidden_layer_sizes_comes_back_as_an_array(tmp_path):
    from fgscale import FeatureGroupingClassifier

    X, y, _ = smooth_problem(np.random.default_rng(0), n=60)
    clf = FeatureGroupingClassifier(model="mlp", regularizer="l2", alpha=0.01,
                                    hidden_layer_sizes=np.array([8]), max_epochs=2,
                                    batch_size=30, random_state=0).fit(X, y)
    save_model(clf, tmp_path)
    loaded = load_model(tmp_path)
    assert isinstance(loaded.hidden_layer_sizes, np.ndarray)
    assert _same_params(loaded.get_params(), clf.get_params())


def _as_an_older_fgscale_saved_it(folder, mask):
    """Rewrite a save of a model fitted with a 3D boolean array mask as fgscale did before the
    array was kept in model.npz: the array as mask.nii.gz with an identity affine (it has no
    affine of its own; ``as_mask_image(mask)``), the mask parameter pointing at that file."""
    import hashlib

    import nibabel as nib

    with np.load(folder / "model.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "mask"}
    with open(folder / "model.npz", "wb") as f:
        np.savez(f, **arrays)
    nib.Nifti1Image(mask.astype(np.uint8), np.eye(4)).to_filename(folder / "mask.nii.gz")
    doc = json.loads((folder / "model.json").read_text())
    doc.pop("sequences", None)
    doc["params"]["mask"] = {"saved": "mask.nii.gz"}
    doc["mask"] = True
    doc["sha256"]["model.npz"] = hashlib.sha256((folder / "model.npz").read_bytes()).hexdigest()
    doc["versions"]["fgscale"] = "0.9.0"
    (folder / "model.json").write_text(json.dumps(doc))


def test_an_old_save_of_an_array_mask_warns_that_its_maps_have_no_true_place(tmp_path):
    import warnings

    from fgscale import FeatureGroupingClassifier

    X, y, mask = smooth_problem(np.random.default_rng(0), n=60)
    clf = FeatureGroupingClassifier(mask=mask, max_epochs=3, batch_size=30,
                                    random_state=0).fit(X, y)
    save_model(clf, tmp_path)
    _as_an_older_fgscale_saved_it(tmp_path, mask)
    with pytest.warns(UserWarning) as caught:
        loaded = load_model(tmp_path)
    message = str(caught[0].message)
    assert message.startswith(f"{tmp_path / 'mask.nii.gz'}: an identity affine")
    assert "fgscale 0.9.0" in message and "load_model(folder, affine=" in message
    assert caught[0].filename == __file__  # said at the caller's line
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))

    # the images' affine given: the maps are placed on their grid, and nothing is warned of
    affine = np.diag([-2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = [10.0, -20.0, -5.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        placed = load_model(tmp_path, affine=affine)
    np.testing.assert_array_equal(placed.mask_img_.affine, affine)
    for name, img in placed.coef_img_.items():
        np.testing.assert_array_equal(img.affine, affine)
        np.testing.assert_allclose(np.asarray(img.dataobj)[mask],
                                   clf.model_.first.weight.detach().numpy()[
                                       list(clf.classes_).index(name)], rtol=1e-6)
    with pytest.raises(ValueError, match="affine must be a 4x4 array"):
        load_model(tmp_path, affine=np.eye(3))
    # a save of today has the array, and no image to place: affine is refused, named
    save_model(clf, tmp_path / "new")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'new'}: affine places the saved "
                                         "mask.nii.gz; this model has none"):
        load_model(tmp_path / "new", affine=affine)
