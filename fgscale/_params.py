"""The estimators' parameters, declared once: name, constraint, default and one line of help.

The table drives the estimator's signature and validation at ``fit`` (messages in the style of
scikit-learn's, naming the parameter and the value), the options of ``fgscale train`` (whose
help shows each default), the Parameters section of the estimator's docstring and the
parameters saved in a run's ``config.json``. It imports nothing heavy: the CLI builds its
parser from it without importing torch.
"""

from __future__ import annotations

import inspect
import numbers
import os
import textwrap
from dataclasses import dataclass

import numpy as np

from fgscale._auto import auto_k_help

__all__ = ["PARAMS", "RUNTIME_PARAMS", "Param", "check_device", "check_prefetch",
           "estimator_signature", "numpydoc", "params_to_json", "validate_params"]


class InvalidParameterError(ValueError):
    """A parameter value outside its constraint (a ValueError, as in scikit-learn)."""


# ------------------------------------------------------------------------- constraints

class _Constraint:
    """What values a parameter takes: ``check`` returns the value or raises, ``describe`` says
    what is expected, ``parse`` reads a command-line string."""

    def check(self, value):
        if not self.accepts(value):
            raise InvalidParameterError(self.describe())
        return value

    def accepts(self, value) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def parse(self, text: str):
        return text


class Options(_Constraint):
    def __init__(self, *choices):
        self.choices = choices

    def accepts(self, value):
        return isinstance(value, str) and value in self.choices

    def describe(self):
        return "a str among " + ", ".join(repr(c) for c in self.choices)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Interval(_Constraint):
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


class Union(_Constraint):
    def __init__(self, *options: _Constraint):
        self.options = options

    def accepts(self, value):
        return any(o.accepts(value) for o in self.options)

    def describe(self):
        return " or ".join(o.describe() for o in self.options)

    def parse(self, text):
        for option in self.options:
            try:
                value = option.parse(text)
            except ValueError:
                continue
            if option.accepts(value):
                return value
        raise ValueError(f"{text!r} is not {self.describe()}")


class _Bool(_Constraint):
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


class _Fraction(_Constraint):
    """k as a count >= 1 or as a fraction of the features in (0, 1)."""

    def accepts(self, value):
        return ((_is_int(value) and value >= 1)
                or (_is_real(value) and not _is_int(value) and 0 < value < 1))

    def describe(self):
        return "an int >= 1 (clusters) or a float in (0, 1) (a fraction of the features)"

    def parse(self, text):
        value = float(text)
        return int(value) if value >= 1 and value.is_integer() else value


class _Searchable(_Constraint):
    """A value, ``"auto"`` (a grid chosen on validation data) or a non-empty list or 1-D array."""

    def __init__(self, single: _Constraint, none: bool = False):
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

    def parse(self, text):
        if text == "auto":
            return text
        if text.lower() == "none" and self.none:
            return None
        values = [self.single.parse(v) for v in text.split(",")]
        return values[0] if len(values) == 1 else values


class _Sizes(_Constraint):
    def accepts(self, value):
        return (isinstance(value, (tuple, list)) and len(value) >= 1
                and all(_is_int(v) and v >= 1 for v in value))

    def describe(self):
        return "a non-empty tuple of ints >= 1"

    def parse(self, text):
        return tuple(int(v) for v in text.replace(",", " ").split())


class _Device(_Constraint):
    def check(self, value):
        check_device(value)
        return value

    def accepts(self, value):
        return isinstance(value, str)

    def describe(self):
        return "a torch device ('cpu', 'cuda', 'cuda:1')"


class _Anything(_Constraint):
    def __init__(self, description: str):
        self.description = description

    def accepts(self, value):
        return True

    def describe(self):
        return self.description


class _RandomState(_Constraint):
    def accepts(self, value):
        return value is None or (_is_int(value) and value >= 0) or isinstance(
            value, np.random.RandomState)

    def describe(self):
        return "None, an int >= 0 or a numpy RandomState"

    def parse(self, text):
        return int(text)


