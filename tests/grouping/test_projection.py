import numpy as np
import pytest
import torch
from helpers import dense_phi, random_labels
from hypothesis import given, settings
from hypothesis import strategies as st

from fgscale.grouping._projection import back_project, cluster_sizes, project, project_rows


@st.composite
def groupings(draw, max_p=40):
    p = draw(st.integers(1, max_p))
    k = draw(st.integers(1, p))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    return random_labels(rng, p, k), rng  # every cluster used


@settings(max_examples=60, deadline=None)
@given(groupings())
def test_phi_rows_orthonormal_and_projector(g):
    labels, _ = g
    phi = dense_phi(labels)
    np.testing.assert_allclose(phi @ phi.T, np.eye(len(phi)), atol=1e-12)
    P = phi.T @ phi
    np.testing.assert_allclose(P, P.T, atol=1e-12)
    np.testing.assert_allclose(P @ P, P, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(groupings())
def test_project_and_back_project_match_dense(g):
    labels, rng = g
    X = rng.standard_normal((5, labels.size))
    phi = dense_phi(labels)
    Z = project(X, labels)
    np.testing.assert_allclose(Z, X @ phi.T, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(back_project(Z, labels), X @ phi.T @ phi, rtol=1e-10, atol=1e-10)
    # 1D vectors and torch tensors give the same numbers
    np.testing.assert_allclose(project(X[0], labels), Z[0], rtol=1e-12)
    Zt = project(torch.from_numpy(X), torch.from_numpy(labels))
    assert isinstance(Zt, torch.Tensor)
    np.testing.assert_allclose(Zt.numpy(), Z, rtol=1e-12)


def test_project_keeps_float32_and_given_k():
    labels = np.array([0, 0, 1, 1, 1], np.int32)
    X = np.ones((2, 5), np.float32)
    Z = project(X, labels, n_clusters=2)
    assert Z.dtype == np.float32 and Z.shape == (2, 2)
    np.testing.assert_allclose(Z, [[2 / np.sqrt(2), 3 / np.sqrt(3)]] * 2, rtol=1e-6)


def test_cluster_sizes():
    labels = np.array([2, 0, 2, 1, 2])
    np.testing.assert_array_equal(cluster_sizes(labels), [1, 1, 3])
    np.testing.assert_array_equal(cluster_sizes(torch.from_numpy(labels)).numpy(), [1, 1, 3])


@settings(max_examples=40, deadline=None)
@given(groupings())
def test_project_rows_equals_project_exactly(g):
    labels, rng = g
    X = rng.standard_normal((6, labels.size)).astype(np.float32)
    order = rng.permutation(6)  # rows arrive in any order
    Z = project_rows(((int(i), X[i]) for i in order), labels, 6)
    np.testing.assert_array_equal(Z, project(X, labels))


def test_project_rows_writes_into_out_and_checks_it():
    labels = np.array([0, 1, 1, 2, 2, 2])
    X = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = np.zeros((2, 3), np.float32)
    Z = project_rows(enumerate(X), labels, 2, out=out)
    assert Z is out
    np.testing.assert_array_equal(out, project(X, labels))
    with pytest.raises(ValueError, match=r"C-contiguous float32 array of shape \(2, 3\)"):
        project_rows(enumerate(X), labels, 2, out=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="got float32 \\(3, 2\\)"):
        project_rows(enumerate(X), labels, 2, out=np.zeros((3, 2), np.float32))
