"""A store damaged on disk after it was written (a shard deleted or truncated by a quota
cleaner, an array removed by hand, a bank's file lost): every command names the damaged file and
what to do, never trains on the fill value as data, never shows a traceback, and the command
that made the store repairs what it can. SYNTHETIC cohorts (fgscale.images make_cohort)."""

import json
import shutil

import numpy as np
import pytest
import zarr
from helpers import (
    TINY_GRID,
    dashboard_port_may_be_taken,
    refused,
    wait_until_blocked_on_a_lock,
)

from fgscale.cli import main
from fgscale.images._synthetic import make_cohort
from fgscale.store import open_store

pytestmark = dashboard_port_may_be_taken

FAST = ["--n-workers", "1", "--no-progress", "--n-groupings", "2", "--n-bootstrap", "5",
        "--n-clusters", "20", "--max-epochs", "1", "--batch-size", "8", "--learning-rate",
        "0.05"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A SYNTHETIC cohort table and its store, converted by the CLI in shards of 8 rows."""
    folder = tmp_path_factory.mktemp("cohort")
    table = make_cohort(folder / "cohort", n_samples=40, n_classes=2, grid=TINY_GRID,
                        n_subjects=5, seed=0)
    out = folder / "s.zarr"
    assert main(["convert", str(table), "--out", str(out), "--block-rows", "8",
                 "--no-progress"]) == 0
    return table, out


def _copy(converted, tmp_path):
    table, store = converted
    out = tmp_path / "s.zarr"
    shutil.copytree(store, out)
    return table, out


@pytest.mark.parametrize("damage", ["deleted", "truncated", "overwritten"])
def test_a_damaged_shard_is_refused_then_rewritten_by_convert(damage, converted, tmp_path,
                                                               capsys, caplog):
    table, store = _copy(converted, tmp_path)
    before = open_store(store).read_rows(np.arange(40))
    shard = store / "X" / "c" / "2" / "0"
    if damage == "deleted":
        shard.unlink()
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-30])
    else:  # same size, other bytes: a block of another store copied over it
        shard.write_bytes(bytes(len(shard.read_bytes())))
    refused(["train", store, "--out", tmp_path / "run", *FAST], capsys,
            r"X/c/2/0: .*(missing|truncated|never written|bytes)")
    assert not (tmp_path / "run" / "model.json").exists()
    assert main(["convert", str(table), "--out", str(store), "--block-rows", "8",
                 "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "already complete" not in captured.out
    assert "shards [2] of X are missing or damaged" in caplog.text
    assert "4 blocks already done" in captured.out
    np.testing.assert_array_equal(open_store(store).read_rows(np.arange(40)), before)
    assert main(["convert", str(table), "--out", str(store), "--block-rows", "8",
                 "--no-progress"]) == 0
    assert "already complete, nothing to do" in capsys.readouterr().out


def test_an_undamaged_store_is_left_as_it_is(converted, tmp_path, capsys):
    table, store = _copy(converted, tmp_path)
    stamps = {p: p.stat().st_mtime_ns for p in (store / "X" / "c").rglob("*") if p.is_file()}
    assert main(["convert", str(table), "--out", str(store), "--block-rows", "8",
                 "--no-progress"]) == 0
    assert "already complete, nothing to do" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in (store / "X" / "c").rglob("*")
                      if p.is_file()}
    assert zarr.open_group(str(store)).attrs["complete"] is True


def _drop(store, name):
    shutil.rmtree(store / name)


def _cut(store, name):
    chunk = next(p for p in (store / name / "c").rglob("*") if p.is_file())
    chunk.write_bytes(chunk.read_bytes()[:3])


def _more_rows(store, name):
    g = zarr.open_group(str(store), mode="r+")
    y = g["y"][:]
    del g["y"]
    g.create_array("y", data=np.concatenate([y, y[:2]]))


@pytest.mark.parametrize("damage, name, message", [
    (_drop, "mask", r"s\.zarr: array 'mask' is missing; a damaged store: convert the cohort "
                    r"again into a new store"),
    (_drop, "classes", r"s\.zarr: array 'classes' is missing"),
    (_cut, "y", r"s\.zarr/y: cannot be read \(.*\); a damaged store"),
    (_cut, "split", r"s\.zarr/split: cannot be read"),
    (_more_rows, "y", r"s\.zarr: array 'y' has shape \(42,\), X has 40 rows"),
])
def test_a_damaged_metadata_array_is_named(damage, name, message, converted, tmp_path, capsys):
    table, store = _copy(converted, tmp_path)
    damage(store, name)
    refused(["train", store, "--out", tmp_path / "run", *FAST], capsys, message)
    refused(["convert", table, "--out", store, "--no-progress", "--block-rows", "8"], capsys,
            message)
    refused(["bank", store, "--list"], capsys, message)


def test_x_of_another_width_than_the_mask_is_named(converted, tmp_path, capsys):
    """X's zarr.json edited to one column fewer: its rows no longer fit the mask."""
    _, store = _copy(converted, tmp_path)
    meta = store / "X" / "zarr.json"
    meta.write_text(meta.read_text().replace("605", "604"))
    refused(["train", store, "--out", tmp_path / "run", *FAST], capsys,
            r"s\.zarr: array 'mask' of shape \(\d+, \d+, \d+\) holds 605 voxels, X has 604 "
            r"columns")


BANK = ["--n-groupings", "3", "--n-bootstrap", "5", "--n-clusters", "20", "--seed", "0",
        "--n-workers", "1", "--no-progress"]


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_damaged_grouping_is_built_again(damage, converted, tmp_path, capsys, caplog):
    """A chunk of a bank's labels removed read as -1 (the fill value) and the training run
    stopped with torch's 'index -1 is out of bounds'; a truncated one with zstd's error."""
    _, store = _copy(converted, tmp_path)
    assert main(["bank", str(store), *BANK]) == 0
    (key,) = [p.name for p in (store / "banks").iterdir() if p.is_dir()]
    labels = store / "banks" / key / "labels"
    before = zarr.open_array(str(labels))[:]
    chunk = labels / "c" / "1" / "0"
    if damage == "deleted":
        chunk.unlink()
    else:
        chunk.write_bytes(chunk.read_bytes()[:5])
    capsys.readouterr()
    assert main(["train", str(store), "--out", str(tmp_path / "run"), *FAST[:2],
                 *["--no-progress", "--n-groupings", "3", "--n-bootstrap", "5", "--n-clusters",
                   "20", "--max-epochs", "1"]]) == 0, capsys.readouterr().err
    assert f"groupings [1] of bank {key} are damaged; building them again" in caplog.text
    np.testing.assert_array_equal(zarr.open_array(str(labels))[:], before)
    assert (tmp_path / "run" / "model.json").exists()


def test_two_conversions_started_at_once_both_end_with_the_store(converted, tmp_path, caplog):
    """The second to rename its new store found the first's in place: '[Errno 39] Directory not
    empty: s.zarr.creating -> s.zarr' (or each removed the other's half-written folder). What
    killed runs left is removed, but not what a process of another node left on a shared file
    system, which may still run: that is named in a warning."""
    from fgscale._utils.files import owner_tag
    from fgscale.store._layout import create_whole
    from fgscale.store._shards import StoreError

    table, made = converted
    out = tmp_path / "s.zarr"
    shutil.copytree(made, out)
    g = zarr.open_group(str(made))
    kwargs = dict(n_samples=40, mask=g["mask"][:], affine=g["affine"][:], y=g["y"][:],
                  classes=list(g["classes"][:]), block_rows=8, attrs=dict(g.attrs))
    host = owner_tag().partition("@")[2]
    for tag in ("999999999", f"999999999@{host}"):  # of runs killed before they renamed it
        (tmp_path / f"s.zarr.creating.{tag}").mkdir()
    elsewhere = tmp_path / f"s.zarr.removing.999999999@{host}x"
    elsewhere.mkdir()
    assert create_whole(out, **kwargs).attrs["complete"] is True  # the first's store, kept
    assert f"s.zarr.removing.999999999@{host}x: left by a process on {host}x" in caplog.text
    elsewhere.rmdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]
    other = dict(kwargs, attrs={**kwargs["attrs"], "params": {"fingerprint": "other inputs"}})
    with pytest.raises(StoreError, match=r"s\.zarr: another conversion, of other inputs, "
                                         r"created it meanwhile"):
        create_whole(out, **other)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]
    np.testing.assert_array_equal(open_store(out).read_rows(np.arange(40)),
                                  open_store(made).read_rows(np.arange(40)))


