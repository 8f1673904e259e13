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

from fgscale._utils.checks import PREFETCH
from fgscale._utils.constraints import (
    Bool,
    ClassWeight,
    Constraint,
    CrossValidation,
    Device,
    Fraction,
    Interval,
    InvalidParameterError,
    Mask,
    Nothing,
    Options,
    RandomState,
    Scoring,
    Searchable,
    Sizes,
    Union,
    check_device,
)
from fgscale.estimators._auto import auto_k_help
from fgscale.estimators._regularizers import REGULARIZERS

__all__ = ["NILEARN_PARAMS", "PARAMS", "RUNTIME_PARAMS", "Param", "check_device",
           "estimator_signature", "numpydoc", "param_named", "params_of", "params_to_json",
           "plain_json", "resolve_seed", "validate_params"]


# ------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Param:
    """One parameter of the estimators.

    Attributes
    ----------
    name : str
    default : object
    constraint : Constraint
    help : str
        One line, for the docstring and ``--help``.
    type_doc : str
        The numpydoc type line.
    cli : bool
        An option of ``fgscale train``.
    runtime : bool
        Does not change what a fit computes: a run may resume with another value.
    task : {"classification", "regression"} or None
        The one estimator that has it; None: both.
    """

    name: str
    default: object
    constraint: Constraint
    help: str
    type_doc: str
    cli: bool = True
    runtime: bool = False
    task: str | None = None


