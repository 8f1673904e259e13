"""Data loading of scripts/bench_accuracy.py, on small fake IDX files (no dataset needed)."""

import numpy as np
import pytest
from helpers import load_script, write_idx

pytestmark = pytest.mark.scripts


@pytest.fixture(scope="module")
def bench():
    with load_script("bench_accuracy") as module:
        yield module


@pytest.fixture
def fake_fashion(bench, tmp_path):
    rng = np.random.default_rng(0)
    for part, n in (("train", 600), ("test", 2500)):
        write_idx(tmp_path / bench.FASHION_FILES[f"{part}_images"],
                   rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / bench.FASHION_FILES[f"{part}_labels"], np.arange(n) % 10)
    return tmp_path


def test_read_idx_round_trip(bench, tmp_path):
    images = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    write_idx(tmp_path / "i.gz", images)
    write_idx(tmp_path / "l.gz", np.array([7, 0, 3]))
    np.testing.assert_array_equal(bench.read_idx(tmp_path / "i.gz", 16), images)
    np.testing.assert_array_equal(bench.read_idx(tmp_path / "l.gz", 8), [7, 0, 3])


def test_missing_files_name_the_package(bench, tmp_path):
    with pytest.raises(SystemExit, match="apt-get install -y dataset-fashion-mnist"):
        bench.load_fashion(tmp_path)


@pytest.mark.parametrize("noise_db", [None, 3.0, 0.6])
def test_fashion_split(bench, fake_fashion, noise_db):
    data = bench.load_fashion(fake_fashion)
    s = bench.fashion_split(data, 10, noise_db, seed=1)
    assert s.X_tr.shape == s.X_val.shape == (100, 784) and s.X_te.shape == (2000, 784)
    assert s.X_tr.dtype == np.float32 and s.mask.shape == (28, 28) and s.mask.all()
    for y in (s.y_tr, s.y_val):
        np.testing.assert_array_equal(np.bincount(y), np.full(10, 10))
    np.testing.assert_array_equal(np.bincount(s.y_te), np.full(10, 200))
    # train and validation rows are disjoint: compare the clean images behind them
    clean = bench.fashion_split(data, 10, None, seed=1)
    rows = {r.tobytes() for r in clean.X_tr}
    assert not rows & {r.tobytes() for r in clean.X_val}
    assert 0.0 <= clean.X_tr.min() and clean.X_tr.max() <= 1.0
    if noise_db is None:
        np.testing.assert_array_equal(s.X_tr, clean.X_tr)
    else:
        noise = np.concatenate([s.X_tr - clean.X_tr, s.X_te - clean.X_te])
        snr = 10 * np.log10(np.mean(clean.X_tr.astype(float) ** 2) / np.mean(noise.astype(float) ** 2))
        assert abs(snr - noise_db) < 0.05
    # seeded: the same seed gives the same split, and the test rows do not depend on n_train
    again = bench.fashion_split(data, 10, noise_db, seed=1)
    np.testing.assert_array_equal(s.X_te, again.X_te)
    np.testing.assert_array_equal(bench.fashion_split(data, 20, None, seed=1).X_te, clean.X_te)
    assert not np.array_equal(bench.fashion_split(data, 10, None, seed=2).X_tr, clean.X_tr)


