"""fgscale.training._handoff: the central process's shared-memory slots for blocks, reused one
task after another, never given again once their task was cancelled, and removed with their
process; a worker that cannot use its slot returns its block."""

import multiprocessing
import os

import numpy as np
import pytest

from fgscale.training._handoff import Handed, Slot, Slots, write_into


def _write(slot, shape, value):
    """In another process, as a worker writes: True when it could use the slot."""
    out = write_into(slot, shape, zeros=True)
    if out is None:
        return False
    assert not out.any()
    out[:] = value
    return True


@pytest.fixture(scope="module")
def worker():
    """Another process, as a worker process is: its ``apply(_write, ...)`` writes there."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        yield pool


def test_a_slot_is_written_elsewhere_read_here_and_reused_once_not_viewed(tmp_path, worker):
    slots = Slots(tmp_path)
    slot = slots.acquire(4 * 12)
    assert worker.apply(_write, (slot, (2, 5), 3.5))  # fewer bytes than the slot holds
    block = slots.take(Handed(slot, (2, 5)))
    np.testing.assert_array_equal(block, np.full((2, 5), 3.5, np.float32))
    view = block[1:]
    del block
    other = slots.acquire(4 * 12)  # a view of the block is alive: the slot is not given again
    assert other.path != slot.path
    slots.release(other)
    np.testing.assert_array_equal(view, np.full((1, 5), 3.5, np.float32))
    del view
    assert slots.acquire(4 * 12).path == slot.path  # free again, and zeroed for its next task
    assert worker.apply(_write, (slot, (3, 4), 1.0))
    np.testing.assert_array_equal(slots.take(Handed(slot, (3, 4))), np.ones((3, 4)))


def test_a_slot_viewed_when_the_slots_are_cleared_goes_with_its_block(tmp_path, worker):
    slots = Slots(tmp_path)
    slot = slots.acquire(40)
    assert worker.apply(_write, (slot, (2, 5), 2.0))
    block = slots.take(Handed(slot, (2, 5)))
    slots.clear()  # another source's pass: this block is still in use here
    assert os.path.exists(slot.path)
    np.testing.assert_array_equal(block, np.full((2, 5), 2.0, np.float32))
    del block
    assert slots.acquire(40).path != slot.path  # dropped, not freed
    assert not os.path.exists(slot.path)
    block = slots.take(Handed(slots.acquire(40), (0, 10)))
    slots.close()  # the last view unmaps it
    assert not slots.folder.exists() and block.shape == (0, 10)


def test_blocks_stay_with_threads_of_this_process_and_where_no_slot_fits(tmp_path, worker):
    slots = Slots(tmp_path)
    slot = slots.acquire(4 * 10)
    assert write_into(slot, (2, 5), zeros=True) is None  # this process: nothing to hand over
    assert not worker.apply(_write, (slot, (3, 5), 1.0))  # too big
    assert not worker.apply(_write, (Slot(str(tmp_path / "gone"), 40, slot.pid), (2, 5), 1.0))
    assert not worker.apply(_write, (None, (2, 5), 1.0))
    slots.release(slot)
    assert slots.acquire(4 * 10).path == slot.path


def test_cancelled_slots_are_dropped_and_everything_goes_with_the_slots(tmp_path):
    slots = Slots(tmp_path)
    kept, cancelled = slots.acquire(400), slots.acquire(400)
    slots.abandon(cancelled)
    assert not os.path.exists(cancelled.path)  # its worker's map keeps its memory until done
    assert slots.acquire(400).path not in (kept.path, cancelled.path)
    slots.acquire(800)  # another size: a new file
    folder = slots.folder
    assert len(list(folder.iterdir())) == 3
    del slots
    assert not folder.exists()


def test_folders_of_processes_gone_are_removed(tmp_path):
    child = multiprocessing.get_context("spawn").Process(target=int)
    child.start()
    child.join()  # a process id that no process holds any more
    orphan = tmp_path / f"fgscale-blocks-{child.pid}-abc"
    orphan.mkdir()
    (orphan / "block").write_bytes(b"0" * 64)
    mine = Slots(tmp_path)
    assert not orphan.exists() and mine.folder.exists()
    assert Slots(tmp_path).folder.exists() and mine.folder.exists()  # alive: kept
    assert Slots(tmp_path / "none").folder is None  # no such tmpfs: no slots at all


def test_only_the_slots_running_a_pass_keep_free_ones(tmp_path):
    first, second = Slots(tmp_path), Slots(tmp_path)
    free, busy = first.acquire(64), first.acquire(64)  # a task still in flight keeps its slot
    first.release(free)
    second.release(second.acquire(64))
    second.start_pass()
    assert [f.name for f in first.folder.iterdir()] == [os.path.basename(busy.path)]
    assert len(list(second.folder.iterdir())) == 1
