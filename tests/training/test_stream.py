"""Streaming from a store on a real LocalCluster, against the in-memory oracle."""

import numpy as np
import pytest
import torch
import zarr
from distributed import Client, LocalCluster
from helpers import mask_img, random_labels, smooth_cohort

from fgscale import FeatureGroupingClassifier
from fgscale.grouping._projection import project, project_rows
from fgscale.store import (
    array_stats,
    bank_key,
    bank_params,
    compute_stats,
    create_bank,
    write_store,
)
from fgscale.training import (
    LipschitzStep,
    MemorySource,
    build_model,
    evaluate,
    fit,
    lipschitz,
    make_optimizer,
)
from fgscale.training._plan import epoch_plan
from fgscale.training._stream import (
    CENTRE_BOUND_BLOCKS,
    PREFETCH_BYTES,
    Prefetcher,
    StoreSource,
    auto_window,
    load_rows,
)

PARAMS = dict(n_clusters=0.1, n_groupings=6, n_bootstrap=12, max_epochs=8, batch_size=16,
              learning_rate=0.05, random_state=5)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    X, y, mask, split = smooth_cohort()
    path = tmp_path_factory.mktemp("stream") / "cohort.zarr"
    write_store(path, X, y, mask, np.eye(4), split=split, block_rows=16,
                attrs={"synthetic": True})
    return path, X, y, mask, split


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def assert_same_model(a, b, rtol=1e-6, atol=1e-7):
    for (name, x), y in zip(a.model_.state_dict().items(), b.model_.state_dict().values(),
                            strict=True):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, msg=name)


MLP_FG = dict(model="mlp", regularizer="feature_grouping", hidden_layer_sizes=(12,), dropout=0.3)


@pytest.mark.parametrize("params", [
    dict(model="logreg", regularizer="feature_grouping"),
    MLP_FG,
    dict(model="logreg", regularizer="l2", alpha=0.01),
    pytest.param(dict(MLP_FG, device="cuda"), marks=CUDA),
], ids=["logreg-fg", "mlp-fg-earlystop", "logreg-l2", "mlp-fg-cuda"])
def test_streamed_training_equals_in_memory(cohort, client, tmp_path, params):
    path, X, y, mask, split = cohort
    # a fresh copy: the bank built by one case must not be reused by the next
    store_path = tmp_path / "s.zarr"
    write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16)
    train = split == "train"
    memory = FeatureGroupingClassifier(mask=mask, **PARAMS, **params).fit(X[train], y[train])
    streamed = FeatureGroupingClassifier(**PARAMS, **params).fit(store_path, client=client)
    if memory.bank_ is not None:
        np.testing.assert_array_equal(streamed.bank_, memory.bank_)
    assert [h["epoch"] for h in streamed.history_] == [h["epoch"] for h in memory.history_]
    # a GPU sums its scatters in no fixed order: equal to float tolerance there
    on_gpu = params.get("device") == "cuda"
    assert_same_model(streamed, memory, **(dict(rtol=1e-4, atol=1e-5) if on_gpu else {}))
    np.testing.assert_array_equal(streamed.predict(X), memory.predict(X))


def test_screened_training_streamed_equals_in_memory(cohort, client, tmp_path):
    from fgscale.training._screening import BRAIN_VOLUME_MM3

    path, X, y, mask, split = cohort
    # voxels so large that the mask weighs twice a brain: screening keeps 10% of the clusters
    side = (2 * BRAIN_VOLUME_MM3 / mask.sum()) ** (1 / 3)
    affine = np.diag([side, side, side, 1.0])
    store_path = tmp_path / "s.zarr"
    write_store(store_path, X, y, mask, affine, split=split, block_rows=16)
    train = split == "train"
    memory = FeatureGroupingClassifier(mask=mask_img(mask, affine), **PARAMS).fit(X[train],
                                                                                 y[train])
    assert memory.screening_percentile_ == pytest.approx(10)
    streamed = FeatureGroupingClassifier(**PARAMS).fit(store_path, client=client)
    assert streamed.screening_percentile_ == memory.screening_percentile_
    assert_same_model(streamed, memory)
    unscreened = FeatureGroupingClassifier(mask=mask_img(mask, affine), screening_percentile=100,
                                           **PARAMS).fit(X[train], y[train])
    assert not np.allclose(unscreened.coef_, memory.coef_, atol=1e-3)


