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
