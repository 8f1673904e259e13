"""The Zarr store: one group per cohort (samples x in-mask voxels), its layout, writers,
reader, shard files and recycled read buffers, and the conversion of a NIfTI cohort into it.

Nothing here imports torch or scikit-learn: conversion and bank workers import this package.
"""

from fgscale.store._buffers import POOL, BlockPool
from fgscale.store._convert import convert
from fgscale.store._layout import (
    block_range,
    create_store,
    default_block_rows,
    mark_complete,
    write_block,
    write_block_rows,
    write_store,
)
from fgscale.store._reader import FORMAT_VERSION, Store, open_group_checked, open_store
from fgscale.store._shards import ShardRowReader, StoreError

__all__ = ["FORMAT_VERSION", "POOL", "BlockPool", "ShardRowReader", "Store", "StoreError",
           "block_range", "convert", "create_store", "default_block_rows", "mark_complete",
           "open_group_checked", "open_store", "write_block", "write_block_rows", "write_store"]
