"""BIDS file names against the specification's rules, as the BIDS validator applies them: valid
names parsed as nilearn's parser parses them (the oracle), invalid ones refused with the
rule they break, and names written as nilearn writes them."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nilearn.interfaces.bids import parse_bids_filename
from nilearn.interfaces.bids.utils import bids_entities, create_bids_filename

from fgscale.images import bids_name, parse_bids_name
from fgscale.images._bids_names import ENTITIES, TEMPLATE, bids_label

VALID = [
    "sub-01_T1w.nii.gz",
    "sub-01_ses-pre_task-rest_acq-fullbrain_run-1_bold.nii.gz",
    "sub-control01_task-nback_run-01_space-MNI152NLin2009cAsym_desc-preproc_bold.nii.gz",
    "sub-01_task-rest_space-MNI152NLin6Asym_res-2_desc-brain_mask.nii.gz",
    "sub-01_ses-1_task-faces_run-2_echo-1_part-mag_bold.nii",
    "sub-01_acq-lo+hi_T1w.nii.gz",  # "+" joins labels since BIDS 1.9
    "sub-01_task-faces_contrast-facesGtHouses_stat-effect_statmap.nii.gz",  # nilearn, FitLins
    "sub-01_task-rest_events.tsv",
    "sub-01_hemi-L_space-fsaverage_den-10k_desc-x_bold.func.gii",
]

# each breaks one rule of the specification, which the message names
INVALID = [
    ("task-rest_sub-01_bold.nii.gz", "begins with sub-<label>"),
    ("sub-01_task-rest_ses-1_bold.nii.gz", "ses comes before task"),
    ("sub-01_run-1_task-rest_bold.nii.gz", "task comes before run"),
    ("sub-01_desc-preproc_space-MNI_bold.nii.gz", "space comes before desc"),
    ("sub-01_task-rest_task-motor_bold.nii.gz", "task entity is given twice"),
    ("sub-01_run-a_bold.nii.gz", "run entity takes an index"),
    ("sub-01_echo-1b_bold.nii.gz", "echo entity takes an index"),
    ("sub-01_task-rest_task_bold.nii.gz", "'task' is not a key-value pair"),
    ("sub-01_task-rest-1_bold.nii.gz", "a label takes letters, digits and '\\+' only"),
    ("sub-01_task-my.task_bold.nii.gz", "suffix"),
    ("sub-01_task-rest__bold.nii.gz", "'' is not a key-value pair"),
    ("sub-01_task-rest_bold", "extension ''"),
    ("sub-01_task-rest_bold.nii.", "extension '.nii.'"),
    ("sub-0 1_task-rest_bold.nii.gz", "letters, digits"),
    ("sub-01_task-rest_bo-ld.nii.gz", "suffix 'bo-ld'"),
    ("sub-01_ta.sk-rest_bold.nii.gz", "suffix"),
    ("sub-01_task-é_bold.nii.gz", "letters, digits"),
]


@pytest.mark.parametrize("name", VALID)
def test_a_valid_name_is_parsed_as_nilearn_parses_it(name):
    parsed = parse_bids_name(name)
    oracle = parse_bids_filename(name)
    assert parsed.entities == oracle["entities"]
    assert parsed.suffix == oracle["suffix"]
    assert parsed.extension == "." + oracle["extension"]
    assert list(parsed.entities) == list(oracle["entities"])  # in the name's order


@pytest.mark.parametrize(("name", "rule"), INVALID)
def test_an_invalid_name_is_refused_with_the_rule_it_breaks(name, rule):
    with pytest.raises(ValueError) as info:
        parse_bids_name(name)
    message = str(info.value)
    assert message.startswith(f"{name}: ") and message.endswith(f"; expected {TEMPLATE}")
    assert re.search(rule, message), message


def test_an_entity_outside_the_specification_is_only_for_derivatives():
    name = "sub-01_task-faces_contrast-faces_stat-t_statmap.nii.gz"
    assert parse_bids_name(name, derivative=True).entities["stat"] == "t"
    with pytest.raises(ValueError, match="'contrast' is not an entity of the specification"):
        parse_bids_name(name, derivative=False)
    # the specification's own are in either, in its order among the others
    assert parse_bids_name("sub-01_ses-1_T1w.nii.gz", derivative=False).entities == {
        "sub": "01", "ses": "1"}


def test_the_files_of_the_inheritance_principle_may_lack_the_subject():
    assert parse_bids_name("task-rest_bold.json", subject=False).entities == {"task": "rest"}
    with pytest.raises(ValueError, match="begins with sub-<label>"):
        parse_bids_name("task-rest_bold.json")


# ---------------------------------------------------------------------- writing names

_VALUES = {"label": st.from_regex(r"[0-9a-zA-Z+]{1,6}", fullmatch=True),
           "index": st.from_regex(r"[0-9]{1,3}", fullmatch=True)}


@st.composite
def _entities(draw):
    keys = draw(st.lists(st.sampled_from([k for k, _, _ in ENTITIES[1:]]), unique=True,
                         max_size=6))
    entities = {"sub": draw(_VALUES["label"])}
    for key in keys:
        form = next(f for k, _, f in ENTITIES if k == key)
        entities[key] = draw(_VALUES[form])
    # entities a derivative may add: after the specification's, in the order given
    for key in draw(st.lists(st.sampled_from(["stat", "contrast", "model"]), unique=True,
                             max_size=2)):
        entities[key] = draw(_VALUES["label"])
    return entities


@given(_entities(), st.sampled_from(["bold", "statmap", "T1w", "mask"]),
       st.sampled_from([".nii.gz", ".nii", ".json"]))
def test_a_written_name_parses_back_to_its_entities(entities, suffix, extension):
    shuffled = dict(reversed(list(entities.items())))  # the order given does not matter
    name = bids_name(shuffled, suffix, extension)
    parsed = parse_bids_name(name)
    assert parsed.entities == entities and parsed.suffix == suffix
    assert parsed.extension == extension
    order = [k for k, _, _ in ENTITIES]
    known = [k for k in parsed.entities if k in order]
    assert known == sorted(known, key=order.index)
    assert list(parsed.entities)[len(known):] == [k for k in shuffled if k not in order]


def test_names_are_written_as_nilearn_writes_them():
    entities = {"desc": "face", "sub": "01", "space": "MNI152NLin2009cAsym", "run": "2",
                "task": "objects", "ses": "pre", "res": "2"}
    include = [*bids_entities()["raw"], *bids_entities()["derivatives"]]
    oracle = create_bids_filename({"suffix": "statmap", "extension": "nii.gz",
                                   "entities": entities}, include)
    assert bids_name(entities, "statmap", ".nii.gz") == oracle
    # long names are the specification's too; None leaves an entity out
    assert bids_name({"subject": "01", "session": "a", "acquisition": None}, "T1w", ".nii") == (
        "sub-01_ses-a_T1w.nii")


def test_a_value_that_is_no_label_is_refused_when_writing():
    with pytest.raises(ValueError, match="a label takes letters, digits"):
        bids_name({"desc": "house/home"}, "statmap", ".nii.gz")
    assert bids_label("house/home") == "househome" and bids_label("chair b") == "chairb"
    assert bids_label("é/_") == ""
