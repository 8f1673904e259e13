"""save_model / load_model: a fitted estimator as JSON, .npz and NIfTI, loaded without
unpickling anything, predicts as the original."""

import json
import os
import pickle

import nibabel as nib
import numpy as np
import pytest
from helpers import mask_img, smooth_problem, wait_until_blocked_on_a_lock
from sklearn.base import clone

from fgscale import FeatureGroupingClassifier, load_model, save_model

FAST = dict(n_groupings=5, n_bootstrap=10, max_epochs=10, learning_rate=0.1, batch_size=50,
            random_state=0)


@pytest.fixture(scope="module")
def problem():
    return smooth_problem(np.random.default_rng(0), n=60)


@pytest.fixture(scope="module")
def saved(problem, tmp_path_factory):
    """A logistic regression fitted on arrays with a mask, and the folder it was saved into."""
    X, y, mask = problem
    clf = FeatureGroupingClassifier(mask=mask, **FAST).fit(X, y)
    folder = tmp_path_factory.mktemp("saved")
    save_model(clf, folder)
    return clf, folder


@pytest.mark.parametrize("params", [
    dict(),
    dict(model="mlp", hidden_layer_sizes=(8, 4), dropout=0.3),
    dict(regularizer="none", standardize=False),
])
def test_round_trip_predicts_as_the_original(problem, tmp_path, params):
    X, y, mask = problem
    clf = FeatureGroupingClassifier(mask=mask, **FAST, **params).fit(X, y)
    save_model(clf, tmp_path)
    # a boolean array has no affine: no mask image is made up for it
    assert sorted(os.listdir(tmp_path)) == ["model.json", "model.npz"]
    loaded = load_model(tmp_path)
    assert type(loaded) is FeatureGroupingClassifier
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))
    assert loaded.predict(X).dtype == clf.predict(X).dtype
    np.testing.assert_allclose(loaded.predict_proba(X), clf.predict_proba(X), rtol=0, atol=1e-12)
    assert loaded.score(X, y) == clf.score(X, y)
    for attr in ("n_features_in_", "alpha_", "dropout_", "n_clusters_", "n_iter_",
                 "batch_size_", "history_"):
        assert getattr(loaded, attr) == getattr(clf, attr), attr
    expected = {k: v for k, v in clf.get_params().items() if k != "mask"}
    assert {k: v for k, v in loaded.get_params().items() if k != "mask"} == expected
    # the array mask comes back as the array it was, and still with no image (no affine)
    assert type(loaded.mask) is np.ndarray and loaded.mask.dtype == bool
    np.testing.assert_array_equal(loaded.mask, mask)
    assert clf.mask_img_ is None and loaded.mask_img_ is None
    if clf.model == "logreg":
        for est in (clf, loaded):
            with pytest.raises(AttributeError, match="coef_img_ needs"):
                _ = est.coef_img_
    if clf.model == "logreg":
        np.testing.assert_array_equal(loaded.coef_, clf.coef_)
        np.testing.assert_array_equal(loaded.intercept_, clf.intercept_)
    if clf.mean_ is None:
        assert loaded.mean_ is None and loaded.scale_ is None
    assert loaded.bank_ is None


@pytest.mark.parametrize("labels", [np.array([3, 7]), np.array([False, True]),
                                    np.array(["no", "yes"], dtype=object)])
def test_labels_keep_their_type(problem, tmp_path, labels):
    X, y, mask = problem
    y = labels[(y == "face").astype(int)]
    clf = FeatureGroupingClassifier(regularizer="none", **FAST).fit(X, y)  # no mask: no image
    save_model(clf, tmp_path)
    assert not (tmp_path / "mask.nii.gz").exists()
    loaded = load_model(tmp_path)
    assert loaded.mask is None and loaded.mask_img_ is None
    assert loaded.classes_.dtype == clf.classes_.dtype
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))


def test_an_image_mask_keeps_its_affine(problem, tmp_path):
    X, y, mask = problem
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    clf = FeatureGroupingClassifier(mask=mask_img(mask, affine), **FAST).fit(X, y)
    save_model(clf, tmp_path)
    img = nib.load(tmp_path / "mask.nii.gz")
    np.testing.assert_array_equal(img.affine, affine)
    np.testing.assert_array_equal(np.asarray(img.dataobj) != 0, mask)


