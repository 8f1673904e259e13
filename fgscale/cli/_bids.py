"""``fgscale export-bids``: a run's maps written as a BIDS derivatives dataset."""

from __future__ import annotations


def register(sub) -> None:
    """Add ``export-bids`` to the subcommands ``sub`` of the ``fgscale`` parser."""
    p = sub.add_parser("export-bids", help="write a run's maps as a BIDS derivatives dataset "
                                           "(dataset_description.json, group/*_statmap.nii.gz)")
    p.add_argument("run", help="a finished run folder (fgscale train --out)")
    p.add_argument("--out", required=True,
                   help="the derivatives dataset: a new folder, or a derivatives dataset "
                        "without another run's maps")
    p.set_defaults(func=_cmd_export_bids)


def _cmd_export_bids(args) -> int:
    from fgscale.runs import export_bids

    written = export_bids(args.run, args.out)
    files = [p.name for p in written["maps"].values()]
    print(f"{args.out}: a BIDS derivatives dataset of {len(files)} map"
          f"{'s' * (len(files) != 1)} in {written['mask'].parent} ({', '.join(files)}) and "
          f"{written['mask'].name}")
    return 0
