"""The store: write/read round trips against in-memory arrays, and refusals of bad stores."""


import nibabel as nib
import numpy as np
import pytest
import zarr
from helpers import TINY_GRID
from hypothesis import given, settings
from hypothesis import strategies as st

from fgscale.images._synthetic import make_classification_volumes
from fgscale.store import (
    FORMAT_VERSION,
    StoreError,
    create_store,
    default_block_rows,
    open_store,
    write_block,
    write_store,
)


@pytest.fixture(scope="module")
def data():
    X, y, mask, affine = make_classification_volumes(37, 3, grid=TINY_GRID, seed=1)
    return X, y, mask, affine


@pytest.fixture(scope="module")
def store(data, tmp_path_factory):
    X, y, mask, affine = data
    split = np.array(["train", "test", ""] * 12 + ["test"])
    return write_store(tmp_path_factory.mktemp("s") / "s.zarr", X, y.astype(str), mask, affine,
                       split=split, groups=[f"sub-{i % 4}" for i in range(37)], block_rows=5)


def test_write_store_round_trip(store, data):
    X, y, mask, affine = data
    assert (store.n_samples, store.n_features) == X.shape == (37, mask.sum())
    np.testing.assert_array_equal(store.X[:], X)
    np.testing.assert_array_equal(store.classes[store.y], y.astype(str))
    assert store.y.dtype == np.int32
    np.testing.assert_array_equal(store.mask, mask)
    np.testing.assert_array_equal(store.affine, affine)
    assert store.groups[5] == "sub-1"
    assert store.attrs["complete"] and store.attrs["fgscale_format_version"] == FORMAT_VERSION
    assert not store.path.with_name("s.zarr.partial").exists()


def test_layout_is_row_chunks_in_shards(store):
    assert store.X.chunks == (1, store.n_features)
    assert store.X.shards == (5, store.n_features)
    assert store._reader is not None  # the direct shard reader applies to this layout


@given(rows=st.lists(st.integers(0, 36), min_size=0, max_size=60))
@settings(max_examples=40, deadline=None)
def test_read_rows_any_order_and_duplicates(store, data, rows):
    np.testing.assert_array_equal(store.read_rows(rows), data[0][np.asarray(rows, int)])


def test_read_rows_direct_reader_equals_zarr(store):
    rows = np.array([36, 0, 7, 7, 12, 35])
    oracle = np.stack([store.X[int(r)] for r in rows])
    np.testing.assert_array_equal(store.read_rows(rows), oracle)
    store_fallback = open_store(store.path)
    store_fallback._reader = None
    np.testing.assert_array_equal(store_fallback.read_rows(rows), oracle)


@pytest.mark.parametrize("direct", [True, False])
def test_read_rows_into_out(store, data, direct):
    if not direct:  # the zarr fallback
        store = open_store(store.path)
        store._reader = None
    out = np.full((4, store.n_features), np.nan, np.float32)
    assert store.read_rows([9, 3, 9, 10], out=out) is out
    np.testing.assert_array_equal(out, data[0][[9, 3, 9, 10]])
    with pytest.raises(ValueError, match=r"out must be a C-contiguous float32 array of shape \(3, "):
        store.read_rows([1, 2, 3], out=out)
    with pytest.raises(ValueError, match="out must be"):
        store.read_rows(range(4), out=np.empty((store.n_features, 4), np.float32).T)


def test_reader_sees_a_shard_rewritten_in_place(tmp_path, data):
    """The reader keeps each shard's index, but reads it again once the file has changed."""
    import google_crc32c

    X, y, mask, affine = data
    path = write_store(tmp_path / "s.zarr", X, y, mask, affine, block_rows=8).path
    store = open_store(path)
    np.testing.assert_array_equal(store.read_rows([9, 10]), X[9:11])
    # the same rows, stored in reverse order in the file: only a fresh index finds them
    shard = path / "X" / "c" / "1" / "0"
    raw, nbytes = shard.read_bytes(), 4 * X.shape[1]
    body = b"".join(raw[i * nbytes:(i + 1) * nbytes] for i in reversed(range(8)))
    index = np.array([[(7 - i) * nbytes, nbytes] for i in range(8)], "<u8")
    tmp = shard.with_name("new")
    tmp.write_bytes(body + index.tobytes() + np.uint32(google_crc32c.value(index.tobytes())).tobytes())
    tmp.replace(shard)
    np.testing.assert_array_equal(zarr.open_array(path / "X", mode="r")[9:11], X[9:11])
    np.testing.assert_array_equal(store.read_rows([9, 10]), X[9:11])
    np.testing.assert_array_equal([row.copy() for _, row in store.iter_rows([10])], X[[10]])


