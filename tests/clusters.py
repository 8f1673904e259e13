"""Real clusters for the tests, started from the command line as a user starts them: a one-node
SLURM (the ``slurm`` fixture), the worker jobs that ``cluster/slurm/slurm_cluster.py`` submits
to it, and a ``dask scheduler`` with ``dask worker`` processes. No LocalCluster anywhere.

The ``slurm`` fixture runs munged, slurmctld and slurmd from Debian's packages (``slurm-wlm``,
``munge``), each with files of its own in a temporary folder (configuration, ports, munge key
and socket, spool and state), so that a SLURM already set up on the machine is neither used
nor disturbed. Where the packages are missing it installs them with apt-get when the tests run
as root; elsewhere, or when apt-get or the daemons fail, the tests that use it are skipped
with the reason.

A test module that uses the fixture imports it (``from clusters import slurm_fixture``: it is
named ``slurm`` for the tests); tests/conftest.py puts this folder on sys.path.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

PACKAGES = ("slurm-wlm", "munge")
# the daemons, and the client commands that the tests and dask-jobqueue call
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
# where Debian puts them: a user's PATH often lacks the sbin folders
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin"])

# Every wait below is for a condition; these bound it, generously, for a loaded machine.
DAEMON_TIMEOUT = 60  # s, for the daemons to start and the node to be idle
WORKERS_TIMEOUT = 120  # s, for jobs to start and their workers to connect
JOB_TIMEOUT = 300  # s, for a command to end
APT_TIMEOUT = 180  # s, for each apt-get: three of them stay within pytest's timeout (600 s)

# A job that ended; any other state (PENDING, RUNNING, COMPLETING...) is still in the queue.
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE"}

# the environment of the clusters' processes: none of the caller's Dask settings
ENV = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}


def wait_for(condition, timeout: float, what: str, *, every: float = 0.1):
    """Poll ``condition()`` until it is true; fail the test if it is not within ``timeout``.

    Parameters
    ----------
    condition : callable
        Called without arguments, every ``every`` seconds.
    timeout : float
        Seconds to wait.
    what : str
        What was awaited, for the failure's message.
    every : float, default=0.1

    Returns
    -------
    value
        ``condition()``'s first true value.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s", pytrace=False)
        time.sleep(every)


def _tail(path: Path, lines: int = 5) -> str:
    """The last lines of a log, joined, for a message."""
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path.name})"


# ---------------------------------------------------------------------------------- SLURM


class Slurm:
    """A running one-node SLURM cluster of the test session's own.

    Parameters
    ----------
    folder : Path
        Its configuration, logs, spool and state.
    env : dict
        The environment of its client commands: ``SLURM_CONF`` names its configuration.
    """

    def __init__(self, folder: Path, env: dict):
        self.folder = folder
        self.env = env

    def command(self, *args: str) -> str:
        """Run a SLURM client command (``squeue``, ``scontrol``...) on this cluster; its stdout."""
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{shlex.join(args)}: {done.stderr.strip()}"
        return done.stdout

    def submit(self, argv: list, *, log: Path, cwd: Path, name: str) -> str:
        """Submit ``argv`` as a batch job whose one process it is (``exec``), so that the job's
        exit code is the command's; returns the job id."""
        wrap = "exec " + shlex.join([str(a) for a in argv])
        return self.command("sbatch", "--parsable", "--job-name", name, "--output", str(log),
                            "--chdir", str(cwd), "--wrap", wrap).strip().split(";")[0]

    def job(self, job_id: str) -> tuple[str, int]:
        """A job's state (``RUNNING``, ``CANCELLED``...) and the exit status of its command."""
        line = self.command("scontrol", "show", "job", "--oneliner", job_id)
        state = re.search(r"\bJobState=(\S+)", line).group(1)
        status = int(re.search(r"\bExitCode=(\d+):", line).group(1))
        return state, status

    def wait_until_ended(self, job_id: str, timeout: float = JOB_TIMEOUT) -> tuple[str, int]:
        """The state and exit status of a job, once it has ended."""
        return wait_for(lambda: (job := self.job(job_id))[0] in ENDED and job, timeout,
                        f"SLURM job {job_id} ended")