def test_two_convert_commands_at_once_both_succeed(converted, tmp_path):
    import subprocess
    import sys

    table, made = converted
    out = tmp_path / "s.zarr"
    cmd = [sys.executable, "-m", "fgscale", "convert", str(table), "--out", str(out),
           "--block-rows", "8", "--n-workers", "1", "--no-progress"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    np.testing.assert_array_equal(open_store(out).read_rows(np.arange(40)),
                                  open_store(made).read_rows(np.arange(40)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


def test_a_conversion_into_a_store_being_converted_waits_for_it(converted, tmp_path, capsys):
    """A second conversion, of other inputs, into a store still being converted removed it as
    'an unfinished conversion of other inputs' and made its own, while the first went on
    writing its shards and flags into the new one. It now waits for the first to end, then
    refuses the store that the first completed."""
    import subprocess
    import sys

    from fgscale._utils.files import exclusive_name

    table, made = converted
    out = tmp_path / "s.zarr"
    other = tmp_path / "other.csv"  # the same images (paths from the table), labels swapped
    lines = table.read_text().splitlines()
    head = lines[0].split(",")
    col = head.index("label")
    path = head.index("path")
    swap = {"class_0": "class_1", "class_1": "class_0"}
    swapped = [",".join(swap.get(f, f) if i == col else str(table.parent / f) if i == path
                        else f for i, f in enumerate(line.split(","))) for line in lines[1:]]
    other.write_text("\n".join([lines[0], *swapped]) + "\n")
    with exclusive_name(out, waiting="held by the test"):  # the first conversion, still running
        proc = subprocess.Popen([sys.executable, "-m", "fgscale", "convert", str(other),
                                 "--out", str(out), "--block-rows", "8", "--no-progress"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until_blocked_on_a_lock(proc)  # however long a loaded machine takes to get there
        assert not out.exists()
        shutil.copytree(made, out)  # what the first conversion leaves: its complete store
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert "s.zarr: another conversion into it is running; waiting for it to end" in err
    assert "s.zarr: exists and was made from other inputs" in err
    np.testing.assert_array_equal(open_store(out).read_rows(np.arange(40)),
                                  open_store(made).read_rows(np.arange(40)))
    # the lock file of a conversion killed while it held the store does not hold the next one
    (tmp_path / ".s.zarr.lock").write_text("")
    assert main(["convert", str(table), "--out", str(out), "--block-rows", "8",
                 "--no-progress"]) == 0
    assert "already complete" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.csv", "s.zarr"]


def test_a_lock_on_a_name_is_held_by_one_at_a_time(tmp_path, monkeypatch):
    """The lock file goes as its holder lets go: a waiter that had opened the file then holds
    a lock on a removed file, which must not let it in beside a newcomer that made a new one."""
    import threading
    import time

    from fgscale._utils.files import exclusive_name

    inside, entered, overlaps = set(), [], []

    def work(i):
        for _ in range(5):
            with exclusive_name(tmp_path / "s.zarr", waiting="waiting"):
                if inside:
                    overlaps.append((i, set(inside)))
                inside.add(i)
                entered.append(i)
                time.sleep(0.01)
                inside.discard(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not overlaps
    assert len(entered) == 30
    assert list(tmp_path.iterdir()) == []
    # "~" is the home folder, not a folder of that name made in the working one
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with exclusive_name("~/s.zarr"):
        assert [p.name for p in tmp_path.iterdir()] == [".s.zarr.lock"]


def test_a_run_folder_or_cv_file_being_written_is_refused_to_a_second_command(
        converted, tmp_path, capsys):
    """A training job submitted twice (or resubmitted with --resume while the first still
    ran) trained twice into one folder, each writing its checkpoints and metrics between the
    other's; two cv commands on one --out trained every fold twice. The second is now refused
    at once, with nothing written, and the same command runs once the first has ended."""
    from fgscale._utils.files import exclusive_name

    _, store = _copy(converted, tmp_path)  # the statistics and banks go into it
    run, results = tmp_path / "runs" / "fg", tmp_path / "cv.json"
    for argv, out, message in [
            (["train", store, "--out", run, *FAST], run,
             r"fg: another fgscale train is running in this run folder; wait for it to end"),
            (["cv", store, "--folds", "2", "--out", results, *FAST], results,
             r"cv\.json: another fgscale cv is writing these results; wait for it to end")]:
        with exclusive_name(out, waiting="the first command"):
            refused(argv, capsys, message)
            assert not out.exists()
        assert main([str(a) for a in argv]) == 0
        assert out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cv.json", "runs", "s.zarr"]
    assert [p.name for p in run.parent.iterdir()] == ["fg"]


STATS_SCRIPT = """
import sys
from distributed import Client, LocalCluster
from fgscale.store import compute_stats
with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                  dashboard_address=None) as cluster, Client(cluster) as client:
    mean, std = compute_stats(sys.argv[1], client=client, progress=False)
print(float(mean.sum()), float(std.sum()))
"""


def test_two_commands_computing_the_same_statistics_at_once(converted, tmp_path):
    """Two training jobs on one fresh store: the first to finish dropped its partial statistics
    under the other's tasks, which stopped with KeyError: 'partial_count' (a traceback). The
    second now waits for the first and reads its result."""
    import subprocess
    import sys

    _, made = converted
    for attempt in range(3):
        store = tmp_path / f"s{attempt}.zarr"
        shutil.copytree(made, store)
        cmd = [sys.executable, "-c", STATS_SCRIPT, str(store)]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            outs.append(out)
        assert outs[0] == outs[1]
    # the second waits while the first holds the store
    from fgscale._utils.files import exclusive

    store = tmp_path / "held.zarr"
    shutil.copytree(made, store)
    with exclusive(store):
        proc = subprocess.Popen([sys.executable, "-c", STATS_SCRIPT, str(store)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until_blocked_on_a_lock(proc)  # however long a loaded machine takes to get there
        assert not (store / "stats").exists()
    assert proc.communicate(timeout=300)[0] == outs[0]


BANK_SCRIPT = """
import sys
from distributed import Client, LocalCluster
from fgscale.grouping import build_bank
with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                  dashboard_address=None) as cluster, Client(cluster) as client:
    labels, info = build_bank(sys.argv[1], n_groupings=24, n_bootstrap=10, n_clusters=20,
                              client=client, progress=False, return_info=True)
print(info["built"], int(labels.sum()))
"""


def test_two_commands_building_the_same_bank_at_once(converted, tmp_path):
    """Two training jobs on one store both built every grouping of the bank they share (twice
    the work, the second creation of the bank able to wipe the first's rows). The second now
    waits for the first and reuses its bank."""
    import subprocess
    import sys

    from fgscale._utils.files import exclusive

    _, made = converted
    store = tmp_path / "s.zarr"
    shutil.copytree(made, store)
    cmd = [sys.executable, "-c", BANK_SCRIPT, str(store)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs.append(out.split())
    assert sorted(int(built) for built, _ in outs) == [0, 24]
    assert outs[0][1] == outs[1][1]  # the same groupings
    # the second waits while the first holds the store's banks
    held = tmp_path / "held.zarr"
    shutil.copytree(made, held)
    zarr.open_group(held, mode="r+").require_group("banks")
    with exclusive(held / "banks"):
        proc = subprocess.Popen([sys.executable, "-c", BANK_SCRIPT, str(held)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until_blocked_on_a_lock(proc)  # however long a loaded machine takes to get there
    assert proc.communicate(timeout=300)[0].split() == ["24", outs[0][1]]


def test_the_temporary_shards_of_a_killed_conversion_are_removed(converted, tmp_path):
    """kill -9 while a shard was written left '.0.<pid>.tmp' (a shard's bytes, 64 MiB at full
    size) beside it for good, through every re-run."""
    import os

    table, store = _copy(converted, tmp_path)
    dead = store / "X" / "c" / "1" / ".0.999999999.tmp"
    live = store / "X" / "c" / "2" / f".0.{os.getpid()}.tmp"  # a conversion still writing
    dead.write_bytes(b"\0" * 1000)
    live.write_bytes(b"\0" * 1000)
    assert main(["convert", str(table), "--out", str(store), "--block-rows", "8",
                 "--no-progress"]) == 0
    assert not dead.exists()
    assert live.exists()


class _Payload:
    """Pickled into the store: unpickling it would create the file ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_zarr_v2_store_of_pickled_objects_is_refused_never_unpickled(converted, tmp_path,
                                                                     capsys):
    """A Zarr v2 store (zarr 3 reads both formats) whose 'source' array holds pickled objects:
    named, never decoded; it stopped train with zarr's 'No Zarr data type found' naming no
    file or array."""
    import pickle

    _, made = converted
    src = open_store(made)
    out = tmp_path / "v2.zarr"
    g = zarr.open_group(str(out), mode="w", zarr_format=2)
    g.create_array("X", data=src.read_rows(np.arange(src.n_samples)), chunks=(8, src.n_features))
    for name in ("y", "volume", "mask", "affine", "done"):
        g.create_array(name, data=src.group[name][:])
    for name in ("classes", "split", "group"):
        g.create_array(name, data=np.asarray(src.group[name][:].tolist(), dtype="U20"))
    g.attrs.update(dict(src.attrs))
    objects = np.empty(src.n_samples, dtype=object)
    objects[:] = [_Payload(tmp_path / "ran") for _ in range(src.n_samples)]
    (out / "source").mkdir()
    (out / "source" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [src.n_samples], "chunks": [src.n_samples], "dtype": "|O",
        "compressor": None, "fill_value": None, "order": "C", "filters": [{"id": "pickle"}],
        "dimension_separator": "."}))
    (out / "source" / "0").write_bytes(pickle.dumps(objects))
    refused(["train", out, "--out", tmp_path / "run", *FAST], capsys,
            r"v2\.zarr/source: cannot be read \(.*\); a damaged store")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("edit", ["done removed", "X of more rows"])
def test_convert_checks_shards_only_of_a_store_it_can_read(edit, converted, tmp_path, capsys):
    """The check for damaged shards read the 'done' flags before the store's own checks:
    KeyError: 'done', or an IndexError past its last flag (tracebacks)."""
    table, store = _copy(converted, tmp_path)
    if edit == "done removed":  # nothing the reader needs: the store stays usable
        shutil.rmtree(store / "done")
        assert main(["convert", str(table), "--out", str(store), "--block-rows", "8",
                     "--no-progress"]) == 0
        assert "already complete, nothing to do" in capsys.readouterr().out
    else:
        meta = store / "X" / "zarr.json"
        document = json.loads(meta.read_text())
        document["shape"][0] = 50
        meta.write_text(json.dumps(document))
        refused(["convert", table, "--out", store, "--block-rows", "8", "--no-progress"],
                capsys, r"s\.zarr: array 'y' has shape \(40,\), X has 50 rows")
