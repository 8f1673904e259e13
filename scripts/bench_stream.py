"""Benchmark: streamed feature-grouping training from a Zarr store on a LocalCluster.

Builds a SYNTHETIC store at full resolution (p = 270,806 by default: random rows, only
throughput and memory are measured), a small bank, then reports:

1. samples/s of feature-grouping training streamed from the store (workers read and project,
   the central process steps), first and second epoch of a run, with thread workers (in the
   central process) and with worker processes (each block then goes through a socket), for
   each worker count of ``--n-workers``. Against: the read limit of as many threads (the rows
   of the store read by that many threads in parallel, each into a block of its own, as
   shard-aligned blocks or as an epoch's random batches, whichever is faster; so that the share
   of the limit means the same on 2 cores and on 16); the raw sequential read of one thread
   (fgscale's reader into recycled blocks; fresh arrays, the whole shard files read as bytes
   and zarr's own reader are shown too); one epoch from rows already in memory; and the compute
   bound of as many cores (each doing nothing but reading, projecting and stepping, with no
   overhead);
2. peak RSS of the central process for epochs over n and 4n rows (each in a fresh process);
3. a run over a store larger than the workers' total memory limit (default 2 x 1 GiB worker
   processes and a ~6 GB store), which must complete without spilling;
4. where the central process's time goes (the feed ratio): CPU seconds per training row of the
   central process and of one worker process over ``--feed-epochs`` epochs of streamed training
   as the estimators run it (standardized rows, a fifth of ``--feed-rows`` for validation after
   every epoch, the step size of ``learning_rate="auto"``), for logistic regression and the
   MLP, the model on the CPU (and on a GPU when torch sees one); the central process's CPU split
   by phase of the training loop (:mod:`fgscale.training._profile`); and the feed ratio, worker
   CPU per row / central CPU per row: how many worker cores one central process keeps fed. With
   ``--baseline DIR`` (another checkout's folder holding ``fgscale/``, e.g. ``git archive HEAD
   fgscale | tar -x -C DIR``), each run is made with that code and with this one, back to back,
   and the table gives both and their ratio. With ``--feed-scheduler-apart``, this code also
   runs with the Dask scheduler in a process of its own (a ``SubprocessCluster``), as
   ``dask scheduler`` runs in the deployments of ``cluster/``: the scheduler's CPU per row is
   then its own column, not part of the central process's;
5. with ``--replicas 1,2``: samples/s of the MLP's streamed training (standardized rows, the
   step size of ``learning_rate="auto"``, no validation) by one central process fed by one
   worker process, and by R data-parallel replicas in R worker processes
   (:mod:`fgscale.training._replicas`), each taking ``batch_size / R`` rows of every step, so
   that all train on the same minibatches; with the CPU seconds per row of the central process
   and of the workers. Only these runs are made. With ``--through-estimator`` as well, the
   same through ``FeatureGroupingClassifier(model="mlp", replicas=R)`` fitted on the store
   (R = 1: its one centre), whose replicas last the whole fit (a ``ReplicaGroup``): each
   epoch's seconds split into the replicas' own, rank 0's weights brought back, and the rest
   (the commands, waiting); starting the replicas (process group, model out) once a phase.

    .venv/bin/python scripts/bench_stream.py [--rows 5600] [--dir /tmp/fgscale-bench] [--quick]
    .venv/bin/python scripts/bench_stream.py --n-workers 4,8,15 --device cuda   # 16 cores, a GPU
    .venv/bin/python scripts/bench_stream.py --n-workers 1,2,4,8,15 --kinds processes --no-feed
    .venv/bin/python scripts/bench_stream.py --feed --rows 1600 --baseline DIR --repeat 3
    .venv/bin/python scripts/bench_stream.py --feed --rows 1600 --feed-scheduler-apart --repeat 3
    .venv/bin/python scripts/bench_stream.py --replicas 1,2 --rows 1600 --repeat 3
    .venv/bin/python scripts/bench_stream.py --replicas 1,2 --through-estimator --rows 1600

Writes ~rows x p x 4 bytes to --dir (6 GB by default); reuses the store if present.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from benchlib import (
    best_time,
    chunk_files,
    comma_list,
    markdown_row,
    markdown_table,
    parse_args,
    peak_rss_mb,
    random_store,
)

from fgscale.store import open_store
from fgscale.store._buffers import POOL
from fgscale.training import MemorySource, make_optimizer, train_epoch
from fgscale.training._plan import epoch_plan

BANK = dict(n_clusters=0.1, n_bootstrap=50, seed=0)  # the bank every measurement uses

def two_epochs(store_path: str, n_rows: int, n_workers: int, memory_limit: str,
               batch_size: int, prefetch: int, processes: bool, device: str) -> dict:
    """Two streamed FG epochs over the first ``n_rows`` rows (run in a fresh process): the
    first includes the ramp-up (cluster warm-up, the first block with nothing to overlap), the
    second is the steady state of a training run."""
    from fgscale._dask.client import get_client
    from fgscale.grouping._dask_bank import load_bank
    from fgscale.training._models import build_model
    from fgscale.training._stream import StoreSource

    store = open_store(store_path)
    bank, info = load_bank(store_path, **BANK)
    k = int(info["n_clusters"])
    rows = np.arange(n_rows)
    torch.manual_seed(0)
    model = build_model("logreg", store.n_features, len(store.classes)).to(device)
    opt = make_optimizer(model, 1e-3)
    bank_t = torch.as_tensor(bank, device=device)
    rss_before = peak_rss_mb()
    seconds = []
    with get_client(n_workers=n_workers, processes=processes,
                    memory_limit=memory_limit if processes else "auto") as client:
        source = StoreSource(client, store_path, n_clusters=k, bank_key=info["key"],
                             prefetch=prefetch)
        for epoch in range(2):
            plan = epoch_plan(rows, batch_size=batch_size, epoch=epoch, seed=0,
                              n_groupings=len(bank))
            start = time.perf_counter()
            train_epoch(model, opt, source.batches(plan), bank=bank_t, device=device)
            synchronize(device)
            seconds.append(time.perf_counter() - start)
        spilled = client.run(_spilled_keys)
    return {"rows": n_rows, "processes": processes, "seconds": seconds,
            "first": n_rows / seconds[0], "steady": n_rows / seconds[1],
            "peak_rss_mb": peak_rss_mb(), "rss_before_mb": rss_before,
            "spilled_keys": int(sum(spilled.values())),
            "max_in_flight": source.prefetcher.max_seen}


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def compute_costs(store, bank, info: dict, model, opt, plan, k: int,
                  device: str) -> tuple[dict, str]:
    """The CPU seconds per row of the work of streamed FG training, with no overhead at all:
    of the worker task (read and project, run here in the calling thread) and of its share of
    the central step (one torch thread), each measured alone; on a GPU, the central step's wall
    time per row too. :func:`compute_bound` turns them into the samples/s of a number of cores."""
    from fgscale.training._loop import Batch
    from fgscale.training._stream import load_batch

    def cpu_per_row(fn) -> float:
        start = time.process_time()  # all threads of the process
        fn()
        return (time.process_time() - start) / sum(len(b) for b in plan.batches)

    path = str(store.path)
    pairs = list(zip(plan.batches, plan.groupings.tolist(), strict=True))
    read = cpu_per_row(lambda: [None for b, _ in pairs for _ in store.iter_rows(b)])
    blocks = []
    # the worker task as StoreSource sends it: the bank's key in the last field, and its place
    key, at = f"|{info['key']}", info["location"]
    worker = cpu_per_row(lambda: blocks.extend(Batch(*load_batch(path, b, g, k, key, bank_at=at), g)
                                               for b, g in pairs))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    bank_t = torch.as_tensor(bank, device=device)
    train_epoch(model, opt, blocks[:2], bank=bank_t, device=device)  # GPU warm-up
    synchronize(device)
    wall = time.perf_counter()
    step = cpu_per_row(lambda: (train_epoch(model, opt, blocks, bank=bank_t, device=device),
                                synchronize(device)))
    wall = (time.perf_counter() - wall) / sum(len(b) for b in plan.batches)
    torch.set_num_threads(threads)
    text = (f"worker task {1e3 * worker:.3f} (of which the read {1e3 * read:.3f}), "
            f"central step {1e3 * step:.3f} (batch {len(plan.batches[0])}, on {device}; "
            f"wall {1e3 * wall:.3f})")
    return {"worker": worker, "step": step, "wall": wall, "device": device}, text


def compute_bound(costs: dict, cores: int) -> float:
    """Samples/s that ``cores`` cores doing nothing but the work allow (see
    :func:`compute_costs`): on the CPU each row costs its worker task and its share of the
    step; with the model on a GPU, the cores read and project, and the step's wall time per row
    bounds it too. A streamed epoch over this bound is the share of those cores that the
    pipeline turns into training, whatever their number."""
    if costs["device"] == "cpu":
        return cores / (costs["worker"] + costs["step"])
    return min(cores / (costs["worker"] + costs["step"]), 1 / costs["wall"])


def parallel_read(store, parts: list[np.ndarray], n_threads: int, passes: int) -> float:
    """Rows/s of ``n_threads`` threads reading ``parts`` (arrays of rows) between them, round
    robin, each into a block of its own allocated beforehand (fgscale's reader releases the GIL
    while it copies), best of ``passes``."""
    shares = [parts[i::n_threads] for i in range(n_threads)]
    width = max(part.size for part in parts)
    blocks = [np.zeros((width, store.n_features), np.float32) for _ in shares]

    def read(share, block):
        for rows in share:
            store.read_rows(rows, out=block[:rows.size])

    with ThreadPoolExecutor(n_threads) as pool:
        seconds = best_time(lambda: list(pool.map(read, shares, blocks)), passes)
    return sum(part.size for part in parts) / seconds


def _spilled_keys(dask_worker) -> int:
    """Keys a worker has spilled to disk (its data buffer's "slow" part)."""
    return len(getattr(dask_worker.data, "slow", ()))


def feed_rows(n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The training and validation rows of the feed runs: a fifth of the first ``n_rows`` rows
    validate (the estimators' default validation fraction), the rest train."""
    n_val = n_rows // 5
    return np.arange(n_val, n_rows), np.arange(n_val)


def this_code_step(centre_only: bool):
    """The step size of ``learning_rate="auto"`` and the streamed source's options for it, as
    the code on sys.path has them (a ``--baseline`` checkout may predate the step size taken
    from a Lipschitz constant computed on the workers), or as the central process computed it
    before (``centre_only``)."""
    from fgscale.training import StoreSource
    from fgscale.training._sgd import lipschitz

    try:
        from fgscale.training._sgd import LipschitzStep
    except ImportError:
        LipschitzStep = None
    if centre_only or LipschitzStep is None:
        return (lambda x, w=None: 1.0 / lipschitz(x, weights=w)), {}
    worker_side = "lipschitz" in inspect.signature(StoreSource).parameters
    return LipschitzStep(), {"lipschitz": True} if worker_side else {}


def profiled():
    """The training loop's phase marks switched on (:mod:`fgscale.training._profile`), or
    None where the code has none."""
    try:
        from fgscale.training._profile import profiling
    except ImportError:
        return None
    return profiling()


def cpu_now(client, scheduler_apart: bool = False) -> dict:
    """CPU seconds so far of this process (all its threads), of this thread, of the worker
    processes (their sum, from ``client.run``) and of the scheduler where it has a process of
    its own (else its CPU is this process's), with the wall clock."""
    return {"centre": time.process_time(), "loop": time.thread_time(),
            "workers": sum(client.run(time.process_time).values()),
            "scheduler": client.run_on_scheduler(time.process_time) if scheduler_apart else 0.0,
            "wall": time.perf_counter()}


@contextlib.contextmanager
def feed_cluster(scheduler_apart: bool):
    """The feed runs' cluster, one worker process of one thread: the embedded LocalCluster
    (its scheduler in this process), or with ``scheduler_apart`` the same worker beside a
    scheduler in a process of its own, as ``dask scheduler`` runs in ``cluster/``'s
    deployments."""
    from distributed import Client
    from distributed.deploy.subprocess import SubprocessCluster

    from fgscale._dask.client import get_client

    if not scheduler_apart:
        with get_client(n_workers=1, processes=True) as client:
            yield client
        return
    with SubprocessCluster(host="127.0.0.1", n_workers=1, threads_per_worker=1,
                           dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(1)
        yield client


def feed_run(store_path: str, model_name: str, device: str, epochs: int, batch_size: int,
             n_rows: int, centre_only: bool = False, scheduler_apart: bool = False) -> dict:
    """CPU seconds of the central process and of one worker process over ``epochs`` streamed
    epochs after one to warm up (run in a fresh process); with the loop's phases where the code
    marks them. With ``centre_only``, this code does in the central process what it did before
    the workers took it over: the step sizes, the validation forward on rows brought here, and
    blocks received through the socket. With ``scheduler_apart``, the scheduler runs in a
    process of its own (:func:`feed_cluster`)."""
    from fgscale.grouping._dask_bank import load_bank
    from fgscale.training import StoreSource, fit
    from fgscale.training._loop import torch_threads
    from fgscale.training._models import build_model

    store = open_store(store_path)
    bank, info = load_bank(store_path, **BANK)
    k = int(info["n_clusters"])
    train, val = feed_rows(n_rows)
    torch.manual_seed(0)
    model = build_model(model_name, store.n_features, len(store.classes)).to(device)
    optimizer = make_optimizer(model, 0.0)
    bank_t = torch.as_tensor(bank, device=device)
    step, step_options = this_code_step(centre_only)
    profile = profiled()
    # the estimators' settings: one torch thread for a minibatch this size, worker processes
    with feed_cluster(scheduler_apart) as client, torch_threads(batch_size * k):
        source = StoreSource(client, store_path, n_clusters=k, bank_key=info["key"],
                             bank_at=info["location"], standardize=True, stats_rows=train,
                             **step_options)
        if centre_only:
            source._handoff = False  # no shared memory: blocks come through the socket

        def validation():  # a plain iterator of blocks is evaluated here
            return iter(source.blocks(val)) if centre_only else source.blocks(val)

        def epochs_from(start: int, stop: int) -> None:
            fit(model, optimizer, max_epochs=stop, start_epoch=start, bank=bank_t,
                device=device, step_size=step, validation=validation,
                epoch_batches=lambda e: source.batches(epoch_plan(
                    train, batch_size=batch_size, epoch=e, seed=0, n_groupings=len(bank))))
            synchronize(device)

        epochs_from(0, 1)
        before = cpu_now(client, scheduler_apart)
        if profile is None:
            epochs_from(1, 1 + epochs)
        else:
            with profile as phases:
                epochs_from(1, 1 + epochs)
        after = cpu_now(client, scheduler_apart)
    spent = {key: after[key] - before[key] for key in before}
    return {**spent, "rows": train.size * epochs, "val_rows": val.size * epochs,
            "phases": None if profile is None else phases.cpu,
            "code": str(Path(sys.modules["fgscale"].__file__).parents[1])}


def feed_child(args, model_name: str, device: str, code: str) -> dict:
    """:func:`feed_run` in a fresh process: with the code of ``--baseline`` first on its path
    (``code`` "before"), or with this checkout's as it was ("centre-only") or is ("after")."""
    cmd = [sys.executable, __file__, "--feed-child", model_name, "--device", device,
           "--dir", str(args.dir), "--rows", str(args.rows), "--p", str(args.p),
           "--batch-size", str(args.batch_size), "--feed-rows", str(args.feed_rows),
           "--feed-epochs", str(args.feed_epochs),
           *(["--feed-centre-only"] if code == "centre-only" else []),
           *(["--feed-scheduler-apart"] if code == "scheduler apart" else [])]
    env = dict(os.environ)
    if code == "before":
        env["PYTHONPATH"] = os.pathsep.join([str(args.baseline), env.get("PYTHONPATH", "")]
                                            ).rstrip(os.pathsep)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


FEED_CODES = {"before": "the --baseline checkout's code",
              "centre-only": "this code with the central process's work of before in it (step "
                             "sizes, validation, blocks through the socket)",
              "after": "this code",
              "scheduler apart": "this code with the scheduler in a process of its own"}
"""The code of each feed run (:func:`feed_child`)."""


def feed_codes(args) -> list[str]:
    """The codes of the feed runs (:data:`FEED_CODES`): "before" with a ``--baseline``."""
    return [*(["before"] if args.baseline else []), "centre-only", "after",
            *(["scheduler apart"] if args.feed_scheduler_apart else [])]


def feed_runs(args) -> dict:
    """Every feed run, keyed by (model, device, code), each a list over ``--repeat``; the codes'
    runs alternate, so that all see the same moments of a shared machine."""
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    runs: dict = {}
    for model_name in args.feed_models:
        for device in devices:
            for _ in range(args.repeat):
                for code in feed_codes(args):
                    run = feed_child(args, model_name, device, code)
                    runs.setdefault((model_name, device, code), []).append(run)
                    print(f"feed, {model_name} on {device}, {code}: central "
                          f"{1e3 * run['centre'] / run['rows']:.3f} ms/row, worker "
                          f"{1e3 * run['workers'] / run['rows']:.3f} ms/row", flush=True)
    return runs


def replica_run(store_path: str, replicas: int, epochs: int, batch_size: int,
                n_rows: int) -> dict:
    """Wall and CPU seconds of ``epochs`` epochs of the MLP's streamed training after one to
    warm up (run in a fresh process): by one central process fed by one worker process
    (``replicas`` 0), or by ``replicas`` replicas in as many worker processes, each taking
    ``batch_size // replicas`` rows of every step. The replicas' wall time is their epochs'
    (``seconds`` of the history): starting the process group and sending the model out, once
    a call, are left out; ``call`` is the whole call's."""
    from fgscale._dask.client import get_client
    from fgscale.grouping._dask_bank import load_bank
    from fgscale.training import LipschitzStep, StoreSource, fit
    from fgscale.training._loop import torch_threads
    from fgscale.training._models import build_model
    from fgscale.training._replicas import fit_replicas

    store = open_store(store_path)
    bank, info = load_bank(store_path, **BANK)
    k = int(info["n_clusters"])
    train, _ = feed_rows(n_rows)
    torch.manual_seed(0)
    model = build_model("mlp", store.n_features, len(store.classes))
    with get_client(n_workers=max(replicas, 1), processes=True) as client, \
            torch_threads(batch_size * k):
        source = StoreSource(client, store_path, n_clusters=k, bank_key=info["key"],
                             bank_at=info["location"], standardize=True, stats_rows=train,
                             lipschitz=not replicas)
        optimizer = make_optimizer(model, 0.0)
        bank_t = torch.as_tensor(bank)

        def epochs_from(start: int, stop: int) -> list[dict]:
            if replicas:
                return fit_replicas(client, source, model, train, replicas=replicas,
                                    batch_size=batch_size // replicas, max_epochs=stop,
                                    start_epoch=start, seed=0, n_groupings=len(bank),
                                    step_size=LipschitzStep())
            return fit(model, optimizer, max_epochs=stop, start_epoch=start, bank=bank_t,
                       step_size=LipschitzStep(),
                       epoch_batches=lambda e: source.batches(epoch_plan(
                           train, batch_size=batch_size, epoch=e, seed=0,
                           n_groupings=len(bank))))

        epochs_from(0, 1)
        before = cpu_now(client)
        history = epochs_from(1, 1 + epochs)
        after = cpu_now(client)
    spent = {key: after[key] - before[key] for key in before}
    wall = sum(h["seconds"] for h in history) if replicas else spent["wall"]
    return {**spent, "call": spent["wall"], "wall": wall, "rows": train.size * epochs}


def estimator_run(store_path: str, replicas: int, epochs: int, batch_size: int,
                  n_groupings: int) -> dict:
    """``epochs`` epochs of ``FeatureGroupingClassifier(model="mlp", replicas=replicas)``
    fitted on the store with 2 worker processes (run in a fresh process), after a fit of one
    epoch that warms up (the bank, the statistics, the cluster); each replica on ``batch_size
    // replicas`` rows of every step, no validation. Per epoch: the estimator's seconds
    (``history_``) and, with ``replicas > 1``, its ``ReplicaGroup.run_epoch`` (timed here by
    wrappers; the library is unchanged): the whole call, the replicas' own epoch (their
    history's ``seconds``), rank 0's weights brought back (``_fetch``) and starting the
    replicas (``_start``: the process group and the model out, at a phase's first epoch)."""
    from fgscale import FeatureGroupingClassifier
    from fgscale._dask.client import get_client
    from fgscale.training._replicas import ReplicaGroup

    calls: list[dict] = []
    timed: dict[str, list[float]] = {"_start": [], "_fetch": []}

    def timer(name, method):
        def timed_method(*args, **kwargs):
            start = time.perf_counter()
            out = method(*args, **kwargs)
            timed[name].append(time.perf_counter() - start)
            return out
        return timed_method

    def timed_run_epoch(self, epoch, **kwargs):
        marks, start = {name: len(v) for name, v in timed.items()}, time.perf_counter()
        history = run_epoch(self, epoch, **kwargs)
        calls.append({"call": time.perf_counter() - start, "replicas": history["seconds"],
                      **{name[1:]: sum(timed[name][marks[name]:]) for name in timed}})
        return history

    run_epoch = ReplicaGroup.run_epoch
    for name in timed:
        setattr(ReplicaGroup, name, timer(name, getattr(ReplicaGroup, name)))
    ReplicaGroup.run_epoch = timed_run_epoch
    store = open_store(store_path)
    params = dict(model="mlp", hidden_layer_sizes=(256,), n_clusters=BANK["n_clusters"],
                  n_groupings=n_groupings, n_bootstrap=BANK["n_bootstrap"],
                  random_state=BANK["seed"], early_stopping=False,
                  batch_size=batch_size // replicas, replicas=replicas)
    with get_client(n_workers=2, processes=True) as client:
        FeatureGroupingClassifier(**params, max_epochs=1).fit(store, client=client)
        calls.clear()
        before = cpu_now(client)
        clf = FeatureGroupingClassifier(**params, max_epochs=epochs).fit(store, client=client)
        after = cpu_now(client)
    spent = {key: after[key] - before[key] for key in before}
    seconds = [h["seconds"] for h in clf.history_]
    return {**spent, "fit": spent["wall"], "wall": sum(seconds), "epochs": seconds,
            "calls": calls, "rows": len(store.train_rows()) * len(seconds)}


def replica_runs(args) -> dict:
    """Every replica run (:func:`replica_run`, or :func:`estimator_run` with
    ``--through-estimator``, each in a fresh process), keyed by R (0: one central process),
    each a list over ``--repeat``, the settings alternating."""
    runs: dict = {}
    settings = args.replicas if args.through_estimator else [0, *args.replicas]
    for _ in range(args.repeat):
        for replicas in settings:
            cmd = [sys.executable, __file__, "--replica-child", str(replicas),
                   "--dir", str(args.dir), "--rows", str(args.rows), "--p", str(args.p),
                   "--batch-size", str(args.batch_size), "--feed-rows", str(args.feed_rows),
                   "--feed-epochs", str(args.feed_epochs), "--n-groupings",
                   str(args.n_groupings), *(["--through-estimator"] if args.through_estimator
                                            else [])]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            run = json.loads(out.strip().splitlines()[-1])
            runs.setdefault(replicas, []).append(run)
            print(f"{replica_name(replicas, args.through_estimator)}: "
                  f"{run['rows'] / run['wall']:.0f} samples/s", flush=True)
    return runs


def replica_name(replicas: int, estimator: bool = False) -> str:
    """A setting's name in the tables: R replicas, or one central process (``replicas`` 0, or
    1 through the estimator)."""
    if replicas == 0 or (estimator and replicas == 1):
        return "one centre"
    return f"{replicas} replica{'s' if replicas > 1 else ''}"


def replica_table(args, runs: dict) -> None:
    """Print the samples/s and CPU per row of each replica setting (medians, with ranges)."""
    train, _ = feed_rows(args.feed_rows)
    print(f"\nMLP, streamed, {args.feed_epochs} epochs of {train.size} rows after one to warm "
          f"up, batch {args.batch_size} per step, {os.cpu_count()} cores, {args.repeat} "
          "run(s) each (median [range])")
    markdown_table("training", "worker processes", "samples/s", "samples/s (whole call)",
                   "centre CPU ms/row", "workers CPU ms/row")
    for replicas, rs in sorted(runs.items()):
        markdown_row(replica_name(replicas), max(replicas, 1),
                     median_range([r["rows"] / r["wall"] for r in rs]),
                     median_range([r["rows"] / r["call"] for r in rs]),
                     median_range([r["centre"] / r["rows"] for r in rs], 1e3),
                     median_range([r["workers"] / r["rows"] for r in rs], 1e3))


def estimator_table(args, runs: dict) -> None:
    """Print, per R, the samples/s of the estimator's measured epochs and of its whole fit, and
    the median epoch's seconds: the estimator's, and of its ``ReplicaGroup.run_epoch`` the
    replicas' own epoch, rank 0's weights brought back, the rest (commands, waiting), the
    replicas' start (process group and model out, in the phase's first epoch only) and the
    share of the epoch that is not the replicas' own; with the CPU per row (medians over all
    the epochs of all the runs, ranges in brackets)."""
    print(f"\nThrough the estimator: FeatureGroupingClassifier(model='mlp', replicas=R), "
          f"{args.feed_epochs} epochs after a fit of one to warm up, batch {args.batch_size} per "
          f"step, 2 worker processes, {os.cpu_count()} cores, {args.repeat} run(s) each "
          "(median [range]); seconds per epoch")
    markdown_table("training", "R", "samples/s", "samples/s (whole fit)", "epoch s",
                   "replicas' own s", "weights back s", "rest s", "start s (first epoch)",
                   "not own / epoch", "centre CPU ms/row", "workers CPU ms/row")
    for replicas, rs in sorted(runs.items()):
        epochs = [s for r in rs for s in r["epochs"]]
        calls = [c for r in rs for c in r["calls"]]
        split = ([median_range([c["replicas"] for c in calls]),
                  median_range([c["fetch"] for c in calls]),
                  median_range([c["call"] - c["replicas"] - c["fetch"] - c["start"]
                                for c in calls]),
                  median_range([c["start"] for c in calls if c["start"]] or [0.0]),
                  median_range([(c["call"] - c["replicas"]) / s
                                for c, s in zip(calls, epochs, strict=True)])]
                 if calls else ["-"] * 5)
        markdown_row(replica_name(replicas, estimator=True), replicas,
                     median_range([r["rows"] / r["wall"] for r in rs]),
                     median_range([r["rows"] / r["fit"] for r in rs]),
                     median_range(epochs), *split,
                     median_range([r["centre"] / r["rows"] for r in rs], 1e3),
                     median_range([r["workers"] / r["rows"] for r in rs], 1e3))


def median_range(values: list[float], scale: float = 1.0) -> str:
    """The median of ``values`` times ``scale``, with their range when there are several."""
    values = sorted(scale * v for v in values)
    text = f"{statistics.median(values):.3f}"
    return text if len(values) == 1 else f"{text} ({values[0]:.3f}-{values[-1]:.3f})"


FEED_TOTALS = ("rest of the loop's thread", "the loop's thread", "other threads",
               "central process")
"""The rows of the phase table below the loop's phases: what no phase covers in the loop's
thread, that thread's CPU, the process's other threads (Dask's event loop receiving and
deserializing blocks, the scheduler; torch's pool), and the whole process."""


def feed_phases(run: dict) -> dict[str, float]:
    """A run's central CPU seconds per training row by phase (:data:`FEED_TOTALS`, with the
    loop's marked phases where the code has them)."""
    rows = run["rows"]
    phases = {"the loop's thread": run["loop"] / rows,
              "other threads": (run["centre"] - run["loop"]) / rows,
              "central process": run["centre"] / rows}
    if run["phases"] is not None:
        phases.update({name: seconds / rows for name, seconds in run["phases"].items()})
        phases["rest of the loop's thread"] = (run["loop"] - sum(run["phases"].values())) / rows
    return phases


def feed_table(args, runs: dict) -> None:
    """Print the feed ratio of every run, then the central CPU by phase, for each code
    (:func:`feed_codes`; medians over ``--repeat``, ranges in brackets)."""
    from fgscale.training._profile import PHASES

    train, val = feed_rows(args.feed_rows)
    print(f"\nWhere the central process's time goes: {os.cpu_count()} cores, one worker "
          f"process, batch {args.batch_size}, p = {args.p}, k = {BANK['n_clusters']:.0%}, "
          f"{args.feed_epochs} epochs of {train.size} rows after one to warm up, "
          f"{val.size} validation rows after each; CPU ms per training row; "
          f"median of {args.repeat} (range in brackets). Codes: " + ", ".join(
              f'"{code}", {FEED_CODES[code]}' for code in feed_codes(args)) + "\n")
    markdown_table("model", "centre on", "code", "central CPU (ms/row)", "worker CPU (ms/row)",
                   "feed ratio", "central + worker CPU (ms/row)", "scheduler CPU (ms/row)",
                   "samples/s")
    for (model_name, device, code), rs in runs.items():
        markdown_row(model_name, device, code,
                     median_range([r["centre"] / r["rows"] for r in rs], 1e3),
                     median_range([r["workers"] / r["rows"] for r in rs], 1e3),
                     median_range([r["workers"] / r["centre"] for r in rs]),
                     median_range([(r["centre"] + r["workers"]) / r["rows"] for r in rs], 1e3),
                     median_range([r["scheduler"] / r["rows"] for r in rs], 1e3)
                     if code == "scheduler apart" else "in the centre",
                     f"{statistics.median(r['rows'] / r['wall'] for r in rs):.0f}")
    codes = feed_codes(args)
    print("\nThe central CPU by phase, ms per training row (the loop's phases: CPU of its own "
          f"thread, each without the phases nested in it); after / {codes[0]}\n")
    markdown_table("model", "centre on", "phase", *codes, f"after / {codes[0]}")
    for model_name, device in dict.fromkeys((m, d) for m, d, _ in runs):
        phases = {code: [feed_phases(r) for r in runs[model_name, device, code]]
                  for code in codes}
        for name in [*PHASES, *FEED_TOTALS]:
            medians = {code: statistics.median(p[name] for p in phases[code])
                       for code in codes if name in phases[code][0]}
            cells = [median_range([p[name] for p in phases[code]], 1e3) if code in medians
                     else "-" for code in codes]
            first = medians.get(codes[0], 0.0)
            cells.append(f"{medians['after'] / first:.2f}" if first and "after" in medians
                         else "-")
            markdown_row(model_name, device, name, *cells)


def run_child(args, n_workers: int, n_rows: int, processes: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", str(n_rows), "--dir", str(args.dir),
           "--child-kind", "processes" if processes else "threads",
           "--rows", str(args.rows), "--p", str(args.p), "--n-workers", str(n_workers),
           "--memory-limit", args.memory_limit, "--batch-size", str(args.batch_size),
           "--prefetch", str(args.prefetch), "--central-threads", str(args.central_threads or 0),
           "--device", args.device]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def worker_counts(text: str) -> list[int]:
    counts = [int(v) for v in text.split(",")]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be positive integers, got {text!r}")
    return counts


def arguments() -> argparse.Namespace:
    """The command line's options (``--quick``: the smallest run, see :func:`benchlib.parse_args`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5600)
    parser.add_argument("--p", type=int, default=270_806)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/fgscale-bench"))
    parser.add_argument("--n-workers", type=worker_counts, default=[2],
                        help="worker counts, comma-separated (default 2): each runs with threads "
                             "and with processes, against as many threads reading")
    parser.add_argument("--kinds", type=comma_list, default=["threads", "processes"],
                        help="worker kinds of the streamed runs, comma-separated (default "
                             "threads,processes)")
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--prefetch", type=lambda v: v if v == "auto" else int(v), default="auto")
    parser.add_argument("--n-groupings", type=int, default=10)
    parser.add_argument("--central-threads", type=int, default=None,
                        help="torch threads of the central process (default: torch's)")
    parser.add_argument("--device", default="cpu", help="torch device of the central model")
    parser.add_argument("--feed", action="store_true",
                        help="measure where the central process's time goes only (the feed "
                             "ratio), not the streaming speeds and memory")
    parser.add_argument("--no-feed", action="store_true",
                        help="the streaming speeds and memory only, not the feed ratio")
    parser.add_argument("--feed-rows", type=int, default=1600,
                        help="the first rows of the store that the feed runs use (at most "
                             "--rows), a fifth of them for validation (default 1600)")
    parser.add_argument("--feed-epochs", type=int, default=3)
    parser.add_argument("--feed-models", type=comma_list, default=["logreg", "mlp"])
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a folder holding another checkout's fgscale/: each feed run is "
                             "made with it (before) and with this code (after), back to back")
    parser.add_argument("--feed-scheduler-apart", action="store_true",
                        help="also run this code with the Dask scheduler in a process of its "
                             "own, as in cluster/'s deployments")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each feed setting")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-kind", default="threads", help=argparse.SUPPRESS)
    parser.add_argument("--feed-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--feed-centre-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=worker_counts, default=None,
                        help="replica counts R, e.g. 1,2: only the replicas' runs (point 5)")
    parser.add_argument("--through-estimator", action="store_true",
                        help="with --replicas: fit the estimator with replicas=R instead "
                             "(R = 1: its one centre), its replicas kept for the whole fit")
    parser.add_argument("--replica-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parse_args(parser, quick=dict(rows=64, p=5_000, n_groupings=2, batch_size=16,
                                         feed_rows=64))
    args.feed_rows = min(args.feed_rows, args.rows)
    if args.feed and args.no_feed:
        parser.error("--feed and --no-feed: give one")
    if not args.kinds or set(args.kinds) - {"threads", "processes"}:
        parser.error(f"--kinds {','.join(args.kinds)}: expected threads, processes or both")
    if args.baseline is not None and not (args.baseline / "fgscale").is_dir():
        parser.error(f"--baseline {args.baseline}: no fgscale/ folder there")
    if args.through_estimator and not (args.replicas or args.replica_child is not None):
        parser.error("--through-estimator needs --replicas")
    return args


def prepare(args, store_path: Path):
    """The SYNTHETIC store (made, or reused if present) and its bank: the store and its size in
    GB."""
    args.dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    store = random_store(store_path, args.rows, args.p, generator="scripts/bench_stream.py")
    size_gb = store.n_samples * store.n_features * 4 / 1e9
    print(f"SYNTHETIC store {store_path}: {store.n_samples} x {store.n_features} float32 "
          f"({size_gb:.1f} GB), ready in {time.perf_counter() - t:.0f} s", flush=True)
    from fgscale._dask.client import get_client
    from fgscale.grouping._dask_bank import build_bank
    from fgscale.store import compute_stats
    with get_client(n_workers=min(args.n_workers)) as client:
        build_bank(store_path, n_groupings=args.n_groupings, **BANK, client=client,
                   progress=False)
        # the statistics the feed runs standardize with, saved in the store
        compute_stats(store_path, feed_rows(args.feed_rows)[0], client=client, progress=False)
    return store, size_gb


class Reads:
    """The reads of the store's n rows in this process that the streamed epochs are set
    against: by one thread (the raw reads), and by as many threads as each worker count (the
    read limits)."""

    def __init__(self, store, batch_size: int, n_workers: list[int]):
        self.store, self.n, self.n_workers = store, store.n_samples, n_workers
        n = self.n
        self.epoch = epoch_plan(np.arange(n), batch_size=batch_size, epoch=1, seed=0)
        self.shards = [np.arange(first, min(first + store.block_rows, n))
                       for first in range(0, n, store.block_rows)]

    def best_of(self, passes: int, read_all) -> float:
        """Rows/s of ``read_all()`` (which reads all n rows) in this process, best of ``passes``."""
        return self.n / best_time(read_all, passes)

    def sequential(self):  # what evaluation does: shard-aligned blocks, into recycled memory
        for _ in self.store.iter_blocks():
            pass

    def sequential_fresh(self):  # the same into a fresh array per block (np.empty)
        store, n = self.store, self.n
        for first in range(0, n, store.block_rows):
            store.read_rows(range(first, min(first + store.block_rows, n)))

    def batches(self):  # the rows of a training epoch, batch by batch in its order, not projected
        for rows in self.epoch.batches:
            self.store.read_rows(rows, out=POOL.empty((rows.size, self.store.n_features)))

    def read_limits(self, passes: int) -> dict[int, tuple[float, float]]:
        """Per worker count: rows/s of as many threads reading shard blocks / random batches."""
        return {w: (parallel_read(self.store, self.shards, w, passes),
                    parallel_read(self.store, list(self.epoch.batches), w, passes))
                for w in self.n_workers}

    def references(self) -> dict[str, float]:
        """Rows/s of the other reads of one thread, shown for reference: into fresh arrays, an
        epoch's batches, zarr's own reader and the shard files' bytes."""
        store, n = self.store, self.n
        rates = {"fresh": self.best_of(3, self.sequential_fresh),
                 "batches": self.best_of(3, self.batches)}
        start = time.perf_counter()  # zarr's own reader, for reference (not the limit)
        for first in range(0, n, store.block_rows):
            store.X[first:first + store.block_rows]
        rates["zarr"] = n / (time.perf_counter() - start)
        files = chunk_files(store.path / "X")
        # the bytes of the shard files, whole, with numpy.fromfile
        rates["file"] = self.best_of(3, lambda: [np.fromfile(f, np.uint8) for f in files])
        return rates


def streamed_runs(args, n: int) -> dict:
    """Two streamed epochs (:func:`two_epochs`, each in a fresh process) per worker count,
    kind of workers and number of rows, keyed so."""
    runs = {}
    for w in args.n_workers:
        for kind in args.kinds:
            # the n / 4 run (for the central memory) at the first count only
            for rows in (n, n // 4) if w == args.n_workers[0] else (n,):
                runs[w, kind, rows] = run_child(args, w, rows, kind == "processes")
                print(f"{w} worker {kind}, {rows} rows: {runs[w, kind, rows]['steady']:.0f} "
                      f"samples/s in the second epoch", flush=True)
    return runs


def memory_epoch(args, store, store_path: Path):
    """One FG epoch from rows already in memory (a quarter of the rows: they must fit in RAM),
    same steps: its samples/s, the bank, and the costs of the work (:func:`compute_costs`)."""
    from fgscale.grouping._dask_bank import load_bank

    n = store.n_samples
    bank, info = load_bank(store_path, **BANK)
    rows = np.arange(n // 4)
    X = store.read_rows(rows)
    y = store.y.astype(np.int64)
    torch.manual_seed(0)
    from fgscale.training._models import build_model

    model = build_model("logreg", store.n_features, len(store.classes)).to(args.device)
    opt = make_optimizer(model, 1e-3)
    plan = epoch_plan(rows, batch_size=args.batch_size, epoch=0, seed=0, n_groupings=len(bank))
    start = time.perf_counter()
    train_epoch(model, opt, MemorySource(X, y, bank).batches(plan),
                bank=torch.as_tensor(bank, device=args.device), device=args.device)
    synchronize(args.device)
    memory = rows.size / (time.perf_counter() - start)
    costs, text = compute_costs(store, bank, info, model, opt, plan, int(bank.max()) + 1,
                                args.device)
    return memory, bank, costs, text


def speed_table(args, store, n_bank: int, rates: dict, limits: dict, runs: dict, costs: dict,
                text: str) -> None:
    """Print the samples/s of every read and epoch against the read limits, one thread's
    sequential read (``rates["raw"]``) and the compute bound."""
    n, cores, raw = store.n_samples, os.cpu_count(), rates["raw"]
    print(f"\n{cores} cores, workers of {args.memory_limit} (processes), batch {args.batch_size}, "
          f"prefetch {args.prefetch}, bank of {n_bank}, p = {store.n_features}, "
          f"central model on {args.device}, central torch threads {torch.get_num_threads()}\n")
    print("The read limit of w threads: the rows read by w threads in parallel, the faster of "
          "shard-aligned blocks and an epoch's random batches (each thread into its own block).\n")
    markdown_table("what", "threads", "rows", "samples/s", "ratio to the read limit of as many "
                   "threads", "ratio to one thread's sequential read",
                   "ratio to the compute bound of as many cores")

    def line(what: str, threads: int | None, rows: int, rate: float) -> None:
        """``threads`` None: the central process's own threads (the bound of all the cores)."""
        limit = max(limits[threads]) if threads in limits else raw if threads == 1 else None
        markdown_row(what, threads or "-", rows, f"{rate:.0f}",
                     "-" if limit is None else f"{rate / limit:.2f}", f"{rate / raw:.2f}",
                     f"{rate / compute_bound(costs, threads or cores):.2f}")

    line("raw sequential read of the rows into recycled blocks, fgscale's reader", 1, n, raw)
    line("raw sequential read of the rows into fresh arrays, fgscale's reader", 1, n,
         rates["fresh"])
    line("raw read of an epoch's random batches into recycled blocks, fgscale's reader",
         1, n, rates["batches"])
    line("raw read of the shard files' bytes, numpy.fromfile (fresh arrays)", 1, n, rates["file"])
    line("raw sequential read of the rows, zarr's own `X[a:b]`", 1, n, rates["zarr"])
    line("in-memory FG epoch (rows preloaded)", None, n // 4, rates["memory"])
    for w in args.n_workers:
        line(f"read limit: shard blocks read by {w} threads", w, n, limits[w][0])
        line(f"read limit: random batches read by {w} threads", w, n, limits[w][1])
        for kind in args.kinds:
            for (count, kind_, rows), r in runs.items():
                if (count, kind_) == (w, kind):
                    line(f"streamed FG, {w} worker {kind}, first epoch", w, rows, r["first"])
                    line(f"streamed FG, {w} worker {kind}, second epoch", w, rows, r["steady"])
    line(f"compute bound: {cores} cores doing only the work, no overhead", cores, n // 4,
         compute_bound(costs, cores))
    print(f"\nCPU ms per row, measured one at a time in this process: {text}")


def memory_table(args, runs: dict, n: int, size_gb: float) -> None:
    """Print the central process's peak RSS of each run, and how it grows from n / 4 to n rows."""
    print()
    markdown_table("central process", "workers", "n rows", "peak RSS (MB)", "spilled keys",
                   "max in flight")
    for (w, kind, rows), r in sorted(runs.items()):
        limit = f"{w} x {args.memory_limit}" if kind == "processes" else "no limit"
        markdown_row("epoch over", f"{w} {kind} ({limit})", rows, f"{r['peak_rss_mb']:.0f}",
                     r["spilled_keys"], r["max_in_flight"])
    w = args.n_workers[0]
    for kind in args.kinds:
        ratio = runs[w, kind, n]["peak_rss_mb"] / runs[w, kind, n // 4]["peak_rss_mb"]
        print(f"\npeak RSS ratio 4n / n with {w} worker {kind}: {ratio:.3f}")
    print(f"store {size_gb:.1f} GB vs the worker processes' total limit "
          f"{w} x {args.memory_limit}")


def main() -> None:
    args = arguments()
    store_path = args.dir / f"stream_{args.rows}x{args.p}.zarr"
    if args.central_threads:
        torch.set_num_threads(args.central_threads)
    if args.child is not None:
        print(json.dumps(two_epochs(str(store_path), args.child, args.n_workers[0],
                                    args.memory_limit, args.batch_size, args.prefetch,
                                    args.child_kind == "processes", args.device)))
        return
    if args.feed_child is not None:
        print(json.dumps(feed_run(str(store_path), args.feed_child, args.device,
                                  args.feed_epochs, args.batch_size, args.feed_rows,
                                  args.feed_centre_only, args.feed_scheduler_apart)))
        return
    if args.replica_child is not None:
        print(json.dumps(estimator_run(str(store_path), args.replica_child, args.feed_epochs,
                                       args.batch_size, args.n_groupings)
                         if args.through_estimator else
                         replica_run(str(store_path), args.replica_child, args.feed_epochs,
                                     args.batch_size, args.feed_rows)))
        return

    store, size_gb = prepare(args, store_path)
    if args.replicas:
        runs = replica_runs(args)
        (estimator_table if args.through_estimator else replica_table)(args, runs)
        return
    if not args.feed:
        streaming(args, store, store_path, size_gb)
    if not args.no_feed:
        feed_table(args, feed_runs(args))


def streaming(args, store, store_path: Path, size_gb: float) -> None:
    """The streaming speeds against the read limits, and the central memory (points 1 to 3
    of the module's docstring)."""
    n = store.n_samples
    reads = Reads(store, args.batch_size, args.n_workers)
    # the limits: the best of passes before the epochs (which also warm the page cache) and
    # after them, so that a busy moment of the machine does not lower the bar
    raw = reads.best_of(3, reads.sequential)
    limits = reads.read_limits(3)
    runs = streamed_runs(args, n)
    raw = max(raw, reads.best_of(2, reads.sequential))
    limits = {w: tuple(map(max, before, after))
              for (w, before), after in zip(limits.items(), reads.read_limits(2).values(),
                                            strict=True)}
    rates = {"raw": raw, **reads.references()}
    rates["memory"], bank, costs, text = memory_epoch(args, store, store_path)
    speed_table(args, store, len(bank), rates, limits, runs, costs, text)
    memory_table(args, runs, n, size_gb)


if __name__ == "__main__":
    main()
