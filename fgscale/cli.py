"""The ``fgscale`` command line: one subcommand per step of the pipeline.

Each subcommand is a small ``_cmd_<name>(args)`` function that calls the public API and
decides what is printed; the work itself lives in the modules.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

log = logging.getLogger("fgscale")


def _cmd_demo(args) -> int:
    from fgscale.demo import run_demo

    run_demo(args.out, seed=args.seed, n_workers=args.n_workers, max_epochs=args.max_epochs)
    return 0


def _cmd_bank(args) -> int:
    if args.list:
        from fgscale.store._banks import list_banks

        banks = list_banks(args.store)
        if not banks:
            print(f"{args.store}: no bank")
            return 0
        rows = [("key", "k", "r", "seed", "rows", "built")] + [
            (b["key"], str(b["n_clusters"]), str(b["n_bootstrap"]), str(b["seed"]),
             str(b["n_rows"]), f"{b['built']}/{b['total']}") for b in banks]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        return 0

    from fgscale.cluster import dashboard_link
    from fgscale.grouping._dask_bank import build_bank

    with _client(args, processes=True) as client:
        print(f"dashboard: {dashboard_link(client) or 'none'}")
        _, info = build_bank(args.store, n_groupings=args.n_groupings, n_bootstrap=args.n_bootstrap,
                             n_clusters=args.n_clusters, seed=args.seed, client=client,
                             overwrite=args.overwrite, return_info=True)
    print(f"bank {info['key']} of {args.store}: {info['built']} groupings built, "
          f"{info['reused']} reused (b={info['n_groupings']}, k={info['n_clusters']}, "
          f"r={info['n_bootstrap']}, seed={info['seed']}) in {info['seconds']:.1f} s")
    return 0


def _client(args, *, processes: bool):
    """The one place where --scheduler, --scheduler-file and --n-workers become a client:
    a running cluster joined, else an embedded LocalCluster (worker processes or threads)."""
    from fgscale.cluster import connect, get_client

    if args.scheduler is not None or args.scheduler_file is not None:
        if args.scheduler is not None and args.scheduler_file is not None:
            raise ValueError("give --scheduler or --scheduler-file, not both")
        return connect(args.scheduler, args.scheduler_file)
    return get_client(n_workers=args.n_workers, processes=processes)


def _estimator_params(args) -> dict:
    from fgscale._params import PARAMS

    params = {p.name: getattr(args, p.name) for p in PARAMS if p.cli}
    return {**params, "verbose": 1, "random_state": args.seed}


def _cmd_cv(args) -> int:
    from fgscale.runs import cross_validate

    with _client(args, processes=args.worker_processes) as client:
        scores = cross_validate(args.store, params=_estimator_params(args), n_folds=args.folds,
                                client=client, echo=print)
    kind = "grouped by subject" if scores["grouped"] else "stratified (the store has no groups)"
    print(f"{args.folds}-fold cross-validation, {kind}: accuracy "
          f"{scores['mean_accuracy']:.4f} ± {scores['std_accuracy']:.4f} (mean ± sd)")
    return 0


def _cmd_train(args) -> int:
    from fgscale.runs import train_run

    params = _estimator_params(args)
    with _client(args, processes=args.worker_processes) as client:
        summary = train_run(args.store, args.out, params=params, resume=args.resume,
                            client=client)
    test = summary["test"]
    acc = "n/a" if test["accuracy"] is None else f"{test['accuracy']:.4f}"
    print(f"trained {args.model}/{args.regularizer} for {summary['epochs']} epochs in "
          f"{summary['seconds']:.1f} s; test accuracy {acc} on {test['n']} rows")
    print(f"run folder: {summary['run']} (weights: {summary['weights']})")
    return 0


def _cmd_evaluate(args) -> int:
    from fgscale.reports import format_report
    from fgscale.runs import evaluate_run

    with _client(args, processes=args.worker_processes) as client:
        report = evaluate_run(args.run, args.store, device=args.device, client=client,
                              predictions=args.predictions)
    print(json.dumps(report) if args.json else format_report(report))
    if args.predictions is not None and not args.json:
        print(f"predictions of the {report['n']} test rows: {args.predictions}")
    return 0


def _cmd_predict(args) -> int:
    from fgscale.runs import predict_run

    summary = predict_run(args.run, args.inputs, args.out, rows=args.rows,
                          resample=args.resample, device=args.device)
    counts = ", ".join(f"{label} {n}" for label, n in summary["counts"].items())
    print(f"{summary['n']} predictions written to {summary['out']} ({counts})")
    return 0


def _add_param(p, name: str, note: str = "") -> None:
    """The option of an estimator parameter, from the table: its type, default and help."""
    from fgscale._params import _BY_NAME, Options, _Sizes

    param = _BY_NAME[name]

    def parse(text: str):
        try:
            value = param.constraint.parse(text)
        except ValueError:
            value = None
        if value is None or not param.constraint.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {param.constraint.describe()}, got "
                                             f"{text!r}")
        return value

    default = param.default
    if isinstance(param.constraint, _Sizes):  # --hidden-layer-sizes 256 128
        kwargs = {"type": int, "nargs": "+", "default": list(default)}
        default = " ".join(map(str, default))
    else:
        kwargs = {"type": parse, "default": default}
    metavar = ("{" + ",".join(param.constraint.choices) + "}"
               if isinstance(param.constraint, Options) else name.upper())
    p.add_argument("--" + name.replace("_", "-"), dest=name, metavar=metavar,
                   help=f"{param.help} (default: {default}{note})", **kwargs)


def _add_bank_args(p, note: str) -> None:
    """The store and the bank's parameters, shared by ``bank`` and ``train``."""
    p.add_argument("store", help="the Zarr store (from fgscale convert)")
    for name in ("n_groupings", "n_bootstrap", "n_clusters"):
        _add_param(p, name, note)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the bank and of training (default: 0)")


