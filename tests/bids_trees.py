"""SYNTHETIC BIDS datasets for the tests, laid out as the specification lays them out: real NIfTI
files written with nibabel, JSON sidecars, ``participants.tsv``, ``sessions.tsv``,
``scans.tsv`` and ``events.tsv`` (import them with ``from bids_trees import ...``;
tests/conftest.py puts this folder on sys.path).

Every image is a box of positive values (the computed mask is the box), a smooth pattern per
class added, and noise: a decoder separates the classes.
"""

import json
from pathlib import Path

import nibabel as nib
import numpy as np

GRID = (10, 11, 9)
AFFINE = np.array([[4.0, 0, 0, -20], [0, 4.0, 0, -22], [0, 0, 4.0, -18], [0, 0, 0, 1]])
SPACE = "MNI152NLin2009cAsym"
# what the CLI tests train with (small and quick) and select the statistical maps with
TRAIN = ["--n-groupings", "4", "--n-bootstrap", "10", "--n-clusters", "0.1", "--batch-size",
         "16", "--seed", "0", "--max-epochs", "4", "--n-workers", "1", "--no-progress"]
MAPS = ["--bids-filter", f"space={SPACE}", "suffix=statmap"]
TR = 2.0
N_VOLUMES = 30
# two blocks per run (volume i at i x TR): face over volumes 2-9, house over 14-21; an n/a
# event over 24-25 and rest elsewhere, left out
EVENTS = [("4.0", "16.0", "face"), ("28.0", "16.0", "house"), ("48.0", "4.0", "n/a")]
LABELLED = {**{i: "face" for i in range(2, 10)}, **{i: "house" for i in range(14, 22)}}


def _patterns():
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in GRID], indexing="ij"), -1)
    centres = {"face": (3, 3, 3), "house": (6, 7, 5), "age": (5, 5, 4)}
    return {k: np.exp(-((grid - np.array(c)) ** 2).sum(-1) / 6.0) for k, c in centres.items()}


_PATTERNS = _patterns()
_BOX = np.zeros(GRID, bool)
_BOX[1:-1, 1:-1, 1:-1] = True


def volume(rng, klass=None, age=None) -> np.ndarray:
    """One SYNTHETIC volume: 10 inside the box, 0 outside, the class's pattern and the age's
    added, noise."""
    vol = 10.0 + 0.5 * rng.standard_normal(GRID)
    if klass is not None:
        vol += 3.0 * _PATTERNS[klass]
    if age is not None:
        vol += 0.1 * (age - 40.0) * _PATTERNS["age"]
    return np.where(_BOX, vol, 0.0).astype(np.float32)


def save(path: Path, data: np.ndarray, tr: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(data, AFFINE)
    img.header.set_xyzt_units("mm", "sec")
    if tr is not None:
        img.header.set_zooms((4.0, 4.0, 4.0, tr))
    img.set_sform(AFFINE, code=4)  # MNI
    nib.save(img, path)
    return path


def write_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))
    return path


