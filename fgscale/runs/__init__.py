"""Runs on a store, and what they leave: a run folder (configuration, checkpoints, metrics,
the fitted model as data, weight maps, predictions), its scores and its HTML report.

- :func:`train_run` trains an estimator on a store into a run folder (``fgscale train``);
- :func:`load_run`, :func:`evaluate_run` and :func:`predict_run` use a finished run
  (:func:`predict_run` also predicts a BIDS dataset's images, ``bids_filter`` selecting
  them, with their entities as columns, as ``fgscale predict`` does);
- :func:`cross_validate` runs K-fold cross-validation on a store's training rows
  (``fgscale cv``);
- :func:`runs_table` lists the run folders below a folder (``fgscale runs``),
  :func:`write_report` draws one run as an HTML file (``fgscale report``), and
  :func:`export_bids` writes its maps as a BIDS derivatives dataset (``fgscale export-bids``).

Names are imported when first used: listing runs or checking a folder does not import torch.
"""

from fgscale._utils.lazy import lazy_names

_EXPORTS = {
    "train_run": "_train",
    "summary_lines": "_train",
    "load_run": "_trained",
    "evaluate_run": "_trained",
    "predict_run": "_trained",
    "predict_line": "_trained",
    "cross_validate": "_crossval",
    "read_results": "_crossval",
    "RunFolder": "_folder",
    "runs_table": "_listing",
    "check_finished_run": "_listing",
    "write_report": "_html",
    "export_bids": "_bids",
    "STDOUT": "_reports",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
