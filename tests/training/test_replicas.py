"""Data-parallel replicas (gloo, in the worker processes of a real LocalCluster) against one
process streaming minibatches of all their rows."""

import _thread
import threading

import numpy as np
import pytest
import torch
from distributed import get_task_stream
from helpers import assert_replicas_leave, smooth_cohort

from fgscale.grouping import build_bank
from fgscale.store import write_store
from fgscale.training import LipschitzStep, StoreSource, build_model, epoch_plan, fit, make_optimizer
from fgscale.training._replicas import ReplicaGroup, fit_replicas


@pytest.fixture(scope="module")
def banked(tmp_path_factory, client):
    """A SYNTHETIC store with a bank of 3 groupings at k = 10%, its rows with labels and a
    numeric target: (path, k, key, training rows, bank)."""
    X, y, mask, split = smooth_cohort(n=150)  # over 64 training rows: a step of 80 rows
    target = X[:, :40].mean(axis=1) * 3.0 + 5.0
    path = tmp_path_factory.mktemp("replicas") / "cohort.zarr"
    write_store(path, X, y, mask, np.eye(4), target=target, split=split, block_rows=16,
                attrs={"synthetic": True})
    bank, info = build_bank(path, n_groupings=3, n_bootstrap=6, n_clusters=0.1, seed=0,
                            client=client, progress=False, return_info=True)
    return path, int(bank.max()) + 1, info["key"], np.flatnonzero(split == "train"), bank


def one_process(client, banked, model, *, batch_size, epochs, step_size, learning_rate,
                source_kw=None, **fit_kw):
    """The oracle: :func:`fit` on the source's batches, in this process (``source_kw`` to
    :class:`StoreSource`, ``fit_kw`` to :func:`fit`)."""
    path, k, key, rows, bank = banked
    source = StoreSource(client, path, n_clusters=k, bank_key=key, lipschitz=True,
                         **(source_kw or {}))
    optimizer = make_optimizer(model, learning_rate, 0.01)
    return fit(model, optimizer, max_epochs=epochs, bank=torch.from_numpy(bank),
               step_size=step_size,
               epoch_batches=lambda e: source.batches(epoch_plan(
                   rows, batch_size=batch_size, epoch=e, seed=4, n_groupings=len(bank))),
               **fit_kw)


def twins(kind, p, n_outputs):
    """Two models of the same initial weights, and a copy of those weights."""
    torch.manual_seed(0)
    start = build_model(kind, p, n_outputs, hidden_layer_sizes=(12,))
    models = [build_model(kind, p, n_outputs, hidden_layer_sizes=(12,)) for _ in range(2)]
    for model in models:
        model.load_state_dict(start.state_dict())
    return (*models, start)


