"""Every notebook again, with each exercise cell replaced by the course's
reference solution: all checks must then say correct. (nbval runs the
notebooks as stored, with the stubs unsolved.) Each runs only up to the
check of its last exercise: the cells after it cannot change a verdict,
and nbval runs them already."""
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ddp_teach.exercises import solution_cell

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def exercise_cells(nb):
    return [c for c in nb.cells if "exercise" in c.metadata.get("tags", [])]


def up_to_the_last_check(nb):
    """The notebook's cells up to the cell that checks its last exercise."""
    last = max(i for i, c in enumerate(nb.cells) if "exercise" in c.metadata.get("tags", []))
    checks = [i for i, c in enumerate(nb.cells) if i > last and c.cell_type == "code"
              and "exercises.check(" in c.source]
    nb.cells = nb.cells[:checks[0] + 1]
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solved_notebook_reports_every_exercise_correct(path):
    nb = nbformat.read(path, as_version=4)
    exercises = exercise_cells(nb)
    if not exercises:
        pytest.skip(f"{path.name} has no exercise cells")
    for cell in exercises:
        cell.source = solution_cell(cell.metadata["exercise"])
    up_to_the_last_check(nb)
    NotebookClient(nb, kernel_name="python3", timeout=180,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs if o.output_type == "stream")
    assert "❌" not in printed and "⏳" not in printed, printed
    assert printed.count("✅") == len(exercises)


def test_every_exercise_cell_names_a_registered_exercise():
    from ddp_teach.exercises import exercise_named
    for path in NOTEBOOKS:
        for cell in exercise_cells(nbformat.read(path, as_version=4)):
            assert exercise_named(cell.metadata["exercise"]).stub_name in cell.source
