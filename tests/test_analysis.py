"""fgscale.grouping._omega against a dense reference built from explicit Phi matrices."""

import subprocess
import sys

import numpy as np
import pytest
import zarr
from numpy.testing import assert_allclose, assert_array_equal

from fgscale.grouping import make_bank
from fgscale.grouping._omega import membership_variance, omega_diagonal, omega_matrix


def _phi(labels: np.ndarray) -> np.ndarray:
    """Phi (k x p) of a grouping, one row per label actually used, in no particular order."""
    used = np.unique(labels)
    phi = np.zeros((used.size, labels.size))
    for q, c in enumerate(used):
        members = labels == c
        phi[q, members] = 1.0 / np.sqrt(members.sum())
    return phi


def _projections(bank: np.ndarray) -> np.ndarray:
    """P_g = Phi_g^T Phi_g for every grouping, shape (b, p, p)."""
    return np.stack([_phi(labels).T @ _phi(labels) for labels in bank])


def _dense(bank: np.ndarray):
    """Omega, Var[Delta] elementwise and its row sums, straight from the definitions."""
    P = _projections(bank)
    omega = P.mean(axis=0)
    variance = ((P - omega) ** 2).mean(axis=0)
    return omega, variance, variance.sum(axis=1)


def _chain_labels(rng, p: int, k: int) -> np.ndarray:
    """k contiguous segments of a chain of p features at random cuts, labelled in random order."""
    cuts = np.sort(rng.choice(np.arange(1, p), size=k - 1, replace=False))
    segment = np.searchsorted(cuts, np.arange(p), side="right")
    return rng.permutation(k)[segment]


def _random_bank(seed: int, b: int, p: int, k: int) -> np.ndarray:
    """Half scattered labels (gaps, singletons likely), half chain segments; labels shuffled."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, k, p) if g % 2 else _chain_labels(rng, p, k) for g in range(b)]
    return np.array(rows, dtype=np.int32)


BANKS = [(0, 1, 7, 3), (1, 2, 9, 9), (2, 3, 10, 4), (3, 5, 30, 4), (4, 8, 50, 20), (5, 12, 40, 35)]


@pytest.mark.parametrize("seed, b, p, k", BANKS)
def test_matches_dense_reference(seed, b, p, k):
    bank = _random_bank(seed, b, p, k)
    omega_ref, variance_ref, membership_ref = _dense(bank)
    omega, variance = omega_matrix(bank)
    assert_allclose(omega, omega_ref, rtol=0, atol=1e-13)
    assert_allclose(variance, variance_ref, rtol=0, atol=1e-13)
    assert_allclose(omega_diagonal(bank), np.diag(omega_ref), rtol=0, atol=1e-13)
    mv = membership_variance(bank)
    assert mv.dtype == np.float64 and mv.shape == (p,)
    assert_allclose(mv, membership_ref, rtol=0, atol=1e-13)
    # the identity the docstring states: diag(Omega) - sum_j Omega_ij^2
    assert_allclose(mv, np.diag(omega_ref) - (omega_ref**2).sum(axis=1), rtol=0, atol=1e-13)


@pytest.mark.parametrize("seed, b, p, k", BANKS)
def test_omega_is_an_averaging_operator(seed, b, p, k):
    omega, variance = omega_matrix(_random_bank(seed, b, p, k))
    assert_array_equal(omega, omega.T)
    eigenvalues = np.linalg.eigvalsh(omega)  # a mean of orthogonal projections
    assert eigenvalues.min() >= -1e-12 and eigenvalues.max() <= 1 + 1e-12
    assert (omega >= 0).all()
    # every P_g averages each feature's cluster, so each row of Omega sums to 1
    assert_allclose(omega.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert (variance >= 0).all()
    mv = membership_variance(_random_bank(seed, b, p, k))
    assert_allclose(variance.sum(axis=1), mv, rtol=0, atol=1e-13)
    assert (mv >= 0).all() and (mv <= np.diag(omega) + 1e-15).all()


def test_identical_groupings_up_to_relabelling_vary_not_at_all():
    rng = np.random.default_rng(0)
    labels = _chain_labels(rng, 40, 9)
    labels[[3, 17]] = [9, 10]  # two singletons
    bank = np.array([rng.permutation(11)[labels] for _ in range(6)])
    assert len({tuple(row) for row in bank}) > 1, "the relabellings should differ"
    # exactly 0, not just close: each pair term is 1/s + 1/s - 2 s/(s s)
    assert_array_equal(membership_variance(bank), 0.0)
    assert_array_equal(membership_variance(bank, max_pairs=8, random_state=1), 0.0)
    omega, variance = omega_matrix(bank)
    assert_allclose(omega, _dense(bank[:1])[0], rtol=0, atol=1e-15)
    assert_allclose(variance, 0.0, rtol=0, atol=1e-15)


def test_zero_exactly_where_membership_is_stable():
    rng = np.random.default_rng(3)
    base = _chain_labels(rng, 30, 6)
    bank = np.array([base, base, base])
    bank[1, :5] = base.max() + 1  # features 0..4 leave their cluster in one grouping
    changed = np.array([len({frozenset(np.flatnonzero(row == row[i])) for row in bank}) > 1
                        for i in range(30)])
    mv = membership_variance(bank)
    assert_array_equal(mv > 0, changed)
    assert changed.any() and not changed.all()


def _pair_terms(bank: np.ndarray) -> np.ndarray:
    """||P_g[i] - P_h[i]||^2 for every off-diagonal pair g < h, shape (n_pairs, p)."""
    P = _projections(bank)
    g, h = np.triu_indices(len(bank), 1)
    return ((P[g] - P[h]) ** 2).sum(axis=2)


def test_sampled_estimate_within_its_standard_error():
    b, p = 40, 60
    bank = _random_bank(7, b, p, 12)
    exact = membership_variance(bank)
    terms = _pair_terms(bank)
    n_pairs, n_draw = terms.shape[0], 300
    estimate = membership_variance(bank, max_pairs=b + n_draw, random_state=0)
    # Standard error of n_draw pairs drawn without replacement out of n_pairs, per feature
    # (finite-population correction included). The estimate is a scaled mean of 300 bounded
    # terms, close to normal: 5 standard errors leave ~1e-6 per feature to chance, and the draw
    # is seeded, so the test cannot flake.
    se = n_pairs / b**2 * terms.std(axis=0, ddof=1) * np.sqrt((1 - n_draw / n_pairs) / n_draw)
    assert (np.abs(estimate - exact) <= 5 * se + 1e-15).all()
    assert (se < 0.2 * exact).all(), "the tolerance should be tighter than the values checked"
    assert_array_equal(estimate, membership_variance(bank, max_pairs=b + n_draw, random_state=0))
    assert not np.array_equal(estimate, membership_variance(bank, max_pairs=b + n_draw,
                                                            random_state=1))
    # a budget covering every pair (diagonal ones included) is the exact computation
    assert_array_equal(membership_variance(bank, max_pairs=b * (b + 1) // 2, random_state=5), exact)


def test_sampled_estimate_is_unbiased():
    b, p, n_draw, n_seeds = 12, 20, 10, 60
    bank = _random_bank(8, b, p, 5)
    exact = membership_variance(bank)
    terms = _pair_terms(bank)
    n_pairs = terms.shape[0]
    estimates = np.array([membership_variance(bank, max_pairs=b + n_draw, random_state=s)
                          for s in range(n_seeds)])
    se = n_pairs / b**2 * terms.std(axis=0, ddof=1) * np.sqrt((1 - n_draw / n_pairs) / n_draw)
    # the mean of independent draws, 5 of its standard errors (seeded: deterministic)
    assert (np.abs(estimates.mean(axis=0) - exact) <= 5 * se / np.sqrt(n_seeds)).all()
    assert (estimates >= 0).all()


def test_zarr_bank_read_row_by_row():
    bank = _random_bank(9, 6, 25, 7)
    stored = zarr.array(bank, chunks=(1, 25))
    assert_array_equal(membership_variance(stored), membership_variance(bank))
    assert_array_equal(omega_matrix(stored)[0], omega_matrix(bank)[0])


def test_real_bank_on_digits():
    """A ReNA bank on scikit-learn's digits: the dense reference, and zero exactly where stable."""
    from sklearn.datasets import load_digits

    X = load_digits().data
    b = 20
    # k = 32 of 64 pixels: fine enough that a few pixels keep the same cluster in every grouping
    bank = make_bank(X, np.ones((8, 8), dtype=bool), 32, n_groupings=b, n_bootstrap=50, seed=0)
    omega_ref, variance_ref, membership_ref = _dense(bank)
    mv = membership_variance(bank)
    assert_allclose(mv, membership_ref, rtol=0, atol=1e-13)
    assert_allclose(omega_matrix(bank)[1], variance_ref, rtol=0, atol=1e-13)
    stable = np.array([len({frozenset(np.flatnonzero(row == row[i])) for row in bank}) == 1
                       for i in range(64)])
    assert 0 < stable.sum() < 64, "this seed should give both stable and unstable pixels"
    assert_array_equal(mv == 0, stable)


