"""BIDS datasets in (fgscale.images._bids and _bids_tables): a query on SYNTHETIC datasets
written in the test (real NIfTI files, JSON sidecars, participants.tsv, sessions.tsv,
scans.tsv, events.tsv), the labels of 3D maps and of the volumes of 4D series (with a
hemodynamic delay), the table written for ``fgscale convert`` with the query recorded beside
it, and the inputs given to an estimator's fit, checked against the store converted from that
table."""

import json
import logging
import math
import shutil

import nibabel as nib
import numpy as np
import pytest
from bids_trees import (
    EVENTS,
    LABELLED,
    N_VOLUMES,
    SPACE,
    TR,
    age,
    condition,
    diagnosis,
    drug,
    series_dataset,
    statmap_dataset,
    subjects,
    write_json,
    write_tsv,
)

from fgscale.images import is_bids_root, mask_images, read_bids, read_cohort
from fgscale.images._bids import parse_filters
from fgscale.images._bids_names import parse_bids_name
from fgscale.images._bids_tables import Event, label_volumes, repetition_time, sidecar
from fgscale.store import convert

MAPS = {"space": SPACE, "suffix": "statmap"}
SERIES = {"desc": "preproc", "suffix": "bold"}


@pytest.fixture(scope="module")
def maps(tmp_path_factory):
    """A SYNTHETIC derivatives dataset of 3D maps (read-only: copy it to change it)."""
    return statmap_dataset(tmp_path_factory.mktemp("bids") / "maps")


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """The derivatives of a SYNTHETIC raw dataset of 4D series (read-only)."""
    return series_dataset(tmp_path_factory.mktemp("bids") / "raw")


def _copy(tree, tmp_path):
    return shutil.copytree(tree, tmp_path / tree.name)


def test_a_query_selects_the_maps_with_their_subjects_labels_and_targets(maps, caplog):
    with caplog.at_level(logging.WARNING, "fgscale.images._bids"):
        cohort = read_bids(maps, MAPS, label="participants:diagnosis", target="participants:age")
    assert is_bids_root(maps) and not is_bids_root(maps / "sub-01")
    rows = cohort.rows
    # 8 subjects x 2 sessions x 2 runs in MNI space: not the T1w ones, nor the masks
    assert len(rows) == 32 and cohort.subjects == [f"sub-{s}" for s in subjects(8)]
    for r in rows:
        name = parse_bids_name(r["path"].rsplit("/", 1)[1])
        assert name.entities["space"] == SPACE and name.suffix == "statmap"
        s = name.subject
        assert (r["group"], r["session"], r["run"]) == (f"sub-{s}", name.entities["ses"],
                                                       name.entities["run"])
        assert r["label"] == diagnosis(s) and r["target"] == age(s) and r["volume"] is None
    assert [r["path"] for r in rows] == sorted(r["path"] for r in rows)
    # the file whose name breaks the rules is said, the one .bidsignore lists is not
    (message,) = [r.getMessage() for r in caplog.records]
    assert "1 NIfTI file(s) skipped" in message and "statmap copy.nii.gz (suffix" in message
    assert "not a bids name" not in message


def test_labels_from_an_entity_and_filters_in_every_form(maps, tmp_path):
    by_session = read_bids(maps, MAPS, label="ses")
    assert {r["label"] for r in by_session.rows} == {"1", "2"}
    # long names, a run index written otherwise (run-1 is run 01), alternatives
    for filters in ({"session": "1", "run": "01", **MAPS}, [f"space={SPACE}", "suffix=statmap",
                                                            "ses=1", "run=1"]):
        assert len(read_bids(maps, filters, label="ses").rows) == 8
    assert len(read_bids(maps, [f"space={SPACE}", "suffix=statmap", "sub=01,02"],
                         label="run").rows) == 8
    # fMRIPrep's filter file: one query, null for an entity absent, "*" for any value
    fmriprep = write_json(tmp_path / "filters.json", {"maps": {"space": SPACE, "desc": None,
                                                               "stat": "*", "suffix": "statmap"}})
    assert len(read_bids(maps, fmriprep, label="ses").rows) == 32
    assert parse_filters(["ses=1", str(fmriprep)]) == {
        "ses": ("1",), "space": (SPACE,), "desc": None, "stat": "*", "suffix": ("statmap",)}
    with pytest.raises(ValueError, match="no NIfTI file matches the filters .*stat=null"):
        read_bids(maps, {**MAPS, "stat": None}, label="ses")
    several = write_json(tmp_path / "several.json", {"bold": {}, "t1w": {}})
    with pytest.raises(ValueError, match="several queries \\(bold, t1w\\)"):
        read_bids(maps, several, label="ses")