PARAMS: tuple[Param, ...] = (
    Param("mask", None, Mask(),
          "spatial layout of the features (X's columns are vol[mask] in C order); None chains "
          "the features in a 1D graph; with a store, the store's mask is used (another one "
          "is warned of)",
          "ndarray of bool, Nifti1Image, str, Path or None", cli=False),
    Param("resample", False, Bool(),
          "images given to fit, predict or score on another grid than the mask's are resampled "
          "to it (linear interpolation); by default they are refused, naming the image",
          "bool", cli=False),
    Param("smoothing_fwhm", None, Union(Nothing(), Interval(float, 0, None)),
          "smooth the images given to fit, predict and score (NIfTI), before masking, by a "
          "Gaussian of this full width at half maximum in mm, as nilearn's decoders and "
          "maskers do; None: no smoothing; refused for arrays (rows masked already); a store's "
          "rows are as converted (fgscale convert --smoothing-fwhm), and the images later "
          "predicted are smoothed as they were", "float or None", cli=False),
    Param("model", "logreg", Options("logreg", "mlp", "cnn"),
          "a linear model (logistic regression for the classifier, least squares for the "
          "regressor), a ReLU multilayer perceptron, or a small convolutional network "
          "on the mask's grid (two convolution and pooling blocks, then a dense hidden layer: "
          "the paper's CNN baseline; weight maps are not defined for it)",
          '{"logreg", "mlp", "cnn"}'),
    Param("regularizer", "feature_grouping", Options(*REGULARIZERS),
          "; ".join(f"{name}: {r.summary}" for name, r in REGULARIZERS.items()),
          "{" + ", ".join(f'"{name}"' for name in REGULARIZERS) + "}"),
    Param("alpha", None, Searchable(Interval(float, 0, None), none=True),
          "L2 strength (weight decay of the weight matrices) with regularizer='l2', and "
          "combined with 'feature_grouping'; None: 'auto' with 'l2', 0 otherwise; 'auto' or a "
          "list: chosen on the validation split", 'float, list, "auto" or None'),
    Param("dropout", 0.5, Searchable(Interval(float, 0, 1, closed="left")),
          "dropout rate: on the input and hidden layers with regularizer='dropout', on hidden "
          "layers only with 'feature_grouping' (the paper's MLP); 'auto' or a list: chosen on "
          "the validation split", 'float, list or "auto"'),
    Param("class_weight", None, ClassWeight(),
          "weight of each class in the loss (classification only), as scikit-learn's: None, "
          "all 1; 'balanced', n / (n_classes * the class's rows) over the training rows; or a "
          "dict of class label -> weight (1 for a class it omits); the weights are rescaled to "
          "average 1 over the training rows, so they set the classes' relative weights and "
          "leave alpha's strength as it is; the validation loss and accuracy that stop "
          "training and choose among candidates are weighted alike; on the command line "
          "balanced, none or label:weight,...", 'dict, "balanced" or None', task="classification"),
    Param("n_clusters", "auto", Searchable(Fraction()), "k, clusters per grouping; a float "
          f"in (0, 1) is a fraction of the features; 'auto': {auto_k_help()}; a list: chosen "
          "among its values", 'int, float, list or "auto"'),
    Param("n_groupings", 100, Interval(int, 1, None), "b, groupings in the bank", "int"),
    Param("n_bootstrap", 50, Interval(int, 1, None),
          "r, training rows drawn with replacement for each grouping", "int"),
    Param("screening_percentile", 20.0, Interval(float, 0, 100, closed="right"),
          "with feature grouping, each grouping keeps the clusters of this best percentile by "
          "F-test against the target on the training rows (nilearn FREM's screening; with "
          "model='logreg', each class against the others, for its own weights), a "
          "percentile of a human brain's volume, as nilearn's: scaled by the mask's volume "
          "(rows without a mask image: 1 mm3 a feature), at most 100; 100 keeps all "
          "clusters", "float"),
    Param("hidden_layer_sizes", (256,), Sizes(), "hidden layers of the MLP, their units; one "
          "int is one layer", "tuple of int, or int"),
    Param("standardize", True, Union(Bool(), Nothing(), Options("zscore_sample", "zscore", hints={
          "psc": "'psc' (percent signal change) scales time series of a positive signal by "
                 "their mean, which maps of effects centred on 0 do not have; give "
                 "'zscore_sample' (or True) to standardize each voxel"})),
          "center and scale each feature by the mean and standard deviation of the training "
          "rows before anything else (a Dask reduction over a store, saved in it), and the "
          "rows predicted by the same statistics; nilearn's values are taken: 'zscore_sample' "
          "and 'zscore' as True (nilearn's maskers divide by the standard deviation of n - 1 "
          "and n rows, a factor sqrt(n / (n - 1)) apart: within 0.5% from 100 rows), None as "
          "False", 'bool, "zscore_sample", "zscore" or None'),
    Param("learning_rate", "auto", Union(Options("auto"), Interval(float, 0, None,
                                                                    closed="neither")),
          "'auto': a step of 1/L on each minibatch, L the smoothness constant of its loss "
          "(whatever the units, n and p); a float: the paper's plain SGD with that fixed step",
          'float or "auto"'),
    Param("batch_size", "auto", Union(Options("auto"), Interval(int, 1, None)),
          "minibatch size m; 'auto': a tenth of the training rows, within [32, 200]; with "
          "replicas, each replica's rows of a step, and 'auto' that tenth shared among them "
          "(rounded up)", 'int or "auto"'),
    Param("max_epochs", 500, Interval(int, 1, None),
          "epochs at most; training stops earlier on the stopping criterion", "int",
          runtime=True),
    Param("early_stopping", "auto", Union(Bool(), Options("auto")),
          "hold out validation_fraction of the training rows and stop after patience epochs "
          "without improvement of the validation loss, keeping the best weights; without "
          "it, training stops on the training loss (tol); 'auto': on when every class (a "
          "regressor: the target) has rows to spare for validation", 'bool or "auto"'),
    Param("validation_fraction", 0.2, Interval(float, 0, 1, closed="neither"),
          "share of the training rows held out for early stopping (by subject on a store with "
          "groups)", "float"),
    Param("patience", 20, Interval(int, 1, None),
          "epochs without improvement by tol before training stops (scikit-learn's "
          "n_iter_no_change)", "int"),
    Param("stop_on", "loss", Options("loss", "accuracy"),
          "what early stopping and the choice among candidates watch on the validation split: "
          "its loss, or its accuracy (as scikit-learn's MLP and SGD; a regressor's R²)",
          '{"loss", "accuracy"}'),
    Param("tol", 1e-4, Interval(float, 0, None),
          "an epoch improves when its loss is below the best one minus tol", "float"),
    Param("cv", "auto", CrossValidation(),
          "how the training rows are split to choose the hyper-parameters and the epoch: None, "
          "one validation split of validation_fraction; an int K, K folds (by subject when the "
          "rows have groups, else stratified for a classifier), every candidate trained on "
          "each and the one of best mean validation score kept; or a scikit-learn splitter "
          "(its split(X, y, groups)); K folds cost K fits a candidate; 'auto': with "
          "model='logreg', 3 folds below 250 training rows (one split would validate on fewer "
          "than 50) when refit is on, validation_fraction is its default and each class spans "
          "3 rows (with groups, 3 subjects), else one split; on the command line an int, auto "
          "or none",
          'int, splitter, "auto" or None'),
    Param("scoring", None, Scoring(),
          "what chooses among candidates on the validation rows: None, the validation loss "
          "(the error with stop_on='accuracy'); or a scikit-learn scorer name ('accuracy', "
          "'balanced_accuracy', 'roc_auc', 'r2', 'neg_mean_absolute_error', ...), greater is "
          "better; early stopping watches stop_on either way", "str or None"),
    Param("refit", True, Bool(), "after early stopping, train again on all the training rows "
          "for as many epochs as the best one took (with cv, their mean over the folds); "
          "refit=False keeps the model trained without the validation rows, and with cv "
          "averages the fold models' weights (nilearn FREM's ensembling; model='logreg')",
          "bool"),
    Param("device", "cpu", Device(), "torch device of the model ('cpu', 'cuda', 'cuda:1'); a "
          "saved run (or a pickle of the estimator) holds its model on the CPU and moves it "
          "back to predict", "str",
          runtime=True),
    Param("prefetch", "auto", PREFETCH,
          "with a store: minibatches in flight on the workers at most; 'auto': two per worker "
          "thread, within 1 GiB of blocks, and two where the model's first layer on the CPU "
          "weighs more than eight blocks (its step is then the slower side)", 'int or "auto"',
          runtime=True),
    Param("replicas", 1, Interval(int, 1, None),
          "with a store: data-parallel copies of the model, each in a worker process of the "
          "cluster, which reads and reduces batch_size rows of every step and sums its "
          "gradients with the others' (torch.distributed, gloo): replicas=R with batch_size=m "
          "trains as replicas=1 with batch_size=R*m (steps of R*m rows, read and reduced in R "
          "shares at once); validation, early stopping and checkpoints are as "
          "with one; needs feature grouping, model 'logreg' or 'mlp', device 'cpu' and R "
          "worker processes (fgscale train starts its LocalCluster with processes for "
          "replicas > 1; give --n-workers R or more); on an MLP with dropout, each replica "
          "draws its own masks", "int"),
    Param("verbose", 0, Union(Bool(), Interval(int, 0, None)),
          "1 or more (or True): a progress bar over epochs", "int or bool", cli=False,
          runtime=True),
    Param("random_state", None, RandomState(), "seed of the bank, the plan, the "
          "initialisation and dropout; an int is the run's seed itself", "int, RandomState or None",
          cli=False),
)

