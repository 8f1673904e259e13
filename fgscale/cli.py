"""The ``fgscale`` command line: one subcommand per step of the pipeline.

Each subcommand is a small ``_cmd_<name>(args)`` function that calls the public API and
decides what is printed; the work itself lives in the modules, the options that subcommands
share in :mod:`fgscale._cli_args`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from fgscale._cli_args import (
    Parser,
    add_bank_args,
    add_cluster_args,
    add_cohort_args,
    add_column_args,
    add_cv_args,
    add_device_arg,
    add_estimator_args,
    add_progress_arg,
    add_task_arg,
    add_worker_kind_arg,
    columns_of,
    given_options,
    one_line_warnings,
    parse_resample,
    positive,
    saved_cv_unless_given,
    saved_unless_given,
    security_from,
    warn_unused_cluster_options,
    worker_processes,
)
from fgscale._cli_runs import add_runs_command, check_finished_run
from fgscale._interrupt import failed, interrupted, run_command

log = logging.getLogger("fgscale")


def _cmd_demo(args) -> int:
    from fgscale.demo import run_demo

    run_demo(args.out, seed=args.seed, n_workers=args.n_workers, max_epochs=args.max_epochs,
             progress=not args.no_progress)
    return 0


def _cmd_bank(args) -> int:
    from fgscale._cli_banks import bank_list, built_line, remove_banks, warn_unused_build_options

    if args.list or args.remove:
        warn_unused_build_options(args.given)
        print("\n".join(bank_list(args.store) if args.list else remove_banks(args.store, args.remove)))
        return 0
    from fgscale._auto import searched_values
    from fgscale.grouping._dask_bank import build_bank

    # "auto" or a list of n_clusters: a bank for each k that training will choose among
    with _client(args, processes=True) as client:  # a cluster only if a grouping is left
        infos = [build_bank(args.store, n_groupings=args.n_groupings,
                            n_bootstrap=args.n_bootstrap, n_clusters=k, seed=args.seed,
                            client=client, overwrite=args.overwrite, return_info=True,
                            progress=not args.no_progress)[1]
                 for k in searched_values("n_clusters", args.n_clusters)]
    print("\n".join(built_line(info, args.store) for info in infos))
    return 0


def _client(args, *, processes: bool):
    """Where --scheduler, --scheduler-file and --n-workers become a client: a running cluster
    joined, else None within a deferred embedded LocalCluster (processes or threads) that the
    first step with work starts: a command with nothing to do, or refused, starts none."""
    from fgscale.cluster import connect, deferred_cluster

    if args.scheduler is not None or args.scheduler_file is not None:
        if args.scheduler is not None and args.scheduler_file is not None:
            raise ValueError("give --scheduler or --scheduler-file, not both")
        return connect(args.scheduler, args.scheduler_file, timeout=args.timeout,
                       security=security_from(args), origin=getattr(args, "scheduler_origin", None))
    return deferred_cluster(n_workers=args.n_workers, processes=processes)


def _estimator_params(args) -> dict:
    from fgscale._params import PARAMS

    params = {p.name: getattr(args, p.name) for p in PARAMS if p.cli}
    return {**params, "verbose": int(not args.no_progress), "random_state": args.seed}


def _cmd_cv(args) -> int:
    from fgscale.crossval import cross_validate, summary_line

    params, folds, task = _estimator_params(args), args.folds, args.task
    if args.resume:
        params, folds, task = saved_cv_unless_given(params, args)
    with _client(args, processes=worker_processes(args)) as client:
        scores = cross_validate(args.store, params=params, n_folds=folds, client=client,
                                echo=print, task=task, out=args.out, resume=args.resume)
    print(summary_line(scores))
    return 0


def _cmd_train(args) -> int:
    from fgscale.runs import summary_lines, train_run

    params = _estimator_params(args)
    if args.resume:
        params = saved_unless_given(params, args.out, args.given)
    with _client(args, processes=worker_processes(args)) as client:
        summary = train_run(args.store, args.out, params=params, resume=args.resume,
                            client=client, task=args.task)
    if summary.get("already_complete"):
        print(f"{summary['run']}: already complete with these parameters, nothing to do; "
              "its saved summary:")
    print("\n".join(summary_lines(summary, params)))
    return 0


def _cmd_evaluate(args) -> int:
    from fgscale.store import open_store

    check_finished_run(args.run)  # and the store, before torch is imported (seconds)
    open_store(args.store)
    from fgscale.reports import STDOUT
    from fgscale.runs import evaluate_run
    from fgscale.scores import format_report

    with _client(args, processes=worker_processes(args, auto=False)) as client:
        report = evaluate_run(args.run, args.store, device=args.device, client=client,
                              predictions=args.predictions, progress=not args.no_progress,
                              rows=args.rows)
    said = sys.stderr if args.predictions == STDOUT else sys.stdout  # stdout: the predictions
    print(json.dumps(report) if args.json else format_report(report), file=said)
    if args.predictions not in (None, STDOUT) and not args.json:
        print(f"predictions of the {report['n']} {args.rows} rows: {args.predictions}")
    return 0


def _cmd_predict(args) -> int:
    check_finished_run(args.run)  # before torch is imported (seconds)
    from fgscale.runs import STDOUT, predict_line, predict_run

    summary = predict_run(args.run, args.inputs, args.out, rows=args.rows,
                          resample=args.resample, device=args.device, columns=columns_of(args),
                          progress=not args.no_progress)
    print(predict_line(summary), file=sys.stderr if args.out == STDOUT else sys.stdout)
    return 0


def _complete_summary(path) -> dict | None:
    """The summary of the complete store at ``path``; None for none there, or a damaged one."""
    from fgscale.store import StoreError, damaged_blocks, open_group_checked

    try:  # a damaged shard is converted again
        attrs = open_group_checked(path).attrs
        return attrs.get("summary", {}) if attrs.get("complete") and not damaged_blocks(
            path) else None
    except StoreError:  # none there yet, or not a store: convert says which
        return None


def _cmd_convert(args) -> int:
    from fgscale.store._convert import convert, summary_line

    cohort = args.cohort[0] if len(args.cohort) == 1 and args.labels is None else args.cohort
    classes = [c.strip() for c in args.classes.split(",")] if args.classes else None
    kwargs = dict(mask=args.mask, resample=args.resample, nan=args.nan, labels=args.labels,
                  classes=classes, intersect_mask=args.intersect_mask, block_rows=args.block_rows,
                  columns=columns_of(args), progress=not args.no_progress, append=args.append)
    before = _complete_summary(args.out)  # with --append, rows may come to a complete store
    if (before is not None and not args.append) or (args.scheduler is None
                                                       and args.scheduler_file is None):
        # convert sizes its own workers to the cohort, and starts none for a complete store
        store = convert(cohort, args.out, n_workers=args.n_workers, **kwargs)
    else:
        with _client(args, processes=False) as client:
            store = convert(cohort, args.out, client=client, **kwargs)
    done = before is not None and store.attrs.get("summary") == before
    print(f"{store.path}: already complete, nothing to do ({store.n_samples} rows x "
          f"{store.n_features} voxels)" if done else summary_line(store))
    return 0


def _cmd_export(args) -> int:
    from fgscale.grouping._export import export_map

    img = export_map(args.store, args.out, values=args.npy, grouping=args.grouping,
                     omega=args.omega, bank=args.bank)
    print(f"{args.out}: image of shape {img.shape}")
    return 0


def _cmd_make_cohort(args) -> int:
    from pathlib import Path

    from fgscale.images import make_cohort

    table = Path(args.out) / "cohort.csv"
    if table.exists():  # the folder may hold a real cohort: never overwrite its table
        raise ValueError(f"{table}: exists; remove it or choose another folder")
    csv = make_cohort(args.out, **{k: getattr(args, k) for k in (
        "n_samples", "n_classes", "grid", "snr_db", "smooth_noise", "n_subjects",
        "test_fraction", "seed", "four_d", "target")})
    grid = args.grid if isinstance(args.grid, str) else "x".join(map(str, args.grid))
    print(f"{csv}: a SYNTHETIC cohort of {args.n_samples} volumes, {args.n_classes} classes"
          f"{' and a target' if args.target else ''}, {grid} grid, SNR {args.snr_db:g} dB "
          f"({args.smooth_noise:.0%} of the noise smooth), seed {args.seed}")
    print(f"SYNTHETIC data, generated, not images of anyone; next: fgscale convert {csv} "
          "--out STORE.zarr" + (", then train with --task regression for the target"
                                if args.target else ""))
    return 0


def _cmd_report(args) -> int:
    from fgscale.report_html import write_report

    nilearn = {"auto": None, "nilearn": True, "matplotlib": False}[args.maps_with]
    try:
        path = write_report(args.run, args.out, nilearn=nilearn)
    except ModuleNotFoundError as exc:
        if exc.name not in ("matplotlib", "nilearn"):
            raise
        print(f"fgscale report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report of {args.run}: {path} (one HTML file, its figures embedded)")
    return 0


def _version() -> str:
    from fgscale import __version__
    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fgscale", description="Feature grouping as a stochastic regularizer, "
                    "trained out-of-core on Dask and Zarr.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="run the whole pipeline on a synthetic cohort (the README's main job)")
    p.add_argument("--out", default="fgscale-demo", help="folder for the cohort, store and runs")
    p.add_argument("--seed", type=int, default=0, help="seed of the cohort, the bank and training")
    p.add_argument("--n-workers", type=positive(int), default=None,
                   help="LocalCluster workers (default: cores)")
    p.add_argument("--max-epochs", type=int, default=None,
                   help="override the demo's epochs (default: the demo's own)")
    add_progress_arg(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("make-cohort", help="write a SYNTHETIC NIfTI cohort and its table "
                                           "(cohort.csv), to try fgscale on")
    p.add_argument("out", help="folder for the images, cohort.csv and cohort.json")
    add_cohort_args(p)
    p.set_defaults(func=_cmd_make_cohort)

    # --- store commands (convert, export) ---
    p = sub.add_parser("convert", help="convert a NIfTI cohort into a Zarr store (resumable)")
    p.add_argument("cohort", nargs="+",
                   help="cohort table (.csv/.tsv: path, then label and/or a numeric target, "
                        "[group], [split], [volume] from 0) or files/globs with --labels")
    p.add_argument("--out", required=True, help="the store to write (STORE.zarr)")
    p.add_argument("--labels", default=None,
                   help="with files/globs: one label per line, per file (default: none)")
    p.add_argument("--mask", default=None, help="mask NIfTI (default: computed from the images)")
    p.add_argument("--intersect-mask", action="store_true",
                   help="intersect --mask with the mask computed from the images")
    p.add_argument("--resample", type=parse_resample, default=None, metavar="MM|mask",
                   help="resample every image to this voxel size (mm) or to the mask's grid "
                        "(default: none, the images' own grid)")
    p.add_argument("--nan", choices=["error", "zero"], default="error",
                   help="NaN/inf inside the mask: fail (error) or set to 0 (zero)")
    p.add_argument("--classes", default=None,
                   help="allowed labels, comma-separated, in order (default: the labels sorted)")
    add_column_args(p, "", group=True)
    p.add_argument("--block-rows", type=positive(int), default=None,
                   help="rows per task and per shard (default: from the row size)")
    p.add_argument("--append", action="store_true",
                   help="--out is a converted store whose rows the table lists first: convert "
                        "only the rows after them (default: refuse a store of other rows)")
    add_cluster_args(p)
    add_progress_arg(p)
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("export", help="write per-voxel values of a store as a NIfTI image")
    p.add_argument("store", help="the Zarr store")
    p.add_argument("--out", required=True, help="output image (.nii or .nii.gz)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--npy", default=None, help=".npy of shape (p,) or (n, p)")
    what.add_argument("--grouping", type=int, default=None, metavar="I",
                      help="grouping I of the store's bank (from 0), its clusters numbered from 1")
    what.add_argument("--omega", action="store_true", help="the bank's Omega diagonal")
    p.add_argument("--bank", default=None, metavar="KEY",
                   help="the bank of --grouping/--omega (default the store's only bank; "
                        "fgscale bank STORE --list shows the keys)")
    p.set_defaults(func=_cmd_export)

    # --- distributed commands (bank, train, cv, evaluate), then predict ---

    p = sub.add_parser("bank", help="build the bank of groupings into a store (its cache store "
                       "when the store is read-only: $FGSCALE_CACHE_DIR), on a Dask cluster")
    add_bank_args(p, "")
    add_cluster_args(p)
    p.add_argument("--overwrite", action="store_true",
                   help="rebuild the bank of these parameters from scratch (other banks are kept)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true",
                      help="list the banks of the store and of its cache store (key, k, r, seed, "
                           "rows, built/total, in); build nothing")
    what.add_argument("--remove", nargs="+", metavar="KEY", default=None,
                      help="remove these banks (keys from --list; folds: those built on a part of "
                           "the training rows, by cv) from the store and its cache (default: none)")
    add_progress_arg(p)
    p.set_defaults(func=_cmd_bank)

    p = sub.add_parser("train", help="train on a store, streaming minibatches from the workers")
    add_estimator_args(p)
    p.add_argument("--out", required=True, help="run folder (config, checkpoints, metrics, maps)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out; with no run there, start it (requeued jobs)")
    add_task_arg(p)
    add_cluster_args(p)
    add_worker_kind_arg(p)
    add_progress_arg(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("cv", help="cross-validate on a store's training rows, folds by subject")
    add_estimator_args(p)
    add_cv_args(p)
    add_task_arg(p)
    add_cluster_args(p)
    add_worker_kind_arg(p)
    add_progress_arg(p)
    p.set_defaults(func=_cmd_cv)

    p = sub.add_parser("evaluate", help="score a trained run on a store's test rows")
    p.add_argument("run", help="run folder (from fgscale train)")
    p.add_argument("store", help="the Zarr store (the run's, or another with its mask)")
    add_device_arg(p)
    p.add_argument("--predictions", default=None, metavar="FILE",
                   help="also write each test row's label, prediction and probabilities (CSV; "
                        ".tsv: tabs; -: the standard output) (default: none)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    p.add_argument("--rows", choices=["test", "all", "train"], default="test",
                   help="the store's rows scored, by split (all: new subjects without one)")
    add_cluster_args(p)
    add_worker_kind_arg(p)
    add_progress_arg(p)
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser("predict", help="predict NIfTI images, a cohort table or a store with a "
                                       "trained run (no cluster)")
    p.add_argument("run", help="run folder (from fgscale train)")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="NIfTI files or a quoted pattern (3D or 4D: a line per volume), or one "
                        "cohort table (.csv/.tsv: path[,label or target, copied][,split]), or one store")
    p.add_argument("--out", required=True, help="the predictions to write (CSV; .tsv: tabs; "
                   "-: the standard output)")
    p.add_argument("--rows", choices=["all", "train", "test"], default="all",
                   help="a store's rows or a cohort table's files, by split (default: all)")
    p.add_argument("--resample", action="store_true",
                   help="resample images on another grid to the run's mask (linear); by "
                        "default they are refused")
    add_column_args(p, " (copied beside the predictions)")
    add_device_arg(p)
    add_progress_arg(p)
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser("report", help="write a run's report: one HTML file with its curves, "
                                      "choices, test scores and maps (needs fgscale[plot])")
    p.add_argument("run", help="run folder (from fgscale train; an unfinished one too)")
    p.add_argument("--out", default=None, help="the HTML file (default: RUN/report.html)")
    p.add_argument("--maps-with", choices=["auto", "nilearn", "matplotlib"], default="auto",
                   help="draw the maps with nilearn.plotting.plot_stat_map or matplotlib alone; "
                        "auto: nilearn when it is installed")
    p.set_defaults(func=_cmd_report)
    add_runs_command(sub)  # fgscale runs [FOLDER]: the run folders, a line each
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.given = given_options(parser, argv)
    if args.verbose < 2:  # Dask's INFO chatter (scheduler, nannies, workers) only with -vv
        # nor a task's failure, logged by its worker with a traceback: main reports it
        if "DASK_LOGGING" not in os.environ and "DASK_LOGGING__DISTRIBUTED" not in os.environ:
            os.environ["DASK_LOGGING"] = str({"distributed": "warning", "distributed.worker":
                                              "critical", "distributed.worker.memory": "warning",
                                              "distributed.client": "critical"})
        logging.getLogger("distributed").setLevel(logging.WARNING)
        logging.getLogger("distributed.worker").setLevel(logging.CRITICAL)
        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)  # a lost scheduler
    # -v: fgscale's progress log (epochs, steps); -vv: its debug log and Dask's own
    logging.basicConfig(level=logging.INFO if args.verbose >= 2 else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    log.setLevel([logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)])
    if args.command is None:
        parser.print_help()
        return 0
    one_line_warnings(args.command)
    if hasattr(args, "scheduler"):  # a command with cluster options
        warn_unused_cluster_options(args)
    try:
        return args.func(args)
    except (ValueError, OSError) as exc:  # OSError: a missing file, a full disk, a scheduler
        return failed(args.command, exc)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (fgscale._interrupt.Terminated)
        return interrupted(args.command, exc)


def run() -> int:
    """The ``fgscale`` command: :func:`main`, exiting so that a late Ctrl-C shows no traceback."""
    return run_command(main)