def test_peak_memory_counts_a_spike_between_two_samples(bench):
    """The kernel's peak (VmHWM, reset at entry) sees 64 MB allocated and freed within one
    sampling interval; a sampler would not."""
    with bench.PeakRSS(interval=60.0) as mem:
        spike = np.ones(64 * 2**20 // 8)  # written, so resident
        del spike
    if not mem.kernel:
        pytest.skip("this kernel does not let a process reset its VmHWM")
    assert 60 * 2**20 <= mem.peak < 128 * 2**20
    with bench.PeakRSS(interval=60.0) as quiet:
        pass
    assert quiet.peak < 16 * 2**20


def test_a_method_in_a_fresh_process_gives_the_same_record(bench, fake_fashion):
    split = bench.fashion_split(bench.load_fashion(fake_fashion), 10, 0.6, seed=0)
    method = bench.BY_NAME["sklearn-lr"]
    here, fresh = bench.run_method(method, split), bench.run_method_fresh(method, split)
    assert fresh.accuracy == here.accuracy and fresh.method == "sklearn-lr"
    assert fresh.peak_mb >= 0 and fresh.time_s > 0


def test_feature_grouping_against_the_best_of_l2_and_dropout(bench):
    acc = {"fgscale-default": [0.70, 0.72, 0.74], "fgscale-l2-auto": [0.68, 0.69, 0.73],
           "fgscale-dropout-auto": [0.69, 0.70, 0.70]}
    recs = [bench.Record("fashion", "30", "0.6 dB", seed, method, a, 1.0, 1.0, 0.0)
            for method, values in acc.items() for seed, a in enumerate(values)]
    stats = {m: bench.mean_se(v) for m, v in acc.items()}
    line = bench._differences("30", "0.6 dB", stats, recs)
    # L2 has the better mean (70.00 against 69.67); paired differences 2, 3, 1 points
    combined = 100 * np.hypot(stats["fgscale-default"][1], stats["fgscale-l2-auto"][1])
    assert line == ("30, 0.6 dB: fgscale default (FG) − best(L2 auto, dropout auto) = − L2: "
                    f"+2.00 ± {combined:.2f} (paired: ± {1 / np.sqrt(3):.2f})")


def test_frem_with_its_default_screening_runs_only_when_named(bench):
    assert "nilearn-frem-screening" not in bench.parse_args([]).methods
    named = ["--methods", "nilearn-frem,nilearn-frem-screening"]
    assert bench.parse_args(named).methods == ["nilearn-frem", "nilearn-frem-screening"]
    assert bench.parse_args([*named, "--no-frem", "--datasets", "fashion"]).methods == []


def test_first_seed_runs_a_part_of_the_seeds(bench, fake_fashion):
    args = bench.parse_args(["--datasets", "fashion", "--n-train", "10", "--noise", "none",
                             "--first-seed", "2", "--seeds", "2"])
    assert [s.seed for s in bench.splits(args, bench.load_fashion(fake_fashion))] == [2, 3]
    with pytest.raises(SystemExit):
        bench.parse_args(["--first-seed", "-1"])


def test_report_of_earlier_parts_from_their_csv(bench, tmp_path):
    """Two parts of one run (seeds 0-1, then 2), written as --csv writes them, rendered as one
    report with the mean and standard error of the three seeds."""
    import csv
    import re

    acc = {0: (0.70, 0.60), 1: (0.74, 0.61), 2: (0.75, 0.65)}
    parts = {tmp_path / "a.csv": (0, 1), tmp_path / "b.csv": (2,)}
    for path, seeds in parts.items():
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(bench.Record.__dataclass_fields__))
            writer.writeheader()
            for seed in seeds:
                for method, a in zip(("fgscale-default", "sklearn-lrcv"), acc[seed], strict=True):
                    writer.writerow(vars(bench.Record("fashion", "30", "0.6 dB", seed, method, a,
                                                      1.0, 1.0, 10.0)))
    common = ["--datasets", "fashion", "--methods", "fgscale-default,sklearn-lrcv"]
    out = tmp_path / "merged.md"
    records = bench.main(common + ["--from-csv", f"{tmp_path / 'a.csv'},{tmp_path / 'b.csv'}",
                                   "--out", str(out)])
    assert sorted((r.seed, r.method) for r in records) == sorted(
        (s, m) for s in acc for m in ("fgscale-default", "sklearn-lrcv"))
    text = out.read_text()
    fg = [100 * acc[s][0] for s in acc]
    row = re.search(r"\| 30 \| 0\.6 dB \| fgscale default[^|]*\| (\d+\.\d+) ± (\d+\.\d+) \|", text)
    assert float(row[1]) == pytest.approx(np.mean(fg), abs=0.005)
    assert float(row[2]) == pytest.approx(np.std(fg, ddof=1) / np.sqrt(3), abs=0.005)
    assert "| 3 |" in text and "a.csv`, `" in text and "no fit run now" in text
    assert "| fgscale default | 0: 70.00, 1: 74.00, 2: 75.00 |" in text  # seed by seed
    with pytest.raises(SystemExit, match="b.csv: the fit dataset=fashion .* seed=2 method="
                                         "fgscale-default is also in"):
        bench.main(common + ["--from-csv", f"{tmp_path / 'b.csv'},{tmp_path / 'b.csv'}"])
    with pytest.raises(SystemExit, match="no rows of the datasets brain"):
        bench.main(["--datasets", "brain", "--from-csv", str(tmp_path / "a.csv")])
    (tmp_path / "bad.csv").write_text(",".join(bench.Record.__dataclass_fields__)
                                      + "\nfashion,30,0.6 dB,zero,sklearn-lr,0.5,1,1,1,,,0,\n")
    with pytest.raises(SystemExit, match="bad.csv, line 2: invalid literal"):
        bench.main(common + ["--from-csv", str(tmp_path / "bad.csv")])



