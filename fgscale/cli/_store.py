"""``fgscale convert`` (NIfTI cohort, or a BIDS dataset, to Zarr store) and ``fgscale export``
(a store's per-voxel values as a NIfTI image)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fgscale.cli._options import (
    HelpFormatter,
    add_cluster_args,
    add_column_args,
    add_progress_arg,
    client_of,
    columns_of,
    parse_resample,
    positive,
)

_BIDS_EXAMPLES = """\
examples:
  fgscale convert cohort.csv --out cohort.zarr
  fgscale convert maps/*.nii.gz --labels labels.txt --out cohort.zarr

  # a BIDS derivatives dataset (fMRIPrep's): the volumes of each run labelled by its events,
  # each volume by the event on 5 s before it (the BOLD response's delay)
  fgscale convert ds000105/derivatives/fmriprep --out haxby.zarr \\
      --bids-filter space=MNI152NLin2009cAsym desc=preproc suffix=bold \\
      --label events:trial_type --hrf-delay 5 --test-subjects 05,06
  # first-level maps, labelled by a column of participants.tsv; filters from a JSON file
  fgscale convert glm/ --out maps.zarr --bids-filter filters.json \\
      --label participants:diagnosis
  # a value per session (sub-<label>_sessions.tsv) or per file (..._scans.tsv)
  fgscale convert glm/ --out maps.zarr --bids-filter suffix=statmap --label sessions:drug
  fgscale convert glm/ --out maps.zarr --bids-filter suffix=statmap --label scans:condition

  A BIDS dataset's cohort table is written beside the store (haxby.zarr.csv: path, label or
  target, group = the subject, session, run, split, volume), to read, edit and convert again,
  with the query that selected its rows (haxby.zarr.json: filters, label, --hrf-delay...).
"""


class _ExamplesFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The help formatter of ``convert``, keeping the line breaks of its examples."""


_SOURCES_METAVAR = "ENTITY|participants:COL|sessions:COL|scans:COL|events:COL"


def _add_bids_args(p, *, labels: bool = True, inputs: str = "COHORT") -> None:
    """The options of a BIDS dataset given as ``inputs`` (the positional argument's name):
    ``--bids-filter``, and with ``labels`` those that label its images (``--label``,
    ``--target``, ``--bids-raw``, ``--hrf-delay``, ``--test-subjects``)."""
    bids = p.add_argument_group(  # its description keeps its line breaks, as the examples'
        "BIDS datasets", f"{inputs} a BIDS dataset, raw or derivatives (a folder with\n"
        "dataset_description.json): the images its entities select"
        + (", each subject a group" if labels else ""))
    bids.add_argument("--bids-filter", nargs="+", default=None, metavar="KEY=VALUE|FILE.json",
                      help="entities the images must have, such as space=MNI152NLin2009cAsym "
                           "desc=preproc suffix=bold (run=1,2: either), or a JSON file of "
                           "entity -> value as fMRIPrep's --bids-filter-file (default: every "
                           "NIfTI file, which must then be of one kind)")
    if not labels:
        return
    bids.add_argument("--label", default=None, metavar=_SOURCES_METAVAR,
                      help="each image's class: an entity of its name (task), a column of "
                           "participants.tsv (participants:diagnosis), of the subject's "
                           "sessions.tsv (sessions:COL, by session_id), of the scans.tsv "
                           "listing the file (scans:COL, by filename), or of a 4D series' "
                           "events.tsv (events:trial_type: a sample per volume in an event, "
                           "volume i at i x RepetitionTime less --hrf-delay; the others are "
                           "left out) (default: none)")
    bids.add_argument("--target", default=None, metavar=_SOURCES_METAVAR,
                      help="each image's regression target, as --label, such as "
                           "participants:age (default: none)")
    bids.add_argument("--hrf-delay", type=float, default=None, metavar="SECONDS",
                      help="with events:COL labels or targets: the hemodynamic delay, each "
                           "volume labelled by the event on SECONDS before it (the BOLD "
                           "response peaks some 4-6 s after the stimulus) (default: 0, none)")
    bids.add_argument("--bids-raw", default=None, metavar="RAW",
                      help="the raw dataset whose participants.tsv, sessions.tsv, scans.tsv "
                           "and events.tsv a derivatives dataset lacks (default: the dataset "
                           "two folders up of one in RAW/derivatives/NAME)")
    bids.add_argument("--test-subjects", default=None, metavar="S1,S2",
                      help="subjects (01 or sub-01) whose images make the test split, the "
                           "others' the training split (default: none, every row trains)")


def register(sub) -> None:
    """Add ``convert``, ``export`` to the subcommands ``sub`` of the ``fgscale`` parser."""
    p = sub.add_parser("convert", help="convert a NIfTI cohort or a BIDS dataset into a Zarr "
                                       "store (resumable)",
                       epilog=_BIDS_EXAMPLES, formatter_class=_ExamplesFormatter)
    p.add_argument("cohort", nargs="+",
                   help="cohort table (.csv/.tsv: path, then label and/or a numeric target, "
                        "[group], [split], [volume] from 0), files/globs with --labels, or a "
                        "BIDS dataset with --label or --target")
    p.add_argument("--out", required=True, help="the store to write (STORE.zarr)")
    p.add_argument("--labels", default=None,
                   help="with files/globs: one label per line, per file (default: none)")
    p.add_argument("--mask", default=None, help="mask NIfTI (default: computed from the images)")
    p.add_argument("--intersect-mask", action="store_true",
                   help="intersect --mask with the mask computed from the images")
    p.add_argument("--resample", type=parse_resample, default=None, metavar="MM|mask",
                   help="resample every image to this voxel size (mm) or to the mask's grid "
                        "(default: none, the images' own grid)")
    p.add_argument("--smoothing-fwhm", type=_fwhm, default=None, metavar="MM",
                   help="smooth every image by a Gaussian of this FWHM in mm before masking, "
                        "as nilearn's maskers (smoothing_fwhm); recorded in the store, so a "
                        "model trained on it predicts images smoothed alike (default: none)")
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
    _add_bids_args(p)
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


def _fwhm(text: str) -> float:
    """A FWHM in mm: a number >= 0 (0: no smoothing)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a width in mm (a number >= 0)")
    return value


def _complete_summary(path) -> dict | None:
    """The summary of the complete store at ``path``; None for none there, or a damaged one."""
    from fgscale.store import StoreError, damaged_blocks, open_group_checked

    try:  # a damaged shard is converted again
        attrs = open_group_checked(path).attrs
        return attrs.get("summary", {}) if attrs.get("complete") and not damaged_blocks(
            path) else None
    except StoreError:  # none there yet, or not a store: convert says which
        return None


def _bids_table(args) -> str | None:
    """With a BIDS dataset given as the cohort, its cohort table, written beside the store
    (``--out`` with ``.csv`` added, the query recorded in ``--out`` with ``.json`` added),
    which is then converted; else None. BIDS options without a BIDS dataset, and a table's
    options with one, are refused."""
    from fgscale.images import is_bids_root, read_bids

    bids = {"--bids-filter": args.bids_filter, "--label": args.label, "--target": args.target,
            "--hrf-delay": args.hrf_delay, "--bids-raw": args.bids_raw,
            "--test-subjects": args.test_subjects}
    given = [option for option, value in bids.items() if value is not None]
    if not (len(args.cohort) == 1 and is_bids_root(args.cohort[0])):
        if given:
            raise ValueError(f"{given[0]} reads a BIDS dataset (a folder with "
                             f"dataset_description.json), and {' '.join(args.cohort)} is none")
        return None
    root = args.cohort[0]
    table_options = [o for o, v in (("--labels", args.labels), *(
        (f"--{k}-column", v) for k, v in columns_of(args).items())) if v is not None]
    if table_options:
        raise ValueError(f"{table_options[0]} reads a cohort table or files; a BIDS dataset "
                         f"({root}) takes --label and --target (ENTITY, participants:COLUMN, "
                         "sessions:COLUMN, scans:COLUMN or events:COLUMN)")
    if args.label is None and args.target is None:
        raise ValueError(f"{root}: a BIDS dataset is converted with --label or --target (an "
                         "entity such as task, participants:COLUMN, sessions:COLUMN, "
                         "scans:COLUMN or events:COLUMN)")
    cohort = read_bids(root, args.bids_filter, label=args.label, target=args.target,
                       raw=args.bids_raw, test_subjects=args.test_subjects,
                       hrf_delay=0.0 if args.hrf_delay is None else args.hrf_delay)
    out = Path(args.out).expanduser()
    # --append converts a grown dataset's query: its table replaces the one of the store's rows
    table = cohort.write_table(out.with_name(out.name + ".csv"), overwrite=args.append)
    files = len({r["path"] for r in cohort.rows})
    delay = f", events {args.hrf_delay:g} s before each volume" if args.hrf_delay else ""
    print(f"{table}: the cohort table of {root} ({len(cohort.rows)} rows from {files} files of "
          f"{len(cohort.subjects)} subjects{delay})")
    return str(table)


def _cmd_convert(args) -> int:
    from fgscale.store._convert import convert, summary_line

    table = _bids_table(args)
    cohort = table or (args.cohort[0] if len(args.cohort) == 1 and args.labels is None
                       else args.cohort)
    classes = [c.strip() for c in args.classes.split(",")] if args.classes else None
    kwargs = dict(mask=args.mask, resample=args.resample, nan=args.nan, labels=args.labels,
                  classes=classes, intersect_mask=args.intersect_mask, block_rows=args.block_rows,
                  columns=columns_of(args), progress=not args.no_progress, append=args.append,
                  smoothing_fwhm=args.smoothing_fwhm)
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
