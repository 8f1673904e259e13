"""``fgscale train`` (a run folder trained on a store) and ``fgscale cv`` (K-fold
cross-validation on its training rows)."""

from __future__ import annotations

from fgscale.cli._options import (
    add_cluster_args,
    add_cv_args,
    add_estimator_args,
    add_progress_arg,
    add_task_arg,
    add_worker_kind_arg,
    client_of,
    estimator_params,
    saved_cv_unless_given,
    saved_unless_given,
    worker_processes,
)


def register(sub) -> None:
    """Add ``train``, ``cv`` to the subcommands ``sub`` of the ``fgscale`` parser."""
    p = sub.add_parser("train", help="train on a store, streaming minibatches from the workers")
    add_estimator_args(p)
    p.add_argument("--out", required=True, help="run folder (config, checkpoints, metrics, maps)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out; with no run there, start it (requeued jobs)")
    add_task_arg(p)
    add_cluster_args(p)
    add_worker_kind_arg(p)
    add_progress_arg(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("cv", help="cross-validate on a store's training rows, folds by subject")
    add_estimator_args(p)
    add_cv_args(p)
    add_task_arg(p)
    add_cluster_args(p)
    add_worker_kind_arg(p)
    add_progress_arg(p)
    p.set_defaults(func=_cmd_cv)


def _processes(args, params: dict) -> bool:
    """The LocalCluster's kind (:func:`worker_processes`), processes by default with
    replicas: each replica needs a worker process of its own (``--worker-threads`` given is
    then refused by the fit, before any work)."""
    return worker_processes(args) or (args.worker_kind is None and params["replicas"] > 1)


def _cmd_train(args) -> int:
    from fgscale.cli._interrupt import _KEPT
    from fgscale.runs import summary_lines, train_run
    from fgscale.training._replicas import ReplicaLost

    params = estimator_params(args)
    if args.resume:
        params = saved_unless_given(params, args.out, args.given)
    with client_of(args, processes=_processes(args, params)) as client:
        try:
            summary = train_run(args.store, args.out, params=params, resume=args.resume,
                                client=client, task=args.task)
        except ReplicaLost as exc:  # the run stops; its checkpoints are where it goes on
            raise ReplicaLost(f"{exc}. {_KEPT['train']}") from None
    if summary.get("already_complete"):
        print(f"{summary['run']}: already complete with these parameters, nothing to do; "
              "its saved summary:")
    print("\n".join(summary_lines(summary, params)))
    return 0


def _cmd_cv(args) -> int:
    from fgscale.runs._crossval import cross_validate, summary_line

    params, folds, task = estimator_params(args), args.folds, args.task
    if args.resume:
        params, folds, task = saved_cv_unless_given(params, args)
    with client_of(args, processes=_processes(args, params)) as client:
        scores = cross_validate(args.store, params=params, n_folds=folds, client=client,
                                echo=print, task=task, out=args.out, resume=args.resume)
    print(summary_line(scores))
    return 0
