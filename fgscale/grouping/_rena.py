"""Recursive Nearest Agglomeration (ReNA): fast, exact-k feature grouping on a graph.

ReNA (Hoyos-Idrobo et al., TPAMI 2019) starts with one cluster per feature and the adjacency graph
of the features (the voxel grid of a mask, or an explicit sparse graph). Each round, every cluster
links to its nearest neighbour over the graph (squared Euclidean distance between cluster means over
the samples); the connected components of that 1-NN graph are merged and the graph is contracted.
It stops when exactly ``n_clusters`` clusters remain.

Exactness of the final round rests on one fact: with a strict total order on edges (weight, then a
unique tie-break rank), the 1-NN graph has no cycle other than mutual pairs, so once its edges are
deduplicated every subset of them is a forest. Merging any ``m`` of them removes exactly ``m``
clusters, and the last round merges just enough to land on ``n_clusters``.

Which ``m`` the last round keeps matters for quality: it keeps the 1-NN edges whose merge adds the
least to the within-cluster sum of squares (Ward's cost, ``|a| |b| / (|a| + |b|)`` times the squared
distance between the means), rather than the shortest edges, which would favour merging large
clusters with close means over small ones. On held-out data this gives a lower approximation error
than both the shortest edges and nilearn's choice (``scripts/bench_rena.py``).
"""

from __future__ import annotations

import hashlib
import logging
import math

import numpy as np
import scipy.sparse as sp

from fgscale._utils.checks import check_count, resolve_n_clusters

logger = logging.getLogger(__name__)

_NO_EDGE = np.iinfo(np.int64).max
_LOW_BITS = np.int64(0xFFFFFFFF)
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment: 2**64 / the golden ratio, odd
_CHUNK = 16384  # edges per block when computing weights: keeps the gathered rows in cache
_TRANSPOSE_BLOCK = 4096  # features per block when transposing the samples
_SORTED_EDGES = 1 << 16  # up to this many edges, contracted with a sort
_LAST_GRID: list = [None]  # (key of a mask, its grid edges): the last mask's, reused


def grid_edges(mask: np.ndarray) -> np.ndarray:
    """Edges of the face-connectivity graph between the in-mask features of a grid.

    Parameters
    ----------
    mask : ndarray of bool, any number of dimensions
        Features are ``vol[mask]`` in C order (the nilearn convention).

    Returns
    -------
    edges : ndarray of int64, shape (2, n_edges)
        Undirected edges ``i < j`` between features that are neighbours along one axis (a chain in
        1D, 4 neighbours in 2D, 6 in 3D), sorted by ``(i, j)``.
    """
    mask = _check_mask(mask)
    p = int(mask.sum())
    index = np.full(tuple(s + 1 for s in mask.shape), -1, dtype=np.int64)
    index[tuple(slice(0, s) for s in mask.shape)][mask] = np.arange(p)
    # In C order the forward neighbour along the last axis has the smallest index, so stacking the
    # axes last-to-first yields edges already sorted by (i, j) without a sort.
    forward = np.empty((p, mask.ndim), dtype=np.int64)
    for col, axis in enumerate(reversed(range(mask.ndim))):
        shifted = tuple(slice(1, s + 1) if d == axis else slice(0, s)
                        for d, s in enumerate(mask.shape))
        forward[:, col] = index[shifted][mask]
    heads = np.repeat(np.arange(p, dtype=np.int64), mask.ndim)
    tails = forward.ravel()
    keep = tails >= 0
    return np.stack([heads[keep], tails[keep]])


