"""``FeatureGroupingClassifier``: Algorithm 1 behind the scikit-learn API.

The estimator is a thin layer: it validates, resolves its parameters, then calls the bank
builder (:mod:`fgscale.bank`), the planner (:mod:`fgscale.plan`) and the training loop
(:mod:`fgscale.training`) on in-memory arrays.
"""

from __future__ import annotations

import logging
import numbers

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from fgscale.bank import make_bank
from fgscale.models import build_model
from fgscale.plan import epoch_plan
from fgscale.training import EarlyStopping, fit, make_optimizer, memory_batches, predict_logits

__all__ = ["FeatureGroupingClassifier"]

log = logging.getLogger(__name__)

MODELS = ("logreg", "mlp")
REGULARIZERS = ("none", "l2", "dropout", "feature_grouping")
_MAX_SEED = np.iinfo(np.int32).max
_BLOCK = 4096  # rows per block at prediction time


def resolve_n_clusters(n_clusters, n_features: int) -> int:
    """k from an int, or from a float in (0, 1) taken as a fraction of p."""
    if isinstance(n_clusters, numbers.Integral) and not isinstance(n_clusters, bool):
        k = int(n_clusters)
    elif isinstance(n_clusters, numbers.Real) and 0 < n_clusters < 1:
        k = max(1, int(round(n_clusters * n_features)))
    else:
        raise ValueError(f"n_clusters must be an int or a float in (0, 1), got {n_clusters!r}")
    if not 1 <= k <= n_features:
        raise ValueError(f"n_clusters={k} must lie in [1, n_features={n_features}]")
    return k


def resolve_graph(mask, n_features: int):
    """The feature graph: a boolean mask array (from an array, image or path) or a 1D chain."""
    if mask is None:
        return np.ones(n_features, dtype=bool)
    if hasattr(mask, "tocsr"):  # an explicit sparse adjacency
        return mask
    if not isinstance(mask, np.ndarray):
        import nibabel

        img = nibabel.load(mask) if not hasattr(mask, "get_fdata") else mask
        mask = np.asarray(img.dataobj) != 0
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise ValueError(f"mask must be a boolean array, got dtype {mask.dtype}")
    if int(mask.sum()) != n_features:
        raise ValueError(f"mask has {int(mask.sum())} voxels set but X has {n_features} features")
    return mask


