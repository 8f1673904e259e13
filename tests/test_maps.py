"""The maps of a run folder: a 3D NIfTI per class that nilearn draws, the 4D stack, maps.json;
the MLP's map checked against autograd."""

import json
import re
import shutil

import nibabel as nib
import numpy as np
import pytest
import torch
from helpers import assert_png_not_blank
from hypothesis import given
from hypothesis import strategies as st

from fgscale.images import unmask
from fgscale.runs import load_run
from fgscale.runs._maps import file_stems, linearized_weights, read_maps, write_maps
from fgscale.training._models import MLP, LogisticRegression


def _jacobian(model, x):
    """d logits / d x at one input x (n_features,), by autograd: (n_classes, n_features)."""
    return torch.autograd.functional.jacobian(lambda v: model(v[None])[0], x).numpy()


def test_mlp_map_is_the_jacobian_of_the_logits_where_every_relu_is_active():
    torch.manual_seed(0)
    model = MLP(7, 3, (5, 4)).eval()
    with torch.no_grad():  # biases large enough that every hidden unit is on near x = 0
        model.first.bias.fill_(10.0)
        model.rest[2].bias.fill_(100.0)
    x = 0.1 * torch.randn(7)
    hidden = model.first(x[None])
    assert (hidden > 0).all() and (model.rest[:3](hidden) > 0).all()  # the oracle's premise
    np.testing.assert_allclose(linearized_weights(model), _jacobian(model, x), rtol=1e-5,
                               atol=1e-6)
    # elsewhere, with units off, the network's gradient is another matrix: the map is the
    # linear part of the network, not a gradient at every input
    with torch.no_grad():
        model.first.bias.fill_(-10.0)
        model.first.bias[0] = 10.0
    assert not np.allclose(linearized_weights(model), _jacobian(model, x), atol=1e-3)


def test_mlp_map_over_many_features_is_the_float64_product_of_its_weights():
    """More features than one block of columns (the first layer is taken to float64 a block
    at a time): the same numbers as the product of the weight matrices in float64."""
    torch.manual_seed(0)
    model = MLP(150_000, 3, (4, 5))
    weights = [m.weight.detach().double() for m in (model.first, model.rest[2], model.rest[5])]
    np.testing.assert_allclose(linearized_weights(model),
                               (weights[2] @ (weights[1] @ weights[0])).numpy(), rtol=1e-12,
                               atol=1e-15)


def test_logistic_regression_map_is_its_weight_matrix():
    torch.manual_seed(0)
    model = LogisticRegression(6, 3)
    with torch.no_grad():
        model.first.weight.normal_()
    np.testing.assert_array_equal(linearized_weights(model), model.first.weight.detach().double().numpy())
    np.testing.assert_allclose(linearized_weights(model), _jacobian(model, torch.randn(6)),
                               rtol=1e-6)


def test_an_unknown_layer_is_refused_rather_than_mapped_wrongly():
    model = MLP(6, 2, (4,))
    model.rest[0] = torch.nn.Tanh()
    with pytest.raises(TypeError, match="cannot linearise a Tanh layer"):
        linearized_weights(model)


@given(st.lists(st.text(max_size=12), min_size=1, max_size=8))
def test_file_stems_are_safe_and_distinct(names):
    stems = file_stems(names)
    assert len(stems) == len(names)
    assert len({s.lower() for s in stems}) == len(stems)  # distinct on case-blind file systems
    for stem in stems:
        assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", stem), stem


def test_file_stems_examples():
    assert file_stems(["face", "house/home", "Face", "chair b", "../x", "", "é"]) == [
        "face", "house_home", "Face_2", "chair_b", "x", "class", "class_2"]


