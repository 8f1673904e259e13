"""Zarr's reads and writes in flight, settled after Ctrl-C (fgscale.cli._interrupt), in real
processes: the interpreter then exits without printing what it found half done."""

import subprocess
import sys
import textwrap

import pytest

# Ctrl-C lands while the main thread waits on a write of 10,000 chunks, zarr's tasks in flight
_SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading
    import numpy as np, zarr
    from fgscale.cli._interrupt import settle_io

    a = zarr.create_array(sys.argv[1], shape=(1000, 1000), chunks=(10, 10), dtype="f4")
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        a[:] = np.ones((1000, 1000), "f4")
        print("finished")
    except KeyboardInterrupt:
        print("interrupted", settle_io() if sys.argv[2] == "settle" else "")
""")


def _run(tmp_path, mode):
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / f"{mode}.zarr"), mode],
                          capture_output=True, text=True, timeout=120)


def test_a_write_in_flight_at_ctrl_c_ends_before_the_interpreter(tmp_path):
    settled = _run(tmp_path, "settle")
    if settled.stdout.startswith("finished"):
        pytest.skip("the write ended before the interrupt landed")
    assert settled.returncode == 0, settled.stderr
    assert settled.stdout.split() == ["interrupted", "True"]
    assert settled.stderr == ""
    # without it, zarr's clean-up at exit finds its loop busy and says so
    plain = _run(tmp_path, "plain")
    if plain.stdout.startswith("interrupted"):
        assert "Traceback" in plain.stderr or "Task was destroyed" in plain.stderr


def test_nothing_to_settle():
    code = ("import sys; from fgscale.cli._interrupt import settle_io; "
            "print(settle_io(), 'zarr.core.sync' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"]  # without zarr loaded: nothing, no import
    code = ("import zarr; from fgscale.cli._interrupt import settle_io; "
            "print(settle_io(), zarr.core.sync.loop[0] is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"]  # zarr loaded, its loop never started


# The console command has returned (its work written); Ctrl-C lands during what comes after
_AFTER = textwrap.dedent("""
    import os, signal, sys, time
    from fgscale.cli import run

    sys.argv = ["fgscale", *sys.argv[1:]]
    status = run()
    print("returned", status, flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)
    print("not reached")
""")


@pytest.mark.parametrize("args,status", [([], 0), (["--version"], 0), (["train"], 2)])
def test_ctrl_c_after_the_command_returned_exits_at_once_with_its_status(args, status):
    """No command (help, returned by main), --version and a usage error (argparse's exit)."""
    done = subprocess.run([sys.executable, "-c", _AFTER, *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == status, done.stderr
    assert done.stdout.splitlines()[-1] == f"returned {status}"
    assert "not reached" not in done.stdout
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    if status == 0:
        assert done.stderr == ""


# the same, with the signal in the interpreter's last clean-up (a module's objects freed), past
# the point where it sets Python's handlers back to the default action
_AT_THE_END = textwrap.dedent("""
    import os, signal, sys, time
    from fgscale.cli import run

    class FreedLast:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            print("freed", flush=True)

    sys.argv = ["fgscale", *sys.argv[1:]]
    status = run()
    freed_last = FreedLast()
    sys.exit(status)
""")


@pytest.mark.parametrize("args,status", [([], 0), (["train"], 2)])
def test_ctrl_c_in_the_interpreters_last_clean_up_keeps_the_commands_status(args, status):
    """It killed the process with 130 (-2 here), which said a command that succeeded failed."""
    done = subprocess.run([sys.executable, "-c", _AT_THE_END, *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == status, done.stderr
    assert done.stdout.splitlines()[-1] == "freed"



# a distributed gather's waiting tasks, left with AllExit by a gather that Ctrl-C interrupted,
# then collected: asyncio logs "Task exception was never retrieved" and a traceback
_GATHER_LEFT = textwrap.dedent("""
    import asyncio, gc, logging, sys
    from distributed.client import AllExit
    from fgscale.cli._interrupt import run_command

    def command():
        async def wait():
            raise AllExit()
        async def other():
            raise ValueError("a real error")
        async def leave():
            for f in (wait, other):
                asyncio.get_running_loop().create_task(f())
            await asyncio.sleep(0.05)
        asyncio.run(leave())
        gc.collect()
        return 0

    logging.basicConfig()
    sys.exit(run_command(command) if sys.argv[1] == "cli" else command())
""")


@pytest.mark.parametrize("mode", ["cli", "bare"])
def test_the_tasks_an_interrupted_gather_leaves_are_not_reported(mode):
    """A Ctrl-C during a bank's gather printed asyncio's report of distributed's AllExit, a
    traceback, before the command's one line; an exception of any other kind left so is
    still reported."""
    done = subprocess.run([sys.executable, "-c", _GATHER_LEFT, mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ValueError: a real error" in done.stderr
    assert ("AllExit" in done.stderr) == (mode == "bare"), done.stderr


# distributed's sync() interrupted before the coroutine it hands the event loop has started:
# the cancel it schedules then reads an unset variable, and tornado logs the NameError
_SYNC_LEFT = textwrap.dedent("""
    import asyncio, logging, signal, sys, threading, time
    from distributed.utils import LoopRunner, sync
    from fgscale.cli._interrupt import run_command

    def in_sync_wait(tid):
        frame = sys._current_frames().get(tid)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "wait" and code.co_filename.endswith("distributed/utils.py"):
                return True
            frame = frame.f_back
        return False

    def command():
        runner = LoopRunner(asynchronous=False)
        runner.start()
        released = threading.Event()

        def hold():  # the loop busy until Ctrl-C has landed in sync's wait
            while not in_sync_wait(threading.main_thread().ident):
                time.sleep(0.01)
            # to the main thread: a signal that another thread takes would not wake its wait
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            released.wait(60)

        runner.loop.add_callback(hold)
        try:
            sync(runner.loop, asyncio.sleep, 5)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            released.set()
        runner.loop.add_callback(lambda: 1 / 0)
        ran = threading.Event()
        runner.loop.add_callback(ran.set)  # after the callbacks before it
        ran.wait(60)
        runner.stop()
        return 0

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background run ignores it
    logging.basicConfig()
    sys.exit(run_command(command) if sys.argv[1] == "cli" else command())
""")


@pytest.mark.parametrize("mode", ["cli", "bare"])
def test_a_sync_interrupted_before_its_coroutine_started_is_not_reported(mode):
    """A Ctrl-C during a bank printed tornado's traceback of distributed's sync() cancelling a
    future it had not yet set, before the command's one line; another callback's error is still
    reported."""
    done = subprocess.run([sys.executable, "-c", _SYNC_LEFT, mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "interrupted\n" and "ZeroDivisionError" in done.stderr
    assert ("NameError" in done.stderr) == (mode == "bare"), done.stderr


def test_a_reader_gone_before_the_output_does_not_fail_the_command(tmp_path):
    """``fgscale runs | head -1``, the pipe closed before the command writes: it ended with
    "error: [Errno 32] Broken pipe" and status 2 after its work was done."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "fgscale", "runs", str(tmp_path)],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == ""
    done = subprocess.run([sys.executable, "-m", "fgscale", "runs", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout == f"{tmp_path}: no run folder in it or below\n"
