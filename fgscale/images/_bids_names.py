"""BIDS file names, parsed and written by the specification's rules.

A BIDS file name is ``sub-<label>[_ses-<label>][_<key>-<value>...]_<suffix><extension>``
(BIDS 1.10, "Filenames" and the entities appendix). What :func:`parse_bids_name` checks, as the BIDS
validator does:

- the entities are ``key-value`` pairs joined by ``_``, each key once, ``sub`` first;
- a label is letters, digits and ``+`` (``[0-9a-zA-Z+]+``); the entities whose format is an
  index (``run``, ``echo``, ``flip``, ``inv``, ``split``, ``chunk``) take digits only;
- the entities of the specification come in its order (:data:`ENTITIES`): ``ses`` before
  ``task`` before ``run`` ... before ``space`` ... before ``desc``;
- the suffix is letters and digits, and the extension begins at the name's first dot;
- a key the specification does not define (``stat``, ``contrast``, ``model``: the statistical
  maps of nilearn, FitLins and BIDS-StatsModels) is allowed in a derivatives dataset, anywhere
  among the others, and refused in a raw dataset.

Which entities a datatype and suffix allow (``desc`` only in derivatives, ``echo`` only where
echoes differ) is not checked: fgscale reads images it is asked for, it does not validate a
dataset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ENTITIES", "TEMPLATE", "BidsName", "bids_label", "bids_name", "entity_key",
           "parse_bids_name"]

# (key, name in the specification, format), in the order the specification puts them in a name
ENTITIES = (
    ("sub", "subject", "label"), ("ses", "session", "label"), ("sample", "sample", "label"),
    ("task", "task", "label"), ("tracksys", "tracksys", "label"),
    ("acq", "acquisition", "label"), ("nuc", "nucleus", "label"), ("voi", "volume", "label"),
    ("ce", "ceagent", "label"), ("trc", "tracer", "label"), ("stain", "stain", "label"),
    ("rec", "reconstruction", "label"), ("dir", "direction", "label"), ("run", "run", "index"),
    ("mod", "modality", "label"), ("echo", "echo", "index"), ("flip", "flip", "index"),
    ("inv", "inversion", "index"), ("mt", "mtransfer", "label"), ("part", "part", "label"),
    ("proc", "processing", "label"), ("hemi", "hemisphere", "label"),
    ("space", "space", "label"), ("split", "split", "index"),
    ("recording", "recording", "label"), ("chunk", "chunk", "index"),
    ("seg", "segmentation", "label"), ("res", "resolution", "label"),
    ("den", "density", "label"), ("label", "label", "label"), ("desc", "description", "label"),
)
_ORDER = {key: i for i, (key, _, _) in enumerate(ENTITIES)}
_INDEX = {key for key, _, form in ENTITIES if form == "index"}
# the long names of the specification, and pybids' one other (fMRIPrep's filter files use
# pybids' names, which are otherwise the specification's names or keys)
_ALIASES = {name: key for key, name, _ in ENTITIES} | {"staining": "stain"}
_LABEL = re.compile(r"[0-9a-zA-Z+]+")
_DIGITS = re.compile(r"[0-9]+")
_KEY = re.compile(r"[a-zA-Z0-9]+")
_EXTENSION = re.compile(r"(\.[a-zA-Z0-9]+)+")
TEMPLATE = "sub-<label>[_ses-<label>][_<key>-<value>...]_<suffix><extension>"


@dataclass(frozen=True)
class BidsName:
    """A parsed BIDS file name.

    Attributes
    ----------
    entities : dict of str to str
        Each entity's key and value as written (``{"sub": "01", "run": "02"}``), in the name's
        order.
    suffix : str
        Such as ``"bold"``, ``"T1w"``, ``"statmap"``.
    extension : str
        From the name's first dot, such as ``".nii.gz"``.
    """

    entities: dict
    suffix: str
    extension: str

    @property
    def subject(self) -> str | None:
        return self.entities.get("sub")


def entity_key(name: str) -> str:
    """The key of an entity given by its key (``ses``) or long name (``session``, pybids'
    ``acquisition``); any other name is returned as it is (an entity of a derivatives dataset
    the specification does not define, or ``suffix``, ``extension``, ``datatype``)."""
    return _ALIASES.get(name, name)


def _check_value(key: str, value: str) -> str | None:
    """What is wrong with an entity's value, or None."""
    if key in _INDEX:
        return None if _DIGITS.fullmatch(value) else (
            f"{key}-{value}: the {key} entity takes an index (digits only)")
    return None if _LABEL.fullmatch(value) else (
        f"{key}-{value}: a label takes letters, digits and '+' only")


