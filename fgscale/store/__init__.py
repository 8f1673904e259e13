"""The Zarr store: one group per cohort (samples x in-mask voxels), its layout, writers,
reader, shard files and recycled read buffers, and the conversion of a NIfTI cohort into it.

Nothing here imports torch or scikit-learn: conversion and bank workers import this package.
"""

from fgscale.store._banks import (
    Bank,
    BankError,
    bank_key,
    bank_key_of,
    bank_params,
    create_bank,
    delete_bank,
    list_banks,
    open_bank,
    rows_hash,
)
from fgscale.store._buffers import POOL, BlockPool
from fgscale.store._convert import convert
from fgscale.store._derived import write_location
from fgscale.store._layout import (
    block_range,
    create_store,
    damaged_blocks,
    default_block_rows,
    mark_complete,
    write_block,
    write_block_rows,
    write_store,
)
from fgscale.store._reader import FORMAT_VERSION, Store, open_group_checked, open_store
from fgscale.store._shards import ShardRowReader, StoreError
from fgscale.store._stats import array_stats, compute_stats, load_stats, stats_key, stats_ready

__all__ = ["FORMAT_VERSION", "POOL", "Bank", "BankError", "BlockPool", "ShardRowReader", "Store",
           "StoreError", "array_stats", "bank_key", "bank_key_of", "bank_params", "block_range",
           "compute_stats", "convert", "create_bank", "create_store", "damaged_blocks",
           "default_block_rows", "delete_bank", "list_banks", "load_stats", "mark_complete",
           "open_bank", "open_group_checked", "open_store", "rows_hash", "stats_key", "stats_ready",
           "write_block", "write_block_rows", "write_location", "write_store"]
