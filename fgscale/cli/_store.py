"""``fgscale convert`` (NIfTI cohort to Zarr store) and ``fgscale export`` (a store's per-voxel
values as a NIfTI image)."""

from __future__ import annotations

from fgscale.cli._options import (
    add_cluster_args,
    add_column_args,
    add_progress_arg,
    client_of,
    columns_of,
    parse_resample,
    positive,
)


def register(sub) -> None:
    """Add ``convert``, ``export`` to the subcommands ``sub`` of the ``fgscale`` parser."""
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
        with client_of(args, processes=False) as client:
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
