"""get_client and connect with real clusters, and the ready configurations under cluster/."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from distributed import Client
from helpers import dashboard_port_may_be_taken

from fgscale._dask.client import (
    ThreadTasks,
    connect,
    dashboard_link,
    deferred_cluster,
    get_client,
    run_tasks,
)

ROOT = Path(__file__).resolve().parents[1] / "cluster"


def _n_workers(client) -> int:
    return len(client.scheduler_info()["workers"])


def test_existing_client_is_yielded_and_left_open(client):
    with get_client(client=client) as c:
        assert c is client
    assert client.status == "running"
    assert client.submit(sum, [1, 2]).result() == 3


def test_the_active_client_is_used_when_none_is_given(client):
    with Client(client.scheduler.address) as active:  # made the default client, as in a notebook
        with get_client(processes=False) as c:
            assert c is active
            assert _n_workers(c) == 2  # the running cluster's, no new one started
        assert active.status == "running"


def test_join_by_address_and_by_scheduler_file(client, tmp_path):
    with connect(client.scheduler.address) as joined:
        assert joined is not client
        assert _n_workers(joined) == 2
        assert joined.submit(sum, [1, 2]).result() == 3
    assert joined.status == "closed"
    assert client.submit(sum, [2, 3]).result() == 5  # the cluster itself keeps running
    scheduler_file = tmp_path / "scheduler.json"
    # What `dask scheduler --scheduler-file` writes at start. Not client.write_scheduler_file:
    # once workers report metrics keyed by tuples, its json.dump fails (a Dask bug).
    scheduler_file.write_text(json.dumps({"type": "Scheduler",
                                          "address": client.scheduler.address}))
    with connect(scheduler_file=scheduler_file) as joined:
        assert joined.scheduler.address == client.scheduler.address


@pytest.mark.parametrize("dashboard", [True, False])
def test_a_joined_schedulers_link_is_printed_only_where_a_dashboard_answers(tmp_path, capsys,
                                                                          dashboard):
    """``dask scheduler --no-dashboard`` still names a dashboard port among its services and
    serves its health and metrics routes there, but no dashboard: no link for it. A scheduler
    with one gets its link, printed once for the client, however many calls use it."""
    import socket
    import time

    with socket.socket() as sock:  # a free port, for a scheduler of its own
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    scheduler_file = tmp_path / "scheduler.json"
    proc = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                             "--host", "127.0.0.1", "--scheduler-file", str(scheduler_file),
                             "--dashboard-address", f"127.0.0.1:{port}",
                             *([] if dashboard else ["--no-dashboard"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not scheduler_file.exists():  # however long a loaded machine takes to write it
            assert proc.poll() is None, f"the scheduler ended (status {proc.returncode})"
            time.sleep(0.1)
        with connect(scheduler_file=scheduler_file) as joined:
            with get_client(joined), get_client(joined):
                pass
            link = dashboard_link(joined)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    err = capsys.readouterr().err
    if dashboard:
        assert link == f"http://127.0.0.1:{port}/status"
        assert err.count("Dask dashboard: ") == 1 and f"Dask dashboard: {link}" in err
    else:
        assert link is None and "Dask dashboard" not in err


@dashboard_port_may_be_taken
def test_embedded_local_cluster_is_closed_on_exit():
    with get_client(n_workers=1, memory_limit="1GiB") as local:
        assert _n_workers(local) == 1
        info = local.scheduler_info()["workers"]
        assert [w["nthreads"] for w in info.values()] == [1]
        assert dashboard_link(local).startswith("http")
        cluster = local.cluster
        # Dask's MALLOC_TRIM_THRESHOLD_ (2x slower ReNA) is not exported to our workers.
        nanny = next(iter(cluster.workers.values()))
        assert "MALLOC_TRIM_THRESHOLD_" not in nanny.pre_spawn_env
    assert local.status == "closed"
    assert cluster.status.name == "closed"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
@dashboard_port_may_be_taken
def test_the_embedded_cluster_has_a_worker_per_core_this_process_may_use():
    # Narrowed to one core (as taskset or a SLURM allocation would) after the imports: the
    # count that sizes the conversion and the one that sizes the embedded cluster both say 1,
    # read when the cluster starts, not when dask was imported.
    code = (
        "import os\n"
        "import distributed\n"
        "from fgscale._dask.client import cpu_count, get_client\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "with get_client(processes=False) as c:\n"
        "    print(cpu_count(), len(c.scheduler_info()['workers']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]


@pytest.mark.parametrize("files, expected", [
    ({}, None),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
], ids=["no-cgroup", "v2-unlimited", "v2-1.5-cpus", "v1-unlimited", "v1-half-a-cpu"])
def test_cgroup_cpu_quota(tmp_path, files, expected):
    from fgscale._dask.cores import _cgroup_cpu_quota

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cgroup_cpu_quota(str(tmp_path)) == expected


@dashboard_port_may_be_taken
def test_the_dashboard_link_is_printed_once_per_client(client, capsys):
    with get_client(n_workers=1, processes=False) as local:
        with get_client(local), get_client(local):  # calls nest: train_run -> fit -> bank
            pass
        link = dashboard_link(local)  # where it listens: this machine only
    assert link.startswith("http://127.0.0.1:")
    err = capsys.readouterr().err
    assert err.count("Dask dashboard: ") == 1 and f"Dask dashboard: {link}" in err
    # a given client's link too, once (none when an earlier test printed it)
    with get_client(client), get_client(client):
        pass
    assert capsys.readouterr().err.count("Dask dashboard: ") <= 1
    with get_client(client):
        pass
    assert "Dask dashboard" not in capsys.readouterr().err


def test_a_taken_dashboard_port_is_no_warning_the_link_says_where(capsys):
    """With port 8787 taken (a notebook's cluster, another fgscale command), distributed warned
    in four lines, "Perhaps you already have a cluster running?", above the printed link: the
    link alone says where this cluster's dashboard is."""
    import socket
    import warnings

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError:  # taken already: what this test needs
        pass
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with get_client(n_workers=1, processes=False) as local:
                link = dashboard_link(local)
    finally:
        holder.close()
    assert not [w for w in caught if "already in use" in str(w.message)]
    assert ":8787/" not in link and f"Dask dashboard: {link}" in capsys.readouterr().err


def test_embedded_thread_workers_run_in_this_process():
    with get_client(n_workers=2, processes=False) as local:
        assert _n_workers(local) == 2
        assert set(local.run(os.getpid).values()) == {os.getpid()}
        assert local.submit(sum, [1, 2]).result() == 3
        # no memory limit of their own: they share the process with the model
        limits = [w["memory_limit"] for w in local.scheduler_info()["workers"].values()]
        assert limits == [0, 0]
    assert local.status == "closed"


def test_a_deferred_cluster_starts_with_its_first_use_and_serves_every_later_one(capsys):
    with deferred_cluster(n_workers=1, processes=False):
        assert "Dask dashboard" not in capsys.readouterr().err  # none started yet
        # its own settings win over the call's (1 thread worker, not 2 processes)
        with get_client(n_workers=2, processes=True) as first:
            assert _n_workers(first) == 1
            assert set(first.run(os.getpid).values()) == {os.getpid()}
        assert first.status == "running"  # still up for the next step
        with get_client(processes=False) as second:
            assert second is first
        assert capsys.readouterr().err.count("Dask dashboard") == 1  # one cluster, announced
        with deferred_cluster(n_workers=1):  # nested: a cluster of its own, never started
            pass
        with Client(first.cluster, set_as_default=True) as active, get_client() as found:
            assert found is active  # an active client still comes first
    assert first.status == "closed" and first.cluster.status.name == "closed"
    with deferred_cluster(n_workers=1):  # nothing used it: nothing to start or close
        pass
    with pytest.raises(ValueError, match="n_workers"):
        with deferred_cluster(n_workers=0):
            pass


def _square_or_fail(i, folder=None, barrier=None):
    if barrier is not None:
        barrier.wait(timeout=30)  # both threads at once: the tasks do run in parallel
    if i == 3:
        raise ValueError(f"task {i} failed")
    if folder is not None:  # the work a task keeps, as a conversion block writes its shard
        (Path(folder) / str(i)).write_text(str(i * i))
    return i * i


@pytest.mark.parametrize("kind", ["threads", "cluster"])
def test_run_tasks_keeps_every_result_then_raises_the_first_error(kind, client, tmp_path):
    """The same contract on ThreadTasks as on a Dask client: every other task finishes (its
    work is kept) before the first task error is raised, unchanged."""
    import threading

    runner = ThreadTasks(2) if kind == "threads" else client
    with pytest.raises(ValueError, match="task 3 failed"):
        run_tasks(runner, _square_or_fail, [(i, str(tmp_path)) for i in range(8)],
                  progress=False)
    assert sorted(int(f.name) for f in tmp_path.iterdir()) == [0, 1, 2, 4, 5, 6, 7]
    assert sorted(run_tasks(runner, _square_or_fail, [(i,) for i in (0, 1, 2)],
                            progress=False)) == [0, 1, 4]
    if kind == "threads":
        barrier = threading.Barrier(2)
        assert runner.nthreads() == {"this-process": 2}
        assert sorted(run_tasks(runner, _square_or_fail, [(1, None, barrier), (2, None, barrier)],
                                progress=False)) == [1, 4]
        with runner:
            pass
        with pytest.raises(RuntimeError, match="shutdown"):
            run_tasks(runner, _square_or_fail, [(0,)], progress=False)
    with pytest.raises(ValueError, match="n_threads must be a positive integer"):
        ThreadTasks(0)


def test_bad_arguments(client, tmp_path):
    with pytest.raises(ValueError, match="one of scheduler and scheduler_file"):
        with connect("tcp://127.0.0.1:1", scheduler_file=tmp_path / "s.json"):
            pass
    with pytest.raises(FileNotFoundError, match="no such scheduler file"):
        with connect(scheduler_file=tmp_path / "missing.json"):
            pass
    with pytest.raises(ValueError, match="n_workers must be a positive integer"):
        with get_client(n_workers=0):
            pass


def test_local_start_and_stop_scripts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", PORT="0", DASHBOARD="0",
               SCHEDULER_FILE=str(tmp_path / "scheduler.json"), LOG_DIR=str(tmp_path / "logs"))
    env.pop("DASK_CONFIG", None)
    subprocess.run([ROOT / "local" / "start.sh", "1", "1GiB"], env=env, check=True,
                   capture_output=True, timeout=60)
    try:
        with connect(scheduler_file=tmp_path / "scheduler.json") as joined:
            joined.wait_for_workers(1, timeout=30)
            assert joined.submit(sum, [1, 2]).result() == 3
            # os.getenv pickles by reference: these workers cannot import this test module.
            malloc = joined.run(partial(os.getenv, "MALLOC_TRIM_THRESHOLD_"))
            assert set(malloc.values()) == {None}
    finally:
        subprocess.run([ROOT / "local" / "stop.sh"], env=env, check=True, timeout=30)
    assert not (tmp_path / "scheduler.json").exists()