def test_an_array_mask_of_images_keeps_the_array_and_the_images_affine(problem, tmp_path):
    """Fitted on images with a boolean array as mask: the array stays the parameter, the mask
    image (the array on the images' grid) the fitted mask_img_, both as they were."""
    from fgscale.images import unmask

    X, y, mask = problem
    affine = np.array([[-3.0, 0, 0, 90], [0, 3, 0, -126], [0, 0, 3, -72], [0, 0, 0, 1]])
    imgs = [unmask(row, mask, affine) for row in X]
    clf = FeatureGroupingClassifier(mask=mask, **FAST).fit(imgs, y)
    save_model(clf, tmp_path)
    loaded = load_model(tmp_path)
    assert type(loaded.mask) is np.ndarray
    np.testing.assert_array_equal(loaded.mask, mask)
    np.testing.assert_array_equal(loaded.mask_img_.affine, affine)
    np.testing.assert_array_equal(np.asarray(loaded.mask_img_.dataobj) != 0, mask)
    for name, img in clf.coef_img_.items():
        np.testing.assert_array_equal(loaded.coef_img_[name].get_fdata(), img.get_fdata())
        np.testing.assert_array_equal(loaded.coef_img_[name].affine, affine)
    np.testing.assert_array_equal(loaded.predict(imgs), clf.predict(imgs))


def test_a_mask_no_3d_image_holds_round_trips_as_it_was(problem, tmp_path):
    """The README's CNN on a 2D grid, and a sparse adjacency: saved in model.npz, loaded as
    they were given, so that the loaded estimator predicts and refits as the original."""
    from scipy.sparse import diags
    from sklearn.base import clone

    X, y, mask = problem
    p = X.shape[1]
    fast = dict(FAST, max_epochs=3)
    side = int(np.ceil(np.sqrt(p)))
    grid = np.arange(side * side).reshape(side, side) < p  # a 2D grid with p cells set
    adjacency = diags([np.ones(p - 1), np.ones(p - 1)], [-1, 1], format="csr")
    for i, params in enumerate([dict(model="cnn", regularizer="dropout", mask=grid),
                                dict(mask=adjacency)]):
        clf = FeatureGroupingClassifier(**params, **fast).fit(X, y)
        save_model(clf, tmp_path / str(i))
        assert not (tmp_path / str(i) / "mask.nii.gz").exists()
        loaded = load_model(tmp_path / str(i))
        assert loaded.mask_img_ is None and type(loaded.mask) is type(clf.mask)
        given, back = (m.toarray() if hasattr(m, "toarray") else m for m in (clf.mask, loaded.mask))
        np.testing.assert_array_equal(back, given)
        np.testing.assert_allclose(loaded.predict_proba(X), clf.predict_proba(X), rtol=0,
                                   atol=1e-12)
        np.testing.assert_array_equal(clone(loaded).fit(X, y).predict_proba(X),
                                      clf.predict_proba(X))
    with np.load(tmp_path / "0" / "model.npz") as npz:
        arrays = dict(npz)
    arrays["mask"] = arrays["mask"][1:]  # a row of cells fewer
    _rewrite_npz(tmp_path / "0", arrays)
    with pytest.raises(ValueError, match=r"model\.npz: array 'mask' must be a boolean grid "
                                         rf"with {p} cells set"):
        load_model(tmp_path / "0")