def test_the_volumes_of_series_in_events_are_samples(series, caplog):
    with caplog.at_level(logging.WARNING, "fgscale.images._bids"):
        cohort = read_bids(series, SERIES, label="events:trial_type", test_subjects="05,sub-06")
    rows = cohort.rows
    assert len(rows) == 6 * 2 * len(LABELLED)
    for path, group in _by_file(rows).items():
        assert [r["volume"] for r in group] == sorted(LABELLED)
        assert [r["label"] for r in group] == [LABELLED[v] for v in sorted(LABELLED)]
        assert {r["split"] for r in group} == {"test" if "sub-05" in path or "sub-06" in path
                                               else "train"}
    left_out = 12 * (N_VOLUMES - len(LABELLED))
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"{left_out} volume(s) of its 12 series" in message


def _by_file(rows):
    out = {}
    for r in rows:
        out.setdefault(r["path"], []).append(r)
    return out


def test_volumes_take_the_value_of_the_one_event_they_fall_in():
    events = [Event(4.0, 6.0, "a"), Event(10.0, 2.0, "b"), Event(11.0, 4.0, "c"),
              Event(16.0, 2.0, None), Event(20.0, 0.0, "d")]
    values, left_out = label_volumes(events, 12, 2.0)
    # t = 0 2 4 6 8 10 12 14 16 18 20 22: 4-10 "a"; 10 "b"; 12 "c" (b ends at 12); 14 "c";
    # 16 n/a; 20 an event of no duration holds no volume
    assert values == {2: "a", 3: "a", 4: "a", 5: "b", 6: "c", 7: "c"}
    assert left_out == 6
    # a volume in two events of different values is left out, of the same value kept
    values, _ = label_volumes([Event(0.0, 4.0, "a"), Event(2.0, 4.0, "b")], 3, 2.0)
    assert values == {0: "a", 2: "b"}
    values, _ = label_volumes([Event(0.0, 4.0, "a"), Event(2.0, 4.0, "a")], 3, 2.0)
    assert values == {0: "a", 1: "a", 2: "a"}
    # onsets in decimals that i x TR meets only to float precision
    values, _ = label_volumes([Event(2.16, 0.72, "x")], 5, 0.72)
    assert values == {3: "x"}


def test_the_repetition_time_follows_the_inheritance_principle(series, tmp_path):
    raw = _copy(series.parent.parent, tmp_path)
    deriv = raw / "derivatives" / "prep"
    stem = f"sub-01_task-objects_run-1_space-{SPACE}_desc-preproc_bold"
    file = deriv / "sub-01" / "func" / f"{stem}.nii.gz"
    name, relative = parse_bids_name(file.name), file.parent.relative_to(deriv)
    own = deriv / "sub-01" / "func" / f"{stem}.json"
    write_json(own, {"RepetitionTime": 1.5})
    assert repetition_time(file, sidecar(relative, name, [deriv, raw])) == 1.5
    own.unlink()  # then the raw dataset's top-level task-objects_bold.json
    write_json(raw / "task-objects_bold.json", {"RepetitionTime": 2.5})
    assert sidecar(relative, name, [deriv, raw])["RepetitionTime"] == 2.5
    (raw / "task-objects_bold.json").unlink()  # then the header's time step
    assert repetition_time(file, sidecar(relative, name, [deriv, raw])) == TR
    img = nib.load(file)
    img.header.set_zooms((4.0, 4.0, 4.0, 0.0))
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), img.affine, img.header), file)
    with pytest.raises(ValueError, match="no RepetitionTime in its JSON sidecar nor a time step"):
        repetition_time(file, {})


def test_the_written_table_is_the_cohort_convert_reads(maps, tmp_path):
    cohort = read_bids(maps, MAPS, label="participants:diagnosis", target="participants:age",
                       test_subjects=["07", "08"])
    table = cohort.write_table(tmp_path / "cohort.csv")
    entries = read_cohort(table)
    assert [(e["path"], e["label"], e["target"], e["group"], e["split"], e["volume"])
            for e in entries] == [(r["path"], r["label"], r["target"], r["group"], r["split"],
                                   r["volume"]) for r in cohort.rows]
    # the same rows again: kept; other rows (another query, or edited): refused
    before = table.stat().st_mtime_ns
    assert cohort.write_table(table) == table and table.stat().st_mtime_ns == before
    with pytest.raises(FileExistsError, match="exists with other rows"):
        read_bids(maps, MAPS, label="ses").write_table(table)