def test_local_start_refuses_a_running_cluster_and_a_scheduler_that_cannot_start(tmp_path):
    """start.sh run again over a running cluster, or on a port already taken: exit 1 with a
    message, nothing started, and stop.sh still stops the first cluster, leaving no process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "MALLOC_"))}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", PORT="0", DASHBOARD="0",
               SCHEDULER_FILE=str(tmp_path / "scheduler.json"), LOG_DIR=str(tmp_path / "logs"))
    start, stop = ROOT / "local" / "start.sh", ROOT / "local" / "stop.sh"
    first = subprocess.run([start, "1", "1GiB"], env=env, capture_output=True, text=True,
                           timeout=60)
    pids = {name: tmp_path / "logs" / f"{name}.pid" for name in ("scheduler", "workers")}
    recorded = {name: path.read_text() for name, path in pids.items()}
    try:
        assert first.returncode == 0, first.stderr
        address = json.loads((tmp_path / "scheduler.json").read_text())["address"]
        assert address in first.stdout  # the real address, not ":0"
        again = subprocess.run([start, "1", "1GiB"], env=env, capture_output=True, text=True,
                               timeout=60)
        assert again.returncode == 1
        assert "is running" in again.stderr and "stop.sh" in again.stderr
        assert {name: path.read_text() for name, path in pids.items()} == recorded
        assert json.loads((tmp_path / "scheduler.json").read_text())["address"] == address
        # another LOG_DIR, on the port the first scheduler holds
        taken = {**env, "PORT": address.rsplit(":", 1)[1], "LOG_DIR": str(tmp_path / "logs2"),
                 "SCHEDULER_FILE": str(tmp_path / "s2.json")}
        busy = subprocess.run([start, "1", "1GiB"], env=taken, capture_output=True, text=True,
                              timeout=60)
        assert busy.returncode == 1
        assert "scheduler did not start" in busy.stderr and "scheduler.log" in busy.stderr
        assert not (tmp_path / "logs2" / "workers.pid").exists()
        assert not (tmp_path / "logs2" / "scheduler.pid").exists()
    finally:
        subprocess.run([stop], env=env, check=True, timeout=60)
    # stop.sh returns once they have ended: the port is free for the next start.sh
    for pid in recorded.values():
        with pytest.raises(OSError):
            os.kill(int(pid), 0)


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dashboard_port_may_be_taken
def test_slurm_job_script():
    pytest.importorskip("dask_jobqueue")
    script = _load_script(ROOT / "slurm" / "slurm_cluster.py")
    with script.make_cluster(cores=4, memory="16GiB", walltime="01:30:00", partition="compute",
                             account="myproj", job_extra=["--qos=normal"]) as cluster:
        text = cluster.job_script()
    for line in ("#SBATCH -p compute", "#SBATCH -A myproj", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --mem=16G", "#SBATCH -t 01:30:00", "#SBATCH --qos=normal",
                 "#SBATCH -J fgscale-worker"):
        assert line in text.splitlines(), line
    assert "distributed.cli.dask_worker" in text
    assert "--nthreads 1" in text and "--nworkers 4" in text
    config = script.DASK_CONFIG / "fgscale.yaml"
    assert f"export DASK_CONFIG={script.DASK_CONFIG}" in text and config.is_file()
    yaml = pytest.importorskip("yaml")
    environ = yaml.safe_load(config.read_text())["distributed"]["nanny"]["pre-spawn-environ"]
    assert environ == {"MALLOC_TRIM_THRESHOLD_": None}


@dashboard_port_may_be_taken
def test_slurm_readme_names_the_script_options_and_python_is_one(capsys):
    """The README's table and the script's options are the same set, and the compute nodes'
    Python, which the README and the script's docstring say defaults to this interpreter, can
    be given (``--python``: there was no such option)."""
    pytest.importorskip("dask_jobqueue")
    import re

    script = _load_script(ROOT / "slurm" / "slurm_cluster.py")
    parser = script.build_parser()
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    table = set(re.findall(r"^\| `(--[a-z-]+)`", (ROOT / "slurm" / "README.md").read_text(), re.M))
    assert table == options - {"--help", "--print-job-script"}
    assert script.main(["--python", "/opt/env/bin/python", "--print-job-script"]) == 0
    assert "/opt/env/bin/python -m distributed.cli.dask_worker" in capsys.readouterr().out


def test_slurm_script_without_sbatch_says_so_and_leaves_nothing(tmp_path):
    """On a machine without SLURM, the script did not stop: it printed jobqueue's tracebacks,
    then 'submitted 1 job(s)', and waited for workers for ever. SLURM is hidden from it here
    (a PATH without sbatch), whether this machine has it or not."""
    pytest.importorskip("dask_jobqueue")
    path = os.pathsep.join(folder for folder in os.environ.get("PATH", "").split(os.pathsep)
                           if shutil.which("sbatch", path=folder) is None)
    proc = subprocess.run([sys.executable, ROOT / "slurm" / "slurm_cluster.py", "--jobs", "1",
                           "--scheduler-file", tmp_path / "sched.json"], cwd=tmp_path,
                          env={**os.environ, "PATH": path}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "slurm_cluster.py: error: sbatch not found on PATH: run this on a SLURM login node "
        "(--print-job-script shows the worker job script without SLURM)"]
    assert "submitted" not in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_slurm_script_stopped_by_sigterm_cancels_its_worker_jobs(tmp_path):
    """Run as a batch job of its own, the script stopped by SLURM (SIGTERM: its time limit,
    scancel) left its worker jobs queued or running; it now cancels them as Ctrl-C does. A
    fake sbatch and scancel on PATH stand for SLURM's."""
    import os
    import signal
    import time

    pytest.importorskip("dask_jobqueue")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    for name, reply in (("sbatch", "Submitted batch job 4242"), ("scancel", "")):
        tool = bin_dir / name
        # the reply first: the call is recorded as the tool ends
        tool.write_text(f"#!/bin/sh\necho {reply}\necho {name} \"$@\" >> {calls}\n")
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, ROOT / "slurm" / "slurm_cluster.py", "--jobs", "1",
                             "--scheduler-file", tmp_path / "sched.json"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = [proc.stdout.readline() for _ in range(2)]  # the scheduler, then "submitted"
        assert said[1].startswith("submitted 1 job(s)"), said
        while not (calls.exists() and any(
                line.startswith("sbatch /") for line in calls.read_text().splitlines())):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        time.sleep(2)  # for jobqueue to read the job id the submission printed
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "scancel 4242" in calls.read_text().splitlines(), err