@pytest.mark.parametrize("name", ["logreg", "mlp"])
def test_run_maps_are_a_3d_image_per_class(tiny_runs, name):
    run, store = tiny_runs[name], tiny_runs["store"]
    sidecar, paths = read_maps(run)
    assert sidecar["outputs"] == list(store.classes) == list(paths)
    assert sidecar["files"] == {"face": "maps/face.nii.gz", "house/home": "maps/house_home.nii.gz",
                                "Face": "maps/Face_2.nii.gz", "chair b": "maps/chair_b.nii.gz"}
    assert sidecar["method"] == {"logreg": "weights", "mlp": "product of weight matrices"}[name]
    assert "standardized features" in sidecar["values"]
    # what a voxel outside the mask holds is said, as it is in the files: 0, not NaN
    assert sidecar["values"].endswith("; 0 outside the mask, where there is no feature")
    assert not np.asarray(nib.load(run / sidecar["image"]).dataobj)[~store.mask].any()
    clf = load_run(run)
    expected = np.asarray(unmask(linearized_weights(clf.model_), store.mask,
                                 store.affine).dataobj)
    stack = nib.load(run / sidecar["image"])
    assert stack.shape == (*store.mask.shape, len(store.classes))
    for j, path in enumerate(paths.values()):
        img = nib.load(path)
        assert img.ndim == 3
        np.testing.assert_array_equal(img.affine, store.affine)
        np.testing.assert_array_equal(np.asarray(img.dataobj), np.asarray(stack.dataobj)[..., j])
        np.testing.assert_allclose(np.asarray(img.dataobj), expected[..., j], rtol=1e-6)
    if name == "logreg":  # the estimator's own coef_img_, as nilearn's decoders give theirs
        for c, img in clf.coef_img_.items():
            np.testing.assert_array_equal(np.asarray(img.dataobj),
                                          np.asarray(nib.load(paths[c]).dataobj))


def test_nilearn_plots_each_class_map(tiny_runs, tmp_path):
    import matplotlib

    matplotlib.use("Agg")  # nilearn draws with pyplot: no display here
    from nilearn import plotting

    _, paths = read_maps(tiny_runs["mlp"])
    for name, path in paths.items():
        png = tmp_path / f"{path.name}.png"
        plotting.plot_stat_map(str(path), output_file=png, title=name,
                               bg_img=str(tiny_runs["mlp"] / "mask.nii.gz"))
        assert_png_not_blank(png)


def test_regressor_map_is_its_coef_in_the_target_units(rng, tmp_path):
    from fgscale import FeatureGroupingRegressor

    mask = np.ones((4, 5, 3), bool)
    X = rng.standard_normal((80, mask.sum())).astype(np.float32)
    y = 100.0 * X[:, :5].sum(axis=1) + rng.standard_normal(80)  # a target in large units
    reg = FeatureGroupingRegressor(mask=mask, regularizer="l2", alpha=1e-3, max_epochs=20,
                                   random_state=0).fit(X, y)
    sidecar = write_maps(tmp_path, reg, mask, np.eye(4))
    assert sidecar["outputs"] == ["target"] and "linear regression" in sidecar["values"]
    assert json.loads((tmp_path / "maps.json").read_text()) == sidecar
    np.testing.assert_allclose(nib.load(tmp_path / "maps/target.nii.gz").get_fdata()[mask],
                               reg.coef_, rtol=1e-5)


def test_a_run_without_maps_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="maps.json: no such file; the run has not "
                                                "finished, or an older fgscale trained it"):
        read_maps(tmp_path)


