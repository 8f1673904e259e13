"""``FeatureGroupingRegressor``: Algorithm 1 with a squared loss, behind the scikit-learn API."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import RegressorMixin

from fgscale.estimators._base import FeatureGroupingBase
from fgscale.estimators._inputs import check_targets_present, coef_images
from fgscale.estimators._params import estimator_signature, numpydoc

__all__ = ["FeatureGroupingRegressor"]


class FeatureGroupingRegressor(RegressorMixin, FeatureGroupingBase):
    __doc__ = f"""Regressor trained with feature grouping as a stochastic regularizer.

    The machinery of :class:`FeatureGroupingClassifier` (bank, standardization, step size,
    early stopping on a validation split, selection of ``"auto"`` and listed
    hyper-parameters, refit) with half the squared error as the loss and one output. The
    target is standardized for training (its mean and standard deviation are ``y_mean_`` and
    ``y_scale_``) and predictions are put back in its units. ``score`` is R², as
    scikit-learn's regressors; ``stop_on="accuracy"`` watches the validation R².

    Parameters
    ----------
{numpydoc("regression")}

    Attributes
    ----------
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features,)
        As :class:`FeatureGroupingClassifier`'s: a DataFrame's column names.
    n_clusters_ : int or None
        k as resolved from ``n_clusters``; None without feature grouping.
    screening_percentile_ : float
        As :class:`FeatureGroupingClassifier`'s, the clusters tested against the target.
    alpha_, dropout_ : float
    cv_results_ : list of dict
        As :class:`FeatureGroupingClassifier`'s; with ``stop_on="accuracy"``, ``val_error`` is 1
        minus the validation R².
    cv_scores_ : dict of list
        As nilearn's ``DecoderRegressor``: ``{{"beta": [...]}}``, the chosen candidate's
        validation score on each fold (``scoring``'s, else R²).
    cv_params_ : dict of dict
        ``{{"beta": {{...}}}}``, as the classifier's.
    smoothing_fwhm_ : float or None
        As :class:`FeatureGroupingClassifier`'s.
    mean_, scale_ : ndarray of shape (n_features,) or None
        The standardization of the features, ``(x - mean_) * scale_``: ``scale_`` is the
        reciprocal of each feature's standard deviation, a factor where scikit-learn's
        ``StandardScaler.scale_`` is a divisor.
    y_mean_, y_scale_ : float
        The standardization of the target, ``(y - y_mean_) / y_scale_``: ``y_scale_`` is the
        target's standard deviation (1 for a constant target).
    bank_ : ndarray of shape (n_groupings, n_features), int32, or None
    batch_size_ : int
        As :class:`FeatureGroupingClassifier`'s.
    coef_ : ndarray of shape (n_features,)
        Weights on the standardized features, in the target's units (``model="logreg"``,
        a linear model here).
    intercept_ : float
    coef_img_ : nibabel.Nifti1Image
        ``coef_`` as a 3D map, when a mask image is known.
    mask_img_ : nibabel.Nifti1Image or None
    model_ : torch.nn.Module
    n_iter_ : int
    history_ : list of dict

    Examples
    --------
    >>> import numpy as np
    >>> from fgscale import FeatureGroupingRegressor
    >>> rng = np.random.default_rng(0)
    >>> mask = np.ones((6, 6, 6), bool)
    >>> X = rng.standard_normal((120, 216)).astype(np.float32)
    >>> y = X[:, :20].sum(axis=1) + 0.1 * rng.standard_normal(120)
    >>> reg = FeatureGroupingRegressor(mask=mask, regularizer="l2", alpha=1e-3,
    ...                                random_state=0).fit(X, y)
    >>> bool(reg.score(X, y) > 0.8)
    True
    """

    _task = "regression"

    def __init__(self, *args, **params):
        super().__init__(*args, **params)

    __init__.__signature__ = estimator_signature("regression")

    def fit(self, X, y=None, *, groups=None, client=None, rows=None, checkpoint=None):
        """Build the bank (with feature grouping) and train.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), images, or a store (Store, str or Path)
            In-memory data; NIfTI images (paths or nibabel images, 3D or 4D, or a list of
            them) masked as :meth:`FeatureGroupingClassifier.fit` masks them; or a complete
            store whose cohort had a ``target`` column, streamed as the classifier streams.
        y : array-like of shape (n_samples,)
            Numeric targets; None with a store.
        groups : array-like of shape (n_samples,), optional
            The subject of each sample, kept on one side of the validation split (or of the
            folds of ``cv``), as
            :meth:`FeatureGroupingClassifier.fit` (by default the subjects of BIDS names).
        client : distributed.Client, optional
            With a store the cluster to use, with arrays or images the one that trains the
            phases of a search (the folds of ``cv``, the candidates), as
            :meth:`FeatureGroupingClassifier.fit`.
        rows, checkpoint : optional
            With a store, as :meth:`FeatureGroupingClassifier.fit`.

        Returns
        -------
        self
        """
        check_targets_present(y, "target")
        if y is not None and np.asarray(y).dtype.kind in "OSU":
            for i, value in enumerate(np.asarray(y).ravel()):  # the first that is no number
                try:
                    float(value)
                except (TypeError, ValueError):
                    raise ValueError(f"y must be numeric targets, got {str(value)!r} (sample "
                                     f"{i}); for class labels use FeatureGroupingClassifier"
                                     ) from None
        return super().fit(X, y, groups=groups, client=client, rows=rows, checkpoint=checkpoint)

    def _encode_targets(self, y) -> np.ndarray:
        y = np.asarray(y, np.float64)
        if y.ndim != 1:
            raise ValueError(f"y must be one target per sample, got shape {y.shape}")
        self._set_target_scale(y, stacklevel=5)  # the caller of fit
        return self._scaled(y)

    def _set_target_scale(self, y: np.ndarray, stacklevel: int) -> None:
        """The target's mean and standard deviation (1 for a constant target, warned of: a
        wrong column, or a unit lost on the way, more often than a wish); ``stacklevel``
        names the frame that called ``fit``, as ``warnings.warn``'s."""
        self.y_mean_ = float(np.mean(y))
        std = float(np.std(y))
        self.y_scale_ = std if std > 0 else 1.0
        if std == 0:
            warnings.warn(f"the target is {self.y_mean_:g} for all {y.size} training samples: "
                          "the model can only predict that value, and R² is not defined on "
                          "targets that do not vary", UserWarning, stacklevel=stacklevel)

    def _set_store_targets(self, store, rows) -> None:
        if store.target is None:
            raise ValueError(f"{store.path}: the store has no target (its cohort table had no "
                             "'target' column): regression needs one")
        # below fit: _store_plan, _fit_store, the base class's fit, this class's fit
        self._set_target_scale(store.target[rows], stacklevel=7)

    def _scaled(self, y: np.ndarray) -> np.ndarray:
        """The standardized target the model trains on, float32."""
        return ((y - self.y_mean_) / self.y_scale_).astype(np.float32)

    def _store_targets(self, store) -> np.ndarray:
        return self._scaled(store.target)

    def _store_source_kwargs(self) -> dict:
        return {"targets": "target", "target_mean": self.y_mean_,
                "target_scale": self.y_scale_}

    def _n_outputs(self) -> int:
        return 1

    def _set_outputs(self) -> None:
        if self.model == "logreg":
            first = self.model_.first
            self.coef_ = first.weight.detach().cpu().numpy()[0] * self.y_scale_
            self.intercept_ = float(first.bias.detach().cpu().numpy()[0]) * self.y_scale_ \
                + self.y_mean_

    @property
    def coef_img_(self):
        """``coef_`` as a 3D image on the mask's grid."""
        return coef_images(self)[0]

    def predict(self, X) -> np.ndarray:
        """Predicted targets, shape (n_samples,)."""
        return self._outputs(X)[:, 0].astype(np.float64) * self.y_scale_ + self.y_mean_