def _programs() -> dict[str, str] | None:
    """Where SLURM's and munge's programs are, or None if any is missing."""
    found = {name: shutil.which(name, path=SEARCH_PATH) for name in PROGRAMS}
    return None if None in found.values() else found


def _install() -> dict[str, str]:
    """SLURM's and munge's programs, installed with apt-get where they are missing; skips the
    test, saying why, where they cannot be."""
    found = _programs()
    if found is not None:
        return found
    why = f"SLURM is not installed ({' and '.join(PACKAGES)})"
    if shutil.which("apt-get") is None:
        pytest.skip(f"{why}, and there is no apt-get to install it")
    install = ["apt-get", "install", "--yes", "--quiet", "--no-install-recommends", *PACKAGES]
    done = _apt(install)
    if done.returncode != 0:  # a machine whose package lists are stale or were never fetched
        _apt(["apt-get", "update", "--quiet"])
        done = _apt(install)
    if done.returncode != 0:
        pytest.skip(f"{why}, and {shlex.join(install)} failed: "
                    f"{(done.stderr.strip().splitlines() or ['(no message)'])[-1]}")
    found = _programs()
    if found is None:
        pytest.skip(f"{why}: apt-get installed {' '.join(PACKAGES)}, yet "
                    f"{', '.join(p for p in PROGRAMS if not shutil.which(p, path=SEARCH_PATH))} "
                    "cannot be found")
    return found


def _apt(argv: list) -> subprocess.CompletedProcess:
    """apt-get, without questions; a run past APT_TIMEOUT counts as failed."""
    try:
        return subprocess.run(argv, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                              capture_output=True, text=True, timeout=APT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 1, "", f"no answer within {APT_TIMEOUT} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemTotal:"))