def test_thread_workers_train_as_worker_processes_do(cohort, tmp_path):
    """The embedded default of training: workers are threads of this process."""
    path, X, y, mask, split = cohort
    store_path = tmp_path / "s.zarr"
    write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16)
    train = split == "train"
    params = dict(PARAMS, model="mlp", hidden_layer_sizes=(12,), dropout=0.3)
    memory = FeatureGroupingClassifier(mask=mask, **params).fit(X[train], y[train])
    streamed = FeatureGroupingClassifier(**params).fit(store_path)  # embedded: threads
    assert_same_model(streamed, memory)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as threads:
        source = StoreSource(threads, store_path)
        blocks = list(source.blocks(np.arange(len(y))))
    np.testing.assert_array_equal(np.concatenate([x for x, _ in blocks]), X)


def test_source_batches_equal_memory_source(cohort, client):
    path, X, y, mask, split = cohort
    rows = np.flatnonzero(split == "train")
    p = int(mask.sum())
    bank = np.stack([np.arange(p) % 7, np.random.default_rng(0).permutation(np.arange(p) % 7)])
    store_path = path.with_name("bank.zarr")
    store = write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16)
    key = write_bank(store.path, bank.astype(np.int32))
    plan = epoch_plan(rows, batch_size=10, epoch=2, seed=1, n_groupings=2)
    y_idx = np.unique(y, return_inverse=True)[1]
    memory = list(MemorySource(X, y_idx, bank).batches(plan))
    streamed = list(StoreSource(client, store_path, n_clusters=7, bank_key=key).batches(plan))
    assert len(streamed) == len(memory) == 7
    assert {b.grouping for b in streamed} == {0, 1}
    for s, m in zip(streamed, memory, strict=True):
        assert s.grouping == m.grouping and s.x.shape == (len(s.y), 7)
        np.testing.assert_array_equal(s.x, m.x)
        np.testing.assert_array_equal(s.y, m.y)


def test_prefetch_never_exceeds_its_bound(cohort, client):
    path = str(cohort[0])
    prefetcher = Prefetcher(client, size=3)
    in_flight = []

    def count_on_scheduler(dask_scheduler):
        return sum(1 for key in dask_scheduler.tasks if "load_rows" in str(key))

    blocks = prefetcher.map(load_rows, ((path, np.array([i, i + 1])) for i in range(0, 40, 2)))
    for i, (x, _) in enumerate(blocks):
        in_flight.append(client.run_on_scheduler(count_on_scheduler))
        np.testing.assert_array_equal(x, cohort[1][[2 * i, 2 * i + 1]])
    assert prefetcher.max_seen == 3
    assert max(in_flight) <= 3


