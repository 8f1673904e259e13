"""Run fgscale's Dask workers as SLURM jobs (dask-jobqueue), from a login node.

This process hosts the Dask scheduler and submits the workers as SLURM batch jobs; it writes a
scheduler file that any ``fgscale`` command joins with ``--scheduler-file``. Keep it running
(``tmux``/``screen``, or inside its own small batch job) while the work runs; Ctrl-C cancels the
worker jobs, stops the scheduler and removes the scheduler file.

Examples
--------
Show the batch script each worker job will run, without submitting anything::

    python cluster/slurm/slurm_cluster.py --partition compute --print-job-script

Start 8 jobs of 4 single-threaded workers each (32 workers), then build a bank::

    python cluster/slurm/slurm_cluster.py --jobs 8 --cores 4 --memory 16GiB \\
        --walltime 02:00:00 --partition compute --scheduler-file ~/fgscale-scheduler.json
    fgscale bank /scratch/$USER/hcp.zarr --scheduler-file ~/fgscale-scheduler.json

Requires ``pip install 'fgscale[jobqueue]'`` (dask-jobqueue) on the login node, and fgscale in
the Python that the compute nodes run (``--python``, default this interpreter).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("fgscale._dask.client.slurm")

# fgscale's worker settings (see the file); the repository must be on the shared file system.
DASK_CONFIG = Path(__file__).resolve().parents[1] / "dask-config"


def make_cluster(*, cores: int = 4, memory: str = "16GiB", walltime: str = "02:00:00",
                 partition: str | None = None, account: str | None = None,
                 processes: int | None = None, local_directory: str | None = None,
                 log_directory: str | None = None, interface: str | None = None,
                 python: str | None = None, job_extra: list[str] | None = None):
    """A ``dask_jobqueue.SLURMCluster`` sized for fgscale (not scaled yet: no job submitted).

    Parameters
    ----------
    cores : int, default=4
        CPUs per job (``--cpus-per-task``). ReNA tasks are single-threaded, so each job runs
        ``processes`` workers of ``cores // processes`` threads.
    memory : str, default="16GiB"
        Memory per job (``--mem``), split evenly between its worker processes. One ReNA task at
        p = 270k and r = 50 needs about 1 GiB (the rows, the graph and the weights).
    walltime : str, default="02:00:00"
        Job time limit (``-t``); workers exit when it is reached, so give the whole build time.
    partition : str, optional
        SLURM partition (``-p``).
    account : str, optional
        SLURM account to charge (``-A``).
    processes : int, optional
        Worker processes per job; default ``cores`` (one thread each).
    local_directory : str, optional
        Node-local scratch for spilling (e.g. ``$TMPDIR`` or ``/tmp``).
    log_directory : str, optional
        Where SLURM writes the jobs' stdout/stderr.
    interface : str, optional
        Network interface the workers and scheduler listen on (e.g. ``ib0``).
    python : str, optional
        Python of the compute nodes; default this interpreter.
    job_extra : list of str, optional
        More ``#SBATCH`` options, e.g. ``["--qos=normal", "--constraint=skylake"]``.

    Returns
    -------
    cluster : dask_jobqueue.SLURMCluster
    """
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as exc:
        raise ImportError("this script needs dask-jobqueue: pip install 'fgscale[jobqueue]'"
                          ) from exc
    processes = cores if processes is None else processes
    return SLURMCluster(
        cores=cores, processes=processes, memory=memory, walltime=walltime, queue=partition,
        account=account, local_directory=local_directory, log_directory=log_directory,
        interface=interface, python=python or sys.executable,
        job_extra_directives=list(job_extra or []), job_name="fgscale-worker",
        job_script_prologue=[f"export DASK_CONFIG={DASK_CONFIG}"],
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="worker jobs to submit (default 1)")
    parser.add_argument("--cores", type=int, default=4, help="CPUs per job (default 4)")
    parser.add_argument("--memory", default="16GiB", help="memory per job (default 16GiB)")
    parser.add_argument("--walltime", default="02:00:00", help="per job (default 02:00:00)")
    parser.add_argument("--partition", default=None, help="SLURM partition")
    parser.add_argument("--account", default=None, help="SLURM account")
    parser.add_argument("--processes", type=int, default=None, help="workers per job (default: cores)")
    parser.add_argument("--local-directory", default=None, help="node-local scratch")
    parser.add_argument("--log-directory", default=None, help="folder for the jobs' logs")
    parser.add_argument("--interface", default=None, help="network interface, e.g. ib0")
    parser.add_argument("--job-extra", action="append", default=[], help="extra #SBATCH option")
    parser.add_argument("--python", default=None,
                        help="the compute nodes' Python, with fgscale (default: this interpreter)")
    parser.add_argument("--scheduler-file", default="fgscale-scheduler.json",
                        help="where to write the scheduler file (default ./fgscale-scheduler.json)")
    parser.add_argument("--print-job-script", action="store_true",
                        help="print the worker job script and exit (submits nothing)")
    return parser


def _refused(job_script: str) -> str | None:
    """SLURM's reason to refuse the worker job (a partition, account or limit it does not
    have), asked of ``sbatch --test-only``, which submits nothing; None if it would take it.
    A refusal met by jobqueue's own submission is only logged, and the script would wait for
    workers for ever."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as script:
        script.write(job_script)
        script.flush()
        done = subprocess.run(["sbatch", "--test-only", script.name], capture_output=True,
                              text=True)
    if done.returncode == 0:
        return None
    return " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.print_job_script and shutil.which("sbatch") is None:
        # dask-jobqueue would log the failed submission, and this script wait for ever
        print("slurm_cluster.py: error: sbatch not found on PATH: run this on a SLURM login "
              "node (--print-job-script shows the worker job script without SLURM)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with make_cluster(cores=args.cores, memory=args.memory, walltime=args.walltime,
                      partition=args.partition, account=args.account, processes=args.processes,
                      local_directory=args.local_directory, log_directory=args.log_directory,
                      interface=args.interface, python=args.python,
                      job_extra=args.job_extra) as cluster:
        if args.print_job_script:
            print(cluster.job_script())
            return 0
        refused = _refused(cluster.job_script())
        if refused is None:
            _serve(cluster, args)
    if refused is not None:  # said last, below the closing scheduler's log
        print(f"slurm_cluster.py: error: SLURM refuses the worker job (sbatch --test-only): "
              f"{refused}; --print-job-script shows it", file=sys.stderr)
        return 2
    return 0


def _serve(cluster, args) -> None:
    """Submit the worker jobs and keep the scheduler up until Ctrl-C, SIGTERM or SIGHUP; the
    scheduler file is removed then, and the worker jobs cancelled as the cluster closes."""
    from distributed import Client

    cluster.scale(jobs=args.jobs)
    with Client(cluster) as client:
        client.write_scheduler_file(args.scheduler_file)
        print(f"scheduler: {cluster.scheduler_address}  file: {args.scheduler_file}  "
              f"dashboard: {cluster.dashboard_link}")
        print(f"submitted {args.jobs} job(s); Ctrl-C to cancel them and stop the scheduler",
              flush=True)
        # run as a batch job, SLURM stops it with SIGTERM (time limit, scancel); a closed
        # login session sends SIGHUP: either cancels the worker jobs, as Ctrl-C does
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _interrupt)
        try:
            while True:
                time.sleep(60)
                log.info("%d workers connected", len(client.scheduler_info()["workers"]))
        except KeyboardInterrupt:
            pass
        finally:
            # as `dask scheduler` removes its own: a command started after this one would
            # otherwise try the address of a scheduler gone, and fail after --timeout
            Path(args.scheduler_file).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