def test_brain_small_split(bench):
    # the smaller cohort: 240 maps of 24 subjects; 6 tested (the generator's), 6 for
    # validation, 12 to train on; the test rows are the generator's test subjects' rows
    from fgscale.images import make_classification_volumes

    s = bench.brain_split(0, "brain-small")
    groups, split, y = bench.brain_subjects(0, "brain-small")
    X, y_gen, mask, _ = make_classification_volumes(**bench.BRAIN_SMALL,
                                                    **bench.BRAIN_NOISE["brain-small"], seed=0)
    assert len(s.y_tr) + len(s.y_val) + len(s.y_te) == 240
    assert len(np.unique(groups)) == 24 and len(np.unique(groups[split == "test"])) == 6
    # the validation rows are the whole of 6 subjects not tested, the training rows the rest
    val = np.array([np.flatnonzero((X == row).all(1))[0] for row in s.X_val])
    val_subjects = np.unique(groups[val])
    assert len(val_subjects) == 6 and split[val].tolist() == ["train"] * len(val)
    np.testing.assert_array_equal(np.sort(val), np.flatnonzero(np.isin(groups, val_subjects)))
    np.testing.assert_array_equal(s.X_tr, X[(split == "train") & ~np.isin(groups, val_subjects)])
    np.testing.assert_array_equal(s.X_te, X[split == "test"])
    np.testing.assert_array_equal(s.y_te, y_gen[split == "test"])
    assert set(s.y_tr.tolist()) == set(s.y_val.tolist()) == {0, 1, 2, 3}
    assert s.X_tr.shape[1] == mask.sum() == bench.brain_mask_image(s.mask).get_fdata().sum()


