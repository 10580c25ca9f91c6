"""Words of prose, cells and the asserts a learner sees, per notebook.

The course keeps its own proofs (the asserts that let CI check what the
prose says) in code cells tagged `check` whose input is collapsed in
JupyterLab (`metadata.jupyter.source_hidden`); every other assert is one
the learner reads. tests/notebooks/test_structure.py holds each notebook
to the road's limits; this prints the numbers for a closing note:

    python tools/notebook_stats.py [NN ...]
"""
import re
import sys
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ASSERT = re.compile(r"^\s*assert\b", re.MULTILINE)


def is_check(cell) -> bool:
    """A course check: tagged `check`, its input collapsed."""
    return ("check" in cell.metadata.get("tags", [])
            and cell.metadata.get("jupyter", {}).get("source_hidden", False))


def prose_words(nb) -> int:
    return sum(len(cell.source.split()) for cell in nb.cells if cell.cell_type == "markdown")


def visible_asserts(nb) -> int:
    return sum(len(ASSERT.findall(cell.source)) for cell in nb.cells
               if cell.cell_type == "code" and not is_check(cell))


def stats(path: Path) -> dict:
    nb = nbformat.read(path, as_version=4)
    return {"notebook": path.stem, "cells": len(nb.cells), "words": prose_words(nb),
            "visible_asserts": visible_asserts(nb),
            "check_cells": sum(1 for c in nb.cells if c.cell_type == "code" and is_check(c))}


def main(argv: list[str]) -> int:
    paths = sorted(NOTEBOOKS.glob("[0-9A][0-9]_*.ipynb"))
    for path in paths:
        if not argv or path.name[:2] in argv:
            print("{notebook:34} cells {cells:4}  words {words:5}  visible asserts "
                  "{visible_asserts:3}  check cells {check_cells:3}".format(**stats(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