def test_fit_inputs_are_the_rows_of_the_converted_store(maps, series, tmp_path):
    """The images, labels and subjects given to fit are, volume for volume, the store's rows
    converted from the table: the in-memory path and the store agree."""
    cohort = read_bids(series, {**SERIES, "sub": "01,02"}, label="events:trial_type")
    store = convert(cohort.write_table(tmp_path / "t.csv"), tmp_path / "s.zarr", progress=False)
    X, y, groups = cohort.fit_inputs()
    assert all(isinstance(x, nib.Nifti1Image) and x.shape[3] == len(LABELLED) for x in X)
    rows = mask_images(X, store.mask_img())
    np.testing.assert_array_equal(rows, store.read_rows(np.arange(store.n_samples)))
    assert list(y) == [store.classes[i] for i in store.y]
    assert groups == list(store.groups)
    # 3D maps are given as their paths
    cohort = read_bids(maps, {**MAPS, "sub": "01"}, label="ses")
    assert cohort.fit_inputs() == ([r["path"] for r in cohort.rows], ["1", "1", "2", "2"],
                                   ["sub-01"] * 4)


def test_a_4d_file_labelled_whole_gives_a_sample_per_volume(series):
    cohort = read_bids(series, {**SERIES, "sub": "01"}, label="participants:diagnosis")
    assert [r["volume"] for r in cohort.rows] == [None, None]
    X, y, groups = cohort.fit_inputs()
    assert X == [r["path"] for r in cohort.rows]
    assert y == [diagnosis("01")] * 2 * N_VOLUMES and groups == ["sub-01"] * 2 * N_VOLUMES
    X, y, _ = read_bids(series, {**SERIES, "sub": "01"}, target="participants:age").fit_inputs()
    assert y == [age("01")] * 2 * N_VOLUMES
    with pytest.raises(ValueError, match="read without a label"):
        read_bids(series, {**SERIES, "sub": "01"}, target="participants:age").fit_inputs("label")


# ------------------------------------------------------------------------- bad input


def test_each_bad_input_names_the_file_and_what_was_expected(maps, series, tmp_path):
    cases = [
        (dict(filters={"space": "MNI152NLin6Asym"}, label="ses"),
         rf"{maps}: no NIfTI file matches the filters space=MNI152NLin6Asym; among its \d+ "
         rf"NIfTI files, space is one of \['{SPACE}', 'T1w'\] \(1 skipped for their names"),
        (dict(filters={"suffix": "statmap"}, label="ses"),
         rf"the files selected differ in space \({SPACE}: 32 files, T1w: 32 files\).*"
         "--bids-filter space=VALUE"),
        (dict(filters=MAPS, label="participants:group"),
         r"participants.tsv: no column 'group' \(--label participants:group\); its columns are"),
        (dict(filters=MAPS, label="participants:sex"),
         r"participants.tsv:2: 'sex' is 'n/a' for sub-01 \(--label participants:sex\)"),
        (dict(filters=MAPS, label="acq"),
         r"statmap.nii.gz: no 'acq' entity in its name \(--label acq\)"),
        (dict(filters=MAPS, target="participants:diagnosis"),
         r"participants.tsv:2: 'patient' \(--target participants:diagnosis\); expected a finite"),
        (dict(filters=MAPS, label="events:trial_type"),
         r"statmap.nii.gz: a 3D image \(--label events:trial_type\); events.tsv labels the "
         "volumes of 4D series"),
        (dict(filters=MAPS, label="diagnosis:x"), r"--label 'diagnosis:x'; expected ENTITY, "),
        (dict(filters=["space"], label="ses"), r"--bids-filter: 'space'; expected KEY=VALUE"),
        (dict(filters=MAPS, label="ses", test_subjects="09"),
         r"--test-subjects sub-09: no file selected .* is theirs"),
    ]
    for kwargs, message in cases:
        filters = kwargs.pop("filters")
        with pytest.raises(ValueError, match=message):
            read_bids(maps, filters, **kwargs)
    with pytest.raises(FileNotFoundError, match="no dataset_description.json there"):
        read_bids(maps / "sub-01", MAPS, label="ses")