def rena(X: np.ndarray, mask: np.ndarray | sp.sparray | sp.spmatrix, n_clusters: int, *,
         n_iter: int | None = None,
         random_state: int | np.random.Generator | None = None) -> np.ndarray:
    """Group features with Recursive Nearest Agglomeration.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Samples the distances are computed from (e.g. r bootstrap samples). Must be finite.
    mask : ndarray of bool, any number of dimensions, or sparse matrix of shape \
(n_features, n_features)
        Either a boolean mask whose True count is ``n_features`` (features are ``vol[mask]`` in C
        order; neighbours share a face, see :func:`grid_edges`), or an explicit adjacency matrix
        whose nonzero pattern (symmetrised, diagonal ignored) gives the edges.
    n_clusters : int
        Number of clusters, ``1 <= n_clusters <= n_features``.
    n_iter : int or None, default=None
        Maximum number of agglomeration rounds. None runs until exactly ``n_clusters`` clusters
        remain; with a limit the result may have more clusters than asked.
    random_state : int, numpy Generator or None, default=None
        Seeds the order in which exactly equal distances are broken (a random rank per edge,
        redrawn each round); a non-negative int, or a Generator drawn from once. None breaks
        ties by edge position, which is deterministic too.

    Returns
    -------
    labels : ndarray of int32, shape (n_features,)
        Cluster of each feature, values ``0 .. n_clusters - 1``; every cluster is connected in the
        graph.

    Raises
    ------
    ValueError
        On bad shapes, non-finite ``X``, a non-boolean mask, ``n_clusters`` not an integer in range,
        or a graph with more than ``n_clusters`` connected components (found when the rounds run
        out of edges, so not with an ``n_iter`` limit that stops earlier).
    """
    data = _feature_major(X)
    p = data.shape[0]
    edges = _graph_edges(mask, p)
    # an int count, within the features
    n_clusters = resolve_n_clusters(check_count("n_clusters", n_clusters), p)
    if n_iter is not None:
        check_count("n_iter", n_iter)
    seed = _tie_break_seed(random_state)

    labels = np.arange(p, dtype=np.int64)
    sums, sizes = data, np.ones(p, dtype=np.float32)
    n_rounds = 0
    while len(sizes) > n_clusters and (n_iter is None or n_rounds < n_iter):
        n_nodes = len(sizes)
        if edges.shape[1] == 0:
            raise ValueError(f"the graph has {n_nodes} connected components, more than "
                             f"n_clusters={n_clusters}; each component needs its own cluster: "
                             f"give n_clusters >= {n_nodes} (a fraction >= "
                             f"{np.ceil(1000 * n_nodes / p) / 1000:g} of the {p} features), a "
                             "mask of fewer separate parts, or regularizer='l2'")
        means = sums if n_rounds == 0 else sums / sizes[:, None]
        ranking = _Ranking.draw(seed, n_rounds)
        keys = _edge_keys(_edge_weights(means, edges), ranking)
        nn_edges, node_edge = _nearest_neighbours(keys, edges, n_nodes, ranking)
        merged = _select_merges(nn_edges, keys, edges, sizes, n_nodes - n_clusters)
        n_new, node_labels = _merge(None if len(merged) == len(nn_edges) else merged,
                                    node_edge, edges)
        labels = node_labels[labels]
        n_rounds += 1
        logger.debug("ReNA round %d: %d -> %d clusters", n_rounds, n_nodes, n_new)
        if n_new == n_clusters or n_rounds == n_iter:
            break  # the last round: the merged clusters' sums and edges would go unused
        sums, sizes = _reduce(sums, sizes, node_labels, n_new)
        edges = _contract(edges, node_labels, n_new)
    return labels.astype(np.int32)


