"""``fgscale evaluate`` (a trained run scored on a store) and ``fgscale predict`` (images,
a cohort table, a store or the images of a BIDS dataset predicted, without a cluster)."""

from __future__ import annotations

import json
import sys

from fgscale.cli._options import (
    add_cluster_args,
    add_column_args,
    add_device_arg,
    add_progress_arg,
    add_worker_kind_arg,
    client_of,
    columns_of,
    worker_processes,
)
from fgscale.cli._store import _add_bids_args
from fgscale.runs import check_finished_run


def register(sub) -> None:
    """Add ``evaluate``, ``predict`` to the subcommands ``sub`` of the ``fgscale`` parser."""
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

    p = sub.add_parser("predict", help="predict NIfTI images, a cohort table, a store or a BIDS "
                                       "dataset with a trained run (no cluster)")
    p.add_argument("run", help="run folder (from fgscale train)")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="NIfTI files or a quoted pattern (3D or 4D: a line per volume), or one "
                        "cohort table (.csv/.tsv: path[,label or target, copied][,split]), or one "
                        "store, or one BIDS dataset (its images' entities beside the "
                        "predictions: subject, session, run...)")
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
    _add_bids_args(p, labels=False, inputs="INPUT")
    add_cluster_args(p, used=False)
    p.set_defaults(func=_cmd_predict)


def _cmd_evaluate(args) -> int:
    from fgscale.store import open_store

    check_finished_run(args.run)  # and the store, before torch is imported (seconds)
    open_store(args.store)
    from fgscale.runs import evaluate_run
    from fgscale.runs._reports import STDOUT
    from fgscale.runs._scores import format_report

    with client_of(args, processes=worker_processes(args, auto=False)) as client:
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
    cohort = _bids_cohort(args)  # and the query's mistakes, before torch too
    from fgscale.runs import STDOUT, predict_line, predict_run

    # a BIDS dataset: the images of its query, read above, with their entities as columns
    summary = predict_run(args.run, args.inputs if cohort is None else cohort, args.out,
                          rows=args.rows, resample=args.resample, device=args.device,
                          columns=columns_of(args), progress=not args.no_progress)
    print(predict_line(summary), file=sys.stderr if args.out == STDOUT else sys.stdout)
    return 0


def _bids_cohort(args):
    """With a BIDS dataset given as the one input, the images its ``--bids-filter`` selects (a
    :class:`fgscale.images.BidsCohort` without labels); else None. ``--bids-filter`` without a
    BIDS dataset, and the options of a store or a cohort table with one, are refused, as
    :func:`fgscale.runs.predict_run` refuses them, in the words of the command's options."""
    from fgscale.runs._bids_inputs import OptionNames, bids_inputs

    names = OptionNames(bids_filter="--bids-filter", query_example="(sub=01,02)",
                        rows="--rows {}", column="--{}-column names a column of a cohort table")
    return bids_inputs(args.inputs, args.bids_filter, args.rows, columns_of(args), names=names)
