"""Cohort tables: labels, targets, or both, and the file:line of every bad value."""

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from fgscale.images._cohort import entry_headers, entry_volumes, read_cohort


def write_table(path, header, rows):
    """A cohort table of ``rows`` (lists of cells) under ``header``, comma- or tab-separated."""
    sep = "\t" if path.suffix == ".tsv" else ","
    path.write_text("\n".join(sep.join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


def test_label_only_entries_have_no_target(tmp_path):
    table = write_table(tmp_path / "c.csv", ["path", "label"], [["a.nii", "x"], ["b.nii", "y"]])
    entries = read_cohort(table)
    assert [e["label"] for e in entries] == ["x", "y"]
    assert [e["target"] for e in entries] == [None, None]
    assert entries[1]["where"] == f"{table}:3"


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_targets_are_floats_with_or_without_labels(tmp_path, suffix):
    both = write_table(tmp_path / f"both{suffix}", ["path", "label", "target", "split"],
                       [["a.nii", "x", "1.5", "train"], ["b.nii", "y", " -2e3 ", "test"]])
    entries = read_cohort(both)
    assert [(e["label"], e["target"], e["split"]) for e in entries] == [
        ("x", 1.5, "train"), ("y", -2000.0, "test")]
    assert all(type(e["target"]) is float for e in entries)
    only = write_table(tmp_path / f"only{suffix}", ["path", "target", "group"],
                       [["a.nii", "3", "s1"], ["b.nii", "0.25", "s2"]])
    entries = read_cohort(only)
    assert [(e["label"], e["target"], e["group"]) for e in entries] == [
        ("", 3.0, "s1"), ("", 0.25, "s2")]
    assert entries[0]["path"] == str(tmp_path / "a.nii")


@pytest.mark.parametrize("value, message", [
    ("abc", "target 'abc' for .*b.nii is not a number"),
    ("nan", "target 'nan' for .*b.nii is not finite"),
    ("-inf", "target '-inf' for .*b.nii is not finite"),
    ("", "missing target for .*b.nii"),
])
@pytest.mark.parametrize("header", [["path", "target"], ["path", "label", "target"]])
def test_a_bad_target_names_the_file_and_line(tmp_path, value, message, header):
    rows = [["a.nii", "x", "1"], ["b.nii", "x", value], ["c.nii", "x", "2"]]
    rows = [r if "label" in header else [r[0], r[2]] for r in rows]
    table = write_table(tmp_path / "c.csv", header, rows)
    with pytest.raises(ValueError, match=rf"c.csv:3: {message}; expected a finite number"):
        read_cohort(table)


def test_a_table_needs_a_label_or_a_target_column(tmp_path):
    table = write_table(tmp_path / "c.csv", ["path", "group"], [["a.nii", "s1"]])
    with pytest.raises(ValueError, match=r"c.csv: cohort table has neither a 'label' nor a "
                                         r"'target' column; .* got \['path', 'group'\]"):
        read_cohort(table)
    table = write_table(tmp_path / "c.csv", ["file", "label"], [["a.nii", "x"]])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['path'\]"):
        read_cohort(table)


def test_images_to_predict_keep_their_split_and_blank_cells(tmp_path):
    paths = write_table(tmp_path / "new.csv", ["path", "split"], [["a.nii", "test"], ["b.nii", ""]])
    entries = read_cohort(paths, known=False)
    assert [(e["label"], e["target"], e["split"]) for e in entries] == [
        ("", None, "test"), ("", None, "")]
    some = write_table(tmp_path / "some.csv", ["path", "label", "target"],
                       [["a.nii", "x", "2.5"], ["b.nii", "", ""]])
    entries = read_cohort(some, known=False)
    assert [(e["label"], e["target"]) for e in entries] == [("x", 2.5), ("", None)]
    # a value that is there is still checked, and training still needs every one
    bad = write_table(tmp_path / "bad.csv", ["path", "target"], [["a.nii", "abc"]])
    with pytest.raises(ValueError, match=r"bad.csv:2: target 'abc' for .*a.nii is not a number"):
        read_cohort(bad, known=False)
    with pytest.raises(ValueError, match=r"some.csv:3: missing target"):
        read_cohort(some)


def test_labels_stay_required_where_the_column_is(tmp_path):
    table = write_table(tmp_path / "c.csv", ["path", "label", "target"],
                        [["a.nii", "x", "1"], ["b.nii", "", "2"]])
    with pytest.raises(ValueError, match=r"c.csv:3: missing label for .*b.nii"):
        read_cohort(table)


def test_images_to_predict_need_no_label_nor_target(tmp_path):
    """known=False (fgscale predict): a table of paths alone, or with blank labels and targets."""
    paths = write_table(tmp_path / "p.csv", ["path"], [["a.nii"], ["b.nii"]])
    assert [(e["label"], e["target"]) for e in read_cohort(paths, known=False)] == [
        ("", None), ("", None)]
    some = write_table(tmp_path / "s.tsv", ["path", "label", "target"],
                       [["a.nii", "x", ""], ["b.nii", "", "2.5"]])
    assert [(e["label"], e["target"]) for e in read_cohort(some, known=False)] == [
        ("x", None), ("", 2.5)]
    with pytest.raises(ValueError, match="target 'old' .* is not a number"):
        read_cohort(write_table(tmp_path / "b.csv", ["path", "target"], [["a.nii", "old"]]),
                    known=False)
    with pytest.raises(ValueError, match="neither a 'label' nor a 'target' column"):
        read_cohort(paths)


def test_classes_need_labels(tmp_path):
    table = write_table(tmp_path / "c.csv", ["path", "target"], [["a.nii", "1"]])
    with pytest.raises(ValueError, match="classes were given but the cohort table has no "
                                         "'label' column"):
        read_cohort(table, classes=["x"])


def test_globs_have_labels_and_no_target(tmp_path):
    for name in ("b.nii", "a.nii"):
        (tmp_path / name).write_bytes(b"")
    entries = read_cohort(str(tmp_path / "*.nii"), labels=["x", "y"])
    assert [(e["path"][-5:], e["label"], e["target"]) for e in entries] == [
        ("a.nii", "x", None), ("b.nii", "y", None)]


def test_common_aliases_of_group_and_split_are_read_and_said(tmp_path, caplog):
    table = tmp_path / "cohort.csv"
    table.write_text("path,label,participant_id,set,age\na.nii,x,sub-1,train,30\n"
                     "b.nii,y,sub-2,test,40\n")
    with caplog.at_level("INFO", logger="fgscale.images._cohort"):
        entries = read_cohort(table)
    assert [(e["group"], e["split"]) for e in entries] == [("sub-1", "train"), ("sub-2", "test")]
    text = caplog.text
    assert "reading column 'participant_id' as 'group'" in text
    assert "reading column 'set' as 'split'" in text
    assert text.count("not used") == 1 and "['age']" in text
    assert "--label-column" not in text  # the table has its labels


def test_a_label_column_of_another_name_is_pointed_at(tmp_path, caplog):
    # a numeric target read without the labels would train a regressor
    table = tmp_path / "cohort.csv"
    table.write_text("path,condition,target\na.nii,x,1.5\nb.nii,y,2.5\n")
    with caplog.at_level("WARNING", logger="fgscale.images._cohort"):
        entries = read_cohort(table)
    assert [e["label"] for e in entries] == ["", ""]
    assert ("column(s) ['condition'] not used (fgscale reads path, label, target, group, split, "
            "volume); --label-column NAME reads one as the labels") in caplog.text
    assert [e["label"] for e in read_cohort(table, columns={"label": "condition"})] == ["x", "y"]


def test_a_file_listed_twice_is_refused_naming_both_lines(tmp_path):
    table = tmp_path / "cohort.csv"
    table.write_text("path,label\na.nii,x\nb.nii,y\n./a.nii,y\n")
    with pytest.raises(ValueError, match=r"cohort.csv:4: .*a.nii is listed again \(first at "
                                         r".*cohort.csv:2\)"):
        read_cohort(table)
    # the volumes of a 4D run labelled one by one without a volume column: said how to
    table.write_text("path,label\nrun.nii.gz,face\nrun.nii.gz,house\n")
    with pytest.raises(ValueError, match=r"cohort.csv:3: .*run.nii.gz is listed again .* to "
                                         r"label its volumes apart, give a row per volume with "
                                         r"a 'volume' column"):
        read_cohort(table)


def test_a_volume_column_lists_a_runs_volumes_one_per_row(tmp_path):
    table = tmp_path / "cohort.csv"
    # "0.0": pandas writes a column with an empty cell as floats
    table.write_text("path,volume,label\nrun.nii.gz,3,face\nrun.nii.gz,0.0,house\nb.nii,,x\n")
    assert [(Path(e["path"]).name, e["volume"], e["label"]) for e in read_cohort(table)] == [
        ("run.nii.gz", 3, "face"), ("run.nii.gz", 0, "house"), ("b.nii", None, "x")]
    refused = {  # rows after the header: the message
        "run.nii.gz,3,face\nrun.nii.gz,3,house\n":
            r"cohort.csv:3: volume 3 of .*run.nii.gz is listed again \(first at .*cohort.csv:2\)",
        "run.nii.gz,3,face\n./run.nii.gz,,house\n":
            r"cohort.csv:3: .*run.nii.gz is listed whole, and by volume at .*cohort.csv:2",
        "run.nii.gz,,face\nrun.nii.gz,1,house\n":
            r"cohort.csv:3: .*run.nii.gz is listed by volume, and whole at .*cohort.csv:2",
        "run.nii.gz,1.5,face\n": r"cohort.csv:2: volume '1.5' for .*run.nii.gz; expected the "
                                 r"volume's index in the file \(an integer from 0\)",
        "run.nii.gz,-1,face\n": r"cohort.csv:2: volume '-1'",
    }
    for rows, message in refused.items():
        table.write_text("path,volume,label\n" + rows)
        with pytest.raises(ValueError, match=message):
            read_cohort(table)


def test_a_volume_beyond_the_files_is_refused_naming_its_line(tmp_path):
    nib.save(nib.Nifti1Image(np.ones((2, 2, 2, 4), np.float32), np.eye(4)), tmp_path / "run.nii")
    nib.save(nib.Nifti1Image(np.ones((2, 2, 2), np.float32), np.eye(4)), tmp_path / "a.nii")
    table = tmp_path / "cohort.csv"
    table.write_text("path,volume,label\nrun.nii,3,x\na.nii,0,y\nrun.nii,0,y\n")
    entries = read_cohort(table)
    assert entry_volumes(entries, entry_headers(entries)) == [range(3, 4), range(0, 1),
                                                              range(0, 1)]
    for rows, message in {"run.nii,4,x\n": r"cohort.csv:2: .*run.nii: volume 4, but the file "
                                           r"has 4 volumes \(0 to 3\)",
                          "a.nii,1,x\n": r"cohort.csv:2: .*a.nii: volume 1, but the file has 1 "
                                         r"volume \(0 to 0\)"}.items():
        table.write_text("path,volume,label\n" + rows)
        entries = read_cohort(table)
        with pytest.raises(ValueError, match=message):
            entry_volumes(entries, entry_headers(entries))


def test_a_row_of_more_cells_than_columns_is_refused_naming_its_line(tmp_path):
    """A comma inside an unquoted cell (a label "face, happy") shifts the cells after it: the
    subject would be read from the wrong cell, the last cell dropped, without a word."""
    table = tmp_path / "c.csv"
    table.write_text('path,label,group\na.nii,"face, happy",s1\nb.nii,face, happy,s2\n')
    with pytest.raises(ValueError, match=r"c.csv:3: 4 cells for 3 columns \(extra \['s2'\]\); "
                                         "quote a cell that holds the delimiter"):
        read_cohort(table)
    table.write_text("path,label,group\na.nii,x,s1,\nb.nii,y,s2,,\n")  # empty trailing cells
    assert [e["group"] for e in read_cohort(table)] == ["s1", "s2"]


def test_a_label_file_with_a_byte_order_mark_and_crlf_gives_its_labels(tmp_path):
    """Windows Notepad's labels file: the mark made the first label a class of its own."""
    for name in ("a.nii", "b.nii", "c.nii"):
        (tmp_path / name).touch()
    (tmp_path / "labels.txt").write_bytes(b"\xef\xbb\xbfface\r\nhouse\r\nface\r\n\r\n")
    entries = read_cohort(str(tmp_path / "*.nii"), labels=tmp_path / "labels.txt")
    assert [e["label"] for e in entries] == ["face", "house", "face"]


def test_a_label_file_not_in_utf8_is_named(tmp_path):
    (tmp_path / "a.nii").touch()
    (tmp_path / "labels.txt").write_bytes("café\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"labels.txt: not a readable label file \(.*\); "
                                         "expected UTF-8 text, one label per line"):
        read_cohort(str(tmp_path / "*.nii"), labels=tmp_path / "labels.txt")


def test_a_column_named_twice_is_refused(tmp_path):
    """Two 'label' columns (tables merged in a spreadsheet): the second was read silently."""
    table = write_table(tmp_path / "c.csv", ["path", "label", "label"],
                        [["a.nii", "x", "y"], ["b.nii", "y", "x"]])
    with pytest.raises(ValueError, match=r"c.csv: column\(s\) \['label'\] named twice"):
        read_cohort(table)


def test_lines_are_the_file_s_own_after_blank_lines(tmp_path):
    """A blank line in the middle of a table (two tables pasted together): the rows after it
    were named a line too early, the fix looked for at the wrong line."""
    table = tmp_path / "c.csv"
    table.write_text("path,label\na.nii,x\n\nb.nii,\n")
    with pytest.raises(ValueError, match=r"c.csv:4: missing label for .*b.nii"):
        read_cohort(table)


def test_a_quote_not_closed_is_refused_on_one_line(tmp_path):
    """The rest of the table became the first row's path: 'missing label for a.nii,x' and
    the following lines, on as many lines of the message."""
    table = tmp_path / "c.csv"
    table.write_text('path,label\n"a.nii,x\nb.nii,y\nc.nii,z\n')
    with pytest.raises(ValueError, match=r"c.csv:4: a cell runs over several lines") as info:
        read_cohort(table)
    assert "\n" not in str(info.value)


def test_a_path_from_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    table = write_table(tmp_path / "c.csv", ["path", "label"], [["~/betas/a.nii", "x"]])
    assert read_cohort(table)[0]["path"] == str(tmp_path / "home" / "betas" / "a.nii")


def test_spaces_around_the_header_names_are_not_part_of_them(tmp_path):
    """``path, label`` (typed by hand, or written by a spreadsheet): ``' label'`` was no
    'label' column, and the table was refused as having neither a label nor a target."""
    table = tmp_path / "c.csv"
    table.write_text("path, label ,group\na.nii,x,s1\nb.nii,y,s2\n")
    entries = read_cohort(table)
    assert [e["label"] for e in entries] == ["x", "y"]
    assert [e["group"] for e in entries] == ["s1", "s2"]


@pytest.mark.parametrize("marker, what", [("config.json", "a run folder of fgscale train"),
                                          ("zarr.json", "already a store"), (None, "a folder")])
def test_a_folder_given_as_images_is_named_for_what_it_is(tmp_path, marker, what):
    """``fgscale convert RUN_FOLDER`` said that a list of files needs labels."""
    folder = tmp_path / "x"
    folder.mkdir()
    if marker:
        (folder / marker).write_text("{}")
    with pytest.raises(ValueError, match=f"x: {what}, not an image; give a cohort table"):
        read_cohort([str(folder)])


def test_a_spreadsheets_csv_is_read_with_its_semicolons_and_capitalised_names(tmp_path):
    """Excel saves "CSV" with semicolons where the decimal mark is a comma, and people write
    "Path" and "Label": read as the table means, where they gave 'lacks column path'."""
    table = tmp_path / "cohort.csv"
    table.write_text("Path;Label;Subject;Diagnosis\na.nii;x;s1;1,5\nb.nii;y;s2;2,5\n")
    entries = read_cohort(table, columns={"target": "Diagnosis"})
    # a known name given with the header's case: found, though read in lower case
    assert read_cohort(table, columns={"target": "Diagnosis", "group": "Subject"})[1]["group"] \
        == "s2"
    assert [(Path(e["path"]).name, e["label"], e["group"]) for e in entries] == [
        ("a.nii", "x", "s1"), ("b.nii", "y", "s2")]
    assert [e["target"] for e in entries] == [1.5, 2.5]  # the decimal mark of such a file
    # a comma anywhere in the header: commas, as before (a path with a ';' stays whole)
    table.write_text("path,label\na;b.nii,x\n")
    assert Path(read_cohort(table)[0]["path"]).name == "a;b.nii"


def test_numeric_labels_are_ordered_by_value_and_classes_without_rows_said(tmp_path, caplog):
    from fgscale.images._cohort import class_order

    assert class_order(["10", "2", "1", "2"]) == ["1", "2", "10"]
    assert class_order(["b", "10", "a"]) == ["10", "a", "b"]
    table = tmp_path / "cohort.csv"
    table.write_text("path,label\na.nii,x\nb.nii,y\n")
    with caplog.at_level("WARNING", logger="fgscale.images._cohort"):
        read_cohort(table, classes=["x", "y", "z"])
    assert "class(es) ['z'] (of the classes given) have no row" in caplog.text


def test_nilearns_column_names_are_read_and_its_labels_txt_said_how_to_write(tmp_path, caplog):
    """nilearn's Haxby labels (``labels``, ``chunks``: the runs): read as label and group, so a
    split by run stays by run; where they were left unread ('chunks' not used) the folds mixed
    each run's volumes. Its space-separated labels.txt is named for what it is."""
    table = tmp_path / "cohort.csv"
    table.write_text("path,volume,labels,chunks\nrun0.nii.gz,0,face,0\nrun0.nii.gz,1,house,0\n")
    with caplog.at_level("INFO", logger="fgscale.images._cohort"):
        entries = read_cohort(table)
    assert [(e["label"], e["group"]) for e in entries] == [("face", "0"), ("house", "0")]
    assert "reading column 'chunks' as 'group'" in caplog.text and "not used" not in caplog.text
    table.write_text("path,label,session,run\na.nii,x,s1,r1\n")
    assert read_cohort(table, columns={"group": "session"})[0]["group"] == "s1"
    with pytest.raises(ValueError, match=r"no column 'subject' to read as the group "
                                         r"\(--group-column\)"):
        read_cohort(table, columns={"group": "subject"})
    with pytest.raises(ValueError, match=r"columns \(--label-column, --target-column, "
                                         r"--group-column\) name columns of a cohort table"):
        read_cohort([str(tmp_path / "a.nii")], labels=["x"], columns={"group": "run"})
    labels = tmp_path / "labels.txt"
    labels.write_text("labels chunks\nrest 0\nface 0\n")
    with pytest.raises(ValueError, match=r"labels.txt: a text file, not a NIfTI image nor a "
                                         r"cohort table; .* a row per volume with its path, "
                                         r"volume \(from 0\) and label"):
        read_cohort(str(labels))
    table.write_text("path volume label\nrun0.nii.gz 0 face\n")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['path'\].*; its cells are "
                                         r"separated by spaces: separate them by commas"):
        read_cohort(table)
    with pytest.raises(ValueError, match=r"got 3 labels for 1 files; .* \(a label per volume "
                                         r"of 4D files: a cohort table with a 'volume' column\)"):
        read_cohort([str(tmp_path / "a.nii")], labels=["x", "y", "z"])


def test_a_label_of_one_row_among_larger_classes_is_named_as_a_likely_typo(tmp_path, caplog):
    rows = [[f"{c}{i}.nii", c] for c in ("face", "house") for i in range(5)]
    typo = write_table(tmp_path / "typo.csv", ["path", "label"], [*rows, ["x.nii", "Face"]])
    with caplog.at_level("WARNING", logger="fgscale.images._cohort"):
        read_cohort(typo)
        read_cohort(typo, known=False)  # images to predict: their labels form no classes
    assert caplog.text.count("label(s) ['Face'] of one row each") == 1
    assert f"({typo}:12), where the other classes have 5 rows or more: a typo?" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fgscale.images._cohort"):
        read_cohort(write_table(tmp_path / "small.csv", ["path", "label"],
                                [*rows[:4], *rows[5:9], ["x.nii", "Face"]]))  # 4 rows a class
        read_cohort(write_table(tmp_path / "ok.csv", ["path", "label"], rows))
    assert "one row each" not in caplog.text
