"""Estimators behind the scikit-learn API: validate parameters, build the bank, train."""

from fgscale.estimators._classifier import FeatureGroupingClassifier

__all__ = ["FeatureGroupingClassifier"]