def test_a_relative_mask_path_refits_from_another_working_folder(problem, tmp_path,
                                                                 monkeypatch):
    X, y, mask = problem
    (tmp_path / "data").mkdir()
    mask_img(mask).to_filename(tmp_path / "data" / "mask.nii.gz")
    monkeypatch.chdir(tmp_path / "data")
    clf = FeatureGroupingClassifier(mask="mask.nii.gz", **FAST).fit(X, y)
    save_model(clf, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    loaded = load_model("model")
    assert loaded.mask == str(tmp_path / "data" / "mask.nii.gz")
    np.testing.assert_array_equal(loaded.fit(X, y).coef_, clf.coef_)
    # the model shared without its mask file: the saved copy stands for the path, so that a
    # clone of it fits again (it raised FileNotFoundError for the former path)
    (tmp_path / "data" / "mask.nii.gz").unlink()
    moved = load_model("model")
    np.testing.assert_array_equal(moved.mask.get_fdata(), mask_img(mask).get_fdata())
    np.testing.assert_array_equal(clone(moved).fit(X, y).coef_, clf.coef_)


def test_a_regressor_round_trips(problem, tmp_path):
    from fgscale import FeatureGroupingRegressor

    X, _, mask = problem
    target = X[:, :10].sum(1) + 3.0
    reg = FeatureGroupingRegressor(mask=mask, regularizer="l2", alpha=1e-3, **FAST).fit(X, target)
    save_model(reg, tmp_path)
    loaded = load_model(tmp_path)
    np.testing.assert_allclose(loaded.predict(X), reg.predict(X), rtol=0, atol=1e-12)
    np.testing.assert_allclose(loaded.coef_, reg.coef_)


def _copy(saved, tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir(parents=True)
    for name in os.listdir(saved[1]):
        (folder / name).write_bytes((saved[1] / name).read_bytes())
    return folder


def _edit_json(folder, change):
    doc = json.loads((folder / "model.json").read_text())
    change(doc)
    (folder / "model.json").write_text(json.dumps(doc))


def _rewrite_npz(folder, arrays, **kw):
    """Replace model.npz, and its checksum in model.json, so that the arrays are checked."""
    import hashlib

    with open(folder / "model.npz", "wb") as f:
        np.savez(f, **arrays, **kw)
    sha = hashlib.sha256((folder / "model.npz").read_bytes()).hexdigest()
    _edit_json(folder, lambda doc: doc["sha256"].update({"model.npz": sha}))


def test_errors_name_the_file_and_the_problem(saved, problem, tmp_path):
    from sklearn.base import clone

    folder = _copy(saved, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"empty.model\.json: no such file"):
        load_model(tmp_path / "empty")

    (folder / "model.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"model\.json: not valid JSON"):
        load_model(folder)

    folder = _copy(saved, tmp_path / "b")
    _edit_json(folder, lambda doc: doc.pop("n_features_in_"))
    with pytest.raises(ValueError, match=r"model\.json: missing key 'n_features_in_'"):
        load_model(folder)

    folder = _copy(saved, tmp_path / "c")
    _edit_json(folder, lambda doc: doc.update(estimator="os.system"))
    with pytest.raises(ValueError, match="unknown estimator 'os.system'"):
        load_model(folder)

    folder = _copy(saved, tmp_path / "d")
    with np.load(folder / "model.npz") as npz:
        arrays = dict(npz)
    arrays["model.first.weight"] = arrays["model.first.weight"][:, :-1]
    _rewrite_npz(folder, arrays)
    with pytest.raises(ValueError, match=r"model\.npz: array 'model\.first\.weight' must be "
                                         r"float of shape \(2, \d+\)"):
        load_model(folder)

    folder = _copy(saved, tmp_path / "g")
    _edit_json(folder, lambda doc: doc.update(format_version=2))
    with pytest.raises(ValueError, match=r"model\.json: model format version 2, this fgscale "
                                         r"reads version 1; upgrade fgscale$"):
        load_model(folder)
    _edit_json(folder, lambda doc: doc.update(format_version=0))
    with pytest.raises(ValueError, match=r"version 0, .*; save the model again$"):
        load_model(folder)
    (tmp_path / "a_file").write_text("notes")
    with pytest.raises(FileExistsError, match=r"a_file: a file, not a folder; save_model writes "
                                              r"a folder \(model\.json, model\.npz, "):
        save_model(saved[0], tmp_path / "a_file")
    assert (tmp_path / "a_file").read_text() == "notes"
    # a fitted Pipeline or another library's estimator: what it is, not "not fitted"
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = problem[:2]
    for other in (make_pipeline(StandardScaler(), clone(saved[0])).fit(X, y),
                  StandardScaler().fit(X)):
        with pytest.raises(TypeError, match=r"save_model saves FeatureGroupingClassifier, "
                                            r"FeatureGroupingRegressor, got (Pipeline|"
                                            r"StandardScaler) \(a Pipeline or another "
                                            r"library's estimator: joblib saves it"):
            save_model(other, tmp_path / "other")
    assert not (tmp_path / "other").exists()

    folder = _copy(saved, tmp_path / "e")
    (folder / "model.npz").write_bytes(b"\0" + (folder / "model.npz").read_bytes())
    with pytest.raises(ValueError, match=r"model\.npz: does not match model\.json"):
        load_model(folder)

    clf, _ = saved  # refitted with its mask as an image, which the save writes
    folder = tmp_path / "f"
    save_model(clone(clf).set_params(mask=mask_img(clf.mask)).fit(*problem[:2]), folder)
    (folder / "mask.nii.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"mask\.nii\.gz: no such file"):
        load_model(folder)


class _Payload:
    """Unpickling this creates ``marker``: what a crafted file would run instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_inside_model_npz_is_never_run(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    marker = tmp_path / "executed"
    with np.load(folder / "model.npz") as npz:
        arrays = dict(npz)
    payload = np.empty(1, dtype=object)
    payload[0] = _Payload(marker)
    arrays["model.first.weight"] = payload  # an object array: stored as a pickle
    _rewrite_npz(folder, arrays)
    pickle.loads(pickle.dumps(_Payload(tmp_path / "works")))  # the payload does run if unpickled
    assert (tmp_path / "works").exists()
    with pytest.raises(ValueError, match=r"model\.npz: not a plain numeric \.npz"):
        load_model(folder)
    assert not marker.exists()


@pytest.mark.parametrize("fitted, later", [
    (dict(), dict(model="mlp")),
    (dict(model="mlp", hidden_layer_sizes=(4,)), dict(hidden_layer_sizes=(8,))),
    (dict(model="mlp", hidden_layer_sizes=(4,)), dict(model="logreg")),
    (dict(), dict(standardize=False)),
    (dict(), dict(model="cnn")),
])
def test_parameters_set_since_the_fit_are_refused_before_a_save_no_load_could_read(
        problem, tmp_path, fitted, later):
    """load_model rebuilds the model from the saved parameters: an estimator whose parameters
    no longer build its fitted model is refused at save, naming them, and nothing is written;
    set back, it saves and loads."""
    X, y, mask = problem
    clf = FeatureGroupingClassifier(mask=mask, **fitted, **FAST).fit(X, y)
    before = {name: getattr(clf, name) for name in later}
    clf.set_params(**later)
    with pytest.raises(ValueError, match=r"^FeatureGroupingClassifier's parameters changed since "
                                         r"its fit: model=.*, hidden_layer_sizes=.* and "
                                         r"standardize=.* do not build its fitted model; fit it "
                                         "again, or set them back, before saving"):
        save_model(clf, tmp_path / "m")
    assert not (tmp_path / "m").exists()
    save_model(clf.set_params(**before), tmp_path / "m")
    np.testing.assert_array_equal(load_model(tmp_path / "m").predict_proba(X),
                                  clf.predict_proba(X))


def test_a_save_into_a_folder_another_save_is_writing_waits_for_it(saved, problem, tmp_path):
    """Two saves into one folder at once each wrote model.npz then model.json: one's json could
    record the other's weights, a checksum and all. The second now waits for the first."""
    import subprocess
    import sys

    from fgscale._utils.files import exclusive_name

    clf, folder = saved
    X = problem[0]
    out = tmp_path / "model"
    code = ("import sys; from fgscale import load_model, save_model; "
            "save_model(load_model(sys.argv[1]), sys.argv[2])")
    with exclusive_name(out, waiting="held by the test"):  # the first save, still writing
        proc = subprocess.Popen([sys.executable, "-c", code, str(folder), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until_blocked_on_a_lock(proc)  # however long a loaded machine takes to get there
        assert not out.exists()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "model: another save into it is running; waiting for it to end" in err
    np.testing.assert_array_equal(load_model(out).predict_proba(X), clf.predict_proba(X))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_files_no_fgscale_save_wrote_are_never_replaced_without_overwrite(saved, tmp_path):
    """A project folder holding the user's own mask.nii.gz, or another library's model.json:
    a save there is refused, naming them, and leaves them as they were (the save used to
    replace the mask, or remove it when the model had none); overwrite=True replaces them.
    A first save killed before its model.json is finished by the next save, not refused."""
    clf, folder = saved
    theirs = {"mask.nii.gz": b"the lab's own mask", "model.json": b'{"format": "keras"}'}
    for name, content in theirs.items():
        project = tmp_path / name.replace(".", "_")
        project.mkdir()
        (project / name).write_bytes(content)
        with pytest.raises(FileExistsError, match=rf"{project}: {name} there, not of an fgscale "
                                                  r"save: .* pass overwrite=True"):
            save_model(clf, project)
        assert [p.name for p in project.iterdir()] == [name]
        assert (project / name).read_bytes() == content
        save_model(clf, project, overwrite=True)
        np.testing.assert_array_equal(load_model(project).coef_, clf.coef_)
    killed = tmp_path / "killed"  # model.npz written, then the process killed
    killed.mkdir()
    (killed / "model.npz").write_bytes((folder / "model.npz").read_bytes())
    save_model(clf, killed)
    np.testing.assert_array_equal(load_model(killed).coef_, clf.coef_)
    save_model(clf, killed)  # and a folder of an fgscale save is saved over, as before
