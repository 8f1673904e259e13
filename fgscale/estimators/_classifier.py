"""``FeatureGroupingClassifier``: Algorithm 1 behind the scikit-learn API."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from fgscale.estimators._base import FeatureGroupingBase
from fgscale.estimators._inputs import check_targets_present, coef_images
from fgscale.estimators._params import estimator_signature, numpydoc

__all__ = ["FeatureGroupingClassifier"]


class FeatureGroupingClassifier(ClassifierMixin, FeatureGroupingBase):
    __doc__ = f"""Classifier trained with feature grouping as a stochastic regularizer.

    Each SGD step reduces its minibatch with a grouping drawn from a bank of ReNA
    clusterings and trains the first layer through it (Aydore et al., ICML 2019, Algorithm 1).
    After training the weights live in the original feature space. By default features are
    standardized, each step is 1/L for its minibatch, training stops when the validation
    loss stops improving, and the model is then refitted on all training rows. The
    parameters are declared once, in :data:`fgscale.estimators._params.PARAMS`, and all checked when
    ``fit`` starts.

    Parameters
    ----------
{numpydoc("classification")}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features,)
        The column names of ``X``, set only when it was a pandas DataFrame of string column
        names; ``predict`` then checks them.
    n_clusters_ : int or None
        k as resolved from ``n_clusters``; None without feature grouping.
    screening_percentile_ : float
        The percentile of each grouping's clusters that training keeps: ``screening_percentile``
        scaled by the mask's volume, as nilearn's; 100 without feature grouping.
    class_weight_ : ndarray of shape (n_classes,) or None
        Each class's weight in the loss, in ``classes_``'s order: ``class_weight`` rescaled
        to average 1 over the training rows; None with ``class_weight=None``.
    alpha_, dropout_ : float
        The values in effect (0 where they do not apply), chosen on the validation split
        where ``"auto"`` or a list.
    cv_results_ : list of dict
        One dict per candidate tried, in order: its ``alpha``, ``dropout``, ``n_clusters``,
        ``best_epoch`` and validation loss ``val_loss`` (``val_error`` with
        ``stop_on="accuracy"``); ``pandas.DataFrame(cv_results_)`` tabulates them. Unlike
        scikit-learn's search objects' dict of arrays, there is no test score to report.
        Each row also holds ``val_score``, the mean validation score (``scoring``'s, else the
        accuracy), and with ``cv`` each fold's epochs, loss and score (``fold_epochs``,
        ``fold_val_loss``, ``fold_val_score``); the means choose.
    cv_scores_ : dict of list
        As nilearn's decoders': keyed by class, the chosen candidate's validation score on
        each fold (one fold without ``cv``; the same list for every class, the classes sharing
        one softmax model); empty without validation rows.
    cv_params_ : dict of dict
        Keyed by class, the values the chosen candidate trained with on each fold, as lists:
        ``alpha``, ``dropout``, ``n_clusters`` and ``n_epochs``, the epochs each fold kept.
    smoothing_fwhm_ : float or None
        The FWHM in mm that the images given to ``predict`` and ``score`` are smoothed by: the
        one the fit's images were smoothed by (``smoothing_fwhm``, or the store's, from
        ``fgscale convert --smoothing-fwhm``); None for none.
    mean_, scale_ : ndarray of shape (n_features,) or None
        The standardization, ``(x - mean_) * scale_`` (None with ``standardize=False``):
        ``scale_`` is the reciprocal of each feature's standard deviation (1 for a constant
        one), a factor where scikit-learn's ``StandardScaler.scale_`` is a divisor.
    bank_ : ndarray of shape (n_groupings, n_features), int32, or None
    batch_size_ : int
        The minibatch size, ``batch_size`` or the one "auto" chose. An epoch's last minibatch
        holds the rows left over, so a ``batch_size_`` of at least the training rows makes each
        epoch one full-batch step. With ``replicas``, each replica's rows of a step: a step
        has ``replicas * batch_size_`` rows ("auto" sizes the step and shares it among the
        replicas, rounded up).
    model_ : torch.nn.Module
    coef_ : ndarray of shape (n_classes, n_features), or (1, n_features) for two classes
        Logistic regression weights on the standardized features, in feature space
        (``model="logreg"`` only), as nilearn's decoders report theirs: ``decision_function``
        is ``((X - mean_) * scale_) @ coef_.T + intercept_``. For two classes, as
        scikit-learn's, the second class's logit weights minus the first's.
    intercept_ : ndarray of shape (n_classes,), or (1,) for two classes
    coef_img_ : dict of nibabel.Nifti1Image
        The weights of each class's logit as a 3D map, keyed by class, when a mask image is
        known. Two classes get two maps, as nilearn's ``Decoder`` keys both classes of a
        binary problem: their difference is ``coef_``, and since the two logits start at zero
        and each step of the softmax loss moves them oppositely, the maps are negatives of
        each other (to float32 rounding), the second class's being ``coef_ / 2``.
    mask_img_ : nibabel.Nifti1Image or None
        The mask of the features, as a uint8 image of 0 and 1: the store's, the one computed
        from or given with the images, ``mask`` when it is an image or a path (its voxels
        finite and non-zero); None for arrays with no image mask (a boolean array has no
        affine). ``predict`` and ``score`` accept images on its grid.
    n_iter_ : int
        Epochs that the returned model was trained for.
    history_ : list of dict
        Metrics of each epoch (``"phase": "refit"`` for the refit's).

    Examples
    --------
    >>> import numpy as np
    >>> from fgscale import FeatureGroupingClassifier
    >>> rng = np.random.default_rng(0)
    >>> mask = np.ones((6, 6, 6), bool)
    >>> y = np.repeat([0, 1], 40)
    >>> X = rng.standard_normal((80, 216)).astype(np.float32) + y[:, None]
    >>> clf = FeatureGroupingClassifier(mask=mask, n_groupings=5, n_bootstrap=20,
    ...                                 random_state=0).fit(X, y)
    >>> clf.coef_.shape  # two classes: one row, as scikit-learn's
    (1, 216)
    >>> bool(clf.score(X, y) > 0.9)
    True
    """

    _task = "classification"

    def __init__(self, *args, **params):
        super().__init__(*args, **params)

    __init__.__signature__ = estimator_signature("classification")

    def fit(self, X, y=None, *, groups=None, client=None, rows=None, checkpoint=None):
        """Build the bank (with feature grouping) and train.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), images, or a store (Store, str or Path)
            In-memory data; or NIfTI images (paths or nibabel images, 3D, or 4D with one
            sample per volume, or a list of them), masked with ``mask`` or else with the
            voxels finite and non-zero in all of them; or a complete fgscale store: then the
            labels, the mask and the training rows come from the store, the bank of these
            parameters is read from it (built on the cluster first if missing) and
            minibatches are streamed from it by Dask workers.
        y : array-like of shape (n_samples,)
            Labels; must be None with a store.
        groups : array-like of shape (n_samples,), optional
            The subject (or session) of each sample: the validation split (or the folds of
            ``cv``) of early stopping and of ``"auto"`` keeps each group on one side, as the
            split of a store with a ``group`` column does. Must be None with a store.
            Default: with NIfTI files of BIDS names (``sub-<label>_...``), their subjects,
            said in a warning; else none (the rows are split one by one).
        client : distributed.Client, optional
            With a store: the cluster to use; default the active ``distributed`` client, else
            an embedded LocalCluster: threads up to 4 workers, processes beyond
            (``processes="auto"`` of :func:`fgscale._dask.client.get_client`). Its workers
            also train the phases of a search (each candidate on each fold of ``cv``) as
            tasks, each reading its fold's rows from the store itself, where it has room: two
            worker processes or more, with memory for four copies of the model's first layer
            within half their limit, ``replicas=1``, the CPU and no ``checkpoint``; else the
            phases train here, their minibatches streamed from the workers. With arrays or
            images: the cluster that trains the phases of a search as tasks on its workers,
            the rows sent to each worker once, with the numbers of a fit without it; tasks
            that share a worker process take turns (torch's random generator is the
            process's), so give workers as processes (``threads_per_worker=1``). None (the
            default): they train one after the other in this process, and no cluster starts.
            Unused, and warned of, with a single phase (no ``cv``, one candidate) or a GPU
            ``device``. The refit trains in this process.
        rows : array-like of int, optional
            With a store: the rows to train on (a fold of a cross-validation); default the
            store's training rows. Statistics and banks are those of these rows.
        checkpoint : callable, optional
            With a store: the per-phase hook, called as ``checkpoint(estimator, optimizer,
            stopper, phase=..., params=...)`` and returning a
            :class:`fgscale.training.History` (or subclass) that records each epoch and says
            where a phase resumes; run folders pass their checkpoints here. Default
            :class:`~fgscale.training.History`, which saves nothing.

        Returns
        -------
        self
        """
        check_targets_present(y, "label")
        return super().fit(X, y, groups=groups, client=client, rows=rows, checkpoint=checkpoint)

    def _encode_targets(self, y) -> np.ndarray:
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"y holds 1 class ({self.classes_.tolist()}); classification needs "
                             "samples of at least 2 classes")
        return y_idx.astype(np.int64)

    def _set_store_targets(self, store, rows) -> None:
        if not store.has_labels:
            raise ValueError(f"{store.path}: the store has no class labels (its cohort had a "
                             "target column only): use FeatureGroupingRegressor")
        present = np.bincount(store.y[rows], minlength=len(store.classes)) > 0
        if present.sum() < 2:
            raise ValueError(f"{store.path}: the training rows hold {int(present.sum())} class "
                             f"({store.classes[present].tolist()}); classification needs at least 2")
        if not present.all():
            raise ValueError(f"{store.path}: no training row of class(es) "
                             f"{store.classes[~present].tolist()}, which the store has: the model "
                             "could never predict them (move some of their rows to the "
                             "training split)")
        self.classes_ = store.classes
        self._check_class_weight_labels()  # before any cluster starts

    def _set_class_weights(self, y_idx: np.ndarray):
        """``class_weight_``: ``class_weight`` as one weight per class, rescaled to average 1
        over the training rows ``y_idx`` (None with ``class_weight=None``)."""
        self.class_weight_ = None
        if self.class_weight is None:
            return None
        labels = self.classes_.tolist()
        counts = np.bincount(y_idx, minlength=len(labels)).astype(np.float64)
        if isinstance(self.class_weight, str):  # "balanced", as scikit-learn's
            weights = len(y_idx) / (len(labels) * np.maximum(counts, 1))
        else:
            self._check_class_weight_labels()
            weights = np.array([float(self.class_weight.get(c, 1.0)) for c in labels])
        self.class_weight_ = weights * (len(y_idx) / (counts @ weights))
        return self.class_weight_

    def _check_class_weight_labels(self) -> None:
        """Refuse a ``class_weight`` dict naming a label that is not in ``classes_``."""
        labels = self.classes_.tolist()
        unknown = [k for k in self.class_weight if k not in labels] \
            if isinstance(self.class_weight, dict) else []
        if unknown:
            raise ValueError(f"class_weight names {unknown}, which are not classes of the "
                             f"training rows: their classes are {labels}")

    def _store_targets(self, store) -> np.ndarray:
        return store.y.astype(np.int64)

    def _n_outputs(self) -> int:
        return len(self.classes_)

    def _set_outputs(self) -> None:
        if self.model == "logreg":
            weight = self.model_.first.weight.detach().cpu().numpy().copy()
            bias = self.model_.first.bias.detach().cpu().numpy().copy()
            if len(self.classes_) == 2:  # scikit-learn's: the weights of decision_function
                weight, bias = weight[1:] - weight[:1], bias[1:] - bias[:1]
            self.coef_, self.intercept_ = weight, bias

    @property
    def coef_img_(self) -> dict:
        """The weights of each class's logit as a 3D image, keyed by class (as nilearn's
        decoders), two classes included: the run folder's maps. For two classes the maps are
        negatives of each other, the second class's being ``coef_ / 2`` (see the class's
        Attributes). Logistic regression fitted with a mask image, on images or on a store."""
        check_is_fitted(self)
        weights = self.model_.first.weight.detach().cpu().numpy() if hasattr(self, "coef_") \
            else None
        return dict(zip(self.classes_.tolist(), coef_images(self, weights), strict=True))

    def _logits(self, X) -> np.ndarray:
        """Logits, shape (n_samples, n_classes)."""
        return self._outputs(X)

    def decision_function(self, X) -> np.ndarray:
        """Logits, shape (n_samples, n_classes); for two classes, the second class's logit
        minus the first's, shape (n_samples,), as scikit-learn's classifiers."""
        logits = self._logits(X).astype(np.float64)  # as predict_proba, and scikit-learn's
        return logits[:, 1] - logits[:, 0] if logits.shape[1] == 2 else logits

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, shape (n_samples, n_classes), in ``classes_``'s order."""
        logits = torch.from_numpy(self._logits(X))
        return torch.softmax(logits.double(), dim=1).numpy()

    def predict_log_proba(self, X) -> np.ndarray:
        """Log class probabilities, shape (n_samples, n_classes), in ``classes_``'s order;
        from the logits, so finite where a probability underflows to 0."""
        logits = torch.from_numpy(self._logits(X))
        return torch.log_softmax(logits.double(), dim=1).numpy()

    def predict(self, X) -> np.ndarray:
        """Predicted class labels, shape (n_samples,)."""
        check_is_fitted(self)
        return self.classes_[self._logits(X).argmax(axis=1)]