def write_tsv(path: Path, header, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


def subjects(n: int) -> list[str]:
    return [f"{i:02d}" for i in range(1, n + 1)]


def diagnosis(subject: str) -> str:
    return "patient" if int(subject) % 2 else "control"


def age(subject: str) -> float:
    return 20.0 + 5.5 * int(subject)


def drug(session: str) -> str:
    """A session's value in ``sessions.tsv``."""
    return "placebo" if session == "1" else "drug"


def condition(run: str) -> str:
    """A run's value in ``scans.tsv``."""
    return "open" if run == "1" else "closed"


def participants(root: Path, n_subjects: int) -> Path:
    return write_tsv(root / "participants.tsv", ["participant_id", "diagnosis", "age", "sex"],
                     [[f"sub-{s}", diagnosis(s), age(s), "n/a"] for s in subjects(n_subjects)])


def statmap_dataset(root: Path, n_subjects: int = 8, seed: int = 0) -> Path:
    """A SYNTHETIC derivatives dataset of first-level 3D maps: per subject, 2 sessions x 2 runs
    of ``stat-effect`` maps in MNI space (the diagnosis' pattern, the age's), each with a JSON
    sidecar, a ``sessions.tsv`` (``drug``) and a ``scans.tsv`` per session listing every map
    (``condition``, by run); beside them what a query must leave out: the same maps in T1w
    space, a brain mask, a file whose name breaks the rules, and a folder that ``.bidsignore``
    lists."""
    rng = np.random.default_rng(seed)
    write_json(root / "dataset_description.json", {
        "Name": "SYNTHETIC first-level maps", "BIDSVersion": "1.10.0",
        "DatasetType": "derivative", "GeneratedBy": [{"Name": "fgscale tests"}]})
    participants(root, n_subjects)
    (root / ".bidsignore").write_text("extra/\n")
    for s in subjects(n_subjects):
        write_tsv(root / f"sub-{s}" / f"sub-{s}_sessions.tsv", ["session_id", "drug", "dose"],
                  [[f"ses-{ses}", drug(ses), "n/a"] for ses in ("1", "2")])
        for ses in ("1", "2"):
            func = root / f"sub-{s}" / f"ses-{ses}" / "func"
            scans = []
            for run in ("1", "2"):
                stem = f"sub-{s}_ses-{ses}_task-faces_run-{run}"
                for space in (SPACE, "T1w"):
                    name = f"{stem}_space-{space}_stat-effect_statmap"
                    klass = "face" if diagnosis(s) == "patient" else "house"
                    save(func / f"{name}.nii.gz", volume(rng, klass, age(s)))
                    write_json(func / f"{name}.json", {"Description": "SYNTHETIC effect size"})
                    scans.append([f"func/{name}.nii.gz", condition(run)])
            write_tsv(root / f"sub-{s}" / f"ses-{ses}" / f"sub-{s}_ses-{ses}_scans.tsv",
                      ["filename", "condition"], scans)
            save(func / f"sub-{s}_ses-{ses}_task-faces_space-{SPACE}_desc-brain_mask.nii.gz",
                 _BOX.astype(np.uint8))
        save(root / f"sub-{s}" / "extra" / "not a bids name.nii.gz", volume(rng))
    save(root / "sub-01" / "ses-1" / "func" / f"sub-01_ses-1_task-faces_space-{SPACE}_statmap "
         "copy.nii.gz", volume(rng))
    return root


def series_dataset(raw: Path, n_subjects: int = 6, seed: int = 0) -> Path:
    """A SYNTHETIC raw dataset of block-design BOLD series (2 runs per subject, TR 2 s, the
    ``events.tsv`` of :data:`EVENTS`, ``RepetitionTime`` in a top-level sidecar by the
    inheritance principle, a ``scans.tsv`` per subject with each run's ``condition``) and its
    fMRIPrep-like derivatives in ``raw/derivatives/prep``: the series in MNI space with their
    sidecars, and brain masks. Returns the derivatives' root, which has no events.tsv,
    participants.tsv nor scans.tsv of its own."""
    rng = np.random.default_rng(seed)
    write_json(raw / "dataset_description.json", {"Name": "SYNTHETIC block design",
                                                   "BIDSVersion": "1.10.0"})
    write_json(raw / "task-objects_bold.json", {"RepetitionTime": TR, "TaskName": "objects"})
    participants(raw, n_subjects)
    deriv = raw / "derivatives" / "prep"
    write_json(deriv / "dataset_description.json", {
        "Name": "SYNTHETIC preprocessed", "BIDSVersion": "1.10.0", "DatasetType": "derivative",
        "GeneratedBy": [{"Name": "fgscale tests"}]})
    for s in subjects(n_subjects):
        write_tsv(raw / f"sub-{s}" / f"sub-{s}_scans.tsv", ["filename", "condition"],
                  [[f"func/sub-{s}_task-objects_run-{run}_bold.nii.gz", condition(run)]
                   for run in ("1", "2")])
        for run in ("1", "2"):
            stem = f"sub-{s}_task-objects_run-{run}"
            series = np.stack([volume(rng, LABELLED.get(i)) for i in range(N_VOLUMES)], -1)
            save(raw / f"sub-{s}" / "func" / f"{stem}_bold.nii.gz", series, TR)
            write_tsv(raw / f"sub-{s}" / "func" / f"{stem}_events.tsv",
                      ["onset", "duration", "trial_type"], EVENTS)
            func = deriv / f"sub-{s}" / "func"
            save(func / f"{stem}_space-{SPACE}_desc-preproc_bold.nii.gz", series, TR)
            write_json(func / f"{stem}_space-{SPACE}_desc-preproc_bold.json",
                       {"RepetitionTime": TR, "SkullStripped": False})
            save(func / f"{stem}_space-{SPACE}_desc-brain_mask.nii.gz", _BOX.astype(np.uint8))
    return deriv