@given(rows=st.lists(st.integers(0, 36), min_size=0, max_size=60), direct=st.booleans())
@settings(max_examples=40, deadline=None)
def test_iter_rows_visit_every_requested_row(store, data, rows, direct):
    if not direct:  # the zarr fallback gives the same rows
        store = open_store(store.path)
        store._reader = None
    seen = {}
    for i, row in store.iter_rows(rows):
        assert i not in seen
        seen[i] = row.copy()
    assert sorted(seen) == list(range(len(rows)))
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(seen[i], data[0][r])


def test_iter_rows_reads_every_row_into_one_buffer(store, data):
    seen = [(i, row, row.copy()) for i, row in store.iter_rows([3, 30, 3, 12])]
    assert len({row.ctypes.data for _, row, _ in seen}) == 1
    for i, _, copy in seen:
        np.testing.assert_array_equal(copy, data[0][[3, 30, 3, 12][i]])


def test_iter_rows_names_a_truncated_shard(tmp_path, data):
    X, y, mask, affine = data
    path = write_store(tmp_path / "s.zarr", X, y, mask, affine, block_rows=8).path
    shard = path / "X" / "c" / "1" / "0"
    with open(shard, "r+b") as f:  # the index stays at the end, the last row's bytes go
        index = f.read()[-(16 * 8 + 4):]
        f.seek(4 * X.shape[1] * 7 + 8)
        f.write(index)
        f.truncate()
    with pytest.raises(StoreError, match=r"c/1/0: truncated, row chunk at byte"):
        list(open_store(path).iter_rows([15]))
    with pytest.raises(StoreError, match=r"c/1/0: truncated, 3 rows from byte"):
        open_store(path).read_rows([13, 14, 15])
    np.testing.assert_array_equal(open_store(path).read_rows([13, 14]), X[13:15])


def test_read_rows_out_of_range(store):
    with pytest.raises(IndexError, match="rows must be in"):
        store.read_rows([37])
    with pytest.raises(IndexError, match="rows must be in"):
        next(store.iter_rows([-1]))


def test_iter_blocks(store, data):
    X = data[0]
    seen = [(idx, block) for idx, block in store.iter_blocks()]
    assert [len(i) for i, _ in seen] == [5] * 7 + [2]
    np.testing.assert_array_equal(np.concatenate([i for i, _ in seen]), np.arange(37))
    for idx, block in seen:
        np.testing.assert_array_equal(block, X[idx])
    # a subset, blocks of 10 rows = 2 shards
    rows = [30, 1, 2, 3, 11, 12, 29]
    parts = list(store.iter_blocks(rows, block_size=10))
    assert [p[0].tolist() for p in parts] == [[1, 2, 3], [11, 12], [29], [30]]
    for idx, block in parts:
        np.testing.assert_array_equal(block, X[idx])


def test_splits(store):
    assert store.test_rows().tolist() == list(range(1, 36, 3)) + [36]
    assert store.train_rows().dtype == np.int64
    assert set(store.train_rows()) | set(store.test_rows()) == set(range(37))
    assert not set(store.train_rows()) & set(store.test_rows())


def test_mask_img(store):
    img = store.mask_img()
    assert isinstance(img, nib.Nifti1Image)
    np.testing.assert_array_equal(img.get_fdata() > 0, store.mask)
    np.testing.assert_array_equal(img.affine, store.affine)


def test_room_for_a_bank(tmp_path, data):
    X, y, mask, affine = data
    s = write_store(tmp_path / "b.zarr", X, y, mask, affine, classes=["a", "b", "c"])
    g = zarr.open_group(s.path, mode="r+")
    g.create_array("bank", data=np.zeros((2, s.n_features), np.int32))
    again = open_store(s.path)
    assert again.group["bank"].shape == (2, s.n_features)
    assert again.classes.tolist() == ["a", "b", "c"]


def test_write_store_replaces_existing(tmp_path, data):
    X, y, mask, affine = data
    write_store(tmp_path / "r.zarr", X, y, mask, affine)
    s = write_store(tmp_path / "r.zarr", X[:4] + 1, y[:4], mask, affine)
    np.testing.assert_array_equal(s.X[:], X[:4] + 1)


def test_write_store_bad_input(tmp_path, data):
    X, y, mask, affine = data
    with pytest.raises(ValueError, match="X must have shape"):
        write_store(tmp_path / "x.zarr", X[:, :-1], y, mask, affine)
    with pytest.raises(ValueError, match="split values"):
        write_store(tmp_path / "x.zarr", X, y, mask, affine, split=["val"] * 37)
    with pytest.raises(ValueError, match="class indices"):
        write_store(tmp_path / "x.zarr", X, y, mask, affine, classes=["a"])
    with pytest.raises(ValueError, match="mask is empty"):
        create_store(tmp_path / "x.zarr", n_samples=1, mask=np.zeros((3, 3, 3)),
                     affine=np.eye(4), y=[0], classes=["a"])