def _slurm_conf(folder: Path, host: str, munge_socket: Path) -> str:
    """A one-node cluster on free ports of this machine, every file in ``folder``.

    Its node declares 8 CPUs whatever this machine has (``config_overrides``: SLURM takes the
    configuration's word), so that the worker jobs and the job of the command that uses them
    run at once on a machine of 2 cores. Processes are tracked through their parents
    (``linuxproc``): no cgroup is needed, and a job's every process still gets its signals.
    """
    return "\n".join([
        "ClusterName=fgscale-tests",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}",
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        "ReturnToService=2",
        "MailProg=/bin/true",  # no mail is sent: quiets slurmctld's error of a missing one
        # SIGTERM, then SIGKILL this many seconds later, at a time limit or a scancel
        "KillWait=30",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory={_memory_mib()} State=UNKNOWN",
        "PartitionName=tests Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ""])


def _start_munged(folder: Path, munged: str) -> tuple[subprocess.Popen, Path]:
    """munged with a key and a socket of its own, once its socket is there."""
    key, run = folder / "munge", folder / "run"
    key.mkdir(mode=0o700)
    run.mkdir(mode=0o755)
    (key / "munge.key").write_bytes(os.urandom(1024))
    (key / "munge.key").chmod(0o400)
    munge_socket = run / "munge.socket"
    proc = subprocess.Popen([munged, "--foreground", f"--socket={munge_socket}",
                             f"--key-file={key / 'munge.key'}", f"--pid-file={run / 'munged.pid'}",
                             f"--seed-file={key / 'munged.seed'}",
                             f"--log-file={key / 'munged.log'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + DAEMON_TIMEOUT
    while not munge_socket.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.skip(f"munged did not start: {_tail(key / 'munged.log')}")
        time.sleep(0.05)
    return proc, munge_socket


def _start_daemon(folder: Path, argv: list) -> subprocess.Popen:
    """A daemon, its output to ``<name>.stderr``: what it says before its log file is open."""
    with open(folder / f"{Path(argv[0]).name}.stderr", "w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _said(folder: Path, name: str) -> str:
    """The last lines of a daemon's log, else of its output."""
    log = folder / f"{name}.log"
    return _tail(log if log.exists() else folder / f"{name}.stderr")


def _wait_until_idle(slurm: Slurm, host: str, daemons: dict[str, subprocess.Popen]) -> None:
    """Return once the node has registered and takes jobs; skip, saying why, if a daemon ends
    or it does not within DAEMON_TIMEOUT."""
    deadline = time.monotonic() + DAEMON_TIMEOUT
    while True:
        for name, proc in daemons.items():
            if proc.poll() is not None:
                pytest.skip(f"{name} ended (status {proc.returncode}): "
                            f"{_said(slurm.folder, name)}")
        done = subprocess.run(["sinfo", "--noheader", "--nodes", host, "--format", "%T"],
                              env=slurm.env, capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip() == "idle":
            return
        if time.monotonic() > deadline:
            pytest.skip(f"the SLURM node did not become idle within {DAEMON_TIMEOUT} s "
                        f"(sinfo: {(done.stdout + done.stderr).strip()!r}): "
                        f"{_said(slurm.folder, 'slurmd')}")
        time.sleep(0.1)


def _cancel_all(slurm: Slurm) -> None:
    """Cancel every job of the cluster and wait until none is left in the queue, so that no job
    outlives the daemons; within KillWait, its SIGTERM ends every process of a job."""
    subprocess.run(["scancel", "--user", "root"], env=slurm.env, capture_output=True,
                   timeout=60)
    deadline = time.monotonic() + DAEMON_TIMEOUT
    while time.monotonic() < deadline:
        done = subprocess.run(["squeue", "--noheader", "--format", "%i"], env=slurm.env,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or not done.stdout.split():
            return
        time.sleep(0.1)


def _stop_in_turn(procs, timeout: float) -> list[int]:
    """SIGTERM to each process in turn, as a batch scheduler stops them, and wait for it to end
    (SIGKILL after ``timeout`` s); their exit statuses."""
    statuses = []
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        statuses.append(proc.returncode)
    return statuses


@pytest.fixture(scope="session", name="slurm")
def slurm_fixture():
    """A one-node SLURM cluster (munged, slurmctld, slurmd) of the session's own, its node idle.

    Yields
    ------
    slurm : Slurm
        At the end of the session every job is cancelled and the daemons stopped.
    """
    if os.geteuid() != 0:  # slurmd starts every job as its user, which only root may do
        pytest.skip("a SLURM of the tests' own needs root (to install slurm-wlm and munge, and "
                    "for slurmd to start jobs): these tests do not run as root")
    programs = _install()
    # munged refuses a socket under a folder that others may not enter, as pytest's are
    folder = Path(tempfile.mkdtemp(prefix="fgscale-slurm-"))
    folder.chmod(0o755)
    host = socket.gethostname().split(".")[0]
    daemons: dict[str, subprocess.Popen] = {}
    slurm = None
    try:
        daemons["munged"], munge_socket = _start_munged(folder, programs["munged"])
        conf = folder / "slurm.conf"
        conf.write_text(_slurm_conf(folder, host, munge_socket))
        env = {**ENV, "SLURM_CONF": str(conf),
               "PATH": os.pathsep.join([os.environ.get("PATH", ""),
                                        str(Path(programs["sbatch"]).parent)])}
        slurm = Slurm(folder, env)
        # in the foreground (-D), so that they are our children: stopped by their process
        daemons["slurmctld"] = _start_daemon(folder, [programs["slurmctld"], "-D", "-i", "-f",
                                                      conf])
        daemons["slurmd"] = _start_daemon(folder, [programs["slurmd"], "-D", "-f", conf, "-N",
                                                   host])
        _wait_until_idle(slurm, host, daemons)
        yield slurm
    finally:
        try:
            if slurm is not None and len(daemons) == 3 and all(
                    proc.poll() is None for proc in daemons.values()):
                _cancel_all(slurm)
        finally:
            _stop_in_turn(list(daemons.values())[::-1], DAEMON_TIMEOUT)
            shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------- clusters on top of it


class _Cluster:
    """A Dask cluster started from the command line: its scheduler file, its processes (the
    scheduler's last), and the SLURM jobs of its workers (``job_ids``), if any."""

    def __init__(self, scheduler_file: Path, procs: list[subprocess.Popen]):
        self.scheduler_file = scheduler_file
        self.procs = procs
        self.job_ids: list[str] = []

    def wait_for_workers(self, n: int, what: str) -> dict:
        """Return once ``n`` workers are connected: their environment's ``SLURM_JOB_ID``, by
        worker address."""
        from distributed import Client

        with Client(scheduler_file=str(self.scheduler_file), timeout=WORKERS_TIMEOUT) as client:
            try:
                client.wait_for_workers(n, timeout=WORKERS_TIMEOUT)
            except TimeoutError:
                pytest.fail(f"{what}: {len(client.scheduler_info()['workers'])} of {n} workers "
                            f"connected within {WORKERS_TIMEOUT} s", pytrace=False)
            return client.run(os.getenv, "SLURM_JOB_ID")

    def stop(self) -> list[int]:
        """Stop its processes in turn (SIGTERM); their exit statuses. Workers go before their
        scheduler: left without it, a worker takes seconds to end."""
        return _stop_in_turn(self.procs, JOB_TIMEOUT)


def _start_scheduler(argv: list, scheduler_file: Path, log: Path, what: str,
                     env: dict = ENV) -> subprocess.Popen:
    """``argv``, a process that writes ``scheduler_file``, once it has written it."""
    scheduler_file.unlink(missing_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for(lambda: scheduler_file.exists() or proc.poll() is not None, WORKERS_TIMEOUT,
                 f"{what} wrote its scheduler file")
        assert proc.poll() is None, f"{what} ended (status {proc.returncode}): {_tail(log)}"
    except BaseException:
        _stop_in_turn([proc], JOB_TIMEOUT)
        raise
    return proc


@contextlib.contextmanager
def dask_command_line_cluster(folder: Path, n_workers: int = 2):
    """``dask scheduler`` and ``dask worker --nworkers n_workers`` run from ``folder`` as a user
    runs them, the workers connected.

    Yields
    ------
    cluster : _Cluster
        Its ``scheduler_file``, and ``stop()``. On exit, whatever is left of it is stopped.
    """
    folder.mkdir(parents=True, exist_ok=True)
    scheduler_file = folder / "scheduler.json"
    scheduler = _start_scheduler([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                  "--dashboard-address", ":0", "--scheduler-file", scheduler_file],
                                 scheduler_file, folder / "scheduler.log", "dask scheduler")
    cluster = _Cluster(scheduler_file, [scheduler])
    try:
        with open(folder / "worker.log", "w") as out:
            cluster.procs.insert(0, subprocess.Popen(
                [BIN / "dask", "worker", "--scheduler-file", scheduler_file, "--nworkers",
                 str(n_workers), "--nthreads", "1", "--memory-limit", "1GiB"],
                cwd=folder, env=ENV, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        cluster.wait_for_workers(n_workers, f"dask worker (log: {folder / 'worker.log'})")
        yield cluster
    finally:
        cluster.stop()


SLURM_CLUSTER = ROOT / "cluster" / "slurm" / "slurm_cluster.py"


@contextlib.contextmanager
def slurm_worker_jobs(slurm: Slurm, folder: Path, jobs: int = 2):
    """``cluster/slurm/slurm_cluster.py`` run from ``folder`` as on a login node, its ``jobs``
    worker jobs (one single-threaded worker each) running and their workers connected.

    Yields
    ------
    cluster : _Cluster
        Its ``scheduler_file``; ``job_ids``, the worker jobs; ``stop()``, SIGTERM to the script,
        as SLURM stops it at its time limit. On exit, whatever is left of it is stopped and its
        jobs cancelled.
    """
    folder.mkdir(parents=True, exist_ok=True)
    scheduler_file = folder / "scheduler.json"
    argv = [sys.executable, SLURM_CLUSTER, "--jobs", str(jobs), "--cores", "1", "--memory",
            "1GiB", "--walltime", "00:15:00", "--log-directory", folder / "logs",
            "--scheduler-file", scheduler_file]
    script = _start_scheduler(argv, scheduler_file, folder / "slurm_cluster.log",
                              "slurm_cluster.py", env=slurm.env)
    cluster = _Cluster(scheduler_file, [script])
    try:
        ids = cluster.wait_for_workers(jobs, "slurm_cluster.py's worker jobs "
                                             f"(logs: {folder / 'logs'})")
        cluster.job_ids = sorted(ids.values())
        yield cluster
    finally:
        cluster.stop()
        # the jobs of a script that failed, or was stopped before it could cancel them
        subprocess.run(["scancel", "--name", "fgscale-worker"], env=slurm.env, timeout=60)