def _feature_major(X) -> np.ndarray:
    """Validate ``X`` and return it as a (n_features, n_samples) float32 C-contiguous array."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2D (n_samples, n_features), got shape {X.shape}")
    if X.dtype.kind not in "iuf":  # integers and floats; not bool, complex or objects
        raise ValueError(f"X must hold real numbers, got dtype {X.dtype}")
    lo, hi = (float(X.min()), float(X.max())) if X.size else (0.0, 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # min and max propagate NaN
        raise ValueError("X contains NaN or infinite values")
    peak = max(-lo, hi)
    if peak > 2.0**50:
        # Squared distances would overflow float32; a power-of-two scale keeps the order exactly.
        X = X * 2.0 ** -np.ceil(np.log2(peak))
    # Transposing in blocks of columns keeps both sides of the copy in cache.
    out = np.empty((X.shape[1], X.shape[0]), dtype=np.float32)
    for start in range(0, X.shape[1], _TRANSPOSE_BLOCK):
        out[start:start + _TRANSPOSE_BLOCK] = X[:, start:start + _TRANSPOSE_BLOCK].T
    return out


def _check_mask(mask) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise ValueError(f"mask must be a boolean array, got dtype {mask.dtype}")
    if mask.ndim == 0:
        raise ValueError("mask must have at least one dimension")
    return mask


def _graph_edges(mask, p: int) -> np.ndarray:
    """Edges (2, n_edges) of the feature graph, ``i < j``, sorted by (i, j)."""
    if sp.issparse(mask):
        if mask.shape != (p, p):
            raise ValueError(f"adjacency matrix must have shape ({p}, {p}) to match X, "
                             f"got {mask.shape}")
        pattern = sp.csr_matrix(mask, dtype=bool)
        pattern.eliminate_zeros()
        upper = sp.triu(pattern + pattern.T, k=1, format="csr")
        upper.sum_duplicates()
        upper.sort_indices()
        heads = np.repeat(np.arange(p, dtype=np.int64), np.diff(upper.indptr))
        return np.stack([heads, upper.indices.astype(np.int64)])
    mask = _check_mask(mask)
    if int(mask.sum()) != p:
        raise ValueError(f"X has {p} features but the mask has {int(mask.sum())} True values")
    # a bank calls ReNA on one mask b times: its edges cost a tenth of a call at 2 mm
    key = (mask.shape, hashlib.blake2b(np.packbits(mask).tobytes(), digest_size=16).digest())
    last = _LAST_GRID[0]  # one read: a thread sees the old pair or the new, never half
    if last is not None and last[0] == key:
        return last[1]
    edges = grid_edges(mask)
    edges.flags.writeable = False  # shared by the calls that follow
    _LAST_GRID[0] = (key, edges)
    return edges


def _edge_weights(means: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Squared Euclidean distance (n_edges,) float32 between the two ends of each edge."""
    heads, tails = edges
    weights = np.empty(len(heads), dtype=np.float32)
    for start in range(0, len(heads), _CHUNK):
        block = slice(start, start + _CHUNK)
        # np.take gathers rows two to three times faster than fancy indexing
        diff = np.take(means, heads[block], axis=0)
        np.subtract(diff, np.take(means, tails[block], axis=0), out=diff)
        np.einsum("ij,ij->i", diff, diff, out=weights[block])
    return weights


class _Ranking:
    """Tie-break ranks of edges: ``rank = (a * edge + c) mod 2**32`` with ``a`` odd.

    That map is a bijection of ``[0, 2**32)``, so ranks are unique for fewer than 2**32 edges, and
    its inverse (``a``'s inverse modulo 2**32) gives an edge back from its rank: a random order in
    two vectorised passes, where a random permutation would cost random memory access.
    """

    _MOD = 2**32

    def __init__(self, a: int, c: int):
        self.a, self.c, self.a_inv = a, c, pow(a, -1, self._MOD)

    @classmethod
    def draw(cls, seed: int | None, round_: int) -> _Ranking:
        """Ranks by edge position for None, else an odd ``a`` and a ``c`` drawn from the seed
        and the round."""
        if seed is None:
            return cls(1, 0)
        bits = _splitmix64(seed + round_ * _GOLDEN)
        return cls((bits & (cls._MOD - 1)) | 1, bits >> 32)

    def ranks(self, n_edges: int) -> np.ndarray:
        ranks = np.arange(n_edges, dtype=np.uint64)
        ranks *= np.uint64(self.a)
        ranks += np.uint64(self.c)
        ranks &= np.uint64(_LOW_BITS)
        return ranks.view(np.int64)

    def edges(self, keys: np.ndarray) -> np.ndarray:
        """The edges of non-negative int64 values whose low 32 bits are ranks (sort keys)."""
        # uint64 arithmetic wraps modulo 2**64, a multiple of 2**32: the low bits are exact,
        # and the high bits of the keys (their weights) drop out of them.
        edges = keys.view(np.uint64) - np.uint64(self.c)
        edges *= np.uint64(self.a_inv)
        edges &= np.uint64(_LOW_BITS)
        return edges.view(np.int64)


