"""``fgscale runs``: the run folders in a folder and below, a line each (state, task, model,
test score, store), read from their files alone, no model loaded."""

from __future__ import annotations

from fgscale.runs import runs_table


def register(sub) -> None:
    """Add ``fgscale runs [FOLDER]`` to the subcommands ``sub`` of the ``fgscale`` parser."""
    p = sub.add_parser("runs", help="list the run folders in a folder and below: state, task, "
                                    "model, test score, store")
    p.add_argument("folder", nargs="?", default=".",
                   help="the folder searched, with its subfolders (default: the working folder)")
    p.set_defaults(func=_cmd_runs)


def _cmd_runs(args) -> int:
    print("\n".join(runs_table(args.folder)))
    return 0
