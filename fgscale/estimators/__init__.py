"""Estimators behind the scikit-learn API: validate parameters, build the bank, train."""

from fgscale.estimators._classifier import FeatureGroupingClassifier
from fgscale.estimators._regressor import FeatureGroupingRegressor

__all__ = ["FeatureGroupingClassifier", "FeatureGroupingRegressor"]
