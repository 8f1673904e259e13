"""The paper's Fig. 3, 4 and 5 from the fits of ``reproduce_table1.py`` (seed 0, high noise).

Fig. 3: accuracy on the validation split (the third of the training images held out for early
stopping; never the test set) against training time, one line per regularizer, for logistic
regression and the MLP. Fig. 4: the weights of logistic regression for two classes under each
regularizer. Fig. 5: three groupings of the bank, and how often each pixel sits on a cluster
boundary over the whole bank. L2 and dropout are the values picked on the validation split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")
SHOWN_CLASSES = (1, 7)  # trouser and sneaker: shapes anyone recognises in a weight map
COLORS = {"none": "0.4", "L2": "tab:blue", "dropout": "tab:orange",
          "feature grouping": "tab:green"}


def _save(fig, path: Path, title: str) -> Path:
    """Title ``fig``, write it to ``path`` (a small PNG) and close it."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _picked(kept: dict, model: str) -> dict:
    """Regularizer -> the fit shown: L2 and dropout at their validation pick."""
    out = {}
    for method in COLORS:
        fits = [f for (m, meth, _), f in kept.items() if m == model and meth == method]
        if fits:
            out[method] = min(fits, key=lambda f: f["val_loss"])
    return out


def _label(method: str, fit: dict) -> str:
    chosen = fit["chosen"]
    if method == "L2":
        return f"L2 (alpha {chosen['alpha']:g})"
    if method == "dropout":
        return f"dropout ({chosen['dropout']:g})"
    return method


def fig3(kept: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, model, title in zip(axes, ("logreg", "mlp"), ("logistic regression", "MLP"),
                                strict=True):
        for method, fit in _picked(kept, model).items():
            hist = fit["history"]
            seconds = np.cumsum([h["seconds"] for h in hist])
            # dashed and on top: L2 at a tiny alpha would otherwise hide it
            ax.plot(seconds, [100 * h["val_accuracy"] for h in hist], color=COLORS[method],
                    label=_label(method, fit), linestyle="--" if method == "none" else "-",
                    zorder=3 if method == "none" else 2)
        ax.set(xlabel="training time (s)", ylabel="validation accuracy (%)", title=title)
        if ax.lines:
            ax.legend(fontsize=8)
    return _save(fig, out / "fig3_convergence.png",
                 "Fig. 3: convergence at high noise (0.6 dB), Fashion-MNIST standing in for "
                 "Olivetti, seed 0")


def fig4(kept: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    picked = {m: f for m, f in _picked(kept, "logreg").items() if f["coef"] is not None}
    fig, axes = plt.subplots(len(SHOWN_CLASSES), len(picked), squeeze=False,
                             figsize=(2.3 * len(picked), 2.4 * len(SHOWN_CLASSES)))
    for col, (method, fit) in enumerate(picked.items()):
        for row, cls in enumerate(SHOWN_CLASSES):
            w = fit["coef"][cls].reshape(28, 28)
            bound = np.abs(w).max() or 1.0
            ax = axes[row, col]
            ax.imshow(w, cmap="RdBu_r", vmin=-bound, vmax=bound)
            ax.set_xticks([]), ax.set_yticks([])
            if row == 0:
                ax.set_title(_label(method, fit), fontsize=9)
            if col == 0:
                ax.set_ylabel(CLASSES[cls], fontsize=9)
    return _save(fig, out / "fig4_weights.png",
                 "Fig. 4: logistic regression weights at high noise (Fashion-MNIST, seed 0)")


def _boundaries(labels: np.ndarray) -> np.ndarray:
    img = labels.reshape(28, 28)
    edge = np.zeros((28, 28), bool)
    edge[:, 1:] |= img[:, 1:] != img[:, :-1]
    edge[1:, :] |= img[1:, :] != img[:-1, :]
    return edge


def fig5(kept: dict, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    fits = [f for (m, meth, _), f in kept.items()
            if m == "logreg" and meth == "feature grouping" and f["bank"] is not None]
    if not fits:
        return None
    bank = np.asarray(fits[0]["bank"])
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(1, 4, figsize=(10, 2.9))
    for ax, g in zip(axes[:3], (0, 1, 2), strict=True):
        colors = rng.random((int(bank[g].max()) + 1, 3))  # random colours: neighbours differ
        ax.imshow(colors[bank[g]].reshape(28, 28, 3))
        ax.set_title(f"grouping {g} (k = {int(bank[g].max()) + 1})", fontsize=9)
    freq = np.mean([_boundaries(b) for b in bank], axis=0)
    im = axes[3].imshow(freq, cmap="magma")
    axes[3].set_title(f"boundary frequency, {len(bank)} groupings", fontsize=9)
    fig.colorbar(im, ax=axes[3], fraction=0.046)
    for ax in axes:
        ax.set_xticks([]), ax.set_yticks([])
    return _save(fig, out / "fig5_groupings.png",
                 "Fig. 5: ReNA groupings of the bank (r = 50 bootstrap images each, "
                 "Fashion-MNIST at high noise)")


def draw_figures(kept: dict, out: Path) -> list[Path]:
    """Draw the three figures into ``out``; return the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    return [p for p in (fig3(kept, out), fig4(kept, out), fig5(kept, out)) if p is not None]
