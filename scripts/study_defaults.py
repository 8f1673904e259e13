"""Compare variants of the estimator's parameters on validation rows only (not a test).

The studies behind the README's table of variants of feature grouping's defaults: each variant
is a set of ``FeatureGroupingClassifier`` parameters, fitted on a seed's training rows and
scored on its validation rows, the rows of ``scripts/bench_accuracy.py``'s splits. The test
rows are never read: a study may be run as often as one likes without tuning on the test set.
Dev seeds start at 100, away from the seeds of the benchmark's test figures (0-39).

The first variant is the reference: the table gives each variant's validation accuracy (mean ±
standard error over seeds) and its difference to the reference, ± the standard error of the
per-seed differences (every variant sees the same splits, so the pairing removes the spread of
the splits). The figure to trust is the difference, and only beyond two of its standard errors.

    .venv/bin/python scripts/study_defaults.py --n-train 100 --seeds 30 \\
        --variants '{"defaults": {}, "b = 50": {"n_groupings": 50}}'
    .venv/bin/python scripts/study_defaults.py --dataset brain --seeds 10 \\
        --variants '{"defaults": {}, "raw": {"standardize": false}}'

(The script sets OMP_NUM_THREADS=1 unless it is set: run two at once on two cores, with other
``--first-seed`` values, and add up their per-seed lines.) Variants that change the code rather
than a parameter (another clustering, another step rule) are not expressible here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core: two studies share this machine

import numpy as np  # noqa: E402 - after the thread limits above

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy import (  # noqa: E402
    BRAIN_NOISE,
    _pm,
    brain_mask_image,
    brain_split,
    fashion_split,
    load_fashion,
    mean_se,
    noise_label,
    versions,
)

DATASETS = ("fashion", *BRAIN_NOISE)


def parse_variants(text: str) -> dict[str, dict]:
    """``{"name": {param: value}}`` from JSON, with a clear error for anything else."""
    try:
        variants = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--variants: not valid JSON ({exc})") from None
    if (not isinstance(variants, dict) or not variants
            or not all(isinstance(v, dict) for v in variants.values())):
        raise SystemExit('--variants: expected a JSON object of named parameter sets, '
                         'for example {"defaults": {}, "b = 50": {"n_groupings": 50}}')
    return variants


def validation_accuracy(split, params: dict, seed: int) -> float:
    """Fit on the split's training rows, score on its validation rows."""
    from fgscale import FeatureGroupingClassifier

    clf = FeatureGroupingClassifier(mask=brain_mask_image(split.mask), random_state=seed, **params)
    clf.fit(split.X_tr, split.y_tr)
    return float(np.mean(clf.predict(split.X_val) == split.y_val))


def study(splits, seeds, variants: dict[str, dict]) -> dict[str, list[float]]:
    """Validation accuracy of every variant on every seed; prints one line per seed.

    ``splits(seed)`` gives the seed's rows (a ``bench_accuracy.Split``)."""
    scores: dict[str, list[float]] = {name: [] for name in variants}
    for seed in seeds:
        split = splits(seed)
        cells = []
        for name, params in variants.items():
            start = time.perf_counter()
            try:
                acc = validation_accuracy(split, params, seed)
            except (TypeError, ValueError) as exc:
                raise SystemExit(f"--variants: variant {name!r} ({json.dumps(params)}): {exc}") from None
            scores[name].append(acc)
            cells.append(f"{name}={100 * acc:.2f} ({time.perf_counter() - start:.1f} s)")
        print(f"seed {seed}: " + ", ".join(cells), flush=True)
    return scores


def table(scores: dict[str, list[float]]) -> str:
    """Markdown: each variant's mean ± SE, and its paired difference to the first variant."""
    reference = np.asarray(next(iter(scores.values())))
    lines = ["| variant | validation accuracy (%) | points vs the first (paired SE) |",
             "|---|---|---|"]
    for i, (name, accs) in enumerate(scores.items()):
        mean, se = mean_se(np.asarray(accs) - reference)
        diff = "" if i == 0 else ("+" if mean >= 0 else "") + _pm(mean, se)
        lines.append(f"| {name} | {_pm(*mean_se(accs))} | {diff} |")
    return "\n".join(lines)


def main(argv=None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=DATASETS, default="fashion",
                        help="fashion (real images) or a SYNTHETIC brain cohort (default: fashion)")
    parser.add_argument("--n-train", type=int, default=100,
                        help="Fashion-MNIST training images per class (default: 100)")
    parser.add_argument("--noise", default="0.6",
                        help="Fashion-MNIST SNR in dB of the added noise, or none (default: 0.6)")
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds (default: 10)")
    parser.add_argument("--first-seed", type=int, default=100, help="(default: 100)")
    parser.add_argument("--variants", required=True, type=parse_variants,
                        help='JSON {"name": {parameter: value}}; the first is the reference')
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    try:
        noise = None if args.noise.lower() == "none" else float(args.noise)
    except ValueError:
        parser.error(f"--noise: expected an SNR in dB or none, got {args.noise!r}")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"# study on validation rows: {args.dataset}"
          + (f", {args.n_train} per class, noise {noise_label(noise)}" if args.dataset == "fashion" else "")
          + f", seeds {seeds.start}-{seeds.stop - 1}; {versions()}", flush=True)
    if args.dataset == "fashion":
        data = load_fashion()
        scores = study(lambda seed: fashion_split(data, args.n_train, noise, seed), seeds,
                       args.variants)
    else:
        scores = study(lambda seed: brain_split(seed, args.dataset), seeds, args.variants)
    print(table(scores))
    return scores


if __name__ == "__main__":
    main()
