"""What a command interrupted by Ctrl-C or SIGTERM does before it exits: zarr's reads and writes
in flight settled, one line saying what was kept and how to go on; and a signal that lands once
the command has returned, during the interpreter's clean-up, ends the process at once.

SIGTERM is how a batch scheduler stops a job (SLURM at its time limit or on ``scancel``,
Kubernetes on deleting a pod), a grace period before SIGKILL: its default action would end the
command where it stands, without a word in the job's log of what was kept and how to go on.

zarr runs its I/O as asyncio tasks on an event loop in a thread of its own. When Ctrl-C lands
while the main thread waits on one of them, the tasks go on; at exit zarr's own clean-up stops
that loop under them, and the interpreter prints what it finds half done ("Task was destroyed
but it is pending", or a traceback from closing a loop that still runs). A command that was
interrupted on purpose must end with its one-line message only.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import signal
import sys

__all__ = ["Terminated", "failed", "interrupted", "run_command", "settle_io"]

_KEPT_DEFAULT = "Nothing it wrote is half-written (files are renamed into place when complete)."
_KEPT = {  # what an interrupted command keeps, and how it goes on
    # interrupted while the mask is computed, there is no store yet: nothing to keep
    "convert": "The blocks converted so far, if any (none before the mask is computed), are "
               "kept in the store: run the same command again to convert the rest.",
    "bank": "The groupings built so far are kept in the store: run the same command again to "
            "build the rest.",
    "train": "The run folder keeps the checkpoint of the last finished epoch (before the first, "
             "no folder is left): run the same command with --resume to go on from there.",
    "cv": "With --out, its file keeps the folds finished so far: run the same command with "
          "--resume to train only the others.",
    "demo": "Finished steps are kept: run the same command again to go on.",
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt, so that every
    clean-up that Ctrl-C runs runs for it too."""


def _terminate(signum, frame) -> None:
    raise Terminated


def _stopped(exc: BaseException | None) -> tuple[str, int]:
    """How a command was stopped, in words, and its exit status: 128 + the signal's number."""
    return ("stopped by SIGTERM", 143) if isinstance(exc, Terminated) else ("interrupted", 130)


def interrupted(command: str, exc: KeyboardInterrupt | None = None) -> int:
    """Settle zarr's I/O (:func:`settle_io`), say on stderr what ``fgscale command`` kept and
    how to go on; return the exit status of an interrupted command: 130 after Ctrl-C, 143
    (128 + SIGTERM) after ``exc`` a :class:`Terminated`."""
    try:
        settle_io()
    except KeyboardInterrupt:  # a second signal: exit now, with the same message
        pass
    how, status = _stopped(exc)
    print(f"fgscale {command}: {how}. {_KEPT.get(command, _KEPT_DEFAULT)}", file=sys.stderr)
    return status


def failed(command: str, exc: Exception) -> int:
    """Say on stderr why ``fgscale command`` failed, in one line, and return its exit status,
    2; a joined cluster lost mid-job (:class:`fgscale._dask.joined.SchedulerLost`) also gets what
    the command kept and how to go on, as an interruption does."""
    from fgscale._dask.joined import SchedulerLost

    kept = f". {_KEPT.get(command, _KEPT_DEFAULT)}" if isinstance(exc, SchedulerLost) else ""
    print(f"fgscale {command}: error: {exc}{kept}", file=sys.stderr)
    return 2


def run_command(main) -> int:
    """Run the console command ``main()``, SIGTERM raising :class:`Terminated` in it, and
    return its exit status; from then on, Ctrl-C or SIGTERM ends the process at once with that
    status.

    Once the command has returned its work is written, but the interpreter's clean-up is still
    to come (zarr's event loop, Dask's threads): a Ctrl-C landing there would print "Exception
    ignored ... KeyboardInterrupt" and a traceback over a command that succeeded.
    """
    signal.signal(signal.SIGTERM, _terminate)
    sys.stdout = _PipeSafe(sys.stdout)
    # the last of the exit handlers (they run in reverse): past it the interpreter sets Python's
    # handlers back to the default action, and a Ctrl-C in its last clean-up (freeing modules,
    # half a second) would kill the process with 130 over a command that succeeded
    atexit.register(_ignore_signals)
    logging.getLogger("asyncio").addFilter(_gathers_left)
    logging.getLogger("tornado.application").addFilter(_sync_cancel_left)
    try:
        status = main()
    except KeyboardInterrupt as exc:  # before the command's own handler: parsing the arguments
        how, status = _stopped(exc)
        print(f"fgscale: {how}.", file=sys.stderr)
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, functools.partial(_exit_now, status))
    return status


def _gathers_left(record: logging.LogRecord) -> bool:
    """Whether asyncio's log record is worth showing: not "Task exception was never retrieved"
    of the tasks with which a ``distributed`` gather waits on each key, which end with its
    ``AllExit`` once the keys are released. distributed quiets that exception when the gather
    ends; a gather interrupted by Ctrl-C never collects it, and the garbage collector's report
    of it, a traceback, would come before the command's one line."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (type(exc).__name__ == "AllExit" and type(exc).__module__.startswith("distributed"))


def _sync_cancel_left(record: logging.LogRecord) -> bool:
    """Whether tornado's log record of a failed callback is worth showing: not the NameError of
    ``distributed.utils.sync``'s ``cancel``. When Ctrl-C lands before the coroutine that
    ``sync`` hands the event loop has started, ``sync`` schedules ``cancel``, which reads that
    coroutine's future before it is set; the traceback tornado logs of it would come before the
    command's one line. There is nothing to cancel then."""
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, NameError):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code if tb is not None else None
    return not (code is not None and code.co_name == "cancel"
                and os.path.join("distributed", "utils.py") in code.co_filename)


class _PipeSafe:
    """The command's standard output, where a reader that has gone (``fgscale runs | head -1``)
    makes the rest go to /dev/null rather than fail the command with "Broken pipe" after its
    work was done; the status stays the command's."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _call(self, method, *args):
        try:
            return getattr(self._stream, method)(*args)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # the buffer's rest, and the exit's flush
            os.close(devnull)
            return len(args[0]) if args else None

    def write(self, text):
        return self._call("write", text)

    def flush(self):
        return self._call("flush")


def _ignore_signals() -> None:
    """Ignore Ctrl-C and SIGTERM from now on: an ignored signal is left so at the interpreter's
    end, where a Python handler is set back to the default action."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def _exit_now(status: int, signum, frame) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say there
            pass
    os._exit(status)


def settle_io(timeout: float = 10.0) -> bool:
    """Cancel zarr's tasks in flight and wait until they have ended, at most ``timeout`` s.

    A write already handed to the file system ends there (a thread of zarr's executor), so a
    block may be written in part: the store's completion marks say which blocks are whole, and
    those of an interrupted block are not set. Does nothing when zarr was not imported or its
    loop is not running; imports nothing.

    Parameters
    ----------
    timeout : float, default=10.0

    Returns
    -------
    settled : bool
        False when zarr's loop still had tasks after ``timeout`` (or its layout was not the
        one expected): exit then prints what it prints.
    """
    loop = getattr(sys.modules.get("zarr.core.sync"), "loop", [None])[0]
    if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_closed() \
            or not loop.is_running():
        return True

    async def cancel_others():
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            return not pending
        return True

    try:
        return bool(asyncio.run_coroutine_threadsafe(cancel_others(), loop).result(timeout + 1))
    except Exception:  # noqa: BLE001 - a loop stopped meanwhile, or a timeout: exit as it is
        return False