def test_auto_prefetch_keeps_two_tasks_per_thread_within_the_byte_bound(cohort, client):
    path, X, y, mask, split = cohort
    assert sum(client.nthreads().values()) == 2
    assert auto_window(client, 1) == 4
    assert auto_window(client, PREFETCH_BYTES // 3) == 3
    assert auto_window(client, 2 * PREFETCH_BYTES) == 2  # never fewer: reading overlaps a step
    source = StoreSource(client, path)  # "auto" by default
    plan = epoch_plan(np.arange(60), batch_size=5, epoch=0, seed=0)
    assert sum(len(b.y) for b in source.batches(plan)) == 60
    assert source.prefetcher.max_seen == 4
    # a first layer heavier than CENTRE_BOUND_BLOCKS blocks: the central step is the slower
    # side, and two blocks in flight keep it fed
    assert auto_window(client, 100, model_bytes=CENTRE_BOUND_BLOCKS * 100) == 4
    assert auto_window(client, 100, model_bytes=CENTRE_BOUND_BLOCKS * 100 + 1) == 2
    heavy = StoreSource(client, path, model_bytes=CENTRE_BOUND_BLOCKS * 4 * 5 * X.shape[1] + 1)
    assert sum(len(b.y) for b in heavy.batches(plan)) == 60 and heavy.prefetcher.max_seen == 2
    with LocalCluster(n_workers=3, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as six_threads:
        source = StoreSource(six_threads, path)
        blocks = list(source.batches(plan))
        assert source.prefetcher.max_seen == 12
    np.testing.assert_array_equal(np.concatenate([b.x for b in blocks]), X[np.concatenate(plan.batches)])


def test_a_store_rewritten_in_place_is_read_afresh(cohort, client, tmp_path):
    """Workers cache the open store; rewriting it at the same path must not serve stale labels."""
    path, X, y, mask, split = cohort
    store_path = tmp_path / "s.zarr"
    rows = np.arange(10)
    write_store(store_path, X, y, mask, np.eye(4), block_rows=16)
    first = list(StoreSource(client, store_path).blocks(rows))[0]
    write_store(store_path, X[::-1].copy(), y[::-1], mask, np.eye(4), block_rows=16)
    second = list(StoreSource(client, store_path).blocks(rows))[0]
    y_idx = np.unique(y, return_inverse=True)[1]
    np.testing.assert_array_equal(first[1], y_idx[rows])
    np.testing.assert_array_equal(second[1], y_idx[::-1][rows])
    np.testing.assert_array_equal(second[0], X[::-1][rows])


# --- standardization (fgscale.store.compute_stats), on the workers and in memory ---


def write_bank(path, bank: np.ndarray) -> str:
    """Write ``bank`` into the store at ``path`` as one of its banks; return its key."""
    params = bank_params(int(bank.max()) + 1, 1, 0, np.arange(3))
    key = bank_key(int(bank.max()) + 1, 1, 0, np.arange(3))
    written = create_bank(zarr.open_group(str(path), mode="r+"), key, params, *bank.shape)
    for i, labels in enumerate(bank):
        written.write(i, labels)
    return key


def test_project_rows_standardizes_as_project_of_the_standardized_rows(rng):
    p, k = 500, 12
    X = (rng.standard_normal((9, p)) * rng.uniform(0.5, 2, p) * 1000 + 10000).astype(np.float32)
    labels = rng.permutation(np.arange(p) % k)  # clusters of ~42 features
    mean, std = array_stats(X)
    scale = 1 / std
    standardized = (X - mean) * scale
    rows = [4, 0, 4, 8]
    got = project_rows(((i, X[r]) for i, r in enumerate(rows)), labels, len(rows), k,
                       mean=mean, scale=scale)
    np.testing.assert_allclose(got, project(standardized[rows], labels, k), rtol=1e-5, atol=1e-5)
    exact = project(((X[rows].astype(np.float64) - X.mean(0, dtype=np.float64))
                     / X.std(0, dtype=np.float64)), labels, k)
    np.testing.assert_allclose(got, exact, atol=1e-4)
    with pytest.raises(ValueError, match="together"):
        project_rows([], labels, 0, k, mean=mean)


@pytest.mark.parametrize("raw", [False, True], ids=["unit", "raw-units"])
def test_standardized_batches_equal_memory_source(cohort, client, tmp_path, raw):
    path, X, y, mask, split = cohort
    if raw:  # raw scanner units: unstandardized, training goes to chance
        X = (X * 1000 + 10000).astype(np.float32)
    store_path = tmp_path / "s.zarr"
    write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16)
    p = int(mask.sum())
    bank = np.stack([np.arange(p) % 7, np.random.default_rng(0).permutation(np.arange(p) % 7)])
    key = write_bank(store_path, bank.astype(np.int32))
    train = np.flatnonzero(split == "train")
    y_idx = np.unique(y, return_inverse=True)[1]
    before = X.copy()
    mean, std = compute_stats(store_path, client=client, progress=False)
    streamed = StoreSource(client, store_path, n_clusters=7, bank_key=key, standardize=True)
    same_stats = MemorySource(X, y_idx, bank, mean=mean, scale=1 / std, block_size=7)
    memory_mean, memory_std = array_stats(X[train])  # what an in-memory fit uses
    in_memory = MemorySource(X, y_idx, bank, mean=memory_mean, scale=1 / memory_std)
    standardized = (X - mean) * (1 / std)
    plans = [epoch_plan(train, batch_size=10, epoch=2, seed=1, n_groupings=2),
             epoch_plan(train, batch_size=10, epoch=0, seed=3)]
    for plan in plans:
        s_batches = list(streamed.batches(plan))
        for s, m, o, rows in zip(s_batches, same_stats.batches(plan), in_memory.batches(plan),
                                 plan.batches, strict=True):
            assert s.grouping == m.grouping == o.grouping
            np.testing.assert_array_equal(s.x, m.x)  # the same operations, the same bits
            np.testing.assert_array_equal(s.y, m.y)
            np.testing.assert_allclose(o.x, s.x, rtol=1e-5, atol=1e-5)  # array_stats
            full = standardized[rows]
            expected = full if s.grouping is None else project(full, bank[s.grouping], 7)
            np.testing.assert_allclose(s.x, expected, rtol=1e-5, atol=1e-5)
        assert {b.grouping for b in s_batches} == ({0, 1} if plan.groupings is not None else {None})
    rows = np.arange(len(y))[::-1]
    s_blocks = np.concatenate([x for x, _ in streamed.blocks(rows)])
    np.testing.assert_array_equal(s_blocks, np.concatenate([x for x, _ in same_stats.blocks(rows)]))
    np.testing.assert_array_equal(s_blocks, standardized[rows])
    np.testing.assert_array_equal(X, before)  # X itself is never standardized
    if raw:  # the rows of raw units, standardized, are those of the original units
        x = cohort[1].astype(np.float64)
        unit = (x - x[train].mean(0)) / x[train].std(0)
        np.testing.assert_allclose(s_blocks, unit[rows], atol=1e-4)


@pytest.mark.parametrize("reply_bytes", [1, 1 << 20], ids=["a-task-per-grouping", "one-share"])
def test_screening_sums_on_the_workers_equal_memory_source(cohort, client, tmp_path,
                                                           reply_bytes):
    from fgscale.training._screening import f_scores

    path, X, y, mask, split = cohort
    store_path = tmp_path / "s.zarr"
    write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16)
    p = int(mask.sum())
    bank = np.stack([np.random.default_rng(g).permutation(np.arange(p) % 7) for g in range(3)])
    key = write_bank(store_path, bank.astype(np.int32))
    train = np.flatnonzero(split == "train")[::-1]  # any order: sums do not depend on it
    y_idx = np.unique(y, return_inverse=True)[1]
    mean, std = compute_stats(store_path, client=client, progress=False)
    streamed = StoreSource(client, store_path, n_clusters=7, bank_key=key, standardize=True)
    memory = MemorySource(X, y_idx, bank, mean=mean, scale=1 / std, block_size=16)
    s = streamed.screen_sums(train, bank, 7, 3, reply_bytes=reply_bytes)
    m = memory.screen_sums(np.sort(train), torch.from_numpy(bank), 7, 3)
    assert s.keys() == m.keys()
    for name in s:
        np.testing.assert_allclose(s[name], m[name], rtol=1e-5, atol=1e-4, err_msg=name)
    np.testing.assert_allclose(f_scores(s, False), f_scores(m, False), rtol=1e-4)
    assert s["n"].sum() == train.size
    with pytest.raises(ValueError, match="k = 7, not 8"):
        streamed.screen_sums(train, bank, 8, 3)


