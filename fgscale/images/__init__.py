"""Images in, maps out: NIfTI files and cohort tables read and checked, voxel values put back
on a grid as NIfTI, and SYNTHETIC cohorts generated for demos and tests.

BIDS datasets come in through :func:`read_bids` (:mod:`._bids`, with the naming rules in
:mod:`._bids_names` and the tables and sidecars in :mod:`._bids_tables`).

Nothing here imports torch or scikit-learn: conversion workers import this package.
"""

from fgscale.images._bids import BidsCohort, is_bids_root, read_bids
from fgscale.images._bids_names import bids_name, parse_bids_name
from fgscale.images._cohort import read_cohort
from fgscale.images._masking import (
    as_mask_image,
    compute_mask,
    image_subjects,
    is_images,
    mask_images,
)
from fgscale.images._nifti import (
    ImageHeader,
    load_img,
    load_mask,
    read_data,
    read_header,
    read_image,
    unmask,
)
from fgscale.images._synthetic import (
    brain_mask,
    grid_geometry,
    make_classification_volumes,
    make_cohort,
)

__all__ = ["BidsCohort", "ImageHeader", "as_mask_image", "bids_name", "brain_mask", "compute_mask",
           "grid_geometry", "image_subjects", "is_bids_root", "is_images", "load_img", "load_mask",
           "make_classification_volumes", "make_cohort", "mask_images", "parse_bids_name",
           "read_bids", "read_cohort", "read_data", "read_header", "read_image", "unmask"]
