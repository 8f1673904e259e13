"""fgscale on clusters of batch jobs, for real: the worker jobs that
``cluster/slurm/slurm_cluster.py`` submits to a one-node SLURM of real daemons, and a ``dask
scheduler`` with ``dask worker`` started from the command line (no LocalCluster in either).

On each, ``fgscale bank`` and ``fgscale train --scheduler-file`` run; a training stopped as a
batch scheduler stops a job (SIGTERM to every process of it) ends with its one line and exit
status 143; on a new cluster, ``--resume`` ends with the weights of an uninterrupted run.

SLURM stops the training job with ``scancel``, which it carries out as it carries out a time
limit (SIGTERM to every process of the job, SIGKILL ``KillWait`` s later); a real time limit is
a minute at the least, and SLURM enforces it up to 30 s late.
"""

import contextlib
import os
import signal
import subprocess
import sys
from functools import partial

import numpy as np
from clusters import (  # noqa: F401 (slurm_fixture: the fixture `slurm`)
    JOB_TIMEOUT,
    dask_command_line_cluster,
    slurm_fixture,
    slurm_worker_jobs,
    wait_for,
)
from helpers import TOLERANCE, synthetic_store

K = 60  # of the store's 605 voxels
BANK = ["--n-groupings", "4", "--n-bootstrap", "8", "--n-clusters", str(K), "--seed", "3"]
# enough epochs that the training is still running when it is stopped after its second
EPOCHS = 40
TRAIN = [*BANK, "--batch-size", "4", "--max-epochs", str(EPOCHS), "--early-stopping", "false",
         "--patience", str(EPOCHS), "--device", "cpu"]
STOPPED = ("fgscale train: stopped by SIGTERM. The run folder keeps the checkpoint of the last "
           "finished epoch (before the first, no folder is left): run the same command with "
           "--resume to go on from there.")


class _SlurmJobs:
    """Commands run as SLURM batch jobs (``sbatch --wrap``), stopped with ``scancel``."""

    def __init__(self, slurm_cluster):
        self.slurm = slurm_cluster

    def start(self, argv, log):
        return self.slurm.submit(argv, log=log, cwd=log.parent, name="fgscale")

    def running(self, job):
        return self.slurm.job(job)[0] in {"PENDING", "CONFIGURING", "RUNNING"}

    def stop(self, job):
        self.slurm.command("scancel", job)

    def wait(self, job):
        """The command's exit status; the job's state agrees with it."""
        state, status = self.slurm.wait_until_ended(job)
        assert state == {0: "COMPLETED", 143: "CANCELLED"}.get(status), (state, status)
        return status