class FeatureGroupingClassifier(ClassifierMixin, BaseEstimator):
    """Classifier trained with feature grouping as a stochastic regularizer.

    Each SGD step reduces its minibatch with a grouping drawn from a bank of ReNA
    clusterings and trains the first layer through it (Aydore et al., ICML 2019, Algorithm 1).
    After training the weights live in the original feature space.

    Parameters
    ----------
    mask : ndarray of bool, Nifti1Image, path or None
        Spatial layout of the features (``X`` columns are ``vol[mask]`` in C order); None
        chains the features in a 1D graph.
    model : {"logreg", "mlp"}
    regularizer : {"none", "l2", "dropout", "feature_grouping"}
    alpha : float
        L2 strength (SGD weight decay on weight matrices) with ``regularizer="l2"``.
    dropout : float
        Dropout rate: on the input and hidden layers with ``regularizer="dropout"``, on hidden
        layers only with ``"feature_grouping"`` (the paper's MLP; 0 disables it).
    n_clusters : int or float
        k, clusters per grouping; a float in (0, 1) is a fraction of the features.
    n_groupings : int
        b, groupings in the bank.
    n_bootstrap : int
        r, training rows (drawn with replacement) per grouping.
    hidden_layer_sizes : tuple of int
        Hidden layers of the MLP.
    learning_rate : float
        SGD step size.
    batch_size : int
        Minibatch size m.
    max_epochs : int
        Epochs (the exact number without early stopping).
    early_stopping : bool or "auto"
        Hold out ``validation_fraction`` of the training rows and stop after ``patience``
        epochs without improvement of the validation loss, restoring the best weights.
        "auto": on for the MLP, off for logistic regression.
    validation_fraction : float
    patience : int
    device : str
        Torch device of the model, e.g. "cpu" or "cuda".
    random_state : int, RandomState or None

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    n_clusters_ : int
    bank_ : ndarray of shape (n_groupings, n_features), int32, or None
    model_ : torch.nn.Module
    coef_ : ndarray of shape (n_classes, n_features)
        Logistic regression weights in feature space (``model="logreg"`` only).
    intercept_ : ndarray of shape (n_classes,)
    history_ : list of dict
        Metrics of each epoch.
    """

    def __init__(self, mask=None, model="logreg", regularizer="feature_grouping", alpha=1e-3,
                 dropout=0.5, n_clusters=0.1, n_groupings=100, n_bootstrap=50,
                 hidden_layer_sizes=(256,), learning_rate=0.01, batch_size=200, max_epochs=200,
                 early_stopping="auto", validation_fraction=0.1, patience=10, device="cpu",
                 random_state=None):
        self.mask = mask
        self.model = model
        self.regularizer = regularizer
        self.alpha = alpha
        self.dropout = dropout
        self.n_clusters = n_clusters
        self.n_groupings = n_groupings
        self.n_bootstrap = n_bootstrap
        self.hidden_layer_sizes = hidden_layer_sizes
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.patience = patience
        self.device = device
        self.random_state = random_state

    def _check_params(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.regularizer not in REGULARIZERS:
            raise ValueError(f"regularizer must be one of {REGULARIZERS}, got {self.regularizer!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.early_stopping not in (True, False, "auto"):
            raise ValueError(f"early_stopping must be True, False or 'auto', got {self.early_stopping!r}")

    def _use_early_stopping(self) -> bool:
        if self.early_stopping == "auto":
            return self.model == "mlp"
        return bool(self.early_stopping)

    def fit(self, X, y):
        """Build the bank (with feature grouping) and train.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)

        Returns
        -------
        self
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float32)
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        y_idx = y_idx.astype(np.int64)
        p = X.shape[1]
        graph = resolve_graph(self.mask, p)
        seed = int(check_random_state(self.random_state).randint(_MAX_SEED))

        rows, val_rows = np.arange(len(y)), None
        if self._use_early_stopping():
            rows, val_rows = _validation_split(y_idx, self.validation_fraction, seed)

        self.bank_ = None
        self.n_clusters_ = resolve_n_clusters(self.n_clusters, p)
        if self.regularizer == "feature_grouping":
            self.bank_ = make_bank(X, graph, self.n_clusters_, n_groupings=self.n_groupings,
                                   n_bootstrap=self.n_bootstrap, rows=rows, seed=seed)

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model_ = build_model(self.model, p, len(self.classes_),
                                      regularizer=self.regularizer, dropout=self.dropout,
                                      hidden_layer_sizes=self.hidden_layer_sizes).to(self.device)
            optimizer = make_optimizer(self.model_, self.learning_rate,
                                       self.alpha if self.regularizer == "l2" else 0.0)
            n_groupings = 0 if self.bank_ is None else len(self.bank_)
            bank_t = None if self.bank_ is None else torch.as_tensor(self.bank_, device=self.device)

            def epoch_batches(epoch):
                plan = epoch_plan(rows, batch_size=self.batch_size, epoch=epoch, seed=seed,
                                  n_groupings=n_groupings)
                return memory_batches(X, y_idx, plan, self.bank_)

            validation = None
            if val_rows is not None:
                def validation():
                    return [(X[val_rows], y_idx[val_rows])]

            self.history_ = fit(self.model_, optimizer, epoch_batches=epoch_batches,
                                max_epochs=self.max_epochs, bank=bank_t, device=self.device,
                                validation=validation,
                                stopper=EarlyStopping(self.patience) if validation else None)
        if self.model == "logreg":
            self.coef_ = self.model_.first.weight.detach().cpu().numpy().copy()
            self.intercept_ = self.model_.first.bias.detach().cpu().numpy().copy()
        return self

    def _logits(self, X) -> np.ndarray:
        """Logits, shape (n_samples, n_classes)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float32, reset=False)
        blocks = (X[i : i + _BLOCK] for i in range(0, len(X), _BLOCK))
        return predict_logits(self.model_, blocks, device=self.device)

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, shape (n_samples, n_classes)."""
        logits = torch.from_numpy(self._logits(X))
        return torch.softmax(logits.double(), dim=1).numpy()

    def predict(self, X) -> np.ndarray:
        """Predicted class labels, shape (n_samples,)."""
        check_is_fitted(self)
        return self.classes_[self._logits(X).argmax(axis=1)]


def _validation_split(y: np.ndarray, fraction: float, seed: int):
    """Split rows into training and validation, stratified when every class allows it."""
    rows = np.arange(len(y))
    n_val = max(1, int(round(fraction * len(y))))
    if len(y) - n_val < 1:
        raise ValueError(f"early stopping needs a validation split: got {len(y)} sample(s), too few")
    counts = np.bincount(y)
    stratify = y if counts.min() >= 2 and n_val >= len(counts) else None
    return train_test_split(rows, test_size=n_val, random_state=seed, stratify=stratify)
