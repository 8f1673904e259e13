"""The command line through its entry point: defaults in --help, --no-progress on every long
command, make-cohort, and "already complete, nothing to do" when nothing was done."""

import argparse
import csv
import json
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import TINY_GRID, dashboard_port_may_be_taken, synthetic_store

from fgscale.cli import build_parser, main
from fgscale.store import open_store

BAR = "%|"  # what every tqdm bar prints: "groupings: 100%|██████████| 4/4 [...]"
DASHBOARD = "Dask dashboard: "  # printed on stderr when a command starts its cluster
# one validation split (cv none): its lines say one phase's epochs and the refit's
TRAIN = ["--n-groupings", "4", "--n-bootstrap", "10", "--n-clusters", "0.1", "--batch-size",
         "8", "--learning-rate", "0.05", "--seed", "3", "--max-epochs", "2", "--n-workers", "1",
         "--cv", "none"]
LONG_COMMANDS = {"convert": ["C.csv", "--out", "S"], "bank": ["S"], "train": ["S", "--out", "R"],
                 "evaluate": ["R", "S"], "cv": ["S"], "predict": ["R", "S", "--out", "P"],
                 "demo": []}
TINY = "x".join(map(str, TINY_GRID))


def _subcommands(parser) -> dict:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def _mtimes(folder):
    return {f: f.stat().st_mtime_ns for f in folder.rglob("*") if f.is_file()}


def test_every_option_shows_its_default_in_help():
    for name, sub in _subcommands(build_parser()).items():
        formatter = sub._get_formatter()
        # the alternatives of a required choice (export's --npy/--grouping/--omega) have none
        alternatives = {a for g in sub._mutually_exclusive_groups if g.required
                        for a in g._group_actions}
        for action in sub._actions:
            if (not action.option_strings or action.required or action in alternatives
                    or action.default is argparse.SUPPRESS):
                continue
            text = formatter._expand_help(action)
            assert "default" in text, f"fgscale {name} {action.option_strings[0]}: {text!r}"
    usage = _subcommands(build_parser())["train"].format_help()
    assert "(default: 0.2)" in usage and "(default: off)" in usage


def test_a_default_of_none_can_be_given_back():
    """--help says "(default: None)": the value must be typable, to set it back on a --resume
    whose saved run had another (it was refused: "expected None, ..., got 'None'")."""
    from fgscale.estimators._params import PARAMS

    for param in (p for p in PARAMS if p.cli and p.default is None):
        option = "--" + param.name.replace("_", "-")
        for text in ("None", "none"):
            args = build_parser().parse_args(["train", "s.zarr", "--out", "run", option, text])
            assert getattr(args, param.name) is None, option
    assert build_parser().parse_args(["train", "s.zarr", "--out", "run", "--alpha", "0.5"]).alpha == 0.5


def test_help_says_how_to_write_a_list_and_a_bool(capsys):
    """--help said "a list: chosen among its values" without saying how to type one (commas,
    not spaces), and "--standardize STANDARDIZE" without its words; the error said neither."""
    sub = _subcommands(build_parser())["train"]
    for option in ("--n-clusters", "--alpha", "--dropout"):
        action = next(a for a in sub._actions if option in a.option_strings)
        assert "comma-separated" in sub._get_formatter()._expand_help(action), option
    args = build_parser().parse_args(["train", "s.zarr", "--out", "run", "--n-clusters",
                                      "0.05,0.1", "--alpha", "auto", "--standardize", "off"])
    assert args.n_clusters == [0.05, 0.1] and args.alpha == "auto" and args.standardize is False
    usage = sub.format_usage()
    assert "--standardize {true,false,none,zscore_sample,zscore}" in usage
    assert "--early-stopping {true,false,auto}" in usage
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "s.zarr", "--out", "run", "--n-clusters", "0.05 0.1"])
    assert "comma-separated, such as 0.05,0.1" in capsys.readouterr().err


