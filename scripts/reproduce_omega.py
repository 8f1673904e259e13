"""Reproduce the paper's Fig. 2: Omega = E[Phi^T Phi] as a smoothing operator, and where Delta varies.

Writes ``fig2_omega.png`` into ``--out`` (default ``scripts/results``):

(a) a small example, as p x p images: one grouping's projection Phi^T Phi, Omega, and the
    elementwise variance of Delta, for a 1D chain of 60 features whose bank is built by ReNA on
    bootstrap rows of smooth 1D signals (random sums of a few Gaussian bumps plus noise);
(b) a real bank, as images: the mean training image, diag(Omega) and the membership variance
    (``fgscale.grouping._omega.membership_variance``, the diagonal of E[Delta^T Delta]) for a bank built
    on 270 Fashion-MNIST training images (standing in for the paper's Olivetti faces), with the
    paper's settings: r = 50 bootstrap rows per grouping, b = 100 groupings, k = 10% of p.
    Without the Fashion-MNIST files (``/usr/share/datasets/fashion-mnist``) scikit-learn's 8x8
    digits stand in, and the titles say so.

    .venv/bin/python scripts/reproduce_omega.py            # paper settings, ~10 s on 1 core
    .venv/bin/python scripts/reproduce_omega.py --quick    # b = 20, smoke test
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fgscale.grouping import make_bank, resolve_n_clusters  # noqa: E402
from fgscale.grouping._omega import membership_variance, omega_diagonal, omega_matrix  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent
N_TRAIN = 270  # training images the bootstrap rows are drawn from (the paper's Olivetti split)
N_BOOTSTRAP = 50  # r
N_GROUPINGS = 100  # b
FRACTION = 0.1  # k / p
CHAIN = dict(n_features=60, n_samples=200, n_clusters=12)


def chain_signals(rng: np.random.Generator, n_samples: int, n_features: int) -> np.ndarray:
    """Smooth 1D signals (n_samples, n_features): sums of 3 random Gaussian bumps, plus noise."""
    t = np.arange(n_features)
    centres = rng.uniform(0, n_features, size=(n_samples, 3, 1))
    widths = rng.uniform(3, 10, size=(n_samples, 3, 1))
    heights = rng.standard_normal((n_samples, 3, 1))
    bumps = heights * np.exp(-0.5 * ((t - centres) / widths) ** 2)
    return bumps.sum(axis=1) + 0.05 * rng.standard_normal((n_samples, n_features))


def load_images(seed: int) -> tuple[np.ndarray, tuple[int, int], str]:
    """N_TRAIN training images (n, p) in [0, 1], their 2D shape, and the data's name."""
    sys.path.insert(0, str(SCRIPTS))
    from bench_accuracy import FASHION_DIR, FASHION_FILES, load_fashion

    rng = np.random.default_rng(seed)
    if all((FASHION_DIR / name).is_file() for name in FASHION_FILES.values()):
        images = load_fashion()["train_images"]
        name = "Fashion-MNIST (standing in for Olivetti)"
    else:
        from sklearn.datasets import load_digits

        images = load_digits().images / 16.0 * 255.0
        name = f"sklearn digits 8x8 (Fashion-MNIST not found in {FASHION_DIR})"
    rows = rng.choice(len(images), size=N_TRAIN, replace=False)
    return images[rows].reshape(N_TRAIN, -1) / 255.0, images.shape[1:], name


def show(ax, image, title, cmap="viridis"):
    im = ax.imshow(image, cmap=cmap, interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    plt.colorbar(im, ax=ax, fraction=0.046, pad=0.03)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="b = 20 groupings instead of 100")
    parser.add_argument("--out", type=Path, default=SCRIPTS / "results", help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    b = 20 if args.quick else N_GROUPINGS
    rng = np.random.default_rng(args.seed)

    # (a) 1D chain: a 1D boolean mask makes ReNA's graph the chain of neighbours
    X_chain = chain_signals(rng, CHAIN["n_samples"], CHAIN["n_features"])
    chain_bank = make_bank(X_chain, np.ones(CHAIN["n_features"], dtype=bool), CHAIN["n_clusters"],
                           n_groupings=b, n_bootstrap=N_BOOTSTRAP, seed=args.seed)
    omega, delta_variance = omega_matrix(chain_bank)
    one = omega_matrix(chain_bank[:1])[0]

    # (b) images: the paper's r, b and k on 270 training images
    X, shape, name = load_images(args.seed)
    k = resolve_n_clusters(FRACTION, X.shape[1])
    bank = make_bank(X, np.ones(shape, dtype=bool), k, n_groupings=b, n_bootstrap=N_BOOTSTRAP,
                     seed=args.seed)
    diag = omega_diagonal(bank)
    mv = membership_variance(bank)

    fig, axes = plt.subplots(2, 3, figsize=(11, 7))
    p_chain = CHAIN["n_features"]
    settings = f"p={p_chain}, k={CHAIN['n_clusters']}, b={b}, r={N_BOOTSTRAP}"
    show(axes[0, 0], one, "(a) one grouping: $\\Phi^T\\Phi$", cmap="magma")
    show(axes[0, 1], omega, "(a) $\\Omega = E[\\Phi^T\\Phi]$", cmap="magma")
    show(axes[0, 2], delta_variance, "(a) Var[$\\Delta$] elementwise", cmap="magma")
    show(axes[1, 0], X.mean(axis=0).reshape(shape), "(b) mean training image", cmap="gray")
    show(axes[1, 1], diag.reshape(shape), "(b) diag($\\Omega$)")
    show(axes[1, 2], mv.reshape(shape), "(b) membership variance $\\Sigma_j$ Var[$\\Delta_{ij}$]")
    fig.suptitle(f"Fig. 2: (a) 1D chain of smooth signals, ReNA bank ({settings})\n"
                 f"(b) {name}: {N_TRAIN} training images, p={X.shape[1]}, k={k}, b={b}, "
                 f"r={N_BOOTSTRAP}", fontsize=10)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "fig2_omega.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")
    # the mean of diag(Omega) over features is k / p for any bank (each cluster adds |C| / |C|),
    # so the spread and the membership variance are what tell banks apart
    for label, d, v in [("chain", np.diag(omega), delta_variance.sum(axis=1)),
                        (name.split(" (")[0], diag, mv)]:
        print(f"{label}: diag(Omega) mean {d.mean():.4f} (= k/p), range [{d.min():.4f}, {d.max():.4f}]; "
              f"membership variance mean {v.mean():.4f}, max {v.max():.4f}, "
              f"mean ratio to diag(Omega) {np.mean(v / d):.2f}")

if __name__ == "__main__":
    main()