def assert_same_training(replicated, oracle, start, history, expected):
    for (name, got), want in zip(replicated.state_dict().items(), oracle.state_dict().values(),
                                 strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(replicated.first.weight, start.first.weight)  # it did train
    np.testing.assert_allclose([h["train_loss"] for h in history],
                               [h["train_loss"] for h in expected], rtol=1e-5)


# batch 40 (2 x 20): the step size's Gram matrix gathered; batch 80 (2 x 40): its power
# iterations summed across the replicas; a fixed step: the gradients alone
@pytest.mark.parametrize("batch_size, auto", [(20, True), (40, True), (20, False)],
                         ids=["gram", "power-iterations", "fixed-step"])
@pytest.mark.parametrize("kind", ["mlp", "logreg"])
def test_two_replicas_equal_one_process_with_twice_the_batch(client, banked, kind, batch_size,
                                                             auto):
    path, k, key, rows, bank = banked
    torch.manual_seed(0)
    start = build_model(kind, int(bank.shape[1]), 3, hidden_layer_sizes=(12,))
    oracle, replicated = (build_model(kind, int(bank.shape[1]), 3, hidden_layer_sizes=(12,))
                          for _ in range(2))
    oracle.load_state_dict(start.state_dict())
    replicated.load_state_dict(start.state_dict())
    step = LipschitzStep(1.0, 0.01) if auto else None
    expected = one_process(client, banked, oracle, batch_size=2 * batch_size, epochs=3,
                           step_size=step, learning_rate=0.05)
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    history = fit_replicas(client, source, replicated, rows, replicas=2, batch_size=batch_size,
                           max_epochs=3, seed=4, n_groupings=len(bank), learning_rate=0.05,
                           weight_decay=0.01, step_size=step)
    assert_same_training(replicated, oracle, start, history, expected)


def test_replicas_need_worker_processes_and_a_bank(client, banked):
    path, k, key, rows, bank = banked
    model = build_model("mlp", int(bank.shape[1]), 3, hidden_layer_sizes=(4,))
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    with pytest.raises(ValueError, match="replicas=3 needs as many worker processes"):
        fit_replicas(client, source, model, rows, replicas=3, batch_size=8, max_epochs=1,
                     seed=0, n_groupings=len(bank))
    with pytest.raises(ValueError, match="need feature grouping"):
        fit_replicas(client, StoreSource(client, path), model, rows, replicas=2, batch_size=8,
                     max_epochs=1, seed=0, n_groupings=0)


def test_a_failing_replica_fails_the_run_without_waiting_for_the_others(client, banked):
    path, k, key, rows, bank = banked
    model = build_model("logreg", int(bank.shape[1]), 3)
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    # one row past the store's end: the replica whose share holds it fails its first read,
    # while the other waits for it at the step's collective
    bad = np.append(rows[:15], 10**6)
    with pytest.raises(IndexError):
        fit_replicas(client, source, model, bad, replicas=2, batch_size=8, max_epochs=1,
                     seed=0, n_groupings=len(bank), timeout=600)
    # the other replica left the collective too, the group torn down: each worker's thread
    # takes tasks again
    assert_replicas_leave(client)
    for address in client.scheduler_info()["workers"]:
        assert client.submit(sum, [1, 2], workers=[address], pure=False).result(timeout=60) == 3


def test_a_replica_that_cannot_start_fails_the_others_by_name(client, banked):
    """Rank 1's worker busy (its one thread held by a task until released): rank 0 opens the
    store and waits for it to join, then fails within ``timeout``, naming it, rather than in
    gloo's rendezvous; once the worker is free again, nothing of the phase stays behind."""
    from distributed import Event

    from fgscale.training._replicas import replica_workers

    path, k, key, rows, bank = banked
    model = build_model("logreg", int(bank.shape[1]), 3)
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    release = Event(f"release-{id(model)}", client=client)

    def hold(name):  # nested: shipped by value to the worker
        from distributed import Event

        return Event(name).wait()

    busy = client.submit(hold, release.name, workers=[replica_workers(client, 2)[1]],
                         allow_other_workers=False, pure=False)
    try:
        with pytest.raises(TimeoutError, match=r"^replica 0 of 2: replica\(s\) \[1\] did not "
                                              r"join the process group within 3 s"):
            fit_replicas(client, source, model, rows, replicas=2, batch_size=8, max_epochs=1,
                         seed=0, n_groupings=len(bank), timeout=3)
    finally:
        release.set()
    assert busy.result(timeout=60)
    assert_replicas_leave(client)
    assert fit_replicas(client, source, model, rows, replicas=2, batch_size=8, max_epochs=1,
                        seed=0, n_groupings=len(bank))


# class weights enter the loss and the step size's rows: the Gram matrix's path (2 x 20 rows)
# gathers the rows' weights with them, the power iterations' (2 x 40) sum weighted products
@pytest.mark.parametrize("batch_size", [20, 40], ids=["gram", "power-iterations"])
def test_replicas_screen_and_weigh_classes_as_one_process(client, banked, batch_size):
    path, k, key, rows, bank = banked
    replicated, oracle, start = twins("logreg", int(bank.shape[1]), 3)
    # screening's mask of each grouping, for each of the 3 outputs (a linear model's, as FREM)
    keep = torch.from_numpy(np.random.default_rng(1).random((len(bank), 3, k)) < 0.6)
    weights = torch.tensor([0.5, 1.0, 2.5])
    step = LipschitzStep(1.0, 0.01)
    expected = one_process(client, banked, oracle, batch_size=2 * batch_size, epochs=3,
                           step_size=step, learning_rate=0.0, keep=keep, class_weight=weights)
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    history = fit_replicas(client, source, replicated, rows, replicas=2, batch_size=batch_size,
                           max_epochs=3, seed=4, n_groupings=len(bank), weight_decay=0.01,
                           step_size=step, keep=keep, class_weight=weights)
    assert_same_training(replicated, oracle, start, history, expected)


def test_replicas_regress_with_the_average_of_their_iterates_as_one_process(client, banked):
    path, k, key, rows, bank = banked
    replicated, oracle, start = twins("mlp", int(bank.shape[1]), 1)
    keep = torch.from_numpy(np.random.default_rng(2).random((len(bank), k)) < 0.6)
    target = {"targets": "target", "target_mean": 5.0, "target_scale": 0.5}
    step = LipschitzStep(2.0, 0.01)  # half the squared error: twice the cross-entropy's
    expected = one_process(client, banked, oracle, batch_size=80, epochs=3, step_size=step,
                           learning_rate=0.0, source_kw=target, keep=keep, regression=True)
    source = StoreSource(client, path, n_clusters=k, bank_key=key, **target)
    history = fit_replicas(client, source, replicated, rows, replicas=2, batch_size=40,
                           max_epochs=3, seed=4, n_groupings=len(bank), weight_decay=0.01,
                           step_size=step, keep=keep, regression=True)
    assert_same_training(replicated, oracle, start, history, expected)


def test_an_epoch_at_a_time_trains_as_the_epochs_in_one_call(client, banked):
    """A phase that starts at each epoch (a run resumed after every epoch: the replicas
    started again from the weights brought back) gives the weights of one phase for all the
    epochs, dropout's masks included."""
    path, k, key, rows, bank = banked
    torch.manual_seed(0)
    whole = build_model("mlp", int(bank.shape[1]), 3, hidden_layer_sizes=(12,),
                        hidden_dropout=0.5)
    by_epoch = build_model("mlp", int(bank.shape[1]), 3, hidden_layer_sizes=(12,),
                           hidden_dropout=0.5)
    by_epoch.load_state_dict(whole.state_dict())
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    common = dict(replicas=2, batch_size=20, seed=4, n_groupings=len(bank), learning_rate=0.05)
    history = fit_replicas(client, source, whole, rows, max_epochs=2, **common)
    losses = [fit_replicas(client, source, by_epoch, rows, start_epoch=e, max_epochs=e + 1,
                           **common)[0]["train_loss"] for e in range(2)]
    for (name, got), want in zip(by_epoch.state_dict().items(), whole.state_dict().values(),
                                 strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    assert losses == [h["train_loss"] for h in history]


def served_tasks(stream) -> dict:
    """How many tasks of each kind a task stream saw: replicas, commands, ..."""
    names = [str(t["key"]).split("-")[0] for t in stream.data]
    return {name: names.count(name) for name in set(names)}


def test_the_replicas_and_their_group_last_the_phase(client, banked):
    """One replica task per worker (one process group, the model sent once) for all the
    epochs of a phase, told each epoch by a small command; each epoch's weights, brought
    back, equal those of a phase per epoch (the per-epoch replicas that came before)."""
    path, k, key, rows, bank = banked
    kept, by_epoch, start = twins("mlp", int(bank.shape[1]), 3)
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    common = dict(replicas=2, batch_size=20, seed=4, n_groupings=len(bank), learning_rate=0.05,
                  step_size=LipschitzStep(1.0, 0.01))
    with get_task_stream(client) as stream:
        with ReplicaGroup(client, source, kept, rows, **common) as group:
            epochs = [(group.run_epoch(epoch)["train_loss"],
                       {name: t.clone() for name, t in kept.state_dict().items()})
                      for epoch in range(3)]
    tasks = served_tasks(stream)
    assert_replicas_leave(client)  # the phase's end stopped them: the group torn down
    # the group's 2 replicas for its 3 epochs; commands: 2 an epoch, and 2 to stop
    assert tasks.get("serve_replica") == 2, tasks
    assert tasks["_command"] == 3 * 2 + 2
    for epoch, (loss, state) in enumerate(epochs):
        want = fit_replicas(client, source, by_epoch, rows, start_epoch=epoch,
                            max_epochs=epoch + 1, **common)[0]["train_loss"]
        assert loss == want
        for (name, got), same in zip(state.items(), by_epoch.state_dict().values(),
                                     strict=True):
            torch.testing.assert_close(got, same, rtol=0, atol=0, msg=name)
    assert not torch.equal(kept.first.weight, start.first.weight)


@pytest.mark.parametrize("when", ["between epochs", "mid-phase"])
def test_ctrl_c_stops_the_replicas(client, banked, when):
    """Ctrl-C in the central process (a KeyboardInterrupt, between two epochs or while the
    replicas train) cancels the replicas: they leave at their next step or wait, and tear
    their process group down; a new phase then trains on the same workers."""
    path, k, key, rows, bank = banked
    model = build_model("mlp", int(bank.shape[1]), 3, hidden_layer_sizes=(12,))
    source = StoreSource(client, path, n_clusters=k, bank_key=key)
    common = dict(replicas=2, batch_size=20, seed=4, n_groupings=len(bank), learning_rate=0.05)
    with pytest.raises(KeyboardInterrupt):
        with ReplicaGroup(client, source, model, rows, **common) as group:
            group.run_epoch(0)
            if when == "between epochs":
                raise KeyboardInterrupt
            # the main thread interrupted as the Ctrl-C of a terminal would, while it waits
            # for the replicas' epochs
            threading.Timer(0.5, _thread.interrupt_main).start()
            for epoch in range(1, 10**6):
                group.run_epoch(epoch, weights=False)
    assert_replicas_leave(client)
    assert fit_replicas(client, source, model, rows, max_epochs=1, **common)
