"""Progress bars that work in a terminal, a log file and Jupyter, with or without ipywidgets."""

from __future__ import annotations

import importlib.util

__all__ = ["tqdm"]

# tqdm.auto picks the notebook widget in Jupyter, and then warns (and draws nothing useful)
# when ipywidgets is missing: fall back to the text bar there (pip install fgscale[notebook]).
if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm
