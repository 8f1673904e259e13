"""scripts/study_defaults.py on small fake IDX files: validation rows only, paired differences."""

import dataclasses

import numpy as np
import pytest
from helpers import load_script, write_idx

from fgscale import FeatureGroupingClassifier

pytestmark = pytest.mark.scripts

CHEAP = {"n_groupings": 3, "n_clusters": 0.1, "max_epochs": 3}


@pytest.fixture(scope="module")
def scripts():
    with load_script("bench_accuracy") as bench, load_script("study_defaults") as study:
        yield bench, study


@pytest.fixture
def splits(scripts, tmp_path):
    bench, _ = scripts
    rng = np.random.default_rng(0)
    for part, n in (("train", 400), ("test", 2000)):
        labels = np.arange(n) % 10
        # class-dependent images, so that accuracies differ from chance and between variants
        images = np.clip(rng.normal(40 + 15 * labels[:, None, None], 60, (n, 28, 28)), 0, 255)
        write_idx(tmp_path / bench.FASHION_FILES[f"{part}_images"], images.astype(np.uint8))
        write_idx(tmp_path / bench.FASHION_FILES[f"{part}_labels"], labels)
    data = bench.load_fashion(tmp_path)
    # the test rows are taken away: a study that read them would fail
    return lambda seed: dataclasses.replace(bench.fashion_split(data, 10, 0.6, seed),
                                            X_te=None, y_te=None)


def test_study_scores_validation_rows_against_a_fit_by_hand(scripts, splits, capsys):
    _, study = scripts
    variants = {"ref": CHEAP, "same": dict(CHEAP), "k 20%": {**CHEAP, "n_clusters": 0.2}}
    scores = study.study(splits, range(100, 103), variants)
    # a variant identical to the reference gives the same numbers: fits are seeded
    assert scores["same"] == scores["ref"]
    for i, seed in enumerate(range(100, 103)):
        s = splits(seed)
        clf = FeatureGroupingClassifier(mask=s.mask, random_state=seed, **variants["k 20%"])
        expected = np.mean(clf.fit(s.X_tr, s.y_tr).predict(s.X_val) == s.y_val)
        assert scores["k 20%"][i] == pytest.approx(expected)
    assert len(capsys.readouterr().out.strip().splitlines()) == 3  # one line per seed

    table = study.table(scores)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert "+0.00 ± 0.00" in rows["same"]
    diff = 100 * (np.asarray(scores["k 20%"]) - np.asarray(scores["ref"]))
    se = diff.std(ddof=1) / np.sqrt(diff.size)
    assert f"{'+' if diff.mean() >= 0 else '-'}{abs(diff.mean()):.2f} ± {se:.2f}" in rows["k 20%"]


@pytest.mark.parametrize("text, message", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object of named parameter sets"),
    ('{"a": 3}', "expected a JSON object of named parameter sets"),
])
def test_bad_variants_are_named(scripts, text, message):
    _, study = scripts
    with pytest.raises(SystemExit, match=message):
        study.parse_variants(text)


def test_a_bad_parameter_names_its_variant(scripts, splits):
    _, study = scripts
    with pytest.raises(SystemExit, match=r"variant 'typo' .*n_groupingz"):
        study.study(splits, [100], {"typo": {"n_groupingz": 3}})
    with pytest.raises(SystemExit, match=r"variant 'neg' .*n_groupings"):
        study.study(splits, [100], {"neg": {**CHEAP, "n_groupings": -1}})