@pytest.mark.parametrize("bank, message", [
    (np.zeros(5, dtype=int), "shape"),
    (np.zeros((0, 5), dtype=int), "shape"),
    (np.zeros((2, 5)), "integer"),
    (np.array([[0, 1, 1], [0, -1, 1]]), "row 1 holds negative labels"),
])
def test_bad_banks(bank, message):
    with pytest.raises(ValueError, match=message):
        membership_variance(bank)
    with pytest.raises(ValueError, match=message):
        omega_matrix(bank)


def test_no_bank_is_said_as_such():
    """The README's ``membership_variance(clf.bank_)`` after ``clf = load_run(...)``: a loaded
    estimator holds no bank. It was "got shape ()" (membership_variance) and an AttributeError
    (omega_diagonal); now one message says why bank_ is None and where a bank is."""
    for function in (membership_variance, omega_matrix, omega_diagonal):
        with pytest.raises(ValueError, match=r"bank is None: .*loaded .*fgscale export STORE --omega"):
            function(None)


def test_unsampled_negative_row_still_rejected():
    bank = _random_bank(10, 6, 12, 4)
    bank[5] = -1  # an unbuilt row; 1 pair of 15 is drawn, so it is usually left out
    for seed in range(5):
        with pytest.raises(ValueError, match="row 5 holds negative labels"):
            membership_variance(bank, max_pairs=7, random_state=seed)


@pytest.mark.parametrize("max_pairs", [0, -3, 1.5, True, "10"])
def test_bad_max_pairs(max_pairs):
    with pytest.raises(ValueError, match="max_pairs must be a positive integer"):
        membership_variance(_random_bank(0, 3, 5, 2), max_pairs=max_pairs)


def test_omega_matrix_refuses_large_p():
    with pytest.raises(ValueError, match="n_features=30 > max_features=20"):
        omega_matrix(np.zeros((2, 30), dtype=int), max_features=20)


def test_does_not_import_torch():
    code = "import sys, fgscale.grouping._omega; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
