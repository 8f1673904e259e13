import numpy as np

from fgscale.training._plan import epoch_plan


def test_plan_is_a_pure_function_of_seed_and_epoch():
    rows = np.arange(10, 110)
    a = epoch_plan(rows, batch_size=32, epoch=3, seed=7, n_groupings=5)
    b = epoch_plan(rows, batch_size=32, epoch=3, seed=7, n_groupings=5)
    c = epoch_plan(rows, batch_size=32, epoch=4, seed=7, n_groupings=5)
    assert len(a) == 4 and [len(r) for r in a.batches] == [32, 32, 32, 4]
    for x, y in zip(a.batches, b.batches, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.groupings, b.groupings)
    assert not np.array_equal(np.concatenate(a.batches), np.concatenate(c.batches))


def test_plan_covers_each_row_once_per_epoch():
    rows = np.random.default_rng(0).choice(1000, 97, replace=False)
    plan = epoch_plan(rows, batch_size=10, epoch=0, seed=1, n_groupings=3)
    np.testing.assert_array_equal(np.sort(np.concatenate(plan.batches)), np.sort(rows))
    assert plan.groupings.shape == (10,) and plan.groupings.min() >= 0 and plan.groupings.max() < 3


def test_plan_without_bank_has_no_groupings():
    assert epoch_plan(np.arange(5), batch_size=2, epoch=0, seed=0).groupings is None
