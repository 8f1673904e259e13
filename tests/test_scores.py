"""What the scores printed and written say: a figure with no rows to define it is ``n/a``
(``null`` in JSON), never a 0 that reads as a failure, in ``fgscale evaluate``'s text and JSON
and in the HTML report (SYNTHETIC stores, real runs)."""

import json
import re

import numpy as np
import pytest
from helpers import TINY_GRID

from fgscale.cli import main
from fgscale.images import make_classification_volumes
from fgscale.runs import train_run
from fgscale.runs._html import write_report
from fgscale.runs._scores import classification_report, format_report, regression_report
from fgscale.store import write_store

PARAMS = dict(n_groupings=4, n_bootstrap=8, n_clusters=0.1, batch_size=8, learning_rate=0.05,
              max_epochs=2, random_state=0)


def _proba(predicted, classes):
    """Probabilities whose largest is the class predicted."""
    proba = np.full((len(predicted), len(classes)), 0.1)
    proba[np.arange(len(predicted)), [classes.index(c) for c in predicted]] = 0.7
    return proba


def test_per_class_figures_without_rows_to_define_them_are_none():
    classes = ["a", "b", "c", "d"]
    # b: true rows, never predicted; c: neither; d: predicted, never true
    report = classification_report(["a", "b", "a", "a"], _proba(["a", "a", "a", "d"], classes),
                                   classes)
    per_class = report["per_class"]
    assert per_class["a"] == pytest.approx({"precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3,
                                            "support": 3})
    assert per_class["b"] == {"precision": None, "recall": 0.0, "f1": 0.0, "support": 1}
    assert per_class["c"] == {"precision": None, "recall": None, "f1": None, "support": 0}
    assert per_class["d"] == {"precision": 0.0, "recall": None, "f1": 0.0, "support": 0}
    lines = format_report(report).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class "))
    rows = {line.split()[0]: line.split()[1:] for line in lines[start + 1 : start + 5]}
    assert rows["b"][:3] == ["n/a", "0.000", "0.000"]
    assert rows["c"] == ["n/a", "n/a", "n/a", "0"]
    assert rows["d"][:3] == ["0.000", "n/a", "0.000"]


def test_scores_come_beside_what_a_model_that_learnt_nothing_scores():
    """Accuracy beside the most frequent class's share of the rows, MAE beside that of
    predicting the rows' mean: what each has to beat, computed by hand."""
    report = classification_report(["a", "b", "a", "a"], _proba(["a", "b", "b", "a"], ["a", "b"]),
                                   ["a", "b"])
    assert report["accuracy"] == 0.75 and report["chance"] == 0.75
    assert "accuracy 0.7500 (the most frequent class alone: 0.7500)" in format_report(report)
    y = np.array([1.0, 2.0, 3.0, 6.0])
    report = regression_report(y, y + [0.5, -0.5, 0.5, -0.5])
    assert report["mae"] == 0.5 and report["mae_of_mean"] == pytest.approx(1.5)  # |y - 3|
    assert "mae 0.5000 (predicting the mean: 1.5000), rmse" in format_report(report)
    assert regression_report([], [])["mae_of_mean"] is None


@pytest.fixture(scope="module")
def run_without_test_rows_of_a_class(client, tmp_path_factory):
    """A run whose store has no test row of its class "c"."""
    root = tmp_path_factory.mktemp("absent_class")
    X, y, mask, affine = make_classification_volumes(40, 3, grid=TINY_GRID, seed=0)
    split = np.where((np.arange(40) % 4 == 0) & (y != 2), "test", "train")
    store = write_store(root / "s.zarr", X, y, mask, affine, classes=["a", "b", "c"],
                        split=split, block_rows=8)
    train_run(store.path, root / "run", params=PARAMS, client=client)
    return store, root / "run"


def test_a_class_without_test_rows_is_scored_n_a_everywhere(run_without_test_rows_of_a_class,
                                                            tmp_path, capsys):
    store, run = run_without_test_rows_of_a_class
    final = json.loads((run / "final.json").read_text())["test"]
    assert final["per_class"]["c"]["recall"] is None and final["per_class"]["c"]["support"] == 0

    assert main(["evaluate", str(run), str(store.path), "--no-progress", "--n-workers", "1"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("c "))
    assert row.split()[2] == "n/a" and "0.000" not in row.split()[2:3]

    assert main(["evaluate", str(run), str(store.path), "--json", "--no-progress",
                 "--n-workers", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["per_class"]["c"]["recall"] is None

    page = write_report(run, tmp_path / "r.html", nilearn=False).read_text()
    cells = re.search(r"<tr><td>c</td>((?:<td>[^<]*</td>){4})</tr>", page)[1]
    values = re.findall(r"<td>([^<]*)</td>", cells)
    assert values[1] == "n/a" and values[3] == "0"