def test_open_store_refusals(tmp_path, data):
    X, y, mask, affine = data
    with pytest.raises(StoreError, match="no such store"):
        open_store(tmp_path / "missing.zarr")
    zarr.open_group(tmp_path / "foreign.zarr", mode="w").create_array("X", shape=(2,), dtype="f4")
    with pytest.raises(StoreError, match="not an fgscale store"):
        open_store(tmp_path / "foreign.zarr")
    s = write_store(tmp_path / "old.zarr", X, y, mask, affine)
    zarr.open_group(s.path, mode="r+").attrs["fgscale_format_version"] = 99
    with pytest.raises(StoreError, match="version 99"):
        open_store(s.path)
    create_store(tmp_path / "partial.zarr", n_samples=4, mask=mask, affine=affine,
                 y=[0, 1, 0, 1], classes=["a", "b"], block_rows=2)
    with pytest.raises(StoreError, match=r"not complete \(0 of 2 blocks.*re-run fgscale convert"):
        open_store(tmp_path / "partial.zarr")
    with pytest.raises(ValueError, match="mode"):
        open_store(s.path, mode="w")


def test_default_block_rows():
    assert default_block_rows(270_806) == 61  # about 64 MiB per shard at HCP 2 mm
    assert default_block_rows(605) == 1024


def test_direct_shard_writes_read_back_through_zarr(tmp_path, data):
    """Shards written by the direct writer follow the Zarr v3 sharding spec (index, crc32c)."""
    X, y, mask, affine = data
    store = write_store(tmp_path / "d.zarr", X, y, mask, affine, block_rows=5)
    assert store._reader is not None
    fresh = zarr.open_array(str(store.path / "X"), mode="r")  # zarr's own decoder, no fgscale
    np.testing.assert_array_equal(fresh[:], X)  # 7 full shards and the partial last one
    zarr.open_array(str(store.path / "X"), mode="r+")[36] = 0.0  # zarr's encoder, on our shard
    np.testing.assert_array_equal(open_store(store.path).read_rows([35, 36]), [X[35], 0 * X[0]])


def test_write_block_checks_the_block_shape(tmp_path, data):
    X, y, mask, affine = data
    g = create_store(tmp_path / "b.zarr", n_samples=37, mask=mask, affine=affine, y=y,
                     classes=["0", "1", "2"], block_rows=5)
    with pytest.raises(ValueError, match=r"block 7 holds rows \[35, 37\) of \d+ voxels, got"):
        write_block(tmp_path / "b.zarr", 7, X[30:35])
    assert not g["done"][:].any()


# --- numeric targets (regression) beside, or instead of, class labels ---


def test_target_round_trip_beside_labels(tmp_path, data):
    X, y, mask, affine = data
    target = np.linspace(-3, 5, 37) ** 3  # float64 values that float32 would round
    s = write_store(tmp_path / "t.zarr", X, y, mask, affine, target=target, block_rows=8)
    assert s.target.dtype == np.float64 and s.has_labels
    np.testing.assert_array_equal(s.target, target)
    np.testing.assert_array_equal(s.classes[s.y], y.astype(str))
    assert open_store(s.path).target.tolist() == target.tolist()


def test_a_store_without_labels_has_no_classes_and_zero_y(tmp_path, data):
    X, _, mask, affine = data
    target = np.arange(37) / 7
    s = write_store(tmp_path / "t.zarr", X, None, mask, affine, target=target, block_rows=8)
    assert not s.has_labels and s.classes.shape == (0,)
    assert s.y.dtype == np.int32 and not s.y.any() and s.y.shape == (37,)
    np.testing.assert_array_equal(s.target, target)
    np.testing.assert_array_equal(s.X[:], X)


def test_a_store_without_target_opens_with_target_none(store):
    # as every store written before targets existed: no target array at all
    assert "target" not in store.group and store.target is None and store.has_labels


@pytest.mark.parametrize("target, message", [
    (np.arange(36.0), r"target must have shape \(37,\), got \(36,\)"),
    (np.r_[np.arange(36.0), np.nan], r"target must be finite, got nan at row 36 \(1 non-finite\)"),
    (["a"] * 37, "target must hold numbers"),
])
def test_bad_targets_are_refused(tmp_path, data, target, message):
    X, y, mask, affine = data
    with pytest.raises(ValueError, match=message):
        write_store(tmp_path / "x.zarr", X, y, mask, affine, target=target)
    assert not (tmp_path / "x.zarr").exists()


def test_labels_or_target_are_needed(tmp_path, data):
    X, _, mask, affine = data
    with pytest.raises(ValueError, match="needs class labels y, a target, or both"):
        write_store(tmp_path / "x.zarr", X, None, mask, affine)
    with pytest.raises(ValueError, match="classes were given without y"):
        create_store(tmp_path / "x.zarr", n_samples=2, mask=mask, affine=affine, classes=["a"])
    with pytest.raises(ValueError, match="y was given without classes"):
        create_store(tmp_path / "x.zarr", n_samples=2, mask=mask, affine=affine, y=[0, 0])