def _add_estimator_args(p) -> None:
    """The store, then every estimator parameter of the table."""
    from fgscale._params import PARAMS

    _add_bank_args(p, "")
    for param in PARAMS:
        if param.cli and param.name not in ("n_groupings", "n_bootstrap", "n_clusters"):
            _add_param(p, param.name)


def _add_cluster_args(p) -> None:
    p.add_argument("--scheduler", default=None, help="join a running scheduler (tcp://HOST:PORT)")
    p.add_argument("--scheduler-file", default=None, help="join the scheduler of this file")
    p.add_argument("--n-workers", type=int, default=None, help="LocalCluster workers (default: cores)")


def _add_device_arg(p) -> None:
    p.add_argument("--device", default=None,
                   help="torch device (default: the run's own, else the CPU where it has no GPU)")


def _add_worker_kind_arg(p) -> None:
    p.add_argument("--worker-processes", action="store_true",
                   help="LocalCluster of worker processes (each with a memory limit) instead of "
                        "threads in this process, which hand blocks to the model without a copy")


def _cmd_convert(args) -> int:
    from fgscale.store._convert import convert

    cohort = args.cohort[0] if len(args.cohort) == 1 and args.labels is None else args.cohort
    resample = args.resample
    if resample not in (None, "mask"):
        resample = float(resample)
    classes = args.classes.split(",") if args.classes else None
    with _client(args, processes=True) as client:
        store = convert(cohort, args.out, mask=args.mask, resample=resample, nan=args.nan,
                        labels=args.labels, classes=classes, intersect_mask=args.intersect_mask,
                        client=client, block_rows=args.block_rows, progress=not args.no_progress)
    s = store.attrs.get("summary", {})
    print(f"{store.path}: {store.n_samples} rows x {store.n_features} voxels, "
          f"{len(store.classes)} classes, {s.get('bytes', 0) / 1e6:.1f} MB; "
          f"{s.get('seconds', 0):.1f} s, {s.get('rows_per_s', 0):.1f} rows/s, "
          f"{s.get('mb_per_s', 0):.1f} MB/s ({s.get('blocks_skipped', 0)} blocks already done)")
    return 0


def _cmd_export(args) -> int:
    from fgscale.grouping._export import export_map

    img = export_map(args.store, args.out, values=args.npy, grouping=args.grouping,
                     omega=args.omega, bank=args.bank)
    print(f"{args.out}: image of shape {img.shape}")
    return 0


