"""A run's maps as a BIDS derivatives dataset (fgscale.runs._bids): the dataset description,
names that parse back by BIDS's rules (and nilearn's parser) to the class each map is of,
sidecars, the maps themselves byte for byte, and what is refused."""

import json

import pytest
from helpers import refused
from nilearn.interfaces.bids import parse_bids_filename

from fgscale import __version__
from fgscale.images import parse_bids_name
from fgscale.runs import export_bids
from fgscale.runs._maps import read_maps


def test_the_maps_of_a_run_make_a_derivatives_dataset(tiny_runs, tmp_path):
    run, out = tiny_runs["logreg"], tmp_path / "deriv"
    written = export_bids(run, out)
    description = json.loads((out / "dataset_description.json").read_text())
    assert description["DatasetType"] == "derivative"
    assert description["BIDSVersion"] == "1.10.0"
    assert [(g["Name"], g["Version"]) for g in description["GeneratedBy"]] == [
        ("fgscale", __version__)]
    _, maps = read_maps(run)
    assert list(written["maps"]) == list(maps)
    descs = []
    for klass, path in written["maps"].items():
        assert path.parent == out / "group"
        name = parse_bids_name(path.name, subject=False)
        assert name.suffix == "statmap" and name.entities["stat"] == "weights"
        assert parse_bids_filename(path.name)["entities"] == name.entities
        descs.append(name.entities["desc"])
        assert path.read_bytes() == maps[klass].read_bytes()
        about = json.loads(path.with_name(path.name.replace(".nii.gz", ".json")).read_text())
        assert about["Class"] == klass and about["Model"] == "logreg"
    # class names made labels: "house/home" and "chair b" lose what a label cannot hold, and
    # "Face" beside "face" gets a number, the names differing whatever the case
    assert descs == ["face", "househome", "Face2", "chairb"]
    assert written["mask"] == out / "group" / "mask.nii.gz"
    assert written["mask"].read_bytes() == (run / "mask.nii.gz").read_bytes()


def test_a_dataset_takes_one_runs_maps(tiny_runs, tmp_path, capsys):
    out = tmp_path / "deriv"
    export_bids(tiny_runs["logreg"], out)
    export_bids(tiny_runs["logreg"], out)  # the same run again: written again, no second entry
    description = json.loads((out / "dataset_description.json").read_text())
    assert len(description["GeneratedBy"]) == 1
    with pytest.raises(ValueError, match="holds the maps of another run"):
        export_bids(tiny_runs["mlp"], out)
    # another derivatives dataset gains fgscale's entry beside its own
    other = tmp_path / "other"
    other.mkdir()
    (other / "dataset_description.json").write_text(json.dumps({
        "Name": "x", "BIDSVersion": "1.9.0", "DatasetType": "derivative",
        "GeneratedBy": [{"Name": "fmriprep"}]}))
    export_bids(tiny_runs["mlp"], other)
    generated = json.loads((other / "dataset_description.json").read_text())["GeneratedBy"]
    assert [g["Name"] for g in generated] == ["fmriprep", "fgscale"]
    # a raw dataset, or a folder of something else, is refused, in one line
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "dataset_description.json").write_text(json.dumps({"Name": "r", "BIDSVersion": "1"}))
    refused(["export-bids", str(tiny_runs["mlp"]), "--out", str(raw)], capsys,
            "not the description of a derivatives dataset")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    refused(["export-bids", str(tiny_runs["mlp"]), "--out", str(tmp_path / "notes")], capsys,
            "a folder that is not a BIDS dataset")
    refused(["export-bids", str(tmp_path), "--out", str(tmp_path / "d")], capsys,
            "maps.json: no such file")