def test_small_rows_standardized_once_give_the_same_batches(rng):
    # all rows in one block: standardized up front, into a C-ordered copy shared by with_bank;
    # a block of 7 rows: standardized at every batch (from F-ordered rows: any layout)
    X = np.asfortranarray(rng.standard_normal((40, 30)).astype(np.float32) * 50 + 900)
    y = rng.integers(0, 3, 40)
    bank = np.stack([np.arange(30) % 4, rng.permutation(np.arange(30) % 4)]).astype(np.int32)
    mean, std = array_stats(X)
    before = X.copy()
    once = MemorySource(X, y, mean=mean, scale=1 / std)
    each = MemorySource(X, y, bank, mean=mean, scale=1 / std, block_size=7)
    assert once.mean is None and once.X.flags.c_contiguous and each.mean is not None
    banked = once.with_bank(bank)
    assert banked.X is once.X and banked.bank is bank and once.bank is None
    plan = epoch_plan(np.arange(40), batch_size=16, epoch=1, seed=2, n_groupings=2)
    for a, b in zip(banked.batches(plan), each.batches(plan), strict=True):
        assert a.grouping == b.grouping
        np.testing.assert_array_equal(a.x, b.x)
    rows = np.arange(40)[::-1]
    np.testing.assert_array_equal(np.concatenate([x for x, _ in banked.blocks(rows)]),
                                  np.concatenate([x for x, _ in each.blocks(rows)]))
    np.testing.assert_array_equal(X, before)


