"""What values a parameter of the estimators takes: the constraints of the table in
:mod:`fgscale.estimators._params`, each able to check a value, say what it expects (in the style of
scikit-learn's messages) and read a command-line string. Imports nothing heavy (torch only
inside :func:`check_device`).
"""

from __future__ import annotations

import numbers
import os

import numpy as np

__all__ = ["Bool", "ClassWeight", "Constraint", "CrossValidation", "Device", "Fraction", "Interval",
           "InvalidParameterError", "Mask", "Nothing", "Options", "RandomState", "Scoring",
           "Searchable", "Sizes", "Union", "check_device"]


class InvalidParameterError(ValueError):
    """A parameter value outside its constraint (a ValueError, as in scikit-learn)."""


class Constraint:
    """What values a parameter takes: ``check`` returns the value or raises, ``describe`` says
    what is expected, ``hint`` what a refused value was likely meant to be, ``parse`` reads a
    command-line string."""

    def check(self, value):
        if not self.accepts(value):
            hint = self.hint(value)
            raise InvalidParameterError(self.describe() + (f": {hint}" if hint else ""))
        return value

    def accepts(self, value) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def hint(self, value) -> str:
        """What the refused ``value`` was likely meant as, said after :meth:`describe` (the
        estimator's error and the command line's alike), or "" where nothing more is known."""
        return ""

    def parse(self, text: str):
        return text


