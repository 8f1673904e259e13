"""Faults survived (issue 14), the soak's cheap variant: a dozen epochs of streamed training on a
tiny store and nothing accumulates in the central process, measured by scripts/bench_soak.py
(which runs 50 epochs on a larger store and reports the figures; see its docstring)."""


import pytest
from distributed import Client, LocalCluster
from helpers import load_script

pytestmark = pytest.mark.scripts


@pytest.fixture(scope="module")
def bench_soak():
    with load_script("bench_soak") as module:
        yield module


@pytest.mark.parametrize("processes", [False, True], ids=["thread-workers", "worker-processes"])
def test_nothing_accumulates_over_epochs(bench_soak, tiny_store, processes):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=processes,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        samples = bench_soak.soak(tiny_store.path, client, epochs=12, processes=processes,
                                  batch_size=8)
    assert [s["epoch"] for s in samples] == list(range(1, 13))
    table = "\n".join(str(s) for s in samples)
    # Futures and tasks are all released at the end of every epoch.
    assert all(s["futures"] == s["scheduler_tasks"] == 0 for s in samples), table
    # What leaks grows with every epoch; what warms up steps once, at any time in the first
    # epochs: a thread pool's next thread, further connections to the workers and the scheduler,
    # a recycled block of a size not asked for before (the block pool's maps). So the second half
    # of the run must be flat up to one such step, and the whole run within a few of them.
    for s in samples:
        s["files"] = s["fds"] - s["sockets"]  # the store's shard files, pipes
    steps = {"threads": 1, "os_threads": 1, "files": 1, "sockets": 2, "pool_maps": 1}
    half = len(samples) // 2
    for name, step in steps.items():
        late = max(s[name] for s in samples[half:]) - samples[half - 1][name]
        assert late <= step, f"{name} grew by {late} over epochs {half + 1}-12:\n{table}"
        grew = max(s[name] for s in samples[1:]) - samples[0][name]
        assert grew <= 2 * step, f"{name} grew by {grew} after epoch 1:\n{table}"