_BY_NAME = {p.name: p for p in PARAMS}

# the parameters of nilearn's Decoder, DecoderRegressor and FREM that have no counterpart of
# that name here, each with what to give instead
NILEARN_PARAMS = {
    "estimator": "the model is set by model= ('logreg': logistic regression or least "
                 "squares) and regularizer= ('feature_grouping', 'l2', 'dropout', 'none')",
    "clustering_percentile": "give n_clusters= as a fraction of the voxels (FREM's "
                             "clustering_percentile=10 is n_clusters=0.1)",
    "param_grid": "give a list (or 'auto') to alpha=, dropout= or n_clusters=: every "
                  "combination is a candidate",
    "mask_strategy": "give mask= an image; without one, the voxels finite and non-zero in "
                     "every image are kept",
    "n_jobs": "the work is spread on the Dask cluster: give fit's client= (or none, for an "
              "embedded one)",
    "memory": "banks and statistics are cached in the store (fgscale convert)",
    "memory_level": "banks and statistics are cached in the store (fgscale convert)",
    "target_affine": "give mask= on the grid wanted and resample=True",
    "target_shape": "give mask= on the grid wanted and resample=True",
    "low_pass": "filter time series before fitting (nilearn.image.clean_img)",
    "high_pass": "filter time series before fitting (nilearn.image.clean_img)",
    "t_r": "filter time series before fitting (nilearn.image.clean_img)",
}
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


