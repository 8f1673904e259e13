"""Checkers of the values that several layers take (worker and thread counts, the number of
clusters, the prefetch window): each concept checked by one function, with one message style,
``"<name> must be <what the constraint describes>, got <value>"``. The estimators check their
parameters against their table (:mod:`fgscale.estimators._params`) with the same constraints;
the library functions below them call these.
"""

from __future__ import annotations

import numbers

from fgscale._utils.constraints import Fraction, Interval, InvalidParameterError, Options, Union

__all__ = ["COUNT", "PREFETCH", "check_count", "check_prefetch", "check_processes",
           "check_value", "resolve_n_clusters"]



class _Count(Interval):
    """An int >= 1, said as a count is."""

    def __init__(self):
        super().__init__(int, 1, None)

    def describe(self):
        return "a positive integer"


COUNT = _Count()
PREFETCH = Union(Options("auto"), Interval(int, 1, None))


def check_value(name: str, value, constraint):
    """``value`` itself, or an :class:`InvalidParameterError` (a ValueError) naming ``name``
    and what ``constraint`` expects."""
    try:  # the constraint's own check, with its hint for a likely slip (5.0 for 5 clusters)
        return constraint.check(value)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{name} must be {exc}, got {value!r}") from None


def check_count(name: str, value) -> int:
    """A positive integer (a worker, thread, row or grouping count), as int."""
    return int(check_value(name, value, COUNT))


def check_prefetch(prefetch):
    """The prefetch window: ``"auto"`` or a positive int (as int)."""
    check_value("prefetch", prefetch, PREFETCH)
    return prefetch if isinstance(prefetch, str) else int(prefetch)


def check_processes(value):
    """A worker kind: True (processes), False (threads) or ``"auto"``."""
    if not (isinstance(value, bool) or value == "auto"):
        raise InvalidParameterError(f"processes must be True, False or 'auto', got {value!r}")
    return value


def resolve_n_clusters(n_clusters, n_features: int) -> int:
    """k as a count, from an int in [1, n_features] or a float in (0, 1) taken as a fraction of
    the ``n_features`` features.

    A fraction gives at least 2 clusters (or p, when p < 2): a single cluster would average
    every feature into one value, leaving nothing to tell classes apart.
    """
    check_value("n_clusters", n_clusters, Fraction())
    if isinstance(n_clusters, numbers.Integral):
        k = int(n_clusters)
    else:
        k = max(min(2, n_features), int(round(n_clusters * n_features)))
    if k > n_features:
        raise InvalidParameterError(f"n_clusters must be at most the number of features, "
                                    f"{n_features}, got {n_clusters!r}")
    return k
