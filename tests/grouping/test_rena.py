"""Tests for fgscale.grouping._rena: exact k, connected clusters, determinism, errors, nilearn quality."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import mask_img, smooth_samples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage
from scipy.sparse import csgraph
from sklearn.datasets import load_digits

from fgscale.grouping._bank import resolve_n_clusters
from fgscale.grouping._rena import (
    _contract,
    _edge_keys,
    _edge_weights,
    _graph_edges,
    _merge,
    _nearest_neighbours,
    _Ranking,
    grid_edges,
    rena,
)


def _largest_component(mask):
    labelled, n = ndimage.label(mask)  # face connectivity, as grid_edges
    if n == 0:
        return mask
    sizes = np.bincount(labelled.ravel())[1:]
    return labelled == 1 + np.argmax(sizes)


def _random_mask(seed, shape):
    rng = np.random.default_rng(seed)
    mask = _largest_component(rng.random(shape) < 0.7)
    if mask.sum() == 0:
        mask.flat[0] = True
    return mask


def _n_pieces(labels, edges):
    """Connected components of the graph keeping only edges inside a cluster."""
    inside = labels[edges[0]] == labels[edges[1]]
    p = len(labels)
    graph = sp.coo_matrix((np.ones(inside.sum()), tuple(edges[:, inside])), shape=(p, p))
    return csgraph.connected_components(graph, directed=False)[0]


def _check_partition(labels, k, edges):
    assert labels.dtype == np.int32
    assert set(np.unique(labels)) == set(range(k))
    assert _n_pieces(labels, edges) == k, "some cluster is not connected"


def _canonical(labels):
    """Relabel clusters by order of first appearance, to compare partitions."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse]


def _ward_cost(features, labels, pair):
    """Increase of the within-cluster sum of squares when the two clusters of ``pair`` merge."""
    def scatter(rows):
        return ((rows - rows.mean(0)) ** 2).sum()

    a, b = (features[labels == node] for node in pair)
    return scatter(np.concatenate([a, b])) - scatter(a) - scatter(b)


def _reference_rena(X, edges, k):
    """Slow, loop-based ReNA: each node to its nearest neighbour, merge components, contract.

    When merging every nearest-neighbour edge would overshoot k, the last round keeps the edges of
    least Ward cost: the increase of the within-cluster sum of squares, computed here from the
    member features themselves.
    """
    features = data = X.T.astype(np.float64)
    sizes = np.ones(len(data))
    labels = np.arange(len(data))
    pairs = {tuple(e) for e in edges.T}
    while len(data) > k:
        dist = {(a, b): ((data[a] - data[b]) ** 2).sum() for a, b in pairs}
        nearest = {}
        for (a, b), d in dist.items():
            for node in (a, b):
                if node not in nearest or d < dist[nearest[node]]:
                    nearest[node] = (a, b)
        chosen = sorted(set(nearest.values()),
                        key=lambda pair: _ward_cost(features, labels, pair))[: len(data) - k]
        graph = sp.coo_matrix((np.ones(len(chosen)), tuple(np.array(chosen).T.reshape(2, -1))),
                              shape=(len(data), len(data)))
        n_new, node_labels = csgraph.connected_components(graph, directed=False)
        new_sizes = np.bincount(node_labels, weights=sizes)
        data = np.stack([(data[node_labels == c] * sizes[node_labels == c, None]).sum(0)
                         for c in range(n_new)]) / new_sizes[:, None]
        sizes, labels = new_sizes, node_labels[labels]
        pairs = {(min(node_labels[a], node_labels[b]), max(node_labels[a], node_labels[b]))
                 for a, b in pairs if node_labels[a] != node_labels[b]}
    return labels


def _held_out_error(X, labels):
    k = labels.max() + 1
    counts = np.bincount(labels, minlength=k)
    errors = [np.linalg.norm(x - (np.bincount(labels, weights=x, minlength=k) / counts)[labels])
              / np.linalg.norm(x) for x in X]
    return np.mean(errors)


def test_grid_edges_match_brute_force():
    mask = _random_mask(3, (4, 5, 6))
    coords = np.argwhere(mask)
    gaps = np.abs(coords[:, None] - coords[None]).sum(-1)
    expected = np.argwhere(np.triu(gaps == 1))
    edges = grid_edges(mask)
    assert edges.dtype == np.int64
    np.testing.assert_array_equal(edges.T, expected)  # already sorted by (i, j)