def test_a_missing_participant_and_missing_events_are_named(maps, series, tmp_path):
    root = _copy(maps, tmp_path)
    write_tsv(root / "participants.tsv", ["participant_id", "diagnosis"],
              [[f"sub-{s}", diagnosis(s)] for s in subjects(7)])
    with pytest.raises(ValueError, match=r"participants.tsv: no row for participant_id sub-08 "
                                         r"\(the subject of .*sub-08_ses-1_task-faces_run-1_"):
        read_bids(root, MAPS, label="participants:diagnosis")
    # a derivatives dataset out of its raw dataset's derivatives/ folder finds no events...
    alone = shutil.copytree(series, tmp_path / "prep")
    with pytest.raises(FileNotFoundError, match=r"sub-01_task-objects_run-1_space-.*: no "
                                                r"events.tsv applies to it in .*prep; expected "
                                                r"sub-01_task-objects_run-1_events.tsv"):
        read_bids(alone, SERIES, label="events:trial_type")
    with pytest.raises(FileNotFoundError, match="participants.tsv: no such file"):
        read_bids(alone, SERIES, label="participants:diagnosis")
    # ... unless told where its raw dataset is
    cohort = read_bids(alone, SERIES, label="events:trial_type", raw=series.parent.parent)
    assert len(cohort.rows) == 12 * len(LABELLED)
    events = series.parent.parent / "sub-01" / "func" / "sub-01_task-objects_run-1_events.tsv"
    assert events.read_text().splitlines()[1].split("\t") == list(EVENTS[0])
    broken = _copy(series.parent.parent, tmp_path / "b")
    bad = broken / "sub-02" / "func" / "sub-02_task-objects_run-2_events.tsv"
    write_tsv(bad, ["onset", "duration", "trial_type"], [["4.0", "n/a", "face"]])
    with pytest.raises(ValueError, match=rf"{bad}:2: duration 'n/a'; expected a number of "):
        read_bids(broken / "derivatives" / "prep", SERIES, label="events:trial_type")
    assert json.loads((series / "dataset_description.json").read_text())["DatasetType"] == (
        "derivative")


# ------------------------------------------------------------------------- the hemodynamic delay


def test_a_hemodynamic_delay_labels_each_volume_by_the_event_before_it(series, tmp_path):
    # volume i at i x TR - delay: an event over [4, 8) s labels the volumes at 8 and 10 s when
    # the delay is 4 s, those at 10 and 12 s (taken at 5 and 7) when it is 5 s
    events = [Event(4.0, 4.0, "a"), Event(12.0, 2.0, "b")]
    assert label_volumes(events, 10, 2.0) == ({2: "a", 3: "a", 6: "b"}, 7)
    assert label_volumes(events, 10, 2.0, 4.0) == ({4: "a", 5: "a", 8: "b"}, 7)
    assert label_volumes(events, 10, 2.0, 5.0) == ({5: "a", 6: "a", 9: "b"}, 7)
    # a longer delay: the response to the last event falls after the series' end
    assert label_volumes(events, 10, 2.0, 8.0) == ({6: "a", 7: "a"}, 8)
    # the series' blocks shifted by 4 s: 2 volumes of TR 2 s later
    delay = 4.0
    cohort = read_bids(series, {**SERIES, "sub": "01"}, label="events:trial_type",
                       hrf_delay=delay)
    shifted = {v + 2: label for v, label in LABELLED.items()}
    for group in _by_file(cohort.rows).values():
        assert {r["volume"]: r["label"] for r in group} == shifted
    assert cohort.query["hrf_delay"] == delay
    # a target from the events is shifted alike
    raw = _copy(series.parent.parent, tmp_path)
    for run in ("1", "2"):
        write_tsv(raw / "sub-01" / "func" / f"sub-01_task-objects_run-{run}_events.tsv",
                  ["onset", "duration", "trial_type", "rating"],
                  [[*e, str(k)] for k, e in enumerate(EVENTS, start=1)])
    rated = read_bids(raw / "derivatives" / "prep", {**SERIES, "sub": "01"},
                      label="events:trial_type", target="events:rating", hrf_delay=delay)
    assert {(r["volume"], r["label"], r["target"]) for r in rated.rows} == {
        (v, label, 1.0 if label == "face" else 2.0) for v, label in shifted.items()}


