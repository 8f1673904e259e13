"""Estimators behind the scikit-learn API: validate parameters, build the bank, train; and
fitted estimators saved as data (no pickle) and loaded back.

The parameter table (:mod:`fgscale.estimators._params`) and the regularizers
(:mod:`fgscale.estimators._regularizers`) import no torch, so that the command line reads its
options from them before it imports torch; the estimators are imported on first use.
"""

from fgscale._utils.lazy import lazy_names

_EXPORTS = {
    "FeatureGroupingClassifier": "_classifier",
    "FeatureGroupingRegressor": "_regressor",
    "load_model": "_persist",
    "save_model": "_persist",
    "make_estimator": "_factory",
    "resolve_seed": "_params",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
