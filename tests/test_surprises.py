"""Silent surprises of a user trial, each now said: a whole float read as a count of clusters,
cluster options refused by the commands that need no cluster, a warning naming the other API's
option, a hint naming a value its API does not take, NaN voxels left out of a computed mask."""

import re
import warnings

import nibabel as nib
import numpy as np
import pytest
from helpers import dashboard_port_may_be_taken
from sklearn.exceptions import ConvergenceWarning

from fgscale import FeatureGroupingClassifier
from fgscale.cli import build_parser, main

# ------------------------------------------------------------------ 1. --n-clusters 5.0


@pytest.mark.parametrize("text", ["5.0", "0.1,5.0", "5e0"])
def test_cli_refuses_a_whole_float_n_clusters_saying_to_write_an_int(text, capsys):
    """--n-clusters 5.0 trained with 5 clusters without a word, where the estimator refuses
    n_clusters=5.0: a float >= 1 is refused, saying that a count is written as an int."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["train", "s.zarr", "--out", "run", "--n-clusters", text])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("fgscale train: error: argument --n-clusters: expected an int >= 1")
    assert err.endswith(f"got {text!r}: k is an int count (write 5) or a fraction in (0, 1)")


def test_python_refuses_a_whole_float_n_clusters_as_the_cli_does():
    for value in (5.0, [0.1, 5.0]):
        with pytest.raises(ValueError, match=r"'n_clusters' parameter .* must be an int >= 1 .*: "
                                             r"k is an int count \(write 5\) or a fraction in "
                                             r"\(0, 1\)\. Got .* instead\.$"):
            FeatureGroupingClassifier(n_clusters=value)._check_params()


def test_n_clusters_ints_and_fractions_still_parse():
    parse = build_parser().parse_args
    assert parse(["train", "s", "--out", "r", "--n-clusters", "5"]).n_clusters == 5
    assert parse(["train", "s", "--out", "r", "--n-clusters", "0.5"]).n_clusters == 0.5
    assert parse(["train", "s", "--out", "r", "--n-clusters", "3,0.1"]).n_clusters == [3, 0.1]
    assert isinstance(parse(["train", "s", "--out", "r", "--n-clusters", "5"]).n_clusters, int)
    FeatureGroupingClassifier(n_clusters=5)._check_params()


# ------------------------------------------------- 2. cluster options of predict and report

CLUSTER = ["--scheduler-file", "scheduler.json", "--n-workers", "4", "--timeout", "30",
           "--tls-ca-file", "ca.pem"]


@pytest.mark.parametrize("command", ["predict", "report"])
def test_predict_and_report_take_the_cluster_options_and_say_they_need_none(command, tmp_path,
                                                                            capsys):
    """A script that passes the same cluster options to every command broke on predict and
    report ("unrecognized arguments: --scheduler-file"): they are taken, and said unused once."""
    run = str(tmp_path / "no-run")
    argv = {"predict": ["predict", run, "x.nii", "--out", "-"], "report": ["report", run]}[command]
    with pytest.warns(UserWarning) as caught:
        assert main([*argv, *CLUSTER]) == 2  # no such run: refused after the warning
    said = [str(w.message) for w in caught]
    assert said == [f"--scheduler-file, --n-workers, --timeout, --tls-ca-file not used: "
                    f"{command} needs no cluster (it runs in this process)"]
    assert "unrecognized arguments" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["predict", "report"])
def test_predict_and_report_say_nothing_of_cluster_options_not_given(command, tmp_path,
                                                                     monkeypatch):
    # a batch job's $DASK_SCHEDULER_ADDRESS is no option given: nothing to say of it
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:1")
    run = str(tmp_path / "no-run")
    argv = {"predict": ["predict", run, "x.nii", "--out", "-"], "report": ["report", run]}[command]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(argv) == 2


@dashboard_port_may_be_taken
def test_predict_with_a_scheduler_file_predicts_in_this_process(tiny_runs, tmp_path, capsys):
    out = tmp_path / "predictions.csv"
    with pytest.warns(UserWarning, match=r"^--scheduler-file not used: predict needs no cluster"):
        assert main(["predict", str(tiny_runs["logreg"]), str(tiny_runs["store"].path),
                     "--out", str(out), "--no-progress", "--scheduler-file",
                     str(tmp_path / "missing.json")]) == 0
    assert out.is_file() and len(out.read_text().splitlines()) == 41  # a header, 40 rows


# ------------------------------------- 3. the ConvergenceWarning names its own API's options


def _not_converged(rng) -> warnings.WarningMessage:
    X = rng.standard_normal((40, 6)).astype(np.float32)
    with pytest.warns(ConvergenceWarning) as caught:
        FeatureGroupingClassifier(regularizer="none", max_epochs=2, random_state=0).fit(
            X, np.arange(40) % 2)
    return next(w for w in caught if w.category is ConvergenceWarning)


def test_python_convergence_warning_names_the_parameters_not_the_options(rng):
    """In Python it told the user to pass --max-epochs, an option of the command line."""
    said = str(_not_converged(rng).message)
    assert "--" not in said, said
    assert "reached max_epochs=2 " in said
    assert "give a larger max_epochs= to train until it stops, or a larger tol= where" in said


def test_cli_convergence_warning_names_the_options(rng, monkeypatch):
    """The command line's one-line warnings say the options (--max-epochs, --tol) where the
    library names a parameter to pass (max_epochs=), and keep a value said (max_epochs=2)."""
    import fgscale.estimators._selection as selection
    from fgscale.cli._options import one_line_warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after
    caught = _not_converged(rng)
    one_line_warnings("train")
    line = warnings.formatwarning(caught.message, caught.category, selection.__file__, 1)
    assert line.startswith("fgscale train: warning: FeatureGroupingClassifier(regularizer="
                           "'none'): training reached max_epochs=2 while its ")
    assert "give a larger --max-epochs to train until it stops, or a larger --tol where" in line
    assert "max_epochs=" not in line.split("reached max_epochs=2", 1)[1]
    assert line.count("\n") == 1
    # another library's warning is not rewritten
    other = warnings.formatwarning("pass max_epochs= here", UserWarning, "/elsewhere/x.py", 3)
    assert "pass max_epochs= here" in other


# ------------------------------------- 4. a resample hint names values its API takes

# "resample=VALUE for API" and "--resample [VALUE] for fgscale COMMAND", as the hints say them
_PYTHON_HINT = re.compile(r"resample=(\S+?) for (convert\(\)|the estimators)")
_CLI_HINT = re.compile(r"--resample((?: \w+)?) for fgscale (\w+)")


def _accepted(message: str) -> None:
    """Every resample value the message names is said with the API that takes it, and that
    API takes it (MM standing for a voxel size): convert() a size or 'mask', the estimators
    True, each command its own option."""
    assert len(_PYTHON_HINT.findall(message)) == message.count("resample="), message
    assert len(_CLI_HINT.findall(message)) == message.count("--resample"), message
    assert _PYTHON_HINT.search(message) and _CLI_HINT.search(message), message
    for value, api in _PYTHON_HINT.findall(message):
        if api == "convert()":
            assert value in ("'mask'", "MM"), message
        else:
            FeatureGroupingClassifier(resample=eval(value))._check_params()
    for value, command in _CLI_HINT.findall(message):
        args = {"convert": ["convert", "c.csv", "--out", "s"],
                "predict": ["predict", "run", "x.nii", "--out", "-"]}[command]
        build_parser().parse_args([*args, "--resample", *value.replace("MM", "2").split()])


@pytest.fixture
def two_grids(tmp_path):
    """4 images on a 1 mm grid, one on 2 mm, and a mask on the 2 mm grid."""
    rng = np.random.default_rng(0)
    for i in range(4):
        nib.save(nib.Nifti1Image(rng.random((6, 7, 5)).astype(np.float32) + 1, np.eye(4)),
                 tmp_path / f"a{i}.nii.gz")
    coarse = np.diag([2.0, 2.0, 2.0, 1.0])
    nib.save(nib.Nifti1Image(rng.random((6, 7, 5)).astype(np.float32) + 1, coarse),
             tmp_path / "odd.nii.gz")
    nib.save(nib.Nifti1Image(np.ones((6, 7, 5), np.uint8), coarse), tmp_path / "mask.nii.gz")
    return tmp_path


def test_convert_hints_name_its_own_values(two_grids):
    from fgscale.store import convert

    table = two_grids / "c.csv"
    table.write_text("path,label\n" + "".join(f"a{i}.nii.gz,{'ab'[i % 2]}\n" for i in range(4)))
    with pytest.raises(ValueError, match="does not match the mask's grid") as to_mask:
        convert(table, two_grids / "s1", mask=two_grids / "mask.nii.gz", progress=False)
    _accepted(str(to_mask.value))
    with open(table, "a") as f:
        f.write("odd.nii.gz,a\n")
    with pytest.raises(ValueError, match="does not match the majority's grid") as majority:
        convert(table, two_grids / "s2", progress=False)
    _accepted(str(majority.value))


def test_cli_convert_resample_mask_without_a_mask_says_the_options(two_grids, capsys):
    """It said resample='mask', which the command line does not take."""
    table = two_grids / "c.csv"
    table.write_text("path,label\n" + "".join(f"a{i}.nii.gz,{'ab'[i % 2]}\n" for i in range(4)))
    assert main(["convert", str(table), "--out", str(two_grids / "s"), "--resample", "mask",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fgscale convert: error: resample='mask' (--resample mask) resamples the images "
                   "to the mask's grid: give the mask (mask=, --mask)"]


def test_estimator_hints_name_its_own_values(two_grids):
    """The estimators' said "--resample for fgscale predict" in a fit, beside resample=True."""
    images = [str(two_grids / f"a{i}.nii.gz") for i in range(4)]
    clf = FeatureGroupingClassifier(max_epochs=1, mask=str(two_grids / "mask.nii.gz"))
    with pytest.raises(ValueError, match="does not match the mask's grid") as to_mask:
        clf.fit(images, [0, 1, 0, 1])
    _accepted(str(to_mask.value))
    with pytest.raises(ValueError, match="does not match the majority's grid") as majority:
        FeatureGroupingClassifier(max_epochs=1).fit([str(two_grids / "odd.nii.gz"), *images],
                                                    [0, 1, 0, 1, 0])
    message = str(majority.value)
    assert "resample=True for the estimators" in message and "--" not in message, message