def test_a_bad_delay_or_one_without_events_is_refused(maps, series):
    for bad in (-1.0, math.nan, math.inf, True, "5"):
        with pytest.raises(ValueError, match=r"hrf_delay .* \(--hrf-delay\); expected a finite "
                                              r"number of seconds, 0 or more"):
            read_bids(series, SERIES, label="events:trial_type", hrf_delay=bad)
    for label in ("participants:diagnosis", "ses"):
        with pytest.raises(ValueError, match=rf"hrf_delay 5 \(--hrf-delay\) shifts the labels "
                                             rf"that a series' events.tsv gives its volumes; "
                                             rf"expected --label or --target events:COLUMN with "
                                             rf"it, got --label {label}"):
            read_bids(maps if label == "ses" else series, MAPS if label == "ses" else SERIES,
                      label=label, hrf_delay=5)
    # 0 is no delay: the default, given or not
    assert read_bids(maps, MAPS, label="ses", hrf_delay=0).query["hrf_delay"] == 0.0


def test_the_query_is_recorded_beside_the_table(series, tmp_path):
    table = tmp_path / "s.zarr.csv"
    query = dict(label="events:trial_type", test_subjects="sub-02")
    first = read_bids(series, {**SERIES, "sub": "01,02"}, hrf_delay=4.0, **query)
    assert first.write_table(table) == table
    recorded = json.loads((tmp_path / "s.zarr.json").read_text())["bids_query"]
    assert recorded == {"root": str(series), "filters": {"desc": ["preproc"], "suffix": ["bold"],
                                                         "sub": ["01", "02"]},
                        "label": "events:trial_type", "target": None,
                        "raw": str(series.parent.parent), "test_subjects": ["sub-02"],
                        "hrf_delay": 4.0}
    # another delay labels other volumes: its table is refused, saying why
    other = read_bids(series, {**SERIES, "sub": "01,02"}, **query)
    with pytest.raises(FileExistsError, match=r"s.zarr.csv: exists with other rows \(the table "
                                              r"of another query: --hrf-delay 4.0 there, 0.0 "
                                              r"now\)"):
        other.write_table(table)
    assert json.loads((tmp_path / "s.zarr.json").read_text())["bids_query"] == recorded
    # the same rows from a query written otherwise: the table kept, the latest query recorded
    before = table.stat().st_mtime_ns
    again = read_bids(series, [*(f"{k}={v}" for k, v in SERIES.items()), "sub=02,01"],
                      hrf_delay=4, **query)
    again.write_table(table)
    assert table.stat().st_mtime_ns == before
    assert json.loads((tmp_path / "s.zarr.json").read_text())["bids_query"]["filters"][
        "sub"] == ["02", "01"]
    # a file of the sidecar's name that is not one is not overwritten
    (tmp_path / "t.json").write_text('{"synthetic": true}')
    with pytest.raises(FileExistsError, match=r"t.json: exists and is not the record of a BIDS "
                                              r"query"):
        first.write_table(tmp_path / "t.csv")
    assert not (tmp_path / "t.csv").exists()


# ------------------------------------------------------------------------- sessions and scans


def test_labels_from_the_sessions_and_scans_tables(maps, series):
    cohort = read_bids(maps, MAPS, label="sessions:drug", target="participants:age")
    assert len(cohort.rows) == 32
    for r in cohort.rows:
        assert r["label"] == drug(r["session"]) and r["target"] == age(r["group"][4:])
    # scans.tsv by the file's name relative to its session's folder
    cohort = read_bids(maps, MAPS, label="scans:condition")
    assert [r["label"] for r in cohort.rows] == [condition(r["run"]) for r in cohort.rows]
    # derivatives read the raw dataset's scans.tsv: each series takes its raw file's row
    cohort = read_bids(series, SERIES, label="scans:condition")
    assert len(cohort.rows) == 12 and all(r["volume"] is None for r in cohort.rows)
    assert [r["label"] for r in cohort.rows] == [condition(r["run"]) for r in cohort.rows]