class _Processes:
    """Commands run as processes of their own session, stopped with SIGTERM to all of it."""

    def start(self, argv, log):
        with open(log, "w") as out:
            return subprocess.Popen(argv, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def running(self, proc):
        return proc.poll() is None

    def stop(self, proc):
        os.killpg(proc.pid, signal.SIGTERM)

    def wait(self, proc):
        try:
            return proc.wait(timeout=JOB_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _start(jobs, argv, scheduler_file, log):
    """Start ``fgscale argv`` on the cluster of ``scheduler_file``, as ``jobs`` runs a command."""
    return jobs.start([sys.executable, "-m", "fgscale", *map(str, argv), "--no-progress",
                       "--scheduler-file", scheduler_file], log)


def _finished(jobs, job, log) -> str:
    """Wait for a command to end: exit status 0; its output."""
    status = jobs.wait(job)
    assert status == 0, f"{log.name}: exit status {status}: {log.read_text()}"
    return log.read_text()


def _epochs(run) -> int:
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def _bank_train_stop_resume(tmp_path, start_cluster, jobs) -> None:
    """On a cluster: a bank, then two trainings alongside, one uninterrupted and one stopped
    by SIGTERM after its second epoch; on a new cluster, the stopped one resumed ends with the
    uninterrupted one's weights."""
    from fgscale.grouping import load_bank, make_bank

    split = np.where(np.arange(40) % 5 == 0, "test", "train")
    store = synthetic_store(tmp_path / "s.zarr", 40, 4, n_subjects=5, seed=0, split=split,
                            block_rows=8)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    logs = {name: tmp_path / f"{name}.log" for name in ("bank", "whole", "stopped", "resumed")}
    with start_cluster(tmp_path / "first") as cluster:
        start = partial(_start, jobs, scheduler_file=cluster.scheduler_file)
        out = _finished(jobs, start(["bank", store.path, *BANK], log=logs["bank"]), logs["bank"])
        assert "4 groupings built, 0 reused" in out, out
        labels, _ = load_bank(store.path, n_clusters=K, n_bootstrap=8, seed=3)
        np.testing.assert_array_equal(labels, make_bank(
            store.X[:], store.mask, K, n_groupings=4, n_bootstrap=8, rows=store.train_rows(),
            seed=3))

        whole_job = start(["train", store.path, "--out", whole, *TRAIN], log=logs["whole"])
        job = start(["train", store.path, "--out", stopped, *TRAIN], log=logs["stopped"])
        wait_for(lambda: _epochs(stopped) >= 2 or not jobs.running(job), JOB_TIMEOUT,
                 "the training to be stopped finished its second epoch")
        assert jobs.running(job), f"it ended before it was stopped: {logs['stopped'].read_text()}"
        jobs.stop(job)
        status = jobs.wait(job)
        out = _finished(jobs, whole_job, logs["whole"])
        assert f"for {EPOCHS} epochs" in out, out
    said = logs["stopped"].read_text()
    assert status == 143, f"exit status {status}: {said}"
    assert "Traceback" not in said, said
    assert [line for line in said.splitlines() if line.startswith("fgscale")] == [STOPPED], said
    assert 2 <= _epochs(stopped) < EPOCHS, "the training was not stopped mid-way"
    assert not (stopped / "final.json").exists()

    with start_cluster(tmp_path / "second") as cluster:
        job = _start(jobs, ["train", store.path, "--out", stopped, *TRAIN, "--resume"],
                     cluster.scheduler_file, logs["resumed"])
        out = _finished(jobs, job, logs["resumed"])
    assert f"for {EPOCHS} epochs" in out, out
    assert _epochs(stopped) == EPOCHS
    with np.load(whole / "model.npz") as a, np.load(stopped / "model.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_allclose(b[name], a[name], err_msg=name, **TOLERANCE["cpu"])


def test_slurm_worker_jobs_run_bank_and_train_and_a_cancelled_train_job_resumes(slurm, tmp_path):
    """The worker jobs of slurm_cluster.py serve the commands, each run as a SLURM job of its
    own; the script stopped by SIGTERM (as at its time limit) cancels its worker jobs."""

    @contextlib.contextmanager
    def worker_jobs(folder):
        with slurm_worker_jobs(slurm, folder) as cluster:
            # the connected workers are those of two jobs that SLURM runs
            assert len(cluster.job_ids) == 2, cluster.job_ids
            assert {slurm.job(job)[0] for job in cluster.job_ids} == {"RUNNING"}
            yield cluster
            assert cluster.stop() == [0]
            assert {slurm.wait_until_ended(job)[0] for job in cluster.job_ids} == {"CANCELLED"}
            assert not cluster.scheduler_file.exists()  # no address left to a scheduler gone

    _bank_train_stop_resume(tmp_path, worker_jobs, _SlurmJobs(slurm))


def test_dask_command_line_cluster_runs_bank_and_train_and_a_stopped_train_resumes(tmp_path):
    """The same on ``dask scheduler`` and ``dask worker`` processes, the commands run as
    processes of their own stopped as a batch scheduler stops a job (SIGTERM to all of it)."""
    _bank_train_stop_resume(tmp_path, dask_command_line_cluster, _Processes())