def _version() -> str:
    from fgscale import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fgscale",
        description="Feature grouping as a stochastic regularizer, trained out-of-core on Dask and Zarr.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="run the whole pipeline on a synthetic cohort (the README's main job)")
    p.add_argument("--out", default="fgscale-demo", help="folder for the cohort, store and runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-workers", type=int, default=None, help="LocalCluster workers (default: cores)")
    p.add_argument("--max-epochs", type=int, default=None, help="override the demo's epochs")
    p.set_defaults(func=_cmd_demo)

    # --- store commands (convert, export) ---
    p = sub.add_parser("convert", help="convert a NIfTI cohort into a Zarr store (resumable)")
    p.add_argument("cohort", nargs="+",
                   help="cohort table (.csv/.tsv: path,label[,group][,split]) or files/globs "
                        "with --labels")
    p.add_argument("--out", required=True, help="the store to write (STORE.zarr)")
    p.add_argument("--labels", default=None, help="with files/globs: one label per line, per file")
    p.add_argument("--mask", default=None, help="mask NIfTI (default: computed from the images)")
    p.add_argument("--intersect-mask", action="store_true",
                   help="intersect --mask with the mask computed from the images")
    p.add_argument("--resample", default=None, metavar="MM|mask",
                   help="resample every image to this voxel size (mm) or to the mask's grid")
    p.add_argument("--nan", choices=["error", "zero"], default="error",
                   help="NaN/inf inside the mask: fail (default) or set to 0")
    p.add_argument("--classes", default=None, help="allowed labels, comma-separated, in order")
    p.add_argument("--block-rows", type=int, default=None, help="rows per task and per shard")
    _add_cluster_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("export", help="write per-voxel values of a store as a NIfTI image")
    p.add_argument("store", help="the Zarr store")
    p.add_argument("--out", required=True, help="output image (.nii or .nii.gz)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--npy", default=None, help=".npy of shape (p,) or (n, p)")
    what.add_argument("--grouping", type=int, default=None, help="row I of the store's bank")
    what.add_argument("--omega", action="store_true", help="the bank's Omega diagonal")
    p.add_argument("--bank", default=None, metavar="KEY",
                   help="the bank of --grouping/--omega (default the store's only bank; "
                        "fgscale bank STORE --list shows the keys)")
    p.set_defaults(func=_cmd_export)

    # --- distributed commands (bank, train, cv, evaluate), then predict ---

    p = sub.add_parser("bank", help="build the bank of groupings into a store, on a Dask cluster")
    _add_bank_args(p, "")
    _add_cluster_args(p)
    p.add_argument("--overwrite", action="store_true",
                   help="rebuild the bank of these parameters from scratch (other banks are kept)")
    p.add_argument("--list", action="store_true",
                   help="list the store's banks (key, k, r, seed, rows, built/total); build nothing")
    p.set_defaults(func=_cmd_bank)

    p = sub.add_parser("train", help="train on a store, streaming minibatches from the workers")
    _add_estimator_args(p)
    p.add_argument("--out", required=True, help="run folder (config, checkpoints, metrics, weights)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    _add_cluster_args(p)
    _add_worker_kind_arg(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("cv", help="cross-validate on a store's training rows, folds by subject")
    _add_estimator_args(p)
    p.add_argument("--folds", type=int, default=5, help="number of folds (default: 5)")
    _add_cluster_args(p)
    _add_worker_kind_arg(p)
    p.set_defaults(func=_cmd_cv)

    p = sub.add_parser("evaluate", help="score a trained run on a store's test rows")
    p.add_argument("run", help="run folder (from fgscale train)")
    p.add_argument("store", help="the Zarr store (the run's, or another with its mask)")
    _add_device_arg(p)
    p.add_argument("--predictions", default=None, metavar="FILE",
                   help="also write each test row's label, prediction and probabilities (CSV)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    _add_cluster_args(p)
    _add_worker_kind_arg(p)
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser("predict", help="predict NIfTI images, a cohort table or a store with a "
                                       "trained run (no cluster)")
    p.add_argument("run", help="run folder (from fgscale train)")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="NIfTI files (3D or 4D: a line per volume), or one cohort table "
                        "(.csv/.tsv: path,label[,group][,split]), or one store")
    p.add_argument("--out", required=True, help="the predictions to write (CSV)")
    p.add_argument("--rows", choices=["all", "train", "test"], default="all",
                   help="a store's rows or a cohort table's files, by split (default: all)")
    p.add_argument("--resample", action="store_true",
                   help="resample images on another grid to the run's mask (linear); by "
                        "default they are refused")
    _add_device_arg(p)
    p.set_defaults(func=_cmd_predict)

    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose < 2:  # Dask's INFO chatter (scheduler, nannies, workers) only with -vv
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        logging.getLogger("distributed").setLevel(logging.WARNING)
    # -v: fgscale's progress log (epochs, steps); -vv: its debug log and Dask's own
    logging.basicConfig(level=logging.INFO if args.verbose >= 2 else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    log.setLevel([logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)])
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"fgscale {args.command}: error: {exc}", file=sys.stderr)
        return 2