def _tie_break_seed(random_state) -> int | None:
    """A 64-bit seed of the tie-break ranks: None as it is, an int as it is, one draw from a
    numpy Generator.

    The ranks of each round come from this seed through :func:`_splitmix64`, a few integer
    operations: a numpy Generator per call would cost a tenth of a small problem's time.
    """
    if random_state is None:
        return None
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**63))
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(f"random_state must be non-negative, got {random_state}")
        return int(random_state) & _MASK64
    raise ValueError("random_state must be None, a non-negative int or a numpy Generator, "
                     f"got {random_state!r}")


def _splitmix64(x: int) -> int:
    """SplitMix64's output function (Steele, Lea and Flood 2014): 64 well-mixed bits of ``x``."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _edge_keys(weights: np.ndarray, ranking: _Ranking) -> np.ndarray:
    """Unique int64 sort keys: the weight's bits, then a tie-break rank that encodes the edge.

    Non-negative float32 values order like their bit patterns, so ``bits << 32 | rank`` is a strict
    total order on edges consistent with the weights (ranks need fewer than 2**32 edges).
    """
    keys = (weights + np.float32(0.0)).view(np.uint32).astype(np.int64)  # + 0 turns -0 into +0
    keys <<= 32
    keys |= ranking.ranks(len(weights))
    return keys


def _nearest_neighbours(keys: np.ndarray, edges: np.ndarray, n_nodes: int,
                        ranking: _Ranking) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique indices of the edges that are some node's nearest-neighbour edge, and
    each node's own (n_nodes,), -1 for a node with no edge."""
    best = np.full(n_nodes, _NO_EDGE, dtype=np.int64)
    np.minimum.at(best, edges[0], keys)
    np.minimum.at(best, edges[1], keys)
    if best.max(initial=0) != _NO_EDGE:  # the usual case: a connected graph has no isolated node
        node_edge = own = ranking.edges(best)
    else:
        linked = best != _NO_EDGE
        node_edge = np.full(n_nodes, -1, dtype=np.int64)
        node_edge[linked] = own = ranking.edges(best[linked])
    chosen = np.zeros(len(keys), dtype=bool)
    chosen[own] = True
    return np.flatnonzero(chosen), node_edge


def _select_merges(nn_edges: np.ndarray, keys: np.ndarray, edges: np.ndarray, sizes: np.ndarray,
                   max_merges: int) -> np.ndarray:
    """Keep the ``max_merges`` cheapest 1-NN edges (Ward's cost) when merging all would overshoot."""
    if len(nn_edges) <= max_merges:
        return nn_edges
    heads, tails = sizes[np.take(edges, nn_edges, axis=1)].astype(np.float64)
    nn_keys = keys[nn_edges]
    weights = (nn_keys >> 32).astype(np.uint32).view(np.float32)
    cost = weights * (heads * tails / (heads + tails))
    # The edge's own tie-break rank keeps the order strict when two costs are equal.
    cheapest = np.lexsort((nn_keys & _LOW_BITS, cost))[:max_merges]
    return np.sort(nn_edges[cheapest])


