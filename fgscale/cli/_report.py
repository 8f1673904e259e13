"""``fgscale report``: a run's report, one HTML file with its curves, choices, scores and maps."""

from __future__ import annotations

import sys

from fgscale.cli._options import add_cluster_args


def register(sub) -> None:
    """Add ``report`` to the subcommands ``sub`` of the ``fgscale`` parser."""
    p = sub.add_parser("report", help="write a run's report: one HTML file with its curves, "
                                      "choices, test scores and maps (needs fgscale[plot])")
    p.add_argument("run", help="run folder (from fgscale train; an unfinished one too)")
    p.add_argument("--out", default=None, help="the HTML file (default: RUN/report.html)")
    p.add_argument("--maps-with", choices=["auto", "nilearn", "matplotlib"], default="auto",
                   help="draw the maps with nilearn.plotting.plot_stat_map or matplotlib alone; "
                        "auto: nilearn when it is installed")
    p.add_argument("--bg-img", default=None, metavar="PATH",
                   help="NIfTI image to draw the maps over (a T1, a template in the maps' "
                        "space), resampled to the maps' grid if it lies on another (default: "
                        "the mean image of the training rows, else the mask)")
    add_cluster_args(p, used=False)
    p.set_defaults(func=_cmd_report)


def _cmd_report(args) -> int:
    from fgscale.runs._html import write_report

    nilearn = {"auto": None, "nilearn": True, "matplotlib": False}[args.maps_with]
    try:
        path = write_report(args.run, args.out, nilearn=nilearn, bg_img=args.bg_img)
    except ModuleNotFoundError as exc:
        if exc.name not in ("matplotlib", "nilearn"):
            raise
        print(f"fgscale report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report of {args.run}: {path} (one HTML file, its figures embedded)")
    return 0
