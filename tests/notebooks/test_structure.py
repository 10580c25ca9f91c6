"""The structure every notebook shares, and what a learner's clone holds.

Every notebook opens with its number (00, 01, ... on the core road; A1,
A2, ... for the optional appendices) and title, then its learning goals and
prerequisites, and ends with a recap and further reading; it is stored
without outputs (nbval and `make html` make them); and the README's course
table and the welcome notebook's course map list it, so that a new notebook
cannot be forgotten there.
"""
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import notebook_stats  # noqa: E402  (tools/ is not a package)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9A][0-9]_*.ipynb"))


def level_two_headings(nb) -> list[str]:
    return [line[3:].strip() for cell in nb.cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if line.startswith("## ")]


def test_the_notebooks_are_numbered_without_gaps():
    """The core road is 00, 01, ...; the optional appendices A1, A2, ...
    come after it (sorted so: digits before letters)."""
    core = [int(path.name[:2]) for path in NOTEBOOKS if path.name[0].isdigit()]
    appendices = [int(path.name[1]) for path in NOTEBOOKS if path.name[0] == "A"]
    assert core == list(range(len(core))), core
    assert appendices == list(range(1, len(appendices) + 1)), appendices


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_goals_and_prerequisites_first_recap_and_reading_last(path):
    nb = nbformat.read(path, as_version=4)
    assert re.match(rf"# {path.name[:2]} · \S", nb.cells[0].source), nb.cells[0].source[:60]
    headings = level_two_headings(nb)
    assert headings[:2] == ["Learning goals", "Prerequisites"], headings[:2]
    assert headings[-2:] == ["Recap", "Further reading"], headings[-2:]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


def test_the_readme_course_table_lists_every_notebook():
    readme = (ROOT / "README.md").read_text()
    listed = re.findall(r"^\| `([\dA]\d_\w+)` \|", readme, re.MULTILINE)
    assert listed == [path.stem for path in NOTEBOOKS]


def test_the_welcome_notebooks_course_map_lists_every_notebook():
    welcome = nbformat.read(NOTEBOOKS[0], as_version=4)
    text = "\n".join(cell.source for cell in welcome.cells if cell.cell_type == "markdown")
    listed = re.findall(r"^\| `([\dA]\d_\w+)` \|", text, re.MULTILINE)
    assert listed == [path.stem for path in NOTEBOOKS]


# The learner's cells carry the lesson; the course's own proofs (the asserts
# that let CI check what the prose says) sit in collapsed cells tagged
# `check`. A learner reads at most this many asserts in a notebook, each one
# a statement meant for them.
VISIBLE_ASSERTS = 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_courses_checks_are_out_of_the_learners_way(path):
    nb = nbformat.read(path, as_version=4)
    assert notebook_stats.visible_asserts(nb) <= VISIBLE_ASSERTS, (
        f"{path.name}: {notebook_stats.visible_asserts(nb)} asserts in cells the "
        f"learner reads (at most {VISIBLE_ASSERTS}): move the course's checks into "
        "a code cell tagged `check` with metadata.jupyter.source_hidden")
    for cell in nb.cells:
        tagged = "check" in cell.metadata.get("tags", [])
        if tagged or cell.metadata.get("jupyter", {}).get("source_hidden"):
            assert cell.cell_type == "code" and notebook_stats.is_check(cell), cell.source[:80]
            assert cell.source.startswith("# Check: "), (
                f"{path.name}: a check cell says first what it proves: {cell.source[:80]!r}")
            assert "assert" in cell.source, cell.source[:80]