def test_standardizing_needs_saved_stats(cohort, client, tmp_path):
    path, X, y, mask, split = cohort
    store_path = tmp_path / "s.zarr"
    write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16)
    with pytest.raises(ValueError, match="compute_stats"):
        StoreSource(client, store_path, standardize=True)
    rows = np.arange(30)
    mean, std = compute_stats(store_path, rows, client=client, progress=False)
    source = StoreSource(client, store_path, standardize=True, stats_rows=rows[::-1])
    x = np.concatenate([b for b, _ in source.blocks(np.arange(len(y)))])
    np.testing.assert_allclose(x[rows].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(x[rows].std(0), 1, rtol=1e-4)
    with pytest.raises(ValueError, match="together"):
        MemorySource(X, y, mean=mean)


# --- numeric targets (regression): targets="target", standardized on the workers ---


def test_target_batches_equal_memory_source_fed_the_standardized_target(cohort, client,
                                                                        tmp_path):
    path, X, y, mask, split = cohort
    target = X[:, :5].sum(1).astype(np.float64) * 1e3 + 40.0  # float64 values, in odd units
    store_path = tmp_path / "t.zarr"
    write_store(store_path, X, None, mask, np.eye(4), target=target, split=split, block_rows=16)
    p = int(mask.sum())
    bank = np.stack([np.arange(p) % 7, np.random.default_rng(0).permutation(np.arange(p) % 7)])
    key = write_bank(store_path, bank.astype(np.int32))
    train = np.flatnonzero(split == "train")
    mean, scale = float(target[train].mean()), float(target[train].std())
    standardized = ((target - mean) / scale).astype(np.float32)  # as the regressor's fit does
    memory = MemorySource(X, standardized, bank)
    streamed = StoreSource(client, store_path, n_clusters=7, bank_key=key, targets="target",
                           target_mean=mean, target_scale=scale)
    for plan in [epoch_plan(train, batch_size=10, epoch=2, seed=1, n_groupings=2),
                 epoch_plan(train, batch_size=10, epoch=0, seed=3)]:
        s_batches = list(streamed.batches(plan))
        for s, m, rows in zip(s_batches, memory.batches(plan), plan.batches, strict=True):
            assert s.grouping == m.grouping and s.y.dtype == np.float32
            np.testing.assert_array_equal(s.y, m.y)  # the same bits, in the plan's order
            np.testing.assert_array_equal(s.y, standardized[rows])
            np.testing.assert_array_equal(s.x, m.x)
    rows = np.arange(len(y))[::-1]
    s_blocks = list(streamed.blocks(rows))
    np.testing.assert_array_equal(np.concatenate([t for _, t in s_blocks]), standardized[rows])
    np.testing.assert_array_equal(np.concatenate([x for x, _ in s_blocks]), X[rows])
    raw = np.concatenate([t for _, t in StoreSource(client, store_path,
                                                    targets="target").blocks(rows)])
    np.testing.assert_array_equal(raw, target[rows].astype(np.float32))  # mean 0, scale 1


def test_labels_and_target_of_one_store(cohort, client, tmp_path):
    path, X, y, mask, split = cohort
    target = np.linspace(-1, 1, len(y))
    store_path = tmp_path / "t.zarr"
    write_store(store_path, X, y, mask, np.eye(4), target=target, block_rows=16)
    rows = np.arange(0, len(y), 3)
    labels = np.concatenate([t for _, t in StoreSource(client, store_path).blocks(rows)])
    values = np.concatenate([t for _, t in StoreSource(
        client, store_path, targets="target", target_mean=1.0, target_scale=0.5).blocks(rows)])
    assert labels.dtype == np.int64 and values.dtype == np.float32
    np.testing.assert_array_equal(labels, np.unique(y, return_inverse=True)[1][rows])
    np.testing.assert_array_equal(values, ((target[rows] - 1.0) / 0.5).astype(np.float32))


def test_asking_for_what_a_store_lacks_is_refused(cohort, client, tmp_path):
    path, X, y, mask, split = cohort
    with pytest.raises(ValueError, match="has no target .*numeric 'target' column"):
        StoreSource(client, path, targets="target")
    with pytest.raises(ValueError, match="targets must be 'labels' or 'target', got 'y'"):
        StoreSource(client, path, targets="y")
    store_path = tmp_path / "t.zarr"
    write_store(store_path, X, None, mask, np.eye(4), target=np.zeros(len(y)), block_rows=16)
    with pytest.raises(ValueError, match="has no class labels .*targets='target'"):
        StoreSource(client, store_path)
    with pytest.raises(ValueError, match="target_scale finite and > 0, got 0.0 and 0.0"):
        StoreSource(client, store_path, targets="target", target_scale=0.0)


def test_groups_given_to_fit_split_as_a_stores_group_column(cohort, client, tmp_path):
    """``fit(X, y, groups=)`` keeps each subject on one side of the validation split, as a
    store's ``group`` column does: the same model either way, another one without groups."""
    path, X, y, mask, split = cohort
    groups = np.array([f"sub-{i % 9}" for i in range(len(y))])
    store_path = tmp_path / "g.zarr"
    write_store(store_path, X, y, mask, np.eye(4), split=split, groups=groups, block_rows=16)
    train = split == "train"
    # early stopping on a validation split; no refit, which would train on all rows alike
    params = dict(PARAMS, **MLP_FG, refit=False)
    streamed = FeatureGroupingClassifier(**params).fit(store_path, client=client)
    grouped = FeatureGroupingClassifier(mask=mask, **params).fit(X[train], y[train],
                                                                 groups=groups[train])
    ungrouped = FeatureGroupingClassifier(mask=mask, **params).fit(X[train], y[train])
    assert_same_model(streamed, grouped)
    with pytest.raises(AssertionError):
        assert_same_model(grouped, ungrouped)
    with pytest.raises(ValueError, match=r"groups must hold one value per sample: got shape "
                                         r"\(3,\) for \d+ samples"):
        FeatureGroupingClassifier(mask=mask, **params).fit(X[train], y[train], groups=groups[:3])
    with pytest.raises(ValueError, match="groups must be None when X is a store"):
        FeatureGroupingClassifier(**params).fit(store_path, groups=groups, client=client)


# --- the central process's work done on the workers: step sizes, validation, shared memory ---


@pytest.mark.parametrize("batch_size", [16, 66], ids=["gram", "power-iterations"])
def test_step_sizes_from_the_workers_train_as_the_central_ones(cohort, client, batch_size):
    """StoreSource(lipschitz=True): each batch brings its Lipschitz constant from its worker,
    and LipschitzStep takes the step from it; the in-memory oracle computes it centrally."""
    path, X, y, mask, split = cohort
    rows = np.flatnonzero(split == "train")
    p = int(mask.sum())
    bank = np.stack([random_labels(np.random.default_rng(g), p, 40) for g in range(3)])
    store_path = path.with_name(f"steps{batch_size}.zarr")
    write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16)
    key = write_bank(store_path, bank)
    y_idx = np.unique(y, return_inverse=True)[1]
    sources = {"memory": MemorySource(X, y_idx, bank),
               "workers": StoreSource(client, store_path, n_clusters=40, bank_key=key,
                                      lipschitz=True)}
    plan = epoch_plan(rows, batch_size=batch_size, epoch=0, seed=3, n_groupings=3)
    for s, m in zip(sources["workers"].batches(plan), sources["memory"].batches(plan),
                    strict=True):
        assert m.lipschitz is None
        assert s.lipschitz == pytest.approx(lipschitz(torch.from_numpy(m.x)), rel=1e-6)
    models = {}
    for name, source in sources.items():
        torch.manual_seed(0)
        model = build_model("mlp", p, 3, hidden_layer_sizes=(5,))
        fit(model, make_optimizer(model, 0.0, 0.01), max_epochs=3, bank=torch.as_tensor(bank),
            step_size=LipschitzStep(steepness=1.5, alpha=0.01),
            epoch_batches=lambda e, source=source: source.batches(epoch_plan(
                rows, batch_size=batch_size, epoch=e, seed=3, n_groupings=3)))
        models[name] = model.state_dict()
    for name, value in models["memory"].items():
        torch.testing.assert_close(models["workers"][name], value, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["labels", "class-weights", "regression"])
