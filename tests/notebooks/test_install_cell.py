"""Every notebook opens with links to Colab and Kaggle and the cell that
installs the package there (tools/install_cell.py), and that cell keeps the
platform's own torch, IPython, ipykernel and ipywidgets.

The cell is run here with pip replaced by a recorder: a real install from
the repository needs the network. `make test-colab` runs it for real, in a
virtual environment with Colab's kernel-side versions."""
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import install_cell  # noqa: E402  (tools/ is not a package)

NOTEBOOKS = install_cell.notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_has_the_links_and_the_install_cell(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].source.endswith(install_cell.links(path)), (
        f"{path.name}: run python tools/install_cell.py")
    assert nb.cells[1].cell_type == "code" and nb.cells[1].source == install_cell.CELL, (
        f"{path.name}: run python tools/install_cell.py")


def test_the_links_open_this_notebook_from_the_repository():
    line = install_cell.links(ROOT / "notebooks" / "03_ddp.ipynb")
    page = f"{install_cell.REPOSITORY}/blob/main/notebooks/03_ddp.ipynb"
    assert f"](https://colab.research.google.com/github/{page.split('github.com/')[1]})" in line
    assert f"](https://www.kaggle.com/kernels/welcome?src={page})" in line


def run_cell(monkeypatch, installed: bool) -> list:
    """Run the install cell as a notebook would, with pip recorded, not run."""
    calls = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: (
        None if name == "ddp_teach" and not installed else real_find_spec(name, *rest)))
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: calls.append(command))
    exec(install_cell.CELL, {})
    return calls


def test_the_cell_does_nothing_where_the_package_is_installed(monkeypatch):
    assert run_cell(monkeypatch, installed=True) == []


def test_the_cell_pins_the_platforms_kernel_packages_and_installs_the_course(monkeypatch):
    monkeypatch.delenv("DDP_TEACH_SOURCE", raising=False)
    [command] = run_cell(monkeypatch, installed=False)
    assert command[:5] == [sys.executable, "-m", "pip", "install", "--quiet"]
    assert command[5] == "--constraint"
    assert command[7] == f"git+{install_cell.REPOSITORY}@main"
    kept = Path(command[6]).read_text().split()
    for name in ("torch", "ipython", "ipykernel", "ipywidgets"):
        assert f"{name}=={importlib.metadata.version(name)}" in kept, kept


def test_the_source_can_be_a_fork_or_a_local_checkout(monkeypatch):
    monkeypatch.setenv("DDP_TEACH_SOURCE", str(ROOT))
    [command] = run_cell(monkeypatch, installed=False)
    assert command[-1] == str(ROOT)


def test_the_tool_reports_a_stale_notebook(tmp_path):
    stale = tmp_path / "03_ddp.ipynb"
    nb = nbformat.read(ROOT / "notebooks" / "03_ddp.ipynb", as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("--quiet", "-q")
    nbformat.write(nb, stale)
    assert install_cell.main(["--check", str(stale)]) == 1
    assert install_cell.main([str(stale)]) == 0
    assert install_cell.main(["--check", str(stale)]) == 0