def test_slurm_script_refused_by_sbatch_says_why_and_submits_nothing(tmp_path):
    """A job SLURM refuses (a partition that does not exist, an account without hours) made
    jobqueue log a traceback, the script say 'submitted 1 job(s)' and wait for workers for
    ever. The script now asks sbatch --test-only first and stops with its reason. A fake sbatch
    on PATH refuses as SLURM's does."""
    import os

    pytest.importorskip("dask_jobqueue")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho sbatch \"$@\" >> {calls}\n"
                      "echo 'sbatch: error: invalid partition specified: nope' >&2\nexit 1\n")
    sbatch.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, ROOT / "slurm" / "slurm_cluster.py", "--jobs", "1",
                           "--partition", "nope", "--scheduler-file", tmp_path / "sched.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "slurm_cluster.py: error: SLURM refuses the worker job (sbatch --test-only): sbatch: "
        "error: invalid partition specified: nope; --print-job-script shows it")
    assert "submitted" not in proc.stdout and "Traceback" not in proc.stderr
    assert [line.split()[:2] for line in calls.read_text().splitlines()] == [
        ["sbatch", "--test-only"]]
    assert not (tmp_path / "sched.json").exists()


def test_kubernetes_manifest():
    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all((ROOT / "kubernetes" / "dask-cluster.yaml").read_text())
            if d]
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "DaskCluster"]
    dask_cluster = docs[1]
    assert dask_cluster["apiVersion"] == "kubernetes.dask.org/v1"
    spec = dask_cluster["spec"]
    scheduler = spec["scheduler"]["spec"]["containers"][0]
    worker = spec["worker"]["spec"]["containers"][0]
    assert scheduler["args"][:2] == ["dask", "scheduler"]
    assert worker["args"][:2] == ["dask", "worker"]
    assert {p["port"] for p in spec["scheduler"]["service"]["ports"]} == {8786, 8787}
    assert spec["worker"]["replicas"] >= 1
    assert worker["resources"]["limits"]["memory"]
    claim = spec["worker"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == docs[0]["metadata"]["name"]


def test_readmes_exist():
    for name in ("local", "slurm", "kubernetes"):
        assert (ROOT / name / "README.md").stat().st_size > 200


_KIND = ("import logging, sys\n"
         "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
         "print('main module ran', flush=True)\n"
         "from fgscale._dask.client import get_client\n"
         "with get_client(n_workers={n}, processes='auto') as c:\n"
         "    print(sorted({{a.split('://')[0] for a in c.scheduler_info()['workers']}}))\n")


@pytest.mark.parametrize("n_workers, from_file, kind", [
    (4, False, "inproc"),  # threads up to 4 workers
    (5, False, "tcp"),  # processes beyond, from a program that spawn does not run again (-c)
    (5, True, "inproc"),  # a script: worker processes would run it again, unguarded
], ids=["4-workers", "5-workers", "5-workers-unguarded-script"])
def test_auto_worker_kind_by_worker_count_and_main_module(tmp_path, n_workers, from_file, kind):
    code = _KIND.format(n=n_workers)
    if from_file:
        (tmp_path / "fit.py").write_text(code)
    out = subprocess.run([sys.executable, *([str(tmp_path / "fit.py")] if from_file else
                                            ["-c", code])], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["main module ran", f"['{kind}']"]
    said = "5 worker threads, not processes: each worker process would run"
    assert (said in out.stderr) == from_file, out.stderr


def test_auto_worker_kind_of_the_command_line():
    from fgscale.cli import build_parser
    from fgscale.cli._options import worker_processes

    def kind(*options):
        return worker_processes(build_parser().parse_args(["train", "s.zarr", "--out", "o", *options]))

    assert [kind("--n-workers", str(n)) for n in (1, 4, 5, 16)] == [False, False, True, True]
    assert kind("--n-workers", "16", "--worker-threads") is False
    assert kind("--n-workers", "2", "--worker-processes") is True
    with pytest.raises(SystemExit):
        kind("--worker-threads", "--worker-processes")
    # evaluate reads full rows, which worker processes would send over a socket: threads
    evaluate = build_parser().parse_args(["evaluate", "run", "s.zarr", "--n-workers", "16"])
    assert worker_processes(evaluate, auto=False) is False
    evaluate.worker_kind = "processes"
    assert worker_processes(evaluate, auto=False) is True


@pytest.mark.parametrize("call", [partial(get_client, processes="yes"),
                                  partial(deferred_cluster, processes=None)])
def test_a_bad_worker_kind_is_refused(call):
    with pytest.raises(ValueError, match=r"^processes must be True, False or 'auto', got "):
        with call():
            pass


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_a_worker_kind_beside_a_scheduler_is_said_unused(kind):
    from fgscale.cli import build_parser
    from fgscale.cli._options import warn_unused_cluster_options

    args = build_parser().parse_args(["train", "s.zarr", "--out", "o", "--scheduler",
                                      "tcp://127.0.0.1:1", f"--worker-{kind}"])
    with pytest.warns(UserWarning, match=rf"^--worker-{kind} not used: a running scheduler"):
        warn_unused_cluster_options(args)