def test_validation_on_the_workers_equals_the_rows_evaluated_here(cohort, client, tmp_path,
                                                                  case):
    """evaluate() on a StoreSource's blocks ships the model to the workers and adds up their
    sums; the same blocks brought here (a list) give the same numbers, exactly."""
    path, X, y, mask, split = cohort
    store_path = tmp_path / "s.zarr"
    target = np.linspace(-2, 5, len(y))
    write_store(store_path, X, y, mask, np.eye(4), split=split, block_rows=16, target=target)
    regression = case == "regression"
    source = StoreSource(client, store_path, targets="target" if regression else "labels",
                         target_mean=1.0, target_scale=2.0)
    torch.manual_seed(0)
    model = build_model("mlp", int(mask.sum()), 1 if regression else 3, hidden_layer_sizes=(6,))
    weight = torch.tensor([0.5, 2.0, 1.0]) if case == "class-weights" else None
    rows = np.arange(5, 75)
    blocks = source.blocks(rows)
    assert blocks.evaluation_sums(model, regression=regression) is not None
    here = evaluate(model, list(source.blocks(rows)), regression=regression, class_weight=weight)
    there = evaluate(model, blocks, regression=regression, class_weight=weight)
    assert there == here and there["n"] == rows.size


def test_a_model_heavier_than_its_validation_rows_evaluates_them_here(cohort, client):
    path, X, y, mask, split = cohort
    source = StoreSource(client, path)
    model = build_model("mlp", int(mask.sum()), 3, hidden_layer_sizes=(40,))
    rows = -(-sum(t.numel() for t in model.parameters()) // int(mask.sum()))  # 41: its weight
    assert source.blocks(np.arange(rows - 1)).evaluation_sums(model) is None
    assert source.blocks(np.arange(rows)).evaluation_sums(model) is not None


def test_worker_processes_hand_their_blocks_through_shared_memory(cohort, client):
    path, X, y, mask, split = cohort
    plan = epoch_plan(np.arange(60), batch_size=7, epoch=0, seed=0)
    source = StoreSource(client, path, prefetch=3)
    slots = source._slots()
    assert slots is not None and slots.folder.is_dir()
    batches = source.batches(plan)
    first = next(batches)
    assert 1 <= len(list(slots.folder.iterdir())) <= 3  # a slot for each task in flight
    batches.close()  # an interrupted pass: its cancelled tasks' slots are never reused
    # the first block is read where its worker wrote it: its slot stays busy while it is held
    assert len(slots._busy) == 1 and len(list(slots.folder.iterdir())) == 1
    np.testing.assert_array_equal(first.x, X[plan.batches[0]])
    del first
    # each block copied and let go, as a training step lets go of its minibatch
    xs = [b.x.copy() for b in source.batches(plan)]
    np.testing.assert_array_equal(np.concatenate(xs), X[np.concatenate(plan.batches)])
    np.testing.assert_array_equal(
        np.concatenate([x.copy() for x, _ in source.blocks(np.arange(40))]), X[:40])
    # kept for the next pass: one per task in flight, and the one being consumed
    assert len(list(slots.folder.iterdir())) <= 4
    other = StoreSource(client, path, prefetch=3)
    list(other.batches(plan))  # only the source running a pass holds slots
    assert not list(slots.folder.iterdir()) and list(other._slots().folder.iterdir())
    folder = slots.folder
    del source, slots, batches
    assert not folder.exists()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as threads:
        assert StoreSource(threads, path)._slots() is None  # their blocks are here already