def _parse_entity(part: str, derivative: bool) -> tuple[str, str]:
    """One ``key-value`` pair of a name, checked."""
    key, dash, value = part.partition("-")
    if not dash or not key or not value:
        raise ValueError(f"{part!r} is not a key-value pair (such as run-1)")
    if not _KEY.fullmatch(key):
        raise ValueError(f"{part!r}: an entity's key takes letters and digits only")
    if key not in _ORDER and not derivative:
        raise ValueError(f"{key}-{value}: {key!r} is not an entity of the specification (an "
                         "entity of its own is allowed in a derivatives dataset only)")
    problem = _check_value(key, value)
    if problem:
        raise ValueError(problem)
    return key, value


def parse_bids_name(name: str, *, derivative: bool = True, subject: bool = True) -> BidsName:
    """Parse a BIDS file name by the specification's rules (see the module's docstring).

    Parameters
    ----------
    name : str
        The file's name, without its folder.
    derivative : bool, default=True
        Whether the file is in a derivatives dataset, where entities the specification does
        not define (``stat``, ``contrast``) are allowed.
    subject : bool, default=True
        Whether the name must begin with ``sub-<label>``; False for the files of the
        inheritance principle at a dataset's top (``task-rest_bold.json``,
        ``task-rest_events.tsv``).

    Returns
    -------
    BidsName

    Raises
    ------
    ValueError
        Saying what breaks the rules, the name first.
    """
    try:
        return _parse(name, derivative, subject)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}; expected {TEMPLATE}") from None


def _parse(name: str, derivative: bool, subject: bool) -> BidsName:
    stem, dot, rest = name.partition(".")
    extension = dot + rest
    if not _EXTENSION.fullmatch(extension):
        raise ValueError(f"extension {extension!r}: expected one such as .nii.gz (letters and "
                         "digits after each dot)")
    *pairs, suffix = stem.split("_")
    if not _KEY.fullmatch(suffix):
        raise ValueError(f"suffix {suffix!r}: expected letters and digits only, after the last "
                         "'_'")
    entities: dict[str, str] = {}
    for part in pairs:
        key, value = _parse_entity(part, derivative)
        if key in entities:
            raise ValueError(f"the {key} entity is given twice")
        entities[key] = value
    keys = list(entities)
    if subject and (not keys or keys[0] != "sub"):
        raise ValueError("a name begins with sub-<label>")
    known = [k for k in keys if k in _ORDER]
    for before, after in zip(known, known[1:], strict=False):
        if _ORDER[before] > _ORDER[after]:
            raise ValueError(f"{after} comes before {before} in BIDS's order of entities")
    return BidsName(entities=entities, suffix=suffix, extension=extension)


def bids_label(text: str) -> str:
    """``text`` made a BIDS label: its letters and digits (``"house/home"`` -> ``"househome"``);
    ``""`` where it has none."""
    return re.sub(r"[^0-9a-zA-Z]", "", str(text))


def bids_name(entities: dict, suffix: str, extension: str) -> str:
    """The BIDS file name of ``entities`` (key -> value; None values left out), ``suffix``
    and ``extension``: the specification's entities in its order, then the others in the
    order given, each checked as :func:`parse_bids_name` checks them.

    Parameters
    ----------
    entities : dict of str to str or None
    suffix : str
    extension : str
        With its dot, such as ``".nii.gz"``.

    Returns
    -------
    str
    """
    given = {entity_key(k): str(v) for k, v in entities.items() if v is not None}
    keys = sorted(given, key=lambda k: (_ORDER.get(k, len(_ORDER)), list(given).index(k)))
    name = "_".join([f"{k}-{given[k]}" for k in keys] + [suffix]) + extension
    parse_bids_name(name, derivative=True, subject=False)  # a wrong value is ours to fix, said here
    return name
