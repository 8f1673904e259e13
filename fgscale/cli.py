"""The ``fgscale`` command line: one subcommand per step of the pipeline.

Each subcommand is a small ``_cmd_<name>(args)`` function that calls the public API and
decides what is printed; the work itself lives in the modules.
"""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger("fgscale")


def _cmd_demo(args) -> int:
    from fgscale.demo import run_demo

    run_demo(args.out, seed=args.seed, n_workers=args.n_workers)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fgscale",
        description="Feature grouping as a stochastic regularizer, trained out-of-core on Dask and Zarr.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="run the whole pipeline on a synthetic cohort (the README's main job)")
    p.add_argument("--out", default="fgscale-demo", help="folder for the cohort, store and runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-workers", type=int, default=None, help="LocalCluster workers (default: cores)")
    p.set_defaults(func=_cmd_demo)

    # --- store commands (convert, export) ---

    # --- distributed commands (bank, train, evaluate) ---

    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose + 1, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"fgscale {args.command}: error: {exc}", file=sys.stderr)
        return 2
