"""1 mm end to end: every stage of fgscale on a SYNTHETIC 1 mm cohort, with each process's peak memory.

Each stage runs as the command a user types (``python -m fgscale ...``, or a few lines of Python
where there is no command), in its own process, on the embedded LocalCluster of that command:

1. ``make-cohort --grid 1mm`` (SYNTHETIC volumes, 182 x 218 x 182, p = 1,827,243; reused when the
   work folder has it; not a stage of fgscale, reported for context);
2. ``convert`` (the mask computed from the images);
3. standardization: ``fgscale.store.compute_stats`` on the training rows, which ``train`` reuses;
4. ``bank`` (ReNA on r = 50 bootstrap rows per grouping, k = 10%);
5. ``train`` logistic regression and the MLP with feature grouping (streamed), each writing its
   weight maps as NIfTI (the MLP's are its input-layer saliency);
6. ``evaluate`` each run on the test rows, and ``predict`` the test NIfTI files with the
   logistic regression's run folder;
7. ReNA alone on the same r = 50 rows (the store's first training rows): fgscale's and nilearn's,
   each in its own process (time, peak memory, or the error nilearn raises).

For each stage: wall seconds, and the peak resident memory (the kernel's VmHWM, read from /proc)
of the command's process and of every process it started, beside the size of the whole
(n x p) float32 array that no process should hold. Goal: every process under 6 GB.

Run: ``python scripts/bench_1mm.py [--n-samples 160] [--workdir DIR] [--out FILE]``;
``--quick`` runs the same stages on a tiny grid with a few volumes (the test does that).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchlib import parse_args, run_monitored, scratch_dir

GOAL_MB = 6 * 1024

_RENA_CODE = """
import json, sys, time, warnings
import numpy as np
from fgscale.store import open_store
store = open_store(sys.argv[1])
rows = store.train_rows()[:int(sys.argv[2])]
X = store.read_rows(rows)
k = store.n_features // 10
start = time.perf_counter()
if sys.argv[3] == "fgscale":
    from fgscale.grouping._rena import rena
    labels = rena(X, store.mask, k, random_state=0)
else:
    import nibabel as nib
    from nilearn.regions import ReNA
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        labels = ReNA(mask_img=nib.Nifti1Image(store.mask.astype("uint8"), store.affine),
                      n_clusters=k, scaling=False, n_iter=10).fit(X).labels_
print(json.dumps({"seconds": time.perf_counter() - start, "clusters": int(len(np.unique(labels))),
                  "rows": int(len(rows)), "k": int(k)}))
"""

_STATS_CODE = """
import sys
from fgscale.store import compute_stats, open_store
store = open_store(sys.argv[1])
compute_stats(store.path, store.train_rows(), progress=False)
"""


def fgscale(*args) -> list[str]:
    return [sys.executable, "-m", "fgscale", *map(str, args)]


def python(code: str, *args) -> list[str]:
    return [sys.executable, "-c", code, *map(str, args)]


def last_json(output: str) -> dict:
    """The last line of ``output`` that parses as a JSON object."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON line in the output:\n{output}")


