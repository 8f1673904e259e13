"""The in-memory batch source: the oracle that the streamed source is tested against."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np

from fgscale.grouping._projection import project, project_rows
from fgscale.training._loop import Batch
from fgscale.training._plan import EpochPlan
from fgscale.training._screening import block_sums, merge_sums

__all__ = ["MemorySource", "standardize_rows"]


# Default size of an in-memory evaluation block: the size of a store shard (fgscale.store), kept
# here so that the core trainer does not import zarr and nibabel.
_BLOCK_BYTES = 64 << 20


class MemorySource:
    """Batches and evaluation blocks from in-memory arrays (the oracle of the streamed source).

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features), float32
    y : ndarray of shape (n_samples,), int64
    bank : ndarray of shape (n_groupings, n_features), int32, optional
    block_size : int, optional
        Rows per evaluation block (each block is a copy); default about 64 MiB of rows.
    mean, scale : ndarray of shape (n_features,), optional
        Standardize rows as they are used, ``(x - mean) * scale`` in float32 (``scale`` is
        ``1 / std``, e.g. from :func:`fgscale.store.array_stats`), given together: batches,
        reduced or not, and evaluation blocks are of standardized rows; ``X`` is never modified.
        When all of ``X`` fits in one evaluation block, its rows are standardized once, into a
        copy, rather than at every batch and every validation pass (the same values).
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, bank=None, *, block_size: int | None = None,
                 mean: np.ndarray | None = None, scale: np.ndarray | None = None):
        if (mean is None) != (scale is None):
            raise ValueError("give mean and scale together, or neither")
        self.X, self.y, self.bank = X, y, bank
        self.block_size = block_size or max(1, _BLOCK_BYTES // (4 * max(X.shape[1], 1)))
        self.mean = None if mean is None else np.asarray(mean, np.float32)
        self.scale = None if scale is None else np.asarray(scale, np.float32)
        if self.mean is not None and len(X) <= self.block_size:
            # small problems are bound by per-batch overheads; a copy costs one block at most
            self.X = standardize_rows(X, self.mean, self.scale)
            self.mean = self.scale = None

    def with_bank(self, bank) -> MemorySource:
        """The same rows (standardized copy included, not copied again) with another bank."""
        source = copy.copy(self)
        source.bank = bank
        return source

    def _rows(self, rows) -> np.ndarray:
        """A copy of full rows, standardized when asked (the streamed source's numbers)."""
        full = self.X[rows]
        return full if self.mean is None else standardize_rows(full, self.mean, self.scale)

    def batches(self, plan: EpochPlan) -> Iterator[Batch]:
        """The plan's minibatches, reduced by the bank's groupings, in plan order.

        A reduced batch whose full rows fit in an evaluation block is copied whole and reduced
        in one call; a larger one is reduced row by row from views of ``X``, as the streamed
        source does from the store, so that its full rows are never copied together. Both
        give the numbers of the streamed source (each row's sums in feature order).
        """
        for i, rows in enumerate(plan.batches):
            if plan.groupings is None:
                yield Batch(self._rows(rows), self.y[rows])
                continue
            g = int(plan.groupings[i])
            if len(rows) <= self.block_size:
                # one call for the batch: small problems are bound by the per-row overhead
                x = project(self._rows(rows), self.bank[g])
            else:
                x = project_rows(((j, self.X[r]) for j, r in enumerate(rows)), self.bank[g],
                                 len(rows), mean=self.mean, scale=self.scale)
            yield Batch(x, self.y[rows], g)

    def blocks(self, rows) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Full rows ``(x, y)`` in blocks, for validation and testing."""
        rows = np.asarray(rows, dtype=np.int64)
        for i in range(0, rows.size, self.block_size):
            part = rows[i : i + self.block_size]
            yield self._rows(part), self.y[part]

    def screen_sums(self, rows, bank, n_clusters: int, n_outputs: int,
                    regression: bool = False) -> dict:
        """The screening sums of ``rows`` for every grouping of ``bank`` (k ``n_clusters``,
        computed on its device): :func:`~fgscale.training._screening.merge_sums` of the sums of
        its evaluation blocks."""
        return merge_sums(block_sums(x, y, bank, n_clusters, n_outputs, regression)
                          for x, y in self.blocks(rows))


def standardize_rows(x: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(x - mean) * scale`` in float32, into a new C-ordered array: the streamed source's
    numbers, for training rows and for the rows an estimator predicts on."""
    out = np.subtract(x, mean, dtype=np.float32, order="C")
    return np.multiply(out, scale, out=out)
