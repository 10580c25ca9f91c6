"""Every notebook runs top to bottom on a machine with GPUs, as it would on
Kaggle's two T4s or a one-GPU Colab: there the "auto" backend is nccl for
CUDA tensors and gloo for CPU ones, 05 trains in fp16 with autocast and
GradScaler on CUDA, and 01 and 03 teach nccl's semantics. Those three come
first. Skipped without CUDA (see conftest.py); `make test` runs them all on
the CPU through nbval. Minutes in all: `pytest -n 4` (pytest-xdist) runs
them side by side."""
from pathlib import Path

import pytest

WHY = ("runs notebooks: needs nbformat, nbclient and ipykernel (`make setup` "
       "installs them; on a bare GPU machine carry them as wheels, see "
       "tools/device_check.sh)")
nbformat = pytest.importorskip("nbformat", reason=WHY)
NotebookClient = pytest.importorskip("nbclient", reason=WHY).NotebookClient
pytest.importorskip("ipykernel", reason=WHY)

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


GPU_PATHS = ["01_collectives", "03_ddp", "05_mixed_precision"]
OTHERS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9A][0-9]_*.ipynb") if p.stem not in GPU_PATHS)


@pytest.mark.parametrize("name", GPU_PATHS + OTHERS)
def test_the_notebook_runs_on_gpus(name):
    path = NOTEBOOKS / f"{name}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    # raises CellExecutionError at the first failing cell (cells tagged
    # raises-exception excepted), with the cell and its traceback
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
