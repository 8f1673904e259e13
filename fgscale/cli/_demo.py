"""``fgscale demo`` (the whole pipeline on a synthetic cohort) and ``fgscale make-cohort``
(a SYNTHETIC cohort to try fgscale on)."""

from __future__ import annotations

from fgscale.cli._options import (
    add_cohort_args,
    add_progress_arg,
    positive,
)


def register(sub) -> None:
    """Add ``demo``, ``make-cohort`` to the subcommands ``sub`` of the ``fgscale`` parser."""
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


def _cmd_demo(args) -> int:
    from fgscale.demo import run_demo

    run_demo(args.out, seed=args.seed, n_workers=args.n_workers, max_epochs=args.max_epochs,
             progress=not args.no_progress)
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
