"""What ``fgscale bank`` prints: the table of ``--list``, a line per bank built and one per bank
removed (``--remove``), each saying whether a bank lies in the store or in its cache store
(:mod:`fgscale.store._derived`)."""

from __future__ import annotations

import warnings
from pathlib import Path

from fgscale.cli._options import (
    add_bank_args,
    add_cluster_args,
    add_param,
    add_progress_arg,
    client_of,
)

__all__ = ["bank_list", "built_line", "register", "remove_banks", "warn_unused_build_options"]

# what builds a bank, and where: nothing that --list or --remove does
_BUILD_OPTIONS = ("n_groupings", "n_bootstrap", "n_clusters", "model", "seed", "overwrite",
                  "scheduler", "scheduler_file", "n_workers")


def warn_unused_build_options(given: set) -> None:
    """Say which of the ``given`` options (their destinations) ``--list`` or ``--remove``
    leave unused: they build nothing, on no cluster (``--remove KEY`` names its banks)."""
    unused = ["--" + name.replace("_", "-") for name in _BUILD_OPTIONS if name in given]
    if unused:
        warnings.warn(f"{', '.join(unused)} not used: --list and --remove build nothing (remove "
                      "a bank by its key, from --list)", stacklevel=2)


def _place(location: str, store) -> str:
    return "store" if Path(location) == Path(store).resolve() else "cache"


def bank_list(store) -> list[str]:
    """The lines of ``fgscale bank STORE --list``: a table of the banks of the store and of its
    cache store (column ``in``), then the cache store's path when it holds any."""
    from fgscale.store._banks import list_banks

    banks = list_banks(store)
    if not banks:
        return [f"{store}: no bank"]
    rows = [("key", "k", "r", "seed", "rows", "built", "in")] + [
        (b["key"], str(b["n_clusters"]), str(b["n_bootstrap"]), str(b["seed"]),
         str(b["n_rows"]), f"{b['built']}/{b['total']}", _place(b["location"], store))
        for b in banks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    caches = sorted({b["location"] for b in banks if _place(b["location"], store) == "cache"})
    return lines + [f"cache: {c} (derived data of a store not written to)" for c in caches]


def built_line(info: dict, store) -> str:
    """The line of ``fgscale bank STORE`` for the bank ``info`` of :func:`build_bank`."""
    where = ("" if _place(info["location"], store) == "store"
             else f" (in its cache store {info['location']})")
    return f"bank {info['key']} of {store}{where}: " + (
        f"{info['built']} groupings built, {info['reused']} reused (b={info['n_groupings']}, "
        f"k={info['n_clusters']}, r={info['n_bootstrap']}, seed={info['seed']}) in "
        f"{info['seconds']:.1f} s" if info["built"] else
        f"already complete ({info['n_groupings']} groupings, k={info['n_clusters']}), "
        "nothing to do")


def remove_banks(store, keys) -> list[str]:
    """Remove the banks ``keys`` of a store, every copy (the store's and its cache store's);
    the lines of ``fgscale bank STORE --remove KEY ...``. ``["folds"]`` stands for every bank
    built on other rows than the store's training rows: those of ``fgscale cv``'s folds.

    Every key is checked before anything is removed: an unknown one is a ValueError that lists
    the banks present, and so is a bank in a place this process may not write, or in the
    store under ``FGSCALE_DERIVED=cache``; no bank is removed then.
    """
    import zarr

    from fgscale.store._banks import BANKS, delete_bank, list_banks, rows_hash
    from fgscale.store._derived import DERIVED_ENV, derived_mode, writable
    from fgscale.store._reader import open_store

    banks = list_banks(store)
    if list(keys) == ["folds"]:
        train = rows_hash(open_store(store).train_rows())
        keys = [b["key"] for b in banks if b["rows_sha1"] != train]
        if not keys:
            return [f"{store}: no bank of a fold (every bank is built on the training rows)"]
    missing = sorted(set(keys) - {b["key"] for b in banks})
    if missing:
        known = sorted({b["key"] for b in banks})  # a few: cross-validation leaves one per fold
        present = ", ".join(known[:6]) + (f" and {len(known) - 6} more" if len(known) > 6 else "")
        present = present or "none"
        raise ValueError(f"{store}: no bank {', '.join(missing)}; banks present: {present} "
                         f"(fgscale bank {store} --list); nothing removed")
    chosen = [b for b in banks if b["key"] in keys]
    for bank in chosen:  # every place checked before any bank is removed
        where = _place(bank["location"], store)
        if where == "store" and derived_mode() == "cache":
            raise ValueError(f"{store}: bank {bank['key']} lies in the store, which {DERIVED_ENV}"
                             "=cache keeps as converted: unset it to remove the bank; nothing "
                             "removed")
        if not writable(bank["location"]):
            raise ValueError(f"{store}: bank {bank['key']} lies in the {where} "
                             f"{bank['location']}, which this process may not write: make it "
                             "writable (or ask its owner); nothing removed")
    lines = []
    for bank in chosen:
        folder = Path(bank["location"]) / BANKS / bank["key"]
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        delete_bank(zarr.open_group(bank["location"], mode="r+"), bank["key"])
        lines.append(f"removed bank {bank['key']} (k={bank['n_clusters']}, "
                     f"{bank['built']}/{bank['total']} groupings) from the "
                     f"{_place(bank['location'], store)} {bank['location']}: "
                     f"{_size(size)} freed")
    return lines


def _size(n: int) -> str:
    """A number of bytes as a person reads it: kB below 1 MB, MB below 1 GB, else GB."""
    for unit, scale in (("kB", 1e3), ("MB", 1e6)):
        if n < scale * 1e3:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e9:.1f} GB"


def register(sub) -> None:
    """Add ``bank`` to the subcommands ``sub`` of the ``fgscale`` parser."""
    p = sub.add_parser("bank", help="build the bank of groupings into a store (its cache store "
                       "when the store is read-only: $FGSCALE_CACHE_DIR), on a Dask cluster")
    add_bank_args(p, "")
    # "auto"'s grid depends on the model that will train on the banks: the MLP's and the CNN's
    # stops sooner, and a bank it never uses would be built for nothing
    add_param(p, "model", "; the model that will train on these banks: with --n-clusters "
              "auto, the banks of its grid are built")
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


def _cmd_bank(args) -> int:
    if args.list or args.remove:
        warn_unused_build_options(args.given)
        print("\n".join(bank_list(args.store) if args.list else remove_banks(args.store, args.remove)))
        return 0
    from fgscale.estimators._auto import searched_values
    from fgscale.grouping._dask_bank import build_bank
    from fgscale.store import open_store

    # "auto" or a list of n_clusters: a bank for each k that training will choose among
    store = open_store(args.store)
    ks = searched_values("n_clusters", args.n_clusters, n_features=store.n_features,
                         regression=store.target is not None, linear=args.model == "logreg")
    with client_of(args, processes=True) as client:  # a cluster only if a grouping is left
        infos = [build_bank(args.store, n_groupings=args.n_groupings,
                            n_bootstrap=args.n_bootstrap, n_clusters=k, seed=args.seed,
                            client=client, overwrite=args.overwrite, return_info=True,
                            progress=not args.no_progress)[1]
                 for k in ks]
    print("\n".join(built_line(info, args.store) for info in infos))
    return 0