def test_grid_edges_1d_is_chain_and_2d_counts():
    np.testing.assert_array_equal(grid_edges(np.ones(5, bool)), [[0, 1, 2, 3], [1, 2, 3, 4]])
    assert grid_edges(np.ones((3, 4), bool)).shape == (2, 3 * 3 + 2 * 4)
    assert grid_edges(np.ones((2, 2, 2), bool)).shape == (2, 12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), three_d=st.booleans(), frac=st.floats(0, 1))
def test_exact_k_and_connected_clusters(seed, three_d, frac):
    mask = _random_mask(seed, (5, 6, 4) if three_d else (9, 11))
    p = int(mask.sum())
    k = 1 + int(frac * (p - 1))
    X = np.random.default_rng(seed).standard_normal((7, p))
    labels = rena(X, mask, k, random_state=seed)
    _check_partition(labels, k, grid_edges(mask))


@pytest.mark.parametrize("k", [1, 2, 17, 119, 120])
def test_extreme_k(k):
    mask = np.ones((10, 12), bool)
    labels = rena(np.random.default_rng(0).standard_normal((5, 120)), mask, k)
    _check_partition(labels, k, grid_edges(mask))
    if k == 120:
        np.testing.assert_array_equal(labels, np.arange(120))


@pytest.mark.parametrize("seed", range(4))
def test_matches_loop_reference(seed):
    mask = _random_mask(seed, (6, 7))
    p = int(mask.sum())
    X = np.random.default_rng(seed).standard_normal((4, p))
    k = max(1, p // 5)
    expected = _reference_rena(X, grid_edges(mask), k)
    np.testing.assert_array_equal(_canonical(rena(X, mask, k)), _canonical(expected))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("share", [1.0, 0.5, 0.1])
def test_merge_numbers_components_as_scipy(seed, share):
    # ties (binary data) and a random subset of the nearest-neighbour edges, as in a last round
    rng = np.random.default_rng(seed)
    mask = _random_mask(seed, (9, 8, 3))
    edges = grid_edges(mask)
    X = rng.integers(0, 2, size=(int(mask.sum()), 3)).astype(np.float32)
    ranking = _Ranking.draw(seed if seed % 2 else None, 0)
    keys = _edge_keys(_edge_weights(X, edges), ranking)
    nn_edges, node_edge = _nearest_neighbours(keys, edges, len(X), ranking)
    merged = np.sort(rng.permutation(nn_edges)[: max(1, int(share * len(nn_edges)))])
    graph = sp.coo_matrix((np.ones(len(merged)), tuple(edges[:, merged])), shape=(len(X),) * 2)
    n_expected, expected = csgraph.connected_components(graph, directed=False)
    n_new, labels = _merge(merged, node_edge, edges)
    assert n_new == n_expected
    np.testing.assert_array_equal(labels, expected)
    if share == 1.0:  # None stands for every nearest-neighbour edge: the same components
        n_all, all_labels = _merge(None, node_edge, edges)
        assert n_all == n_new
        np.testing.assert_array_equal(all_labels, labels)


def test_merge_of_every_edge_leaves_isolated_nodes_alone():
    # node 2 has no edge (node_edge -1): it stays a cluster of its own
    edges = np.array([[0, 3], [1, 4]])
    keys = _edge_keys(np.array([1.0, 2.0], np.float32), _Ranking.draw(None, 0))
    nn_edges, node_edge = _nearest_neighbours(keys, edges, 5, _Ranking.draw(None, 0))
    assert node_edge[2] == -1
    n_new, labels = _merge(None, node_edge, edges)
    assert n_new == 3
    np.testing.assert_array_equal(labels, [0, 0, 1, 2, 2])


@pytest.mark.parametrize("n_edges", [40, 5000])
def test_contract_both_ways_agree(n_edges, monkeypatch):
    # few edges are contracted with a sort, many with a sparse pattern: the same edges
    rng = np.random.default_rng(n_edges)
    edges = np.sort(rng.integers(0, 300, size=(2, n_edges)), axis=0)
    labels = rng.integers(0, 90, size=300)
    by_sort = _contract(edges, labels, 90)
    monkeypatch.setattr("fgscale.grouping._rena._SORTED_EDGES", 0)
    by_pattern = _contract(edges, labels, 90)
    np.testing.assert_array_equal(by_sort, by_pattern)
    lows, highs = np.minimum(*labels[edges]), np.maximum(*labels[edges])
    expected = sorted({(a, b) for a, b in zip(lows, highs, strict=True) if a != b})
    assert [tuple(e) for e in by_sort.T] == expected


def test_edges_of_the_last_mask_are_reused_for_that_mask_only():
    first = np.ones((4, 6), bool)
    same_count = np.ones((6, 4), bool)  # the same number of features, other edges
    other_pattern = first.copy()
    other_pattern[0, 0], other_pattern[3, 5] = False, False
    other_pattern = np.pad(other_pattern, ((0, 0), (0, 1)), constant_values=True)[:, 1:]
    for mask in (first, same_count, first, other_pattern, first.copy()):
        edges = _graph_edges(mask, int(mask.sum()))
        np.testing.assert_array_equal(edges, grid_edges(mask))
        assert not edges.flags.writeable
    assert _graph_edges(first, 24) is _graph_edges(first.copy(), 24)


def test_deterministic_for_a_seed_with_ties():
    mask = np.ones((8, 8, 3), bool)
    X = np.random.default_rng(0).integers(0, 2, size=(3, mask.sum())).astype(float)  # many ties
    first = rena(X, mask, 20, random_state=7)
    np.testing.assert_array_equal(first, rena(X, mask, 20, random_state=7))
    np.testing.assert_array_equal(rena(X, mask, 20), rena(X, mask, 20))
    _check_partition(first, 20, grid_edges(mask))


@pytest.mark.parametrize("X", [np.zeros((3, 60)), np.ones((4, 60)), np.zeros((0, 60))],
                         ids=["zeros", "identical", "no-samples"])
def test_degenerate_data_gives_no_warning(X):
    mask = np.ones((6, 10), bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels = rena(X, mask, 7, random_state=0)
    _check_partition(labels, 7, grid_edges(mask))


def test_huge_values_do_not_overflow():
    mask = np.ones(30, bool)
    X = np.random.default_rng(0).standard_normal((3, 30)) * 1e300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels = rena(X, mask, 4)
    _check_partition(labels, 4, grid_edges(mask))


def test_1d_mask_gives_contiguous_segments():
    mask = np.ones(50, bool)
    mask[[3, 20]] = False  # the chain breaks into 3 pieces, so k = 2 is impossible
    X = np.random.default_rng(1).standard_normal((6, 48))
    with pytest.raises(ValueError, match=r"3 connected components, more than n_clusters=2; .*"
                                         r"give n_clusters >= 3 \(a fraction >= 0\.063 of the "
                                         r"48 features\), a mask of fewer separate parts, or "
                                         r"regularizer='l2'"):
        rena(X, mask, 2)
    assert resolve_n_clusters(0.063, 48) >= 3
    labels = rena(X, mask, 5)
    _check_partition(labels, 5, grid_edges(mask))
    assert np.count_nonzero(np.diff(labels[:3])) + np.count_nonzero(np.diff(labels[3:19])) \
        + np.count_nonzero(np.diff(labels[19:])) == 2  # 3 segments already, 2 more cuts


@pytest.mark.parametrize("fmt", ["csr", "coo", "upper-only"])
def test_sparse_adjacency_equals_grid(fmt):
    mask = _random_mask(5, (5, 6, 4))
    p = int(mask.sum())
    edges = grid_edges(mask)
    adjacency = sp.coo_matrix((np.ones(edges.shape[1]), tuple(edges)), shape=(p, p))
    if fmt != "upper-only":
        adjacency = (adjacency + adjacency.T + sp.eye(p)).asformat(fmt)
    X = np.random.default_rng(5).standard_normal((5, p))
    for seed in (None, 3):
        np.testing.assert_array_equal(rena(X, adjacency, p // 7, random_state=seed),
                                      rena(X, mask, p // 7, random_state=seed))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), frac=st.floats(0, 1))
def test_general_sparse_graph(seed, frac):
    rng = np.random.default_rng(seed)
    p = 40
    heads = np.concatenate([np.arange(p - 1), rng.integers(0, p, 30)])  # a path plus random edges
    tails = np.concatenate([np.arange(1, p), rng.integers(0, p, 30)])
    adjacency = sp.coo_array((rng.random(p + 29) + 0.5, (tails, heads)), shape=(p, p))
    k = 1 + int(frac * (p - 1))
    labels = rena(rng.standard_normal((3, p)), adjacency, k, random_state=seed)
    edges = np.stack([np.minimum(heads, tails), np.maximum(heads, tails)])
    _check_partition(labels, k, edges[:, edges[0] != edges[1]])


def test_explicit_zeros_are_not_edges():
    adjacency = sp.csr_matrix((np.array([1.0, 0.0]), np.array([1, 2]), np.array([0, 1, 2, 2])),
                              shape=(3, 3))  # edges 0-1 and an explicitly stored zero 1-2
    with pytest.raises(ValueError, match="2 connected components"):
        rena(np.zeros((2, 3)), adjacency, 1)


def test_n_iter_limits_rounds():
    mask = np.ones((12, 12), bool)
    X = np.random.default_rng(2).standard_normal((5, 144))
    labels = rena(X, mask, 3, n_iter=1)
    k = labels.max() + 1
    assert 3 < k < 144
    _check_partition(labels, k, grid_edges(mask))


@pytest.mark.parametrize(("X", "mask", "k", "message"), [
    (np.zeros((2, 6)), np.ones(6, bool), 0, "n_clusters"),
    (np.zeros((2, 6)), np.ones(6, bool), 7, "n_clusters"),
    (np.zeros((2, 6)), np.ones(6, bool), 2.5, "integer"),
    (np.zeros((2, 5)), np.ones(6, bool), 2, "6 True"),
    (np.full((2, 6), np.nan), np.ones(6, bool), 2, "NaN"),
    (np.full((2, 6), np.inf), np.ones(6, bool), 2, "NaN or infinite"),
    (np.zeros((2, 6)), np.ones(6, int), 2, "boolean"),
    (np.zeros(6), np.ones(6, bool), 2, "2D"),
    (np.zeros((2, 6)), sp.eye(5), 2, "shape"),
    (np.zeros((2, 6)), sp.eye(6), 2, "6 connected components"),
])
def test_errors(X, mask, k, message):
    with pytest.raises(ValueError, match=message):
        rena(X, mask, k)


def test_n_iter_must_be_positive():
    with pytest.raises(ValueError, match="n_iter"):
        rena(np.zeros((2, 6)), np.ones(6, bool), 2, n_iter=0)


def _nilearn_labels(X, mask, k):
    nilearn_rena = pytest.importorskip("nilearn.regions")
    model = nilearn_rena.ReNA(mask_img=mask_img(mask), n_clusters=k, scaling=False, n_iter=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.unique(model.fit(X).labels_, return_inverse=True)[1]


def test_quality_at_least_nilearns_on_smooth_volumes():
    grid = np.indices((14, 14, 14)) - 6.5
    mask = (grid**2).sum(0) < 6.5**2
    k = int(mask.sum()) // 10
    ours, theirs = [], []
    for seed in range(3):
        X, held_out = smooth_samples(mask, 30, seed), smooth_samples(mask, 20, 100 + seed)
        ours.append(_held_out_error(held_out, rena(X, mask, k, random_state=seed)))
        theirs.append(_held_out_error(held_out, _nilearn_labels(X, mask, k)))
    assert np.mean(ours) <= np.mean(theirs)


@pytest.mark.parametrize("k", [8, 16])
def test_quality_at_least_nilearns_on_real_digits(k):
    images = load_digits().data
    mask = np.ones((8, 8, 1), bool)
    ours, theirs = [], []
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(len(images))
        X, held_out = images[order[:50]], images[order[50:550]]
        ours.append(_held_out_error(held_out, rena(X, mask, k, random_state=seed)))
        theirs.append(_held_out_error(held_out, _nilearn_labels(X, mask, k)))
    assert np.mean(ours) <= np.mean(theirs)


@pytest.mark.parametrize("seed", [None, 0, 5, 2**40, 2**64 - 1])
def test_ranks_are_unique_and_keys_give_their_edges_back(seed):
    n = 5000
    weights = np.random.default_rng(0).integers(0, 4, n).astype(np.float32)  # many ties
    orders = set()
    for round_ in range(3):
        ranking = _Ranking.draw(seed, round_)
        ranks = ranking.ranks(n)
        assert ranks.min() >= 0 and ranks.max() < 2**32 and len(np.unique(ranks)) == n
        keys = _edge_keys(weights, ranking)
        np.testing.assert_array_equal(ranking.edges(keys), np.arange(n))
        # equal weights are ordered by rank: with a seed, a new order each round
        orders.add(tuple(np.argsort(keys)[:50]))
    assert len(orders) == (1 if seed is None else 3)


def test_random_state_kinds():
    mask = np.ones((8, 8, 3), bool)
    X = np.random.default_rng(1).integers(0, 2, size=(3, mask.sum())).astype(float)  # many ties
    by_int = rena(X, mask, 20, random_state=3)
    np.testing.assert_array_equal(rena(X, mask, 20, random_state=np.int64(3)), by_int)
    from_generator = rena(X, mask, 20, random_state=np.random.default_rng(9))
    np.testing.assert_array_equal(rena(X, mask, 20, random_state=np.random.default_rng(9)),
                                  from_generator)
    assert len({tuple(rena(X, mask, 20, random_state=s)) for s in range(4)}) > 1  # seeds matter
    for bad in (-1, 1.5, "0", True):
        with pytest.raises(ValueError, match="random_state must be"):
            rena(X, mask, 20, random_state=bad)
