"""``FeatureGroupingClassifier``: Algorithm 1 behind the scikit-learn API.

The estimator is a thin layer: it validates, resolves its parameters, then calls the bank
builder (:mod:`fgscale.grouping`), the planner and the training loop (:mod:`fgscale.training`)
on in-memory arrays or on a store.
"""

from __future__ import annotations

import copy
import logging
import numbers
import os

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from fgscale._params import PARAMS, estimator_signature, numpydoc, validate_params
from fgscale.grouping._bank import make_bank, resolve_n_clusters
from fgscale.training._loop import EarlyStopping, fit, make_optimizer, predict_logits
from fgscale.training._memory import MemorySource
from fgscale.training._models import build_model
from fgscale.training._plan import epoch_plan

__all__ = ["FeatureGroupingClassifier"]

log = logging.getLogger(__name__)

_MAX_SEED = np.iinfo(np.int32).max
_BLOCK = 4096  # rows per block at prediction time


def resolve_graph(mask, n_features: int):
    """The feature graph: a boolean mask array (from an array, image or path) or a 1D chain."""
    if mask is None:
        return np.ones(n_features, dtype=bool)
    if hasattr(mask, "tocsr"):  # an explicit sparse adjacency
        return mask
    if not isinstance(mask, np.ndarray):  # an image or a path: errors name the file
        from fgscale.images._nifti import load_mask

        mask = load_mask(mask)[0]
    if mask.dtype != bool:
        raise ValueError(f"mask must be a boolean array, got dtype {mask.dtype}")
    if int(mask.sum()) != n_features:
        raise ValueError(f"mask has {int(mask.sum())} voxels set but X has {n_features} features")
    return mask


class _History:
    """Per-epoch metrics of one fit, and where a fit resumes: nothing is saved here.

    The run folders of :mod:`fgscale.runs` subclass it to checkpoint every epoch.
    """

    def __init__(self, estimator, optimizer, stopper):
        self.estimator, self.optimizer, self.stopper = estimator, optimizer, stopper
        self.history: list[dict] = []

    @property
    def stopped_early(self) -> bool:
        """Early stopping ended the run: resuming it, even with a larger ``max_epochs``,
        trains no more. A run that ended at ``max_epochs`` goes on when that is raised."""
        return self.stopper is not None and self.stopper.bad_epochs >= self.stopper.patience

    def resume(self) -> int:
        """The first epoch left to run."""
        return 0

    def epoch_end(self, metrics: dict) -> None:
        self.history.append(metrics)


