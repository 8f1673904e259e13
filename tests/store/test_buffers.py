import threading

import numpy as np
import torch

from fgscale.store._buffers import BlockPool


def test_recycled_block_is_zeroed_and_reuses_the_memory():
    pool = BlockPool()
    a = pool.zeros((3, 5))
    assert a.shape == (3, 5) and a.dtype == np.float32 and a.flags.c_contiguous
    a += 7.0
    address = a.ctypes.data
    del a
    b = pool.zeros((3, 5))
    assert b.ctypes.data == address and pool.fresh == 1
    np.testing.assert_array_equal(b, 0.0)
    c = pool.empty((5, 3))  # same number of bytes, another shape: the next free map
    assert c.shape == (5, 3) and pool.fresh == 2


def test_block_not_reused_while_a_view_or_a_tensor_holds_it():
    pool = BlockPool()
    a = pool.zeros((4, 6))
    address = a.ctypes.data
    row, tensor = a[1], torch.from_numpy(a)
    del a
    assert pool.zeros((4, 6)).ctypes.data != address
    del row
    assert pool.zeros((4, 6)).ctypes.data != address  # the tensor still sees it
    del tensor
    assert pool.zeros((4, 6)).ctypes.data == address


def test_free_memory_is_bounded_and_old_sizes_are_dropped():
    pool = BlockPool(max_bytes=3 * 4 * 100)
    blocks = [pool.empty((100,)) for _ in range(5)]
    del blocks
    assert pool._free_bytes == 3 * 4 * 100 and len(pool._free) == 3
    for _ in range(3):  # a new size, freed at once: old maps make room for it
        pool.empty((150,))
    assert [len(b) for b in pool._free] == [4 * 100, 4 * 150]


def test_threads_never_share_a_live_block():
    pool = BlockPool(max_bytes=4 * 64 * 8)
    errors = []

    def work(value: float):
        for _ in range(200):
            block = pool.zeros((64,))
            if block.any():
                errors.append("not zeroed")
            block[:] = value
            if not (block == value).all():
                errors.append("written by another thread")

    threads = [threading.Thread(target=work, args=(v,)) for v in (1.0, 2.0, 3.0, 4.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.fresh < 4 * 200  # most blocks were recycled
