"""The ``fgscale`` command line: one subcommand per step of the pipeline.

Each command module of this package registers its subcommands (``register(sub)``) and holds
their small ``_cmd_<name>(args)`` functions, which call the public API and decide what is
printed; the work itself lives in the library, the options that subcommands share in
:mod:`fgscale.cli._options`, the handling of Ctrl-C and SIGTERM in :mod:`fgscale.cli._interrupt`.
"""

from __future__ import annotations

import argparse
import logging
import os

from fgscale.cli._bank import register as register_bank
from fgscale.cli._bids import register as register_bids
from fgscale.cli._demo import register as register_demo
from fgscale.cli._evaluate import register as register_evaluate
from fgscale.cli._interrupt import failed, interrupted, run_command
from fgscale.cli._options import Parser, given_options, one_line_warnings, warn_unused_cluster_options
from fgscale.cli._report import register as register_report
from fgscale.cli._runs import register as register_runs
from fgscale.cli._store import register as register_store
from fgscale.cli._train import register as register_train

log = logging.getLogger("fgscale")

# the subcommands in the order of the help: getting started, the store, the bank, training,
# using a trained run, looking at runs, sharing their maps
_COMMANDS = (register_demo, register_store, register_bank, register_train, register_evaluate,
             register_report, register_runs, register_bids)


def _version() -> str:
    from fgscale import __version__
    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fgscale", description="Feature grouping as a stochastic regularizer, "
                    "trained out-of-core on Dask and Zarr.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _COMMANDS:
        register(sub)
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
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (fgscale.cli._interrupt.Terminated)
        return interrupted(args.command, exc)


def run() -> int:
    """The ``fgscale`` command: :func:`main`, exiting so that a late Ctrl-C shows no traceback."""
    return run_command(main)