def param_named(name: str) -> Param:
    """The table's row of parameter ``name`` (a KeyError names an unknown one)."""
    return _BY_NAME[name]


def saved_param(saved: dict, name: str):
    """Parameter ``name`` as a run or a cross-validation saved it (``params_to_json``'s
    values): a parameter added since, absent from an older file, had its default there; None
    for a name that is no parameter of the table."""
    if name in saved:
        return saved[name]
    try:
        return params_to_json({name: param_named(name).default})[name]
    except KeyError:
        return None


def params_of(task: str) -> tuple[Param, ...]:
    """The parameters of the estimator of ``task`` ("classification" or "regression")."""
    return tuple(p for p in PARAMS if p.task in (None, task))


def estimator_signature(task: str) -> inspect.Signature:
    """``__init__``'s signature for ``task``: every parameter keyword-only, with its default."""
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Signature([self] + [
        inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default)
        for p in params_of(task)])


def numpydoc(task: str) -> str:
    """The Parameters section of the docstring of the estimator of ``task``."""
    lines = []
    for p in params_of(task):
        # "k, clusters per grouping" keeps its symbol lower case; other lines start upper case
        text = p.help if p.help[1:2] == "," else p.help[0].upper() + p.help[1:]
        lines.append(f"    {p.name} : {p.type_doc}, default={p.default!r}")
        lines += textwrap.wrap(text + ".", width=92, initial_indent=" " * 8,
                               subsequent_indent=" " * 8)
    return "\n".join(lines)


def plain_json(value):
    """``value`` with numpy scalars, arrays and tuples as JSON's numbers and lists, dict keys
    as str."""
    if isinstance(value, dict):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if isinstance(value, (np.generic, np.ndarray)):
        return plain_json(value.tolist())
    return value


def params_to_json(params: dict) -> dict:
    """Parameters as JSON values: tuples, 1-D arrays as lists; a dict (``class_weight``) with
    its labels as str; an image, mask or RandomState: repr."""
    out = {}
    for name, value in params.items():
        if isinstance(value, dict):
            value = {str(k): float(v) for k, v in value.items()}
        elif isinstance(value, (tuple, np.generic)) or (isinstance(value, np.ndarray) and value.ndim == 1):
            value = list(value) if isinstance(value, tuple) else value.tolist()
        elif not (value is None or isinstance(value, (str, bool, int, float, list))):
            value = os.fspath(value) if isinstance(value, os.PathLike) else repr(value)
        out[name] = value
    return out


_MAX_SEED = np.iinfo(np.int32).max


def resolve_seed(random_state) -> int:
    """A run's seed from ``random_state``: an int as it is (so that ``fgscale bank --seed S``
    and ``fgscale train --seed S`` agree), else one drawn from it (None: from numpy's global
    generator, as scikit-learn's ``check_random_state(None)``; a RandomState: from it).

    Parameters
    ----------
    random_state : None, int or numpy.random.RandomState

    Returns
    -------
    seed : int
        In ``[0, 2**31 - 1)``, or the int given.
    """
    if isinstance(random_state, numbers.Integral):
        return int(random_state)
    if random_state is None:
        return int(np.random.randint(_MAX_SEED))  # noqa: NPY002 - the global generator, on purpose
    return int(random_state.randint(_MAX_SEED))
