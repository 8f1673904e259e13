"""Training: seeded minibatch plans, torch models with a grouped first layer, the training
loop fed by any batch source, and the streamed source (Dask workers read and project rows).
``_replicas.fit_replicas`` trains R copies of a model on Dask worker processes with
torch.distributed (gloo), each on its share of every step's rows: the estimators'
``replicas=R``, kept for the epochs of a phase (``_replicas.ReplicaGroup``) while the
central loop validates and checkpoints between them.
"""

from fgscale.training._loop import (
    Batch,
    EarlyStopping,
    History,
    evaluate,
    fit,
    make_optimizer,
    predict_logits,
    train_epoch,
)
from fgscale.training._memory import MemorySource
from fgscale.training._models import MLP, GroupedLinear, LogisticRegression, build_model
from fgscale.training._plan import EpochPlan, epoch_plan
from fgscale.training._sgd import LipschitzStep, lipschitz
from fgscale.training._stream import PREFETCH_BYTES, Prefetcher, StoreSource, auto_window

__all__ = ["MLP", "PREFETCH_BYTES", "Batch", "EarlyStopping", "EpochPlan", "GroupedLinear", "History",
           "LipschitzStep", "LogisticRegression", "MemorySource", "Prefetcher", "StoreSource", "auto_window",
           "build_model", "epoch_plan", "evaluate", "fit", "lipschitz", "make_optimizer",
           "predict_logits", "train_epoch"]