def test_brain_smooth_cells(bench):
    """The brain-smooth grid: its cells, the CLI forms that select them, and the design of each:
    VOLUMES / 4 subjects of one map per class, the generator's 25% of subjects tested."""
    every = [f"brain-smooth:{f}:{n}" for f in ("0.1", "0.5", "0.9") for n in (100, 400)]
    assert bench.smooth_cells("brain-smooth") == every
    assert bench.smooth_cells("brain-smooth::100") == every[::2]
    assert bench.smooth_cells("brain-smooth:0.9") == every[4:]
    assert bench.smooth_cells("brain-smooth:0.5:400") == ["brain-smooth:0.5:400"]
    # a cell named twice runs once
    assert bench.expand_datasets(["brain-smooth::100", "fashion", "brain-smooth"]) == [
        *every[::2], "fashion", *every[1::2]]
    for bad in ("brain-smooth:1.5", "brain-smooth::98", "brain-smooth:x", "brain-smooth:0.5:100:1"):
        with pytest.raises(ValueError):
            bench.smooth_cells(bad)
        with pytest.raises(SystemExit):
            bench.parse_args(["--datasets", bad])
    # its own default methods, the others' unchanged; --methods applies to all
    args = bench.parse_args(["--datasets", "fashion,brain-smooth"])
    assert args.by_dataset["brain-smooth"] == ["fgscale-default", "sklearn-lrcv",
                                               "nilearn-decoder", "nilearn-frem-screening"]
    assert args.by_dataset["fashion"] == bench.parse_args(["--datasets", "fashion"]).methods
    assert "nilearn-decoder" not in args.by_dataset["fashion"]
    assert bench.parse_args(["--datasets", "brain-smooth", "--no-frem"]).methods == [
        "fgscale-default", "sklearn-lrcv", "nilearn-decoder"]
    for cell in every:
        _, smooth, volumes = cell.split(":")
        noise, design = bench.cohort_params(cell)
        assert noise == {"snr_db": bench.SMOOTH_SNR_DB, "smooth_noise": float(smooth)}
        assert (design["n_samples"], design["n_classes"]) == (int(volumes), 4)
        groups, split, y = bench.brain_subjects(0, cell)
        subjects = np.unique(groups)
        assert len(subjects) == int(volumes) // 4
        assert all(sorted(y[groups == s]) == [0, 1, 2, 3] for s in subjects)
        tested = np.unique(groups[split == "test"])
        assert len(tested) == round(len(subjects) / 4)
        np.testing.assert_array_equal(split == "test", np.isin(groups, tested))  # whole subjects


def test_brain_smooth_run(bench, monkeypatch, capsys):
    """Each cell's smooth-noise share reaches the generator, its splits are whole subjects, and
    a tiny run (two cells on a 12×12×12 grid, one seed) prints one row per method per cell."""
    import fgscale.images

    monkeypatch.setitem(bench.BRAIN, "grid", (12, 12, 12))
    real, calls = fgscale.images.make_classification_volumes, []

    def spy(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(fgscale.images, "make_classification_volumes", spy)
    for cell in bench.smooth_cells("brain-smooth"):
        s = bench.brain_split(1, cell)
        _, smooth, volumes = cell.split(":")
        assert (calls[-1]["smooth_noise"], calls[-1]["n_samples"]) == (float(smooth), int(volumes))
        assert calls[-1]["snr_db"] == bench.SMOOTH_SNR_DB and calls[-1]["seed"] == 1
        assert s.dataset == "brain-smooth (SYNTHETIC)" and f"{float(smooth):.0%} smooth" in s.noise
        groups, split, _ = bench.brain_subjects(1, cell)
        X = real(**calls[-1])[0]
        np.testing.assert_array_equal(s.X_te, X[split == "test"])
        train, val = set(s.groups_tr), set(s.groups_val)
        assert not train & val and not (train | val) & set(groups[split == "test"])
        assert len(s.y_tr) == 4 * len(train) and len(s.y_val) == 4 * len(val)
        assert len(s.y_te) == 4 * len(set(groups[split == "test"]))
    # nilearn's Decoder gets the subjects of its rows: its C chosen leaving one subject out
    from nilearn.decoding import Decoder

    fit, folds = Decoder.fit, []

    def decoder_fit(self, X, y, groups=None):
        out = fit(self, X, y, groups=groups)
        folds.append((len(set(groups)), len(self.cv_)))
        return out

    monkeypatch.setattr(Decoder, "fit", decoder_fit)
    methods = ["fgscale-default", "sklearn-lr", "nilearn-decoder"]
    bench.main(["--datasets", "brain-smooth:0.1:100,brain-smooth:0.9:100", "--seeds", "1",
                "--methods", ",".join(methods)])
    assert folds == [(19, 19)] * 2  # 13 training + 6 validation subjects, one fold each
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 100 vol.")]
    assert len(rows) == 2 * len(methods)
    for smooth in ("10%", "90%"):
        labels = [r.split(" | ")[2] for r in rows if f"{smooth} smooth" in r]
        assert labels == [bench.BY_NAME[m].label for m in methods]
