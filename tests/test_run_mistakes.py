"""What a researcher is told when a run folder is given where a store is expected, and a store
where a run folder is (arguments swapped): one line naming the folder, what it is and what to
give instead, before any cluster starts (SYNTHETIC runs)."""

import pytest
from helpers import refused

STORE_COMMANDS = [["train", "{run}", "--out", "{tmp}/new"], ["cv", "{run}", "--folds", "2"],
                  ["bank", "{run}", "--list"], ["export", "{run}", "--omega", "--out", "{tmp}/o.nii.gz"],
                  ["evaluate", "{run}", "{run}"]]


@pytest.mark.parametrize("argv", STORE_COMMANDS, ids=lambda a: a[0])
def test_a_run_folder_where_a_store_is_expected_is_named_as_a_run(argv, tiny_runs, tmp_path,
                                                                  capsys):
    run, store = tiny_runs["logreg"], tiny_runs["store"]
    line = refused([a.format(run=run, tmp=tmp_path) for a in argv], capsys,
                   rf"{run}: a run folder of fgscale train, not a store")
    # where its store is, from its config.json; and not taken for a folder of images to fit
    assert str(store.path.resolve()) in line and "NIfTI images" not in line


@pytest.mark.parametrize("command", ["evaluate", "predict", "report"])
def test_a_store_where_a_run_folder_is_expected_is_named_as_a_store(command, tiny_runs, tmp_path,
                                                                    capsys):
    run, store = tiny_runs["logreg"], tiny_runs["store"].path
    argv = {"evaluate": [command, store, run], "report": [command, store],
            "predict": [command, store, run, "--out", tmp_path / "p.csv"]}[command]
    refused(argv, capsys, rf"{store}: a store \(fgscale convert writes them\), not a run folder; "
                          r"the run folder \(fgscale train --out\) comes first")


def test_a_run_is_not_started_in_a_folder_holding_a_saved_model(tiny_runs, tmp_path, capsys):
    """Until the run ends, that model.json would pass for the run's model (evaluate, predict)."""
    from fgscale import load_model, save_model
    from fgscale.runs import load_run

    folder = tmp_path / "models"
    save_model(load_run(tiny_runs["mlp"]), folder)
    before = sorted(p.name for p in folder.iterdir())
    refused(["train", tiny_runs["store"].path, "--out", folder, "--max-epochs", "1",
             "--no-progress"], capsys,
            rf"{folder}: holds a saved model \(model.json\) and no run: choose another --out")
    assert sorted(p.name for p in folder.iterdir()) == before
    assert load_model(folder).model == "mlp"


_REFUSED_UNLOADED = """
import sys
from fgscale.cli import main
assert main(sys.argv[1:]) == 2
assert "torch" not in sys.modules, "torch imported before the refusal"
"""


@pytest.mark.parametrize("case", ["no run", "unfinished run", "no store"])
def test_evaluate_and_predict_refuse_a_missing_run_or_store_before_importing_torch(
        case, tiny_runs, tmp_path):
    """Seconds of imports (torch, the estimators) come after the arguments' checks: a batch
    script's typo is answered at once, by the same line as after them."""
    import subprocess
    import sys

    run, store = tiny_runs["logreg"], tiny_runs["store"].path
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text("{}")
    given, expected = {"no run": (tmp_path / "nothing", "not a run folder"),
                       "unfinished run": (unfinished, "has not finished"),
                       "no store": (run, "no such store")}[case]
    stores = {"no run": store, "unfinished run": store, "no store": tmp_path / "missing.zarr"}
    for argv in (["evaluate", given, stores[case]], ["predict", given, tmp_path / "x.nii.gz",
                                                      "--out", tmp_path / "p.csv"]):
        if case == "no store" and argv[0] == "predict":
            continue  # predict's inputs (images, tables, stores) are checked by the run's model
        done = subprocess.run([sys.executable, "-c", _REFUSED_UNLOADED, *map(str, argv)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert expected in done.stderr and "Traceback" not in done.stderr
