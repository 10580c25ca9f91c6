"""The notebooks whose cells take a GPU path when one is there (05 trains
in fp16 with autocast and GradScaler on CUDA), and those that teach the
nccl semantics (01, 03), run top to bottom on a machine with GPUs.
Skipped without CUDA (see conftest.py); `make test` runs them on the CPU
through nbval."""
from pathlib import Path

import pytest

WHY = ("runs notebooks: needs nbformat, nbclient and ipykernel (`make setup` "
       "installs them; on a bare GPU machine carry them as wheels, see "
       "tools/device_check.sh)")
nbformat = pytest.importorskip("nbformat", reason=WHY)
NotebookClient = pytest.importorskip("nbclient", reason=WHY).NotebookClient
pytest.importorskip("ipykernel", reason=WHY)

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("name", ["01_collectives", "03_ddp", "05_mixed_precision"])
def test_the_notebook_runs_on_gpus(name):
    path = NOTEBOOKS / f"{name}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    # raises CellExecutionError at the first failing cell (cells tagged
    # raises-exception excepted), with the cell and its traceback
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