# ------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Param:
    """One parameter of the estimators.

    Attributes
    ----------
    name : str
    default : object
    constraint : _Constraint
    help : str
        One line, for the docstring and ``--help``.
    type_doc : str
        The numpydoc type line.
    cli : bool
        An option of ``fgscale train``.
    runtime : bool
        Does not change what a fit computes: a run may resume with another value.
    """

    name: str
    default: object
    constraint: _Constraint
    help: str
    type_doc: str
    cli: bool = True
    runtime: bool = False


PARAMS: tuple[Param, ...] = (
    Param("mask", None, _Anything("an image, a path or a boolean array"),
          "spatial layout of the features (X's columns are vol[mask] in C order); None chains "
          "the features in a 1D graph; with a store, the store's mask is used",
          "ndarray of bool, Nifti1Image, str, Path or None", cli=False),
    Param("resample", False, _Bool(),
          "images given to fit, predict or score on another grid than the mask's are resampled "
          "to it (linear interpolation); by default they are refused, naming the image",
          "bool", cli=False),
    Param("model", "logreg", Options("logreg", "mlp", "cnn"),
          "a linear model (logistic regression for the classifier, least squares for the "
          "regressor), a ReLU multilayer perceptron, or a small convolutional network "
          "on the mask's grid (two convolution and pooling blocks, then a dense hidden layer: "
          "the paper's CNN baseline; weight maps are not defined for it)",
          '{"logreg", "mlp", "cnn"}'),
    Param("regularizer", "feature_grouping", Options("none", "l2", "dropout", "feature_grouping"),
          "stochastic feature grouping (the paper's), L2 weight decay, dropout, or none",
          '{"none", "l2", "dropout", "feature_grouping"}'),
    Param("alpha", None, _Searchable(Interval(float, 0, None), none=True),
          "L2 strength (weight decay of the weight matrices) with regularizer='l2', and "
          "combined with 'feature_grouping'; None: 'auto' with 'l2', 0 otherwise; 'auto' or a "
          "list: chosen on the validation split", 'float, list, "auto" or None'),
    Param("dropout", 0.5, _Searchable(Interval(float, 0, 1, closed="left")),
          "dropout rate: on the input and hidden layers with regularizer='dropout', on hidden "
          "layers only with 'feature_grouping' (the paper's MLP); 'auto' or a list: chosen on "
          "the validation split", 'float, list or "auto"'),
    Param("n_clusters", "auto", _Searchable(_Fraction()), "k, clusters per grouping; a float "
          f"in (0, 1) is a fraction of the features; 'auto': {auto_k_help()}; a list: chosen "
          "among its values", 'int, float, list or "auto"'),
    Param("n_groupings", 100, Interval(int, 1, None), "b, groupings in the bank", "int"),
    Param("n_bootstrap", 50, Interval(int, 1, None),
          "r, training rows drawn with replacement for each grouping", "int"),
    Param("hidden_layer_sizes", (256,), _Sizes(), "hidden layers of the MLP",
          "tuple of int"),
    Param("standardize", True, _Bool(), "center and scale each feature by the mean and "
          "standard deviation of the training rows before anything else (a Dask reduction "
          "over a store, saved in it)", "bool"),
    Param("learning_rate", "auto", Union(Options("auto"), Interval(float, 0, None,
                                                                    closed="neither")),
          "'auto': a step of 1/L on each minibatch, L the smoothness constant of its loss "
          "(whatever the units, n and p); a float: the paper's plain SGD with that fixed step",
          'float or "auto"'),
    Param("batch_size", "auto", Union(Options("auto"), Interval(int, 1, None)),
          "minibatch size m; 'auto': a tenth of the training rows, within [32, 200]",
          'int or "auto"'),
    Param("max_epochs", 500, Interval(int, 1, None),
          "epochs at most; training stops earlier on the stopping criterion", "int",
          runtime=True),
    Param("early_stopping", "auto", Union(_Bool(), Options("auto")),
          "hold out validation_fraction of the training rows and stop after patience epochs "
          "without improvement of the validation loss, keeping the best weights; without "
          "it, training stops on the training loss (tol); 'auto': on when every class has "
          "rows to spare for validation", 'bool or "auto"'),
    Param("validation_fraction", 0.2, Interval(float, 0, 1, closed="neither"),
          "share of the training rows held out for early stopping (by subject on a store with "
          "groups)", "float"),
    Param("patience", 20, Interval(int, 1, None),
          "epochs without improvement by tol before training stops (scikit-learn's "
          "n_iter_no_change)", "int"),
    Param("stop_on", "loss", Options("loss", "accuracy"),
          "what early stopping and the choice among candidates watch on the validation split: "
          "its loss, or its accuracy (as scikit-learn's MLP and SGD)", '{"loss", "accuracy"}'),
    Param("tol", 1e-4, Interval(float, 0, None),
          "an epoch improves when its loss is below the best one minus tol", "float"),
    Param("refit", True, _Bool(), "after early stopping, train again on all the training rows "
          "for as many epochs as the best one took", "bool"),
    Param("device", "cpu", _Device(), "torch device of the model ('cpu', 'cuda', 'cuda:1'); a "
          "saved run (or a pickle of the estimator) holds its model on the CPU and moves it "
          "back to predict", "str",
          runtime=True),
    Param("prefetch", "auto", Union(Options("auto"), Interval(int, 1, None)),
          "with a store: minibatches in flight on the workers at most; 'auto': two per worker "
          "thread, within 1 GiB of blocks", 'int or "auto"', runtime=True),
    Param("verbose", 0, Interval(int, 0, None), "1 or more: a progress bar over epochs", "int",
          cli=False, runtime=True),
    Param("random_state", None, _RandomState(), "seed of the bank, the plan, the "
          "initialisation and dropout; an int is the run's seed itself", "int, RandomState or None",
          cli=False),
)