def stages(args, work: Path) -> list[tuple[str, list[str], bool]]:
    """(name, command, may_fail) of every stage, in order."""
    cohort, store = work / "cohort", work / "store.zarr"
    bank = ["--n-groupings", args.n_groupings, "--n-bootstrap", args.n_bootstrap, "--seed", 0]
    train = ["--regularizer", "feature_grouping", "--max-epochs", args.max_epochs,
             "--batch-size", args.batch_size, "--no-progress", *bank]
    out = [("convert", fgscale("convert", cohort / "cohort.csv", "--out", store,
                               "--no-progress"), False),
           ("standardization", python(_STATS_CODE, store), False),
           ("bank", fgscale("bank", store, *bank, "--no-progress"), False)]
    for model in ("logreg", "mlp"):
        out.append((f"train {model} + FG", fgscale("train", store, "--model", model, "--out",
                                                   work / f"run_{model}", *train), False))
        out.append((f"evaluate {model}", fgscale("evaluate", work / f"run_{model}", store,
                                                 "--json", "--no-progress"), False))
    test_files = [row["path"] for row in csv.DictReader(open(cohort / "cohort.csv"))
                  if row.get("split") == "test"]
    test_files = [str(cohort / f) if not os.path.isabs(f) else f for f in test_files]
    out.append(("predict (test NIfTI files)", fgscale("predict", work / "run_logreg",
                                                      *test_files, "--out",
                                                      work / "predictions.csv",
                                                      "--no-progress"), False))
    for library in ("fgscale", "nilearn"):
        out.append((f"ReNA alone, {library}", python(_RENA_CODE, store, args.n_bootstrap,
                                                      library), library == "nilearn"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="1mm", help="grid of the SYNTHETIC cohort")
    parser.add_argument("--n-samples", type=int, default=160, help="volumes (4 classes)")
    parser.add_argument("--n-groupings", type=int, default=10, help="b, groupings in the bank")
    parser.add_argument("--n-bootstrap", type=int, default=50, help="r, rows per grouping")
    parser.add_argument("--max-epochs", type=int, default=10, help="epochs of each training")
    parser.add_argument("--batch-size", type=int, default=32, help="minibatch rows")
    parser.add_argument("--workdir", default=None,
                        help="folder kept for the cohort (reused) and the outputs (default: a "
                             "temporary folder, removed)")
    parser.add_argument("--out", default=None, help="also write the Markdown report here")
    args = parse_args(parser, quick=dict(grid="16x18x16", n_samples=16, n_groupings=2,
                                         n_bootstrap=8, max_epochs=2, batch_size=8))
    with scratch_dir(args.workdir, prefix="fgscale-bench-1mm-") as work:
        report = run(args, Path(work))
    print(report)
    if args.out:
        tmp = Path(args.out).with_name(Path(args.out).name + ".tmp")
        tmp.write_text(report + "\n")
        os.replace(tmp, args.out)


def run(args, work: Path) -> str:
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cohort = work / "cohort"
    lines = []
    if (cohort / "cohort.csv").is_file():
        lines.append(f"cohort reused from {cohort}")
    else:
        seconds, _ = run_monitored(fgscale("make-cohort", cohort, "--grid", args.grid,
                                              "--n-samples", args.n_samples, "--n-classes", 4,
                                              "--seed", 0), env=env)
        lines.append(f"cohort generated in {seconds:.0f} s (SYNTHETIC)")
    for name in ("store.zarr", "run_logreg", "run_mlp"):
        shutil.rmtree(work / name, ignore_errors=True)
    (work / "predictions.csv").unlink(missing_ok=True)

    rows = []
    for name, cmd, may_fail in stages(args, work):
        print(f"-- {name}", file=sys.stderr, flush=True)
        try:
            seconds, info = run_monitored(cmd, env=env)
        except subprocess.CalledProcessError as exc:
            if not may_fail:
                raise
            tail = [line for line in exc.output.splitlines() if line.strip()][-1:]
            rows.append((name, "failed", "-", "-", "-", (tail or ["?"])[0][:120]))
            continue
        peaks = info["peaks_mb"]
        command = max((mb for role, mb in peaks.values() if role == "command"), default=0.0)
        children = [mb for role, mb in peaks.values() if role == "child"]
        biggest = max([command, *children])
        note = ""
        if name.startswith("evaluate"):
            note = f"test accuracy {last_json(info['output'])['accuracy']:.3f}"
        elif name.startswith("ReNA"):
            got = last_json(info["output"])
            note = f"ReNA {got['seconds']:.1f} s, {got['clusters']:,} clusters of {got['rows']} rows"
        elif name == "convert":
            from fgscale.store import open_store

            store = open_store(work / "store.zarr")
            note = f"n = {store.n_samples}, p = {store.n_features:,}"
        rows.append((name, f"{seconds:.1f}", f"{command:,.0f}",
                     f"{max(children):,.0f} ({len(children)})" if children else "-",
                     "ok" if biggest < GOAL_MB else "ABOVE", note))

    from fgscale.store import open_store

    store = open_store(work / "store.zarr")
    whole_mb = store.n_samples * store.n_features * 4 / 2**20
    maps = sorted(str(f.relative_to(work)) for f in work.glob("run_*/maps.nii.gz"))
    header = [f"# fgscale end to end on a SYNTHETIC {args.grid} cohort "
              f"(`python scripts/bench_1mm.py --grid {args.grid} --n-samples {args.n_samples} "
              f"--n-groupings {args.n_groupings} --n-bootstrap {args.n_bootstrap} "
              f"--max-epochs {args.max_epochs} --batch-size {args.batch_size}`)", "",
              *lines, "",
              f"n = {store.n_samples} volumes, p = {store.n_features:,} voxels: the whole (n x p) "
              f"float32 array would be {whole_mb:,.0f} MB. Peak resident memory (VmHWM) of the "
              f"command's process and of the largest process it started (their count in "
              f"brackets), MB; goal: every process under {GOAL_MB:,} MB.", "",
              "| stage | wall s | command MB | largest child MB (count) | goal | notes |",
              "|---|---|---|---|---|---|"]
    body = ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    footer = ["", f"Weight maps written: {', '.join(maps) or 'none'}.",
              f"Machine: {os.cpu_count()} cores; Python {sys.version.split()[0]}; "
              f"{time.strftime('%Y-%m-%d')}."]
    return "\n".join(header + body + footer)


if __name__ == "__main__":
    main()
