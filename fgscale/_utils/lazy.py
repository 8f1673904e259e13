"""Packages whose public names are imported on first use, so that importing one of their light
modules (the parameter table, the run listing) does not import torch through the package."""

from __future__ import annotations

import importlib

__all__ = ["lazy_names"]


def lazy_names(package: str, exports: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for ``package``, whose names ``exports`` maps to the
    private module (of the package) that defines each.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    exports : dict of str to str
        Public name -> module name within the package, such as ``"_train"``.

    Returns
    -------
    __getattr__, __dir__ : callables
    """

    def __getattr__(name):
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(exports)

    return __getattr__, __dir__