def _merge(merged: np.ndarray | None, node_edge: np.ndarray, edges: np.ndarray
           ) -> tuple[int, np.ndarray]:
    """Connected components (count, node labels) of the graph of the ``merged`` edges (None:
    every node's own edge).

    Each merged edge is the nearest-neighbour edge (``node_edge``) of one of its ends at
    least, so pointing every node across its own edge, when merged, gives a forest whose
    only cycles are the mutual pairs: with the smaller node of each pair made a root,
    pointer jumping finds every node's root in log(depth) vectorised passes. Components are
    numbered by their smallest node, as scipy's ``connected_components`` does.
    """
    n_nodes = len(node_edge)
    nodes = np.arange(n_nodes, dtype=np.int64)
    if merged is None and n_nodes and node_edge.min() >= 0:  # every round but the last
        parent = np.take(edges, node_edge, axis=1).sum(axis=0)
        parent -= nodes  # a node's edge has it at one end: the other end is the sum less it
    else:
        linked = node_edge >= 0
        if merged is not None:
            kept = np.zeros(edges.shape[1], dtype=bool)
            kept[merged] = True
            linked &= kept[np.maximum(node_edge, 0)]
        moving = np.flatnonzero(linked)
        parent = nodes.copy()
        parent[moving] = np.take(edges, node_edge[moving], axis=1).sum(axis=0) - moving
    # the smaller node of each mutual pair becomes its root (and a root stays one)
    np.minimum(parent, nodes, out=parent, where=parent[parent] == nodes)
    while True:
        grand = parent[parent]
        if (grand == parent).all():
            break
        parent = grand
    smallest = np.full(n_nodes, n_nodes, dtype=np.int64)
    np.minimum.at(smallest, parent, nodes)
    first = smallest[parent]
    number = np.cumsum(first == nodes) - 1
    return int(number[-1]) + 1 if n_nodes else 0, number[first]


def _reduce(sums: np.ndarray, sizes: np.ndarray, node_labels: np.ndarray,
            n_new: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums (n_new, n_samples) and sizes (n_new,) after merging."""
    n_nodes = len(node_labels)
    indptr = np.zeros(n_new + 1, dtype=np.int64)
    np.cumsum(np.bincount(node_labels, minlength=n_new), out=indptr[1:])
    # The pooling matrix built in CSR form at once: each row's columns are its cluster's nodes
    # in increasing order (a stable sort), the layout a conversion from COO would give, at a
    # third of its cost on the few thousand nodes of a bank's small problems.
    members = np.argsort(node_labels, kind="stable")
    pooling = sp.csr_array((np.ones(n_nodes, dtype=np.float32), members, indptr),
                           shape=(n_new, n_nodes))
    new_sizes = np.bincount(node_labels, weights=sizes, minlength=n_new).astype(np.float32)
    return np.ascontiguousarray(pooling @ sums), new_sizes


def _contract(edges: np.ndarray, node_labels: np.ndarray, n_new: int) -> np.ndarray:
    """Edges between merged clusters: relabelled, self loops dropped, deduplicated, sorted."""
    heads, tails = node_labels[edges]
    keep = heads != tails
    heads, tails = heads[keep], tails[keep]
    lows, highs = np.minimum(heads, tails), np.maximum(heads, tails)
    if len(heads) <= _SORTED_EDGES:
        # one sort of (low, high) keys: for few edges, cheaper than building a sparse pattern
        keys = np.sort(lows * n_new + highs, kind="stable")  # runs of sorted keys: timsort
        first = np.ones(len(keys), dtype=bool)
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        keys = keys[first]
        out = np.empty((2, len(keys)), dtype=np.int64)
        np.divmod(keys, n_new, out=(out[0], out[1]))
        return out
    # A sparse pattern deduplicates and sorts by (row, column) with a counting sort over rows and
    # short per-row sorts: linear in the number of edges, where one global sort is not.
    pattern = sp.coo_array((np.ones(len(heads), dtype=bool), (lows, highs)),
                           shape=(n_new, n_new)).tocsr()
    pattern.sum_duplicates()
    rows = np.repeat(np.arange(n_new, dtype=np.int64), np.diff(pattern.indptr))
    return np.stack([rows, pattern.indices.astype(np.int64)])
