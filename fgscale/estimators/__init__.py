"""Estimators behind the scikit-learn API: validate parameters, build the bank, train; and
fitted estimators saved as data (no pickle) and loaded back."""

from fgscale.estimators._classifier import FeatureGroupingClassifier
from fgscale.estimators._persist import load_model, save_model
from fgscale.estimators._regressor import FeatureGroupingRegressor

__all__ = ["FeatureGroupingClassifier", "FeatureGroupingRegressor", "load_model", "save_model"]