class Options(Constraint):
    """A str among ``choices``; ``hints`` maps a refused str (another library's value) to what
    to give instead."""

    def __init__(self, *choices, hints: dict | None = None):
        self.choices, self.hints = choices, hints or {}

    def accepts(self, value):
        return isinstance(value, str) and value in self.choices

    def describe(self):
        return "a str among " + ", ".join(repr(c) for c in self.choices)

    def hint(self, value):
        return self.hints.get(value, "") if isinstance(value, str) else ""


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Interval(Constraint):
    """A number in ``[low, high]``; ``closed`` says which ends belong to it."""

    def __init__(self, kind: type, low=None, high=None, closed: str = "both"):
        self.kind, self.low, self.high, self.closed = kind, low, high, closed

    def accepts(self, value):
        if not (_is_int(value) if self.kind is int else _is_real(value)):
            return False
        if not np.isfinite(value):
            return False
        left_open = self.closed in ("right", "neither")
        right_open = self.closed in ("left", "neither")
        if self.low is not None and (value < self.low or (left_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (right_open and value == self.high))

    def describe(self):
        left = "(" if self.closed in ("right", "neither") or self.low is None else "["
        right = ")" if self.closed in ("left", "neither") or self.high is None else "]"
        low = "-inf" if self.low is None else self.low
        high = "inf" if self.high is None else self.high
        return f"{'an int' if self.kind is int else 'a float'} in the range {left}{low}, {high}{right}"

    def parse(self, text):
        return self.kind(text)


class Union(Constraint):
    def __init__(self, *options: Constraint):
        self.options = options

    def accepts(self, value):
        return any(o.accepts(value) for o in self.options)

    def describe(self):
        return " or ".join(o.describe() for o in self.options)

    def hint(self, value):
        return next((h for h in (o.hint(value) for o in self.options) if h), "")

    def parse(self, text):
        for option in self.options:
            try:
                value = option.parse(text)
            except ValueError:
                continue
            if option.accepts(value):
                return value
        raise ValueError(f"{text!r} is not {self.describe()}")


class Nothing(Constraint):
    """None (in a :class:`Union`, a parameter that may be left unset); ``none`` on the command
    line."""

    def accepts(self, value):
        return value is None

    def describe(self):
        return "None"

    def parse(self, text):
        if text.lower() != "none":
            raise ValueError(f"{text!r} is not none")


class Bool(Constraint):
    _WORDS = {"on": True, "true": True, "yes": True, "off": False, "false": False, "no": False}

    def accepts(self, value):
        return isinstance(value, (bool, np.bool_))

    def describe(self):
        return "a bool"

    def parse(self, text):
        try:
            return self._WORDS[text.lower()]
        except KeyError:
            raise ValueError(f"{text!r} is not on or off") from None


class Fraction(Constraint):
    """k as a count >= 1 or as a fraction of the features in (0, 1)."""

    def accepts(self, value):
        return ((_is_int(value) and value >= 1)
                or (_is_real(value) and not _is_int(value) and 0 < value < 1))

    def describe(self):
        return "an int >= 1 (clusters) or a float in (0, 1) (a fraction of the features)"

    def hint(self, value):
        # 5.0 most likely means 5 clusters, but 1.0 may mean "all the features" (a fraction):
        # refused with the spelling of each, not read as a count in silence
        if _is_real(value) and not _is_int(value) and value >= 1 and float(value).is_integer():
            return f"k is an int count (write {int(value)}) or a fraction in (0, 1)"
        return ""

    def parse(self, text):
        # "5" is a count, "5.0" a float, refused as the estimator refuses n_clusters=5.0
        try:
            return int(text)
        except ValueError:
            return float(text)


class Searchable(Constraint):
    """A value, ``"auto"`` (a grid chosen on validation data) or a non-empty list or 1-D array."""

    def __init__(self, single: Constraint, none: bool = False):
        self.single, self.none = single, none

    def accepts(self, value):
        if value is None:
            return self.none
        if isinstance(value, str):
            return value == "auto"
        if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
            return len(value) >= 1 and all(self.single.accepts(v) for v in value)
        return self.single.accepts(value)

    def describe(self):
        return (("None, " if self.none else "") + f"{self.single.describe()}, 'auto' or a list "
                "of such values")

    def hint(self, value):
        if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
            return next((h for h in map(self.single.hint, value) if h), "")
        return "" if value is None or isinstance(value, str) else self.single.hint(value)

    def parse(self, text):
        if text == "auto":
            return text
        if text.lower() == "none" and self.none:
            return None
        values = [self.single.parse(v) for v in text.split(",")]
        return values[0] if len(values) == 1 else values


class Sizes(Constraint):
    """Hidden layer sizes: a non-empty tuple, list or 1-D array of ints >= 1, or one int (one
    layer), as scikit-learn's MLP takes them."""

    def accepts(self, value):
        if _is_int(value):
            return value >= 1
        return ((isinstance(value, (tuple, list))
                 or (isinstance(value, np.ndarray) and value.ndim == 1))
                and len(value) >= 1 and all(_is_int(v) and v >= 1 for v in value))

    def describe(self):
        return "an int >= 1 or a non-empty tuple of ints >= 1"

    def parse(self, text):
        return tuple(int(v) for v in text.replace(",", " ").split())


class ClassWeight(Constraint):
    """None, ``"balanced"`` or a dict of class label -> weight > 0, as scikit-learn's
    ``class_weight``; on the command line ``balanced``, ``none`` or ``label:weight,...``."""

    def accepts(self, value):
        if value is None or (isinstance(value, str) and value == "balanced"):
            return True
        return isinstance(value, dict) and len(value) >= 1 and all(
            _is_real(w) and np.isfinite(w) and w > 0 for w in value.values())

    def describe(self):
        return "None, 'balanced' or a non-empty dict of class label -> weight > 0"

    def parse(self, text):
        if text.lower() in ("balanced", "none"):  # "None", as --help shows the default
            return None if text.lower() == "none" else "balanced"
        pairs = [item.rpartition(":") for item in text.split(",")]
        if not all(label and sep for label, sep, _ in pairs):
            raise ValueError(f"{text!r} is not label:weight,...")
        return {label: float(weight) for label, _, weight in pairs}


class Device(Constraint):
    def check(self, value):
        check_device(value)
        return value

    def accepts(self, value):
        return isinstance(value, str)

    def describe(self):
        return "a torch device ('cpu', 'cuda', 'cuda:1')"


class Mask(Constraint):
    """What ``mask`` takes; checked by duck typing, so that this module imports no nibabel."""

    def accepts(self, value):
        return (value is None or isinstance(value, (str, os.PathLike, np.ndarray))
                or hasattr(value, "tocsr")  # a sparse adjacency
                or hasattr(value, "dataobj") and hasattr(value, "affine"))  # a nibabel image

    def describe(self):
        return ("None, a mask image (nibabel), a path to one, a boolean array or a sparse "
                "adjacency (for a nilearn masker, give its mask image: a masker's mask_img_ "
                "once fitted; fgscale standardizes the features itself and does not smooth)")


class RandomState(Constraint):
    def accepts(self, value):
        return value is None or (_is_int(value) and value >= 0) or isinstance(
            value, np.random.RandomState)

    def describe(self):
        return "None, an int >= 0 or a numpy RandomState"

    def parse(self, text):
        return int(text)


class CrossValidation(Constraint):
    """``cv`` as scikit-learn's searches and nilearn's decoders take it: None, a number of folds
    >= 2, or a splitter (an object with ``split`` and ``get_n_splits``, checked by duck typing so
    that this module imports no scikit-learn); and ``"auto"``, folds where the rows are few."""

    def accepts(self, value):
        if value is None or (isinstance(value, str) and value == "auto"):
            return True
        if _is_int(value):
            return value >= 2
        return callable(getattr(value, "split", None)) and callable(
            getattr(value, "get_n_splits", None))

    def describe(self):
        return ('"auto", None, an int >= 2 (folds) or a scikit-learn splitter (an object with '
                "split and get_n_splits, such as GroupKFold(5))")

    def hint(self, value):
        if _is_int(value) and value == 1:
            return "one fold leaves nothing to validate on; give None for one validation split"
        return ""

    def parse(self, text):
        word = text.lower()
        if word == "auto":
            return "auto"
        return None if word == "none" else int(text)


class Scoring(Constraint):
    """None or the name of one of scikit-learn's scorers (``sklearn.metrics.get_scorer_names``,
    imported only to check a name)."""

    def accepts(self, value):
        if value is None:
            return True
        if not isinstance(value, str):
            return False
        from sklearn.metrics import get_scorer_names

        return value in get_scorer_names()

    def describe(self):
        return ("None (the validation loss) or a scikit-learn scorer name ('accuracy', "
                "'balanced_accuracy', 'roc_auc', 'r2', 'neg_mean_absolute_error', ...)")

    def hint(self, value):
        if not isinstance(value, str):
            return ""
        import difflib

        from sklearn.metrics import get_scorer_names

        close = difflib.get_close_matches(value, get_scorer_names(), n=1)
        return f"did you mean {close[0]!r}?" if close else ""

    def parse(self, text):
        return None if text.lower() == "none" else text


def check_device(device) -> None:
    """A device torch can use here; checked before any work, so that a run asking for a GPU
    on a machine without one stops at once, not after its bank is built."""
    import torch  # here: checking the other parameters imports no torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), "
                         f"got {device!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={str(device)!r}: this torch {torch.__version__} sees no "
                             "CUDA GPU (use device='cpu')")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={str(device)!r}: this machine has {count} CUDA GPU(s)")
    elif device.type != "cpu":  # mps, xpu...: can torch put a tensor there?
        try:
            usable = device.type != "meta" and torch.empty(1, device=device).numel() == 1
        except Exception:  # noqa: BLE001 - RuntimeError, AssertionError, a missing backend module
            usable = False
        if not usable:
            raise ValueError(f"device={str(device)!r}: this torch {torch.__version__} cannot hold "
                             "a model there (use device='cpu', or 'cuda' on a machine with a GPU)")
