"""The images of a BIDS dataset that :func:`fgscale.runs.predict_run` and ``fgscale predict``
predict, and the refusal of what does not apply to them: a query without a dataset, a store's
split, a cohort table's columns. Both callers use this one check, each with the names of its
own options, so that a message says what the user typed. It never imports torch: the command
refuses a mistake before importing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from fgscale.images import BidsCohort, is_bids_root, read_bids

__all__ = ["PYTHON_NAMES", "OptionNames", "bids_inputs"]


class OptionNames(NamedTuple):
    """How a caller names the options that :func:`bids_inputs` refuses.

    Attributes
    ----------
    bids_filter : str
        The query, such as ``"bids_filter"`` or ``"--bids-filter"``.
    query_example : str
        A query of two subjects as the caller writes it, after the query's name.
    rows : str
        A split given, as a format of its value, such as ``"rows={!r}"``.
    column : str
        A column given, as a format of its kind (``label``, ``target``, ``group``): the
        message goes on with "to copy".
    """

    bids_filter: str
    query_example: str
    rows: str
    column: str


PYTHON_NAMES = OptionNames(bids_filter="bids_filter",
                           query_example="(such as {'sub': ['01', '02']})",
                           rows="rows={!r}", column="columns names a cohort table's {} column")


def bids_inputs(inputs, bids_filter, rows: str, columns: dict | None, *,
                names: OptionNames = PYTHON_NAMES) -> BidsCohort | None:
    """The images to predict with their entities: ``inputs`` itself where it is a
    :class:`fgscale.images.BidsCohort`, the query ``bids_filter`` of a BIDS dataset given as
    the one input; else None (files, a cohort table or a store).

    A ``bids_filter`` without a BIDS dataset (or with a ``BidsCohort``, already selected), and
    ``columns`` or a split ``rows`` other than "all" with one, are refused with a ValueError
    in the words of ``names`` (the columns first, as ``fgscale convert`` refuses them).
    """
    if isinstance(inputs, BidsCohort):
        if bids_filter is not None:
            raise ValueError(f"{names.bids_filter} selects the images of a BIDS dataset given "
                             "as inputs; a BidsCohort given is already selected: give its "
                             "dataset, or read_bids() it with those filters")
        where, cohort = inputs.root, inputs
    else:
        given = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
        if not (len(given) == 1 and is_bids_root(given[0])):
            if bids_filter is not None:
                raise ValueError(f"{names.bids_filter} reads a BIDS dataset (a folder with "
                                 f"dataset_description.json), and "
                                 f"{' '.join(map(str, given))} is none")
            return None
        where, cohort = given[0], None
    named = [k for k, v in (columns or {}).items() if v is not None]
    if named:
        raise ValueError(f"{names.column.format(named[0])} to copy; a BIDS dataset ({where}) "
                         "is predicted with its images' entities beside the predictions, and "
                         "no labels")
    if rows != "all":
        raise ValueError(f"{names.rows.format(rows)} selects a store's rows or a cohort table's "
                         f"files by split; a BIDS dataset ({where}) has none: select its images "
                         f"with {names.bids_filter} {names.query_example}")
    return cohort if cohort is not None else read_bids(where, bids_filter)