def test_each_bad_sessions_or_scans_table_is_named(maps, series, tmp_path):
    root = _copy(maps, tmp_path)
    sessions = root / "sub-03" / "sub-03_sessions.tsv"
    scans = root / "sub-03" / "ses-2" / "sub-03_ses-2_scans.tsv"
    cases = [
        ("sessions:group", lambda: None,
         rf"{sessions.parent.parent / 'sub-01' / 'sub-01_sessions.tsv'}: no column 'group' "
         r"\(--label sessions:group\); its columns are \['session_id', 'drug', 'dose'\]"),
        ("sessions:dose", lambda: None,
         r"sub-01_sessions.tsv:2: 'dose' is 'n/a' for ses-1 \(--label sessions:dose\); expected "
         r"a value for every session selected \(leave a session out with --bids-filter ses="),
        ("sessions:drug", lambda: write_tsv(sessions, ["session_id", "drug"],
                                            [["ses-1", "placebo"]]),
         rf"{sessions}: no row for session_id ses-2 \(the session of .*sub-03_ses-2_task-faces_"
         r"run-1_.*\); expected a row per session, with its 'drug' \(--label sessions:drug\)"),
        ("sessions:drug", lambda: write_tsv(sessions, ["session_id", "drug"],
                                            [["ses-1", "a"], ["ses-2", "b"], ["ses-1", "c"]]),
         rf"{sessions}:4: session_id ses-1 again \(first at line 2\); expected a row per "
         "session"),
        ("sessions:drug", lambda: sessions.unlink(),
         rf"{sessions}: no such file \(--label sessions:drug\); expected the table of sub-03's "
         r"sessions \(for a derivatives dataset, --bids-raw RAW"),
        ("scans:condition", lambda: write_tsv(scans, ["filename", "condition"], []),
         rf"{scans}: no row for filename func/sub-03_ses-2_task-faces_run-1_space-{SPACE}_"
         r"stat-effect_statmap.nii.gz \(--label scans:condition\); expected a row per file"),
        ("scans:condition", lambda: write_tsv(scans, ["filename", "cond"], []),
         rf"{scans}: no column 'condition' \(--label scans:condition\); its columns are "
         r"\['filename', 'cond'\]"),
        ("scans:condition", lambda: scans.unlink(),
         rf"{scans}: no such file \(--label scans:condition\); expected the table of the files "
         r"of sub-03/ses-2"),
    ]
    for label, change, message in cases:
        change()
        error = FileNotFoundError if "no such file" in message else ValueError
        with pytest.raises(error, match=message):
            read_bids(root, MAPS, label=label)
    # series without sessions have no sessions.tsv row to take
    with pytest.raises(ValueError, match=r"_bold.nii.gz: no session in its name \(--label "
                                         r"sessions:drug\); sessions.tsv gives a value per "
                                         "session"):
        read_bids(series, SERIES, label="sessions:drug")
    # a derivative whose raw file is listed twice, by two names as specific: which is its own?
    raw = _copy(series.parent.parent, tmp_path / "r")
    listed = raw / "sub-01" / "sub-01_scans.tsv"
    write_tsv(listed, ["filename", "condition"],
              [["func/sub-01_task-objects_run-1_bold.nii.gz", "open"],
               ["func/sub-01_task-objects_acq-a_bold.nii.gz", "x"],
               ["func/sub-01_task-objects_acq-b_bold.nii.gz", "y"]])
    with pytest.raises(ValueError, match=rf"{listed}: no row for filename func/sub-01_task-"
                                         r"objects_run-2_space-.*\(for a derivative file, the "
                                         "row of the raw file it was made of"):
        read_bids(raw / "derivatives" / "prep", SERIES, label="scans:condition")
    write_tsv(listed, ["filename", "condition"],
              [["func/sub-01_task-objects_bold.nii.gz", "open"],
               ["func/sub-01_run-1_bold.nii.gz", "closed"]])
    with pytest.raises(ValueError, match=rf"{listed}: lines 2 and 3 \(func/.*, func/.*\) both "
                                         r"list a file func/sub-01_task-objects_run-1_space-"):
        read_bids(raw / "derivatives" / "prep", SERIES, label="scans:condition")


def test_the_entities_of_each_file(maps, series):
    table = read_bids(maps, {**MAPS, "sub": "01", "ses": "2"}).entity_table()
    assert table == {
        "path": [str(maps / "sub-01" / "ses-2" / "func" / f"sub-01_ses-2_task-faces_run-{run}_"
                                                          f"space-{SPACE}_stat-effect_statmap.nii.gz")
                 for run in ("1", "2")],
        "subject": ["01", "01"], "session": ["2", "2"], "task": ["faces", "faces"],
        "run": ["1", "2"], "space": [SPACE, SPACE], "stat": ["effect", "effect"]}
    # a file's volumes, a row each in a cohort labelled by events, are one row here
    cohort = read_bids(series, {**SERIES, "sub": "02"}, label="events:trial_type")
    table = cohort.entity_table()
    assert list(table) == ["path", "subject", "task", "run", "space", "description"]
    assert table["run"] == ["1", "2"] and table["description"] == ["preproc", "preproc"]
