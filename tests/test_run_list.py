"""``fgscale runs``: the run folders under a folder, a line each, read from their files
(SYNTHETIC runs)."""

import json
import re
import shutil

from helpers import refused

from fgscale.cli import main


def test_runs_lists_each_run_with_its_state_and_test_score(tiny_runs, tmp_path, capsys):
    root = tmp_path / "runs"
    for name in ("logreg", "mlp"):
        shutil.copytree(tiny_runs[name], root / name)
    # killed after its epochs: no model.json, no final.json
    shutil.copytree(tiny_runs["logreg"], root / "lab" / "killed")
    for name in ("final.json", "model.json"):
        (root / "lab" / "killed" / name).unlink()
    (root / "notes").mkdir()
    (root / "notes" / "config.json").write_text('{"editor": "vim"}')  # not a run's
    assert main(["runs", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "state", "task", "model", "test", "store"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == ["lab/killed", "logreg", "mlp"]
    final = json.loads((root / "logreg" / "final.json").read_text())
    store = str(tiny_runs["store"].path.resolve())
    assert rows["logreg"].split()[1:] == ["finished", "classification", "logreg/feature_grouping",
                                          "accuracy", f"{final['test']['accuracy']:.4f}", store]
    assert "mlp/feature_grouping" in rows["mlp"]
    assert "unfinished (5 epochs, 5 refit)" in rows["lab/killed"] and rows["lab/killed"].endswith(store)

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["runs", str(empty)]) == 0
    assert capsys.readouterr().out.strip() == f"{empty}: no run folder in it or below"
    refused(["runs", tmp_path / "missing"], capsys, rf"{tmp_path / 'missing'}: no such folder")
    (tmp_path / "cohort.csv").write_text("path,label\n")
    refused(["runs", tmp_path / "cohort.csv"], capsys, r"cohort\.csv: not a folder; give the "
                                                       r"folder that holds the runs")
    # a regression's model, as train names it (it said logreg/feature_grouping)
    config = json.loads((root / "logreg" / "config.json").read_text())
    (root / "logreg" / "config.json").write_text(json.dumps({**config, "task": "regression"}))
    assert main(["runs", str(root)]) == 0
    assert re.search(r"^logreg +finished +regression +linear/feature_grouping ",
                     capsys.readouterr().out, flags=re.M)
