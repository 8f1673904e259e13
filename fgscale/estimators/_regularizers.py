"""The regularizers, each declared in one place: what it needs on the workers, which
hyper-parameters apply to it, and how the model uses it.

The parameter table (:mod:`fgscale.estimators._params`) takes its choices from here, the search
(:mod:`fgscale.estimators._selection`) which hyper-parameters are in effect, the estimators how
a bank is built and where dropout goes. Adding a regularizer is adding a row here (and, for a
new hyper-parameter, a row of the parameter table). Imports no torch: the command line reads
the choices before it imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REGULARIZERS", "Regularizer", "model_dropout", "regularizer_named"]


@dataclass(frozen=True)
class Regularizer:
    """What a regularizer is made of.

    Attributes
    ----------
    name : str
        The value of the estimators' ``regularizer``.
    summary : str
        A few words for the parameter's help.
    weight_decay : bool
        ``alpha`` (L2 weight decay of the weight matrices) applies.
    alpha_auto : bool
        ``alpha=None`` means ``"auto"`` (a grid chosen on validation data); else 0.
    input_dropout : bool
        ``dropout`` applies to the input layer.
    hidden_dropout : bool
        ``dropout`` applies to the hidden layers (models with some).
    grouping : bool
        Training projects each minibatch with a grouping of a bank: the workers need the bank
        (``n_clusters``, ``n_groupings``, ``n_bootstrap`` apply, and ``screening_percentile``).
    """

    name: str
    summary: str
    weight_decay: bool = False
    alpha_auto: bool = False
    input_dropout: bool = False
    hidden_dropout: bool = False
    grouping: bool = False

    def dropout_applies(self, model: str) -> bool:
        """Whether ``dropout`` has an effect with ``model`` (a linear model has no hidden
        layer)."""
        return self.input_dropout or (self.hidden_dropout and model != "logreg")

    def dropout_rates(self, dropout: float) -> tuple[float, float]:
        """The rates of the input and hidden layers' dropout for a ``dropout`` of ``dropout``."""
        return (dropout if self.input_dropout else 0.0, dropout if self.hidden_dropout else 0.0)


REGULARIZERS = {r.name: r for r in (
    Regularizer("none", "no regularization"),
    Regularizer("l2", "L2 weight decay", weight_decay=True, alpha_auto=True),
    Regularizer("dropout", "dropout on the input and hidden layers", input_dropout=True,
                hidden_dropout=True),
    # the paper's MLP keeps dropout on its hidden layers, and L2 may be combined with grouping
    Regularizer("feature_grouping",
                "stochastic feature grouping (the paper's), with dropout on hidden layers",
                weight_decay=True, hidden_dropout=True, grouping=True),
)}


def regularizer_named(name: str) -> Regularizer:
    """The regularizer ``name`` (a ValueError lists the known ones)."""
    try:
        return REGULARIZERS[name]
    except KeyError:
        raise ValueError(f"regularizer must be one of {sorted(REGULARIZERS)}, got {name!r}") from None


def model_dropout(name: str, dropout: float) -> dict:
    """The keywords of :func:`fgscale.training.build_model` that place the dropout of
    regularizer ``name`` at rate ``dropout``."""
    input_rate, hidden_rate = regularizer_named(name).dropout_rates(dropout)
    return {"input_dropout": input_rate, "hidden_dropout": hidden_rate}
