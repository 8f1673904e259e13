"""scripts/tutorial.ipynb runs top to bottom in a fresh kernel and shows what it promises."""

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.scripts

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "scripts" / "tutorial.ipynb"


def _text(nb) -> str:
    """Everything the code cells printed on stdout."""
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []) if out.get("name") == "stdout")


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.source[:60]


def test_python3_kernel_is_this_interpreter():
    # the notebook imports fgscale: its kernel must be the interpreter fgscale is installed in
    from jupyter_client.manager import KernelManager

    cmd = KernelManager(kernel_name="python3").format_kernel_cmd()
    assert Path(cmd[0]).resolve() == Path(sys.executable).resolve(), cmd


def test_tutorial_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if one fails

    text = _text(nb)
    accuracies = {}
    for name in ("feature grouping", "scikit-learn LogisticRegression()"):
        found = re.search(rf"^{re.escape(name)} test accuracy: (\S+)$", text, re.MULTILINE)
        assert found, f"no '{name} test accuracy' line in:\n{text}"
        accuracies[name] = float(found[1])
        assert 0.0 <= accuracies[name] <= 1.0, accuracies
    # 4 balanced classes: chance is 0.25, and this cohort is far above it
    assert accuracies["feature grouping"] > 0.5, accuracies
    assert "Dask dashboard: http" in text

    workdir = tmp_path / "fgscale-tutorial"
    assert (workdir / "cohort" / "cohort.csv").is_file()
    assert (workdir / "cohort.zarr").is_dir()
    assert sorted(p.name for p in (workdir / "maps").glob("*.nii.gz")) == [
        f"class_{k}.nii.gz" for k in range(4)]
    figures = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
               if "image/png" in out.get("data", {})]
    assert figures, "the weight map was not drawn inline"