class FeatureGroupingClassifier(ClassifierMixin, BaseEstimator):
    __doc__ = f"""Classifier trained with feature grouping as a stochastic regularizer.

    Each SGD step reduces its minibatch with a grouping drawn from a bank of ReNA
    clusterings and trains the first layer through it (Aydore et al., ICML 2019, Algorithm 1).
    After training the weights live in the original feature space. The parameters are declared
    once, in :data:`fgscale._params.PARAMS`, and all checked when ``fit`` starts.

    Parameters
    ----------
{numpydoc()}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    n_clusters_ : int
        k as resolved from ``n_clusters``.
    bank_ : ndarray of shape (n_groupings, n_features), int32, or None
    model_ : torch.nn.Module
    coef_ : ndarray of shape (n_classes, n_features)
        Logistic regression weights in feature space (``model="logreg"`` only).
    intercept_ : ndarray of shape (n_classes,)
    history_ : list of dict
        Metrics of each epoch.

    Examples
    --------
    >>> import numpy as np
    >>> from fgscale import FeatureGroupingClassifier
    >>> rng = np.random.default_rng(0)
    >>> mask = np.ones((6, 6, 6), bool)
    >>> y = np.repeat([0, 1], 40)
    >>> X = rng.standard_normal((80, 216)).astype(np.float32) + y[:, None]
    >>> clf = FeatureGroupingClassifier(mask=mask, n_groupings=5, n_bootstrap=20,
    ...                                 max_epochs=20, random_state=0).fit(X, y)
    >>> clf.coef_.shape
    (2, 216)
    >>> bool(clf.score(X, y) > 0.9)
    True
    """

    def __init__(self, **params):
        unknown = sorted(set(params) - {p.name for p in PARAMS})
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected parameter(s) {unknown}")
        for p in PARAMS:
            setattr(self, p.name, params.get(p.name, p.default))

    __init__.__signature__ = estimator_signature()

    def _check_params(self):
        """Check every parameter (the table's constraints), before any work."""
        validate_params(self.get_params(), type(self).__name__)

    def _use_early_stopping(self) -> bool:
        if self.early_stopping == "auto":
            return self.model == "mlp"
        return bool(self.early_stopping)

    def fit(self, X, y=None, *, client=None):
        """Build the bank (with feature grouping) and train.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), or str or Path of a store
            In-memory data, or a complete fgscale store: then the labels, the mask and the
            training rows come from the store, the bank of these parameters is read from it
            (built on the cluster first if missing) and minibatches are streamed from it by
            Dask workers.
        y : array-like of shape (n_samples,)
            Labels; must be None with a store.
        client : distributed.Client, optional
            With a store: the cluster to use; default the active ``distributed`` client, else an
            embedded LocalCluster of thread workers (:func:`fgscale.cluster.get_client`).

        Returns
        -------
        self
        """
        self._check_params()
        if isinstance(X, (str, os.PathLike)):
            if y is not None:
                raise ValueError("y must be None when X is a store: the labels come from the store")
            return self._fit_store(X, client)
        X, y = validate_data(self, X, y, dtype=np.float32)
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        graph = resolve_graph(self.mask, X.shape[1])
        self.n_clusters_ = resolve_n_clusters(self.n_clusters, X.shape[1])
        seed, rows = self._seed(), np.arange(len(y))
        bank = None
        if self.regularizer == "feature_grouping":
            bank = make_bank(X, graph, self.n_clusters_, n_groupings=self.n_groupings,
                             n_bootstrap=self.n_bootstrap, rows=rows, seed=seed)
        return self._train(MemorySource(X, y_idx.astype(np.int64), bank), y_idx, rows, bank,
                           seed)

    def _seed(self) -> int:
        """The run's seed: an int ``random_state`` as it is (so ``fgscale bank --seed S`` and
        ``fgscale train --seed S`` agree), else one drawn from it."""
        if isinstance(self.random_state, numbers.Integral):
            return int(self.random_state)
        return int(check_random_state(self.random_state).randint(_MAX_SEED))

    def _fit_store(self, path, client, history=_History):
        from fgscale.cluster import get_client
        from fgscale.grouping._dask_bank import ensure_bank
        from fgscale.store._reader import open_store
        from fgscale.training._stream import StoreSource

        store = open_store(path)
        self.classes_ = store.classes
        self.n_features_in_ = store.n_features
        self.n_clusters_ = resolve_n_clusters(self.n_clusters, store.n_features)
        seed, rows = self._seed(), store.train_rows()
        with get_client(client=client, processes=False) as client:
            bank, key = None, ""
            if self.regularizer == "feature_grouping":
                # the bank of exactly these parameters and training rows, built if missing
                bank, info = ensure_bank(store.path, n_groupings=self.n_groupings,
                                         n_bootstrap=self.n_bootstrap, n_clusters=self.n_clusters,
                                         seed=seed, client=client)
                key = info["key"]
                log.info("using the store's bank %s", key)
            source = StoreSource(client, store.path, n_clusters=self.n_clusters_, bank_key=key,
                                 prefetch=self.prefetch)
            return self._train(source, store.y.astype(np.int64), rows, bank, seed, history)

    def _train(self, source, y_idx, rows, bank, seed, history=_History):
        """Train on ``source`` (in memory or streamed) over ``rows``: the shared second half of fit."""
        val_rows = None
        if self._use_early_stopping():
            train, val = _validation_split(y_idx[rows], self.validation_fraction, seed)
            rows, val_rows = rows[train], rows[val]
        self.bank_ = bank
        gpu = _cuda(self.device)
        # the caller's generators are left as they were, the GPU's too (dropout draws there)
        with torch.random.fork_rng(devices=[] if gpu is None else [gpu]):
            torch.manual_seed(seed)
            self.model_ = build_model(self.model, self.n_features_in_, len(self.classes_),
                                      regularizer=self.regularizer, dropout=self.dropout,
                                      hidden_layer_sizes=self.hidden_layer_sizes).to(self.device)
            optimizer = make_optimizer(self.model_, self.learning_rate,
                                       self.alpha if self.regularizer == "l2" else 0.0)
            stopper = EarlyStopping(self.patience) if val_rows is not None else None
            run = history(self, optimizer, stopper)
            start_epoch = run.resume()
            n_groupings = 0 if bank is None else len(bank)
            bank_t = None if bank is None else torch.as_tensor(bank, device=self.device)

            def epoch_batches(epoch):
                return source.batches(epoch_plan(rows, batch_size=self.batch_size, epoch=epoch,
                                                 seed=seed, n_groupings=n_groupings))

            validation = None if val_rows is None else (lambda: source.blocks(val_rows))
            if not run.stopped_early:  # the epochs left: none once max_epochs are done
                fit(self.model_, optimizer, epoch_batches=epoch_batches,
                    max_epochs=self.max_epochs, bank=bank_t, device=self.device,
                    validation=validation, stopper=stopper, start_epoch=start_epoch,
                    on_epoch_end=run.epoch_end, progress=bool(self.verbose))
            elif stopper is not None and stopper.best_state is not None:
                self.model_.load_state_dict(stopper.best_state)
            self.history_ = run.history
        if self.model == "logreg":
            self.coef_ = self.model_.first.weight.detach().cpu().numpy().copy()
            self.intercept_ = self.model_.first.bias.detach().cpu().numpy().copy()
        return self

    def _logits(self, X) -> np.ndarray:
        """Logits, shape (n_samples, n_classes)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float32, reset=False)
        blocks = (X[i : i + _BLOCK] for i in range(0, len(X), _BLOCK))
        return predict_logits(self._placed_model(), blocks, device=self.device)

    def _placed_model(self) -> torch.nn.Module:
        """``model_`` on ``device``: an unpickled estimator holds it on the CPU."""
        return self.model_.to(self.device)

    def __getstate__(self):
        # The model on the CPU: a run trained on a GPU node loads on a CPU-only one.
        state = super().__getstate__()
        model = state.get("model_")
        if model is not None and any(p.device.type != "cpu" for p in model.parameters()):
            state["model_"] = copy.deepcopy(model).cpu()
        return state

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, shape (n_samples, n_classes)."""
        logits = torch.from_numpy(self._logits(X))
        return torch.softmax(logits.double(), dim=1).numpy()

    def predict(self, X) -> np.ndarray:
        """Predicted class labels, shape (n_samples,)."""
        check_is_fitted(self)
        return self.classes_[self._logits(X).argmax(axis=1)]


def _cuda(device) -> torch.device | None:
    """``device`` as a torch device if it is a GPU, else None."""
    device = torch.device(device)
    return device if device.type == "cuda" else None


def _validation_split(y: np.ndarray, fraction: float, seed: int):
    """Split rows into training and validation, stratified when every class allows it."""
    rows = np.arange(len(y))
    n_val = max(1, int(round(fraction * len(y))))
    if len(y) - n_val < 1:
        raise ValueError(f"early stopping needs a validation split: got {len(y)} sample(s), too few")
    counts = np.bincount(y)
    stratify = y if counts.min() >= 2 and n_val >= len(counts) else None
    return train_test_split(rows, test_size=n_val, random_state=seed, stratify=stratify)
