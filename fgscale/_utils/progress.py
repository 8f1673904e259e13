"""Progress bars that work in a terminal, a log file and Jupyter, with or without ipywidgets."""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import sys

__all__ = ["bar_prefix", "tqdm"]

# tqdm.auto picks the notebook widget in Jupyter, and then warns (and draws nothing useful)
# when ipywidgets is missing: fall back to the text bar there (pip install fgscale[notebook]).
if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm as _tqdm
else:
    from tqdm.std import tqdm as _tqdm

LOG_INTERVAL = 30.0  # seconds between a bar's updates in a log file
_PREFIX = contextvars.ContextVar("fgscale_bar_prefix", default="")


@contextlib.contextmanager
def bar_prefix(prefix: str):
    """Name every bar drawn inside with ``prefix`` first ("fold 2/5: epochs"): the bars of a
    cross-validation's folds (their statistics, bank, epochs, predictions) told apart."""
    token = _PREFIX.set(prefix)
    try:
        yield
    finally:
        _PREFIX.reset(token)


def tqdm(*args, **kwargs):
    """A progress bar (tqdm's arguments). Written to a file rather than a terminal or a notebook
    (a batch job's log), it is redrawn every :data:`LOG_INTERVAL` seconds at most, not ten
    times a second: a log then holds a line of progress now and then, not megabytes of it."""
    stream = kwargs.get("file") or sys.stderr
    if _PREFIX.get():
        kwargs["desc"] = f"{_PREFIX.get()}: {kwargs.get('desc') or ''}".rstrip(": ")
    try:
        interactive = stream.isatty() or "ipykernel" in sys.modules
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        interactive = False
    if not interactive:
        kwargs.setdefault("mininterval", LOG_INTERVAL)
        kwargs.setdefault("maxinterval", LOG_INTERVAL)  # else tqdm's monitor redraws after 10 s
        kwargs["file"] = _Lines(stream)
    return _tqdm(*args, **kwargs)


class _Lines:
    """A log file as a bar's stream: each drawing on a line of its own. tqdm redraws in place
    with a carriage return, which a terminal honours; in a file, ``tail -f``, ``grep`` and
    editors would see one line holding every update, and any warning glued to it."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()  # the padding that overwrites a longer drawing
        if line:  # not the bare line end tqdm writes on closing
            self._stream.write(line + "\n")

    def __getattr__(self, name):  # flush, encoding...: the stream's own
        return getattr(self._stream, name)
