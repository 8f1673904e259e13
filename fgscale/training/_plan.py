"""Training plans: which rows form each minibatch and which grouping each iteration uses.

A plan is a pure function of ``(seed, epoch)``: the in-memory trainer and the distributed
streamer replay exactly the same plan, which is what makes them comparable bit for bit, and
a resumed run can rebuild the plan of any epoch without replaying the earlier ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EpochPlan", "epoch_plan"]


@dataclass(frozen=True)
class EpochPlan:
    """The minibatches of one epoch.

    Attributes
    ----------
    epoch : int
    batches : tuple of ndarray of int64
        Row indices of each minibatch, in training order.
    groupings : ndarray of shape (n_batches,) or None
        Index into the bank of the grouping used at each iteration; None without a bank.
    """

    epoch: int
    batches: tuple
    groupings: np.ndarray | None

    def __len__(self) -> int:
        return len(self.batches)


def epoch_plan(
    rows, *, batch_size: int, epoch: int, seed: int, n_groupings: int = 0
) -> EpochPlan:
    """Plan one epoch: a seeded permutation of ``rows`` cut into minibatches.

    Parameters
    ----------
    rows : array-like of int of shape (n_rows,)
        Training rows (indices into the data or the store).
    batch_size : int
        Rows per minibatch; the last one may be smaller.
    epoch : int
        Epoch number; each epoch gets its own independent stream.
    seed : int
        The run's seed.
    n_groupings : int
        Size of the bank to draw groupings from; 0 for no grouping.

    Returns
    -------
    plan : EpochPlan
    """
    rows = np.asarray(rows, dtype=np.int64)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)]))
    order = rows[rng.permutation(rows.size)]
    batches = tuple(order[i : i + batch_size] for i in range(0, order.size, batch_size))
    groupings = rng.integers(n_groupings, size=len(batches)) if n_groupings else None
    return EpochPlan(epoch=int(epoch), batches=batches, groupings=groupings)
