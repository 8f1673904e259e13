"""The ``fgscale`` command line (:func:`main`, and :func:`run` behind the installed command).

The library never imports this package: it calls the library's public functions and decides
what is printed.
"""

from fgscale.cli._main import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