@pytest.mark.parametrize("command", LONG_COMMANDS)
def test_every_long_command_has_no_progress(command):
    args = build_parser().parse_args([command, *LONG_COMMANDS[command], "--no-progress"])
    assert args.no_progress is True
    assert build_parser().parse_args([command, *LONG_COMMANDS[command]]).no_progress is False


def test_make_cohort_writes_a_synthetic_cohort_once(tmp_path, capsys):
    out = tmp_path / "cohort"
    assert main(["make-cohort", str(out), "--n-samples", "8", "--n-classes", "2", "--grid", TINY,
                 "--n-subjects", "2", "--snr-db", "3", "--four-d"]) == 0
    printed = capsys.readouterr().out
    assert "a SYNTHETIC cohort of 8 volumes, 2 classes, 12x14x12 grid, SNR 3 dB" in printed
    with open(out / "cohort.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["label"] for r in rows} == {"class_0", "class_1"}
    assert len(rows) < 8  # --four-d: a 4D file per subject, class and split
    assert json.loads((out / "cohort.json").read_text())["synthetic"] is True
    # a second call would overwrite the table: refused
    assert main(["make-cohort", str(out)]) == 2
    assert "cohort.csv: exists; remove it or choose another folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["make-cohort", str(tmp_path / "c2"), "--grid", "3mm"])
    assert "expected 4mm, 2mm, 1mm or XxYxZ" in capsys.readouterr().err


def test_unknown_options_are_reported_by_their_subcommand(tmp_path, capsys):
    # the top parser would report them with its own usage, which names no option of train
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run"),
              "--max-epocs", "3", "--regulariser=fg", "--nonsense"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    # train's full usage is some twenty lines: cut to what it needs, the error line below it
    assert err.splitlines()[0] == ("usage: fgscale train store --out OUT [options] (fgscale "
                                   "train --help lists them)")
    assert ("fgscale train: error: unrecognized arguments: --max-epocs 3 --regulariser=fg "
            "--nonsense; did you mean --max-epochs (not --max-epocs), --regularizer (not "
            "--regulariser)?") in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        main(["--nonsense"])
    assert "fgscale: error: unrecognized arguments: --nonsense\n" in capsys.readouterr().err
    # -v is the top parser's: given after the command, where most tools take it, it is pointed at
    for flag in ("-v", "-vv", "--verbose"):
        with pytest.raises(SystemExit):
            main(["bank", str(tmp_path / "s.zarr"), flag, "--list"])
        assert (f"fgscale bank: error: unrecognized arguments: {flag}; did you mean {flag} before "
                f"the command (fgscale {flag} bank ...)?") in capsys.readouterr().err


@dashboard_port_may_be_taken
def test_convert_progress_then_already_complete(tmp_path, capsys):
    table = tmp_path / "cohort" / "cohort.csv"
    assert main(["make-cohort", str(table.parent), "--n-samples", "12", "--n-classes", "3",
                 "--grid", TINY, "--n-subjects", "3"]) == 0
    quiet, shown = tmp_path / "quiet.zarr", tmp_path / "shown.zarr"
    capsys.readouterr()
    assert main(["convert", str(table), "--out", str(quiet), "--n-workers", "1",
                 "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "12 rows x" in out and BAR not in err
    assert "Dask dashboard" not in err  # a small cohort: threads of this process, no cluster
    with pytest.raises(SystemExit) as refused:  # argparse's: the option named
        main(["convert", str(table), "--out", str(tmp_path / "none.zarr"), "--n-workers", "0"])
    assert refused.value.code == 2
    assert "argument --n-workers: expected a positive integer, got '0'" in capsys.readouterr().err
    assert open_store(quiet).attrs["synthetic"] is True
    assert main(["convert", str(table), "--out", str(shown), "--n-workers", "1"]) == 0
    err = capsys.readouterr().err
    assert BAR in err
    # each bar says what it counts, as training's do ("feature stats", "epochs")
    assert "mask: 100%" in err and "converting: 100%" in err

    files = _mtimes(quiet)
    assert main(["convert", str(table), "--out", str(quiet), "--n-workers", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"{quiet}: already complete, nothing to do (12 rows x " \
                          f"{open_store(quiet).n_features} voxels)"
    assert "Dask dashboard" not in err  # no cluster started to do nothing
    assert _mtimes(quiet) == files
    # --classes typed with spaces after the commas, as the table's labels are read stripped
    assert main(["convert", str(table), "--out", str(tmp_path / "classes.zarr"), "--n-workers",
                 "1", "--no-progress", "--classes", "class_2, class_0, class_1"]) == 0
    assert list(open_store(tmp_path / "classes.zarr").classes) == ["class_2", "class_0", "class_1"]
    assert "3 classes" in capsys.readouterr().out


@dashboard_port_may_be_taken
def test_convert_starts_a_cluster_above_the_in_process_size(tmp_path, capsys, monkeypatch):
    import fgscale.store._convert as convert_module

    table = tmp_path / "cohort" / "cohort.csv"
    assert main(["make-cohort", str(table.parent), "--n-samples", "6", "--n-classes", "2",
                 "--grid", TINY, "--n-subjects", "2"]) == 0
    monkeypatch.setattr(convert_module, "_IN_PROCESS_BYTES", 0)  # every cohort is "large"
    capsys.readouterr()
    assert main(["convert", str(table), "--out", str(tmp_path / "s.zarr"), "--n-workers", "1",
                 "--no-progress"]) == 0
    assert capsys.readouterr().err.count("Dask dashboard: http") == 1  # once, for its cluster
    assert open_store(tmp_path / "s.zarr").n_samples == 6


def test_small_convert_imports_no_dask(tmp_path):
    """The start-up a small cohort is spared: distributed and dask are never imported."""
    table = tmp_path / "cohort" / "cohort.csv"
    assert main(["make-cohort", str(table.parent), "--n-samples", "6", "--n-classes", "2",
                 "--grid", TINY, "--n-subjects", "2"]) == 0
    code = ("import sys; from fgscale.cli import main; "
            f"rc = main(['convert', {str(table)!r}, '--out', {str(tmp_path / 's.zarr')!r}, "
            "'--no-progress']); print(rc, sorted(m for m in ('dask', 'distributed') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.splitlines()[-1] == "0 []", done.stdout + done.stderr
    assert open_store(tmp_path / "s.zarr").n_samples == 6


def test_bank_with_n_clusters_auto_builds_a_bank_for_each_k_of_the_grid(tmp_path, capsys):
    from fgscale.estimators._auto import searched_values
    from fgscale.grouping._bank import resolve_n_clusters
    from fgscale.store._banks import list_banks

    store = synthetic_store(tmp_path / "s.zarr", 12, 2, seed=0)
    bank = ["bank", str(store.path), "--n-groupings", "2", "--n-bootstrap", "4",
            "--n-workers", "1", "--no-progress"]  # n_clusters: "auto" by default
    # the MLP's grid stops at 20%: no bank of 40% built for a model that never uses it
    assert main([*bank, "--model", "mlp"]) == 0
    out, err = capsys.readouterr()
    assert out.count("2 groupings built") == 3 and "already complete" not in out
    assert main(bank) == 0  # logistic regression's: 40% too
    out, err = capsys.readouterr()
    # 5, 10, 20 and 40% (2% leaves too few clusters here, 80% is regression's)
    ks = searched_values("n_clusters", "auto", n_features=store.n_features)
    assert ks == (0.05, 0.1, 0.2, 0.4)
    assert out.count("already complete") == 3 and out.count("2 groupings built") == 1
    assert err.count(DASHBOARD) == 1  # one cluster for the four banks
    assert sorted(b["n_clusters"] for b in list_banks(store.path)) == [
        resolve_n_clusters(k, store.n_features) for k in ks]


def test_cluster_options_that_a_command_will_not_use_are_said(tiny_store, client, capsys):
    """--n-workers beside --scheduler sized nothing, and --tls-* without one secured nothing,
    both in silence: a user who asked for 32 workers should learn the joined cluster's count
    is what runs. The command itself goes on."""
    bank = ["bank", str(tiny_store.path), "--n-groupings", "2", "--n-bootstrap", "10",
            "--n-clusters", "0.1", "--no-progress"]
    with pytest.warns(UserWarning, match=r"^--n-workers not used: a running scheduler is "
                                         r"joined, whose cluster has its own workers$"):
        assert main([*bank, "--scheduler", client.scheduler.address, "--n-workers", "32"]) == 0
    assert "2 groupings built" in capsys.readouterr().out
    with pytest.warns(UserWarning, match=r"^--tls-cert, --tls-key not used: no scheduler is "
                                         r"joined \(--scheduler tls://HOST:PORT\)"):
        assert main([*bank, "--tls-cert", "c.pem", "--tls-key", "k.pem"]) == 0
    assert "already complete" in capsys.readouterr().out


def test_bank_list_and_remove_say_the_build_options_they_do_not_use(tiny_store, capsys):
    """--list --n-clusters 0.1 listed every bank, --remove KEY --overwrite removed without a
    word of the options: a user may think them filters or rebuilds."""
    store = str(tiny_store.path)
    with pytest.warns(UserWarning, match=r"^--n-clusters, --seed not used: --list and --remove "
                                         r"build nothing"):
        assert main(["bank", store, "--list", "--n-clusters", "0.1", "--seed", "3"]) == 0
    assert f"{store}: no bank" in capsys.readouterr().out
    with pytest.warns(UserWarning, match=r"^--overwrite not used"):
        assert main(["bank", store, "--remove", "folds", "--overwrite"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the options alone: no warning
        assert main(["bank", store, "--list"]) == 0


def test_bank_then_already_complete(tiny_store, capsys):
    bank = ["bank", str(tiny_store.path), "--n-groupings", "3", "--n-bootstrap", "10",
            "--n-clusters", "0.1", "--n-workers", "1"]
    assert main([*bank, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "3 groupings built, 0 reused" in out and BAR not in err
    assert err.count(DASHBOARD) == 1  # the embedded cluster, started for the work
    assert main(bank) == 0
    out, err = capsys.readouterr()
    assert "already complete (3 groupings, k=" in out and BAR not in err
    assert DASHBOARD not in err  # nothing to do: no cluster started
    assert main([*bank, "--n-groupings", "4"]) == 0  # one more: built, with its bar
    out, err = capsys.readouterr()
    assert "1 groupings built, 3 reused" in out and BAR in err and err.count(DASHBOARD) == 1


def test_train_evaluate_predict_progress_and_nothing_to_do(tiny_store, tmp_path, capsys):
    store, quiet, shown = str(tiny_store.path), tmp_path / "quiet", tmp_path / "shown"
    assert main(["train", store, "--out", str(quiet), *TRAIN, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "trained logreg/feature_grouping for 2 epochs" in out and BAR not in err
    assert "maps: " in out and "see maps.json" in out
    assert main(["train", store, "--out", str(shown), *TRAIN]) == 0
    assert "epochs: 100%|" in capsys.readouterr().err

    # the finished run, asked again (with bars this time): its saved summary, said as such
    files = _mtimes(quiet)
    assert main(["train", store, "--out", str(quiet), *TRAIN, "--resume"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{quiet}: already complete with these parameters, nothing to do")
    assert "trained logreg/feature_grouping for 2 epochs" in out and BAR not in err
    assert _mtimes(quiet) == files
    assert DASHBOARD not in err  # nothing to do: no cluster started
    # refused before any cluster starts: a run already there, a store that is not
    for args in ([store, "--out", str(quiet)], [str(tmp_path / "nosuch.zarr"), "--out",
                                                 str(tmp_path / "other")]):
        assert main(["train", *args, *TRAIN]) == 2
        err = capsys.readouterr().err
        assert "fgscale train: error: " in err and DASHBOARD not in err

    for command in (["evaluate", str(quiet), store, "--n-workers", "1"],
                    ["predict", str(quiet), store, "--out", str(tmp_path / "p.csv")]):
        assert main(command) == 0
        assert "predicting: 100%|" in capsys.readouterr().err
        assert main([*command, "--no-progress"]) == 0
        assert BAR not in capsys.readouterr().err


def test_cv_without_progress(tiny_store, capsys):
    assert main(["cv", str(tiny_store.path), *TRAIN, "--folds", "2", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "2-fold cross-validation" in out and BAR not in err


def test_a_resumed_run_says_its_own_model_and_a_warning_is_one_line(tiny_store, tmp_path):
    """In a fresh process (pytest keeps warnings to itself): a parameter with no effect is
    said in one line, as errors are; a finished run asked again with --resume alone reports
    its saved model and regularizer, not the options' defaults."""
    run = tmp_path / "mlp"
    fgscale = [sys.executable, "-m", "fgscale", "train", str(tiny_store.path), "--out", str(run),
               *TRAIN, "--no-progress"]
    first = subprocess.run([*fgscale, "--model", "mlp", "--hidden-layer-sizes", "8",
                            "--regularizer", "dropout"], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    # one line, no source line (Dask's own warnings keep their format)
    assert [line for line in first.stderr.splitlines() if "n_clusters" in line] == [
        "fgscale train: warning: n_clusters=0.1 has no effect with regularizer='dropout' and "
        "model='mlp'"]
    # a warning at the estimator's caller's line (here the command's start) is one line too
    said = [line for line in first.stderr.splitlines() if "max_epochs=2" in line]
    assert len(said) == 1 and said[0].startswith(
        "fgscale train: warning: FeatureGroupingClassifier(regularizer='dropout'): training "
        "reached max_epochs=2 "), said
    # its advice in the command line's words (the library says max_epochs=, tol=)
    assert "give a larger --max-epochs to train until it stops, or a larger --tol " in said[0]
    again = subprocess.run([*fgscale, "--resume"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stdout and "trained mlp/dropout for" in again.stdout


def test_train_shows_the_bar_of_the_banks_it_builds(tiny_store, tmp_path, capsys):
    """A bank missing when training starts is built first: with progress bars, its bar shows
    (it was a silent wait between the statistics' bar and the epochs'), and without, none."""
    store = str(tiny_store.path)
    assert main(["train", store, "--out", str(tmp_path / "quiet"), *TRAIN, "--no-progress"]) == 0
    assert BAR not in capsys.readouterr().err
    auto = [a for a in TRAIN if a not in ("--n-clusters", "0.1")]  # 5, 20 and 40%: new banks
    assert main(["train", store, "--out", str(tmp_path / "shown"), *auto]) == 0
    err = capsys.readouterr().err
    # a bar starts at 0% once (it may print its 100% twice: its last update, then its close)
    # one bar per new bank, named by its k
    started = re.findall(r"groupings \(k (\d+)\):   0%\|", err)
    assert len(started) == 3 and len(set(started)) == 3 and "100%|" in err
    # each candidate's bar named by its values, the refit's by its phase: five bars named
    # "epochs" could not be told apart
    ks = re.findall(r"epochs \(candidate (\d): alpha 0, dropout 0, k (\d+)\): 100%\|", err)
    assert [c for c, _ in sorted(set(ks))] == ["1", "2", "3", "4"]  # 5, 10, 20, 40% of p
    assert len({k for _, k in ks}) == 4
    assert "epochs (refit): 100%|" in err


def test_a_bar_written_to_a_log_file_is_redrawn_now_and_then(tmp_path):
    """A batch job's stderr is a file: the bars are redrawn every 30 s at most there, not ten
    times a second (the demo's log held 164 KB of carriage-return updates)."""
    store = synthetic_store(tmp_path / "s.zarr", 40, 4, n_subjects=5, seed=0, block_rows=8)
    commands = {"groupings": ["bank", str(store.path), "--n-groupings", "400", "--n-bootstrap",
                              "10", "--n-clusters", "0.1", "--n-workers", "1"],
                "epochs": ["train", str(store.path), "--out", str(tmp_path / "run"),
                           "--regularizer", "none", "--early-stopping", "false", "--max-epochs",
                           "300", "--batch-size", "8", "--n-workers", "1"]}
    for bar, command in commands.items():  # many updates: 400 tasks, epochs with their losses
        log = tmp_path / f"{command[0]}.err"
        with open(log, "w") as err:
            done = subprocess.run([sys.executable, "-m", "fgscale", *command], stderr=err,
                                  stdout=subprocess.DEVNULL, timeout=300)
        text = log.read_bytes().decode()  # as written: read_text would turn \r into \n
        assert done.returncode == 0, text
        # drawn at 0%, then its last update and its close (training may stop early): no
        # redraw in between
        named = rf"{bar}(?: \(k \d+\))?:"  # a bank's bar names its k
        assert 2 <= len(re.findall(named, text)) <= 3 and re.search(named + "   0%", text), text
        # each drawing on a line of its own, as tail -f and grep read a log: not carriage
        # returns that glue every update, and any warning, into one line
        assert "\r" not in text, text
        lines = [line for line in text.splitlines() if f"{bar}:" in line]
        assert all(line.startswith(f"{bar}:") and line.endswith("]") for line in lines), text


def test_train_says_what_it_chose_and_the_refit(tiny_store, tmp_path, capsys):
    """With candidates (n_clusters "auto", a list of alpha), the lines of train said "for N
    epochs", N the chosen candidate's alone, and neither the choice nor the refit."""
    out = str(tmp_path / "run")
    auto = [a for a in TRAIN if a not in ("--n-clusters", "0.1", "--max-epochs", "2")]
    assert main(["train", str(tiny_store.path), "--out", out, *auto, "--max-epochs", "3",
                 "--alpha", "0,0.1", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads((tmp_path / "run" / "final.json").read_text())
    chosen = summary["selected"]
    assert len(summary["candidates"]) == 8  # 5, 10, 20, 40% × two alphas
    ks = sorted({c["n_clusters"] for c in summary["candidates"]})
    assert lines[0].startswith(f"trained logreg/feature_grouping for {summary['epochs']} epochs "
                               f"(+ {summary['refit_epochs']} refit)")
    y_test = tiny_store.y[tiny_store.split == "test"]
    assert lines[0].endswith(f"on {y_test.size} rows (the most frequent class alone "
                             f"{np.bincount(y_test).max() / y_test.size:.4f})")
    assert lines[1] == (f"chosen on the validation split among 8 candidates: alpha "
                        f"{chosen['alpha']:g} (of 0, 0.1), n_clusters {chosen['n_clusters']} "
                        f"(of {', '.join(map(str, ks))})")


def test_a_quoted_home_path_is_the_home_folder_never_a_folder_named_tilde(tmp_path,
                                                                          monkeypatch, capsys):
    """'~/x.zarr' quoted (a batch script, a config file) reaches fgscale unexpanded: it means
    the home folder, as for NIfTI paths, not a folder named '~' in the working directory."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert main(["make-cohort", "~/cohort", "--n-samples", "24", "--n-classes", "2",
                 "--grid", TINY]) == 0
    assert main(["convert", "~/cohort/cohort.csv", "--out", "~/s.zarr", "--no-progress"]) == 0
    assert main(["train", "~/s.zarr", "--out", "~/run", *TRAIN, "--no-progress"]) == 0
    assert main(["bank", "~/s.zarr", "--list"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "~/run", "~/s.zarr", "--json", "--predictions", "~/p.csv",
                 "--n-workers", "1", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] > 0
    assert not (work / "~").exists()
    assert {p.name for p in home.iterdir()} == {"cohort", "s.zarr", "run", "p.csv"}
    # and in Python, as nilearn reads '~/x.nii.gz'
    from fgscale import load_model, save_model
    from fgscale.runs import load_run
    from fgscale.store import convert, open_store

    convert("~/cohort/cohort.csv", "~/py.zarr", n_workers=1, progress=False)
    assert open_store("~/py.zarr").n_samples == 24
    save_model(load_run("~/run"), "~/model")
    assert load_model("~/model").n_features_in_ == open_store("~/s.zarr").n_features
    assert not (work / "~").exists()
    assert {"py.zarr", "model"} <= {p.name for p in home.iterdir()}
