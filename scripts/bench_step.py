"""Benchmark: one SGD step with feature grouping against the plain full-dimension step.

Batch 200, p = 270,806 (the HCP 2 mm mask size), k = 27,080, 20 classes; logistic regression
and the MLP (256 hidden units). The data are random (synthetic); only timing is measured.
Columns: the step on full rows (L2, dropout, no regularizer) and the step on reduced rows with
W0 Phi^T computed inside (what the central process pays with feature grouping), each through
autograd and SGD (a dense (h x p) gradient for W0) and deferred, as training runs first layers
of 64M weights and more (full rows: one in-place W0 += -lr g^T x; reduced rows: the (h x k)
gradient applied to W0 row by row, the same numbers); and the reduction of the batch itself,
Phi x (what a worker pays per minibatch in the distributed trainer).

    .venv/bin/python scripts/bench_step.py [--repeats 7] [--p 270806] [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from benchlib import markdown_row, markdown_table, median_time, parse_args
from torch.nn import functional as F

from fgscale.grouping._projection import project
from fgscale.training._loop import make_optimizer
from fgscale.training._models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=270_806)
    parser.add_argument("--k", type=int, default=27_080)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--labels", choices=("random", "runs"), default="random",
                        help="clusters of voxels drawn at random (the worst case for the "
                             "gathers' locality), or contiguous runs of voxels, closer to "
                             "ReNA's spatially compact clusters (default random)")
    args = parse_args(parser, quick=dict(p=20_000, k=2_000, batch=50, classes=5, repeats=3))
    rng = np.random.default_rng(0)
    p, k, m = args.p, args.k, args.batch
    x = rng.standard_normal((m, p), dtype=np.float32)
    y = torch.as_tensor(rng.integers(0, args.classes, m))
    labels_np = rng.permutation(np.concatenate([np.arange(k), rng.integers(0, k, p - k)]))
    if args.labels == "runs":
        labels_np = np.sort(labels_np)
    labels = torch.as_tensor(labels_np).long()
    x_full = torch.from_numpy(x)
    x_red = torch.from_numpy(project(x, labels_np.astype(np.int32), k))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {m}, p = {p}, "
          f"k = {k} ({args.labels} clusters), {args.classes} classes; median of {args.repeats}; "
          "synthetic random data\n")
    markdown_table("model", "full rows, autograd (ms)", "full rows, deferred (ms)",
                   "grouped, autograd (ms)", "grouped, deferred (ms)",
                   "speed-up deferred / autograd: full, grouped",
                   "batch reduction Phi x (ms, on a worker)")
    reduce_ms = 1e3 * median_time(lambda: project(x, labels_np, k), args.repeats)
    for name in ("logreg", "mlp"):
        torch.manual_seed(0)
        model = build_model(name, p, args.classes)
        opt = make_optimizer(model, 0.01)
        group = opt.param_groups[0]  # the weight matrices, W0 among them

        def step(inputs, grouping, model=model, opt=opt, group=group):
            # train_epoch's step: with first.defer, W0 gets no dense gradient (h x p), and
            # step_deferred applies what its forward kept in place of SGD
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(inputs, grouping), y).backward()
            opt.step()
            model.first.step_deferred(group["lr"], group["weight_decay"])

        times = []
        for defer in (False, True):
            model.first.defer = defer
            times += [median_time(lambda: step(x_full, None), args.repeats),
                      median_time(lambda: step(x_red, labels), args.repeats)]
        model.first.defer = False
        full, grouped, full_deferred, grouped_deferred = times
        markdown_row(name, f"{1e3 * full:.1f}", f"{1e3 * full_deferred:.1f}",
                     f"{1e3 * grouped:.1f}", f"{1e3 * grouped_deferred:.1f}",
                     f"{full / full_deferred:.2f}, {grouped / grouped_deferred:.2f}",
                     f"{reduce_ms:.1f}")


if __name__ == "__main__":
    main()