def test_a_damaged_maps_sidecar_or_one_naming_files_outside_the_run_is_refused(tiny_runs, tmp_path):
    run = shutil.copytree(tiny_runs["logreg"], tmp_path / "run")
    good = json.loads((run / "maps.json").read_text())
    name = good["outputs"][0]
    for change in ({"files": {**good["files"], name: "../../elsewhere.nii.gz"}},
                   {"files": {**good["files"], name: "/etc/x.nii.gz"}},
                   {"outputs": None}, {"files": ["maps/a.nii.gz"]}, {"outputs": [1]}):
        (run / "maps.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(ValueError, match=r"maps.json: damaged maps sidecar \(expected "
                                             r'"outputs", a list of names, and "files"'):
            read_maps(run)
    (run / "maps.json").write_text(json.dumps(good))
    assert read_maps(run)[1][name] == run / good["files"][name]


def test_maps_keep_the_images_space_codes(tiny_cohort, tmp_path):
    """Images in MNI space (sform and qform codes 4, as fMRIPrep writes them) give maps, a mask
    and exports in MNI space too, not nibabel's default 'aligned' (2): AFNI puts a map of
    another space code in another view than its template."""
    from helpers import cohort_rows

    from fgscale.cli import main

    rows = cohort_rows(tiny_cohort)
    folder = tmp_path / "mni"
    folder.mkdir()
    for r in rows:
        img = nib.load(tiny_cohort.parent / r["path"])
        out = nib.Nifti1Image(np.asarray(img.dataobj), img.affine)
        out.set_sform(img.affine, code=4)
        out.set_qform(img.affine, code=4)
        out.to_filename(folder / r["path"])
    shutil.copy(tiny_cohort, folder / "cohort.csv")
    store, run = tmp_path / "mni.zarr", tmp_path / "run"
    fast = ["--n-workers", "1", "--no-progress"]
    assert main(["convert", str(folder / "cohort.csv"), "--out", str(store), *fast]) == 0
    assert main(["train", str(store), "--out", str(run), "--n-groupings", "2", "--n-bootstrap",
                 "5", "--n-clusters", "0.2", "--max-epochs", "2", "--batch-size", "8", *fast]) == 0
    p = int(np.asarray(nib.load(run / "mask.nii.gz").dataobj).sum())
    np.save(tmp_path / "w.npy", np.ones(p, np.float32))
    assert main(["export", str(store), "--npy", str(tmp_path / "w.npy"), "--out",
                 str(tmp_path / "w.nii.gz")]) == 0
    _, paths = read_maps(run)
    written = [run / "mask.nii.gz", run / "maps.nii.gz", *paths.values(), tmp_path / "w.nii.gz"]
    images = [nib.load(path) for path in written]
    images += list(load_run(run).coef_img_.values())
    reference = nib.load(folder / rows[0]["path"])
    for path, img in zip([*written, *["coef_img_"] * 3], images, strict=True):
        assert (int(img.header["sform_code"]), int(img.header["qform_code"])) == (4, 4), path
        np.testing.assert_allclose(img.affine, reference.affine, atol=1e-5, err_msg=str(path))


def test_binary_coef_img_keys_both_classes_as_nilearn_decoder_does():
    """Two classes: a map per class, as nilearn's Decoder keys both classes of a binary problem
    (its coef_img_ holds two maps, negatives of each other); here the second class's map is
    coef_ / 2 and the first's its negative, since the two logits start at zero and move
    oppositely."""
    import warnings

    from nilearn.decoding import Decoder

    from fgscale import FeatureGroupingClassifier
    from fgscale.images import make_classification_volumes

    X, y, mask, affine = make_classification_volumes(40, 2, grid=(8, 9, 8), seed=0)
    labels = np.array(["rest", "task"])[y]
    mask_img = nib.Nifti1Image(mask.astype(np.uint8), affine)
    clf = FeatureGroupingClassifier(mask=mask_img, n_groupings=4, n_bootstrap=10,
                                    max_epochs=5, random_state=0).fit(X, labels)
    maps = clf.coef_img_
    assert list(maps) == ["rest", "task"]
    coef = np.zeros(mask.shape)
    coef[mask] = clf.coef_[0]
    np.testing.assert_allclose(maps["task"].get_fdata(), coef / 2, atol=1e-7)
    np.testing.assert_allclose(maps["rest"].get_fdata(), -maps["task"].get_fdata(), atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nilearn's about its defaults
        decoder = Decoder(estimator="logistic_l2", mask=mask_img, cv=2,
                          screening_percentile=100).fit(unmask(X, mask, affine), labels)
    assert list(decoder.coef_img_) == list(maps)
    nilearn_maps = [img.get_fdata() for img in decoder.coef_img_.values()]
    np.testing.assert_allclose(nilearn_maps[0], -nilearn_maps[1])
