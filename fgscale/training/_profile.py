"""Where the training loop's own thread spends its time, phase by phase, when asked.

The loop and the first layer mark their phases with :func:`phase`; nothing is measured unless a
:class:`Profile` is active (``with profiling() as profile:`` around a fit), and an inactive mark
costs one global lookup. Phases nest: time spent in an inner phase (the reduced weights, inside
the forward) is charged to it alone, so the phases of one thread never overlap and their sum is
at most the thread's time. CPU seconds are the calling thread's (``time.thread_time``): the
work of other threads (Dask's event loop receiving blocks, torch's intra-op pool) is not in
them, and a caller that wants it compares the process's CPU time with their sum
(``scripts/bench_stream.py`` does).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

__all__ = ["PHASES", "Profile", "phase", "profiling"]

PHASES = {
    "blocks": "waiting for the next block, and making it a batch",
    "to_device": "the batch as tensors on the model's device",
    "lipschitz": "the step size (power iterations) where the batch did not bring it",
    "reduce": "the grouping's reduced weights W0_hat = W0 Phi^T",
    "forward_backward": "the forward pass, the loss and the backward pass",
    "expand": "the reduced gradient expanded onto W0, one row at a time (the deferred step)",
    "step": "the optimizer's step of the other parameters, and the epoch's bookkeeping",
    "validation": "evaluating the validation rows after each epoch",
}
"""The phases the training loop marks, and what each covers."""


class Profile:
    """CPU and wall seconds of the marked phases of one thread, each exclusive of the phases
    nested in it.

    Attributes
    ----------
    cpu, wall : dict of str to float
        Seconds per phase name.
    calls : dict of str to int
        Times each phase was entered.
    """

    def __init__(self):
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self._stack: list[str] = []
        self._since = (0.0, 0.0)

    def _charge(self) -> None:
        """Charge the time since the last mark to the innermost open phase."""
        now = (time.thread_time(), time.perf_counter())
        if self._stack:
            name = self._stack[-1]
            self.cpu[name] = self.cpu.get(name, 0.0) + now[0] - self._since[0]
            self.wall[name] = self.wall.get(name, 0.0) + now[1] - self._since[1]
        self._since = now

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._charge()
        self._stack.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()


_ACTIVE: Profile | None = None
_OFF = nullcontext()


def phase(name: str):
    """A context that charges its time to phase ``name`` of the active profile; a no-op
    when none is active."""
    return _OFF if _ACTIVE is None else _ACTIVE.phase(name)


@contextmanager
def profiling(profile: Profile | None = None) -> Iterator[Profile]:
    """Activate ``profile`` (default a new one) for the marks of the training loop, and yield it.
    Marks are meant for one thread, the loop's: activate it there."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, profile or Profile()
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = previous