# ------------------------------- 5. NaN voxels left out of a computed mask are said


@pytest.fixture
def nan_cohort(tmp_path):
    """6 images, non-zero everywhere; the third and fifth hold NaN or inf at 2 voxels."""
    rng = np.random.default_rng(0)
    lines = ["path,label"]
    for i in range(6):
        data = rng.random((6, 7, 5)).astype(np.float32) + 1
        if i == 2:
            data[1, 1, 1] = np.nan
        if i == 4:
            data[1, 1, 1], data[3, 4, 2] = np.inf, np.nan
        nib.save(nib.Nifti1Image(data, np.eye(4)), tmp_path / f"s{i}.nii.gz")
        lines.append(f"s{i}.nii.gz,{'ab'[i % 2]}")
    (tmp_path / "c.csv").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_convert_says_the_voxels_its_computed_mask_leaves_out_for_nan(nan_cohort, caplog):
    """33,852 voxels instead of 33,854, without a word: a NaN in one image removes its voxel
    from the computed mask (as nilearn's), which is now said once, naming the first image."""
    from fgscale.store import convert

    with caplog.at_level("WARNING", logger="fgscale"):
        store = convert(nan_cohort / "c.csv", nan_cohort / "s.zarr", progress=False)
    assert store.n_features == 6 * 7 * 5 - 2
    said = [r.getMessage() for r in caplog.records if "NaN or inf" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("the mask computed from the images leaves out 2 voxel(s) where "
                              "some image holds NaN or inf (the first: ")
    assert "s2.nii.gz" in said[0] and "s4.nii.gz" not in said[0]


def test_convert_says_nothing_of_nan_outside_the_mask_given(nan_cohort, caplog):
    from fgscale.store import convert

    mask = np.ones((6, 7, 5), np.uint8)
    mask[1, 1, 1] = mask[3, 4, 2] = 0
    nib.save(nib.Nifti1Image(mask, np.eye(4)), nan_cohort / "m.nii.gz")
    with caplog.at_level("WARNING", logger="fgscale"):
        convert(nan_cohort / "c.csv", nan_cohort / "s.zarr", mask=nan_cohort / "m.nii.gz",
                progress=False)
    assert not [r for r in caplog.records if "NaN or inf" in r.getMessage()]


def test_compute_mask_says_the_voxels_it_leaves_out_for_nan(nan_cohort):
    from fgscale.images import compute_mask

    with pytest.warns(UserWarning, match=r"^the mask computed from the images leaves out 2 "
                                         r"voxel\(s\) where some image holds NaN or inf \(the "
                                         r"first: .*s2\.nii\.gz\)") as caught:
        mask = compute_mask([str(nan_cohort / f"s{i}.nii.gz") for i in range(6)])
    assert np.asarray(mask.dataobj).sum() == 6 * 7 * 5 - 2 and len(caught) == 1


def test_convert_refuses_resample_true_rather_than_read_it_as_1_mm(tiny_cohort, tmp_path):
    """convert(resample=True), the estimators' way to say "to the mask", was read as 1 mm."""
    from fgscale.store import convert

    for value in (True, "2mm", 0):
        with pytest.raises(ValueError, match="resample must be a voxel size in mm"):
            convert(tiny_cohort, tmp_path / "out.zarr", resample=value)
    assert not (tmp_path / "out.zarr").exists()