_BY_NAME = {p.name: p for p in PARAMS}
RUNTIME_PARAMS = tuple(p.name for p in PARAMS if p.runtime)


def validate_params(params: dict, owner: str = "FeatureGroupingClassifier") -> None:
    """Check every parameter against the table; a ValueError names the first one that fails.

    Parameters
    ----------
    params : dict
        From ``get_params()``.
    owner : str
        The estimator's name, for the message.
    """
    for name, value in params.items():
        try:
            _BY_NAME[name].constraint.check(value)
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"The {name!r} parameter of {owner} must be {exc}. "
                                        f"Got {value!r} instead.") from None


def estimator_signature() -> inspect.Signature:
    """``__init__``'s signature: every parameter keyword-only, with its default."""
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Signature([self] + [
        inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default)
        for p in PARAMS])


def numpydoc() -> str:
    """The Parameters section of the estimators' docstrings."""
    lines = []
    for p in PARAMS:
        # "k, clusters per grouping" keeps its symbol lower case; other lines start upper case
        text = p.help if p.help[1:2] == "," else p.help[0].upper() + p.help[1:]
        lines.append(f"    {p.name} : {p.type_doc}, default={p.default!r}")
        lines += textwrap.wrap(text + ".", width=92, initial_indent=" " * 8,
                               subsequent_indent=" " * 8)
    return "\n".join(lines)


def params_to_json(params: dict) -> dict:
    """Parameters as JSON values: tuples, 1-D arrays as lists; an image, mask or RandomState: repr."""
    out = {}
    for name, value in params.items():
        if isinstance(value, (tuple, np.generic)) or (isinstance(value, np.ndarray) and value.ndim == 1):
            value = list(value) if isinstance(value, tuple) else value.tolist()
        elif not (value is None or isinstance(value, (str, bool, int, float, list))):
            value = os.fspath(value) if isinstance(value, os.PathLike) else repr(value)
        out[name] = value
    return out


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


def check_prefetch(prefetch):
    """``prefetch`` itself (an int as int), checked against the table's constraint; a
    ValueError names what it must be."""
    validate_params({"prefetch": prefetch}, "StoreSource")
    return prefetch if isinstance(prefetch, str) else int(prefetch)
