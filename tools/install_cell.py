"""The first lines of every notebook: links that open it on Colab or Kaggle,
and a cell that installs the course's package where it is missing.

On Colab, Kaggle or a JupyterHub the notebook arrives alone, without the
package, and `pip install` of it must not replace what the platform's kernel
runs on: its torch (a build matched to its CUDA driver), IPython, ipykernel
and ipywidgets. So the cell pins each of those that is installed to the
version it finds (a pip constraints file) and lets pip add only what is
missing. Where the package is already importable (`make lab`, CI) the cell
does nothing.

    python tools/install_cell.py          # write the links and the cell into every notebook
    python tools/install_cell.py --check  # exit 1 if a notebook differs

tests/notebooks/test_install_cell.py keeps every notebook equal to this file.
"""
import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
# Where the course is published; the install cell and the links point here.
REPOSITORY = "https://github.com/ddp-teach/ddp_teach"
BRANCH = "main"
MARKER = "# Colab, Kaggle, a JupyterHub:"

CELL = f'''{MARKER} install the course's package if this Python lacks it.
# The torch, IPython, ipykernel and ipywidgets already here are kept as they are.
# DDP_TEACH_SOURCE may name another source for pip (a fork, a local checkout).
import importlib.metadata as metadata, importlib.util, os, subprocess, sys, tempfile
if importlib.util.find_spec("ddp_teach") is None:
    here = {{(dist.metadata["Name"] or "").lower() for dist in metadata.distributions()}}
    keep = [f"{{name}}=={{metadata.version(name)}}" for name in
            ("torch", "ipython", "ipykernel", "ipywidgets", "numpy", "matplotlib") if name in here]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
        pins.write("\\n".join(keep) + "\\n")
    source = os.environ.get("DDP_TEACH_SOURCE", "git+{REPOSITORY}@{BRANCH}")
    print("installing ddp_teach from", source, "beside", ", ".join(keep))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--constraint", pins.name, source], check=True)
    importlib.invalidate_caches()'''


def links(notebook: Path) -> str:
    """The line under a notebook's title: open this notebook on Colab or Kaggle."""
    page = f"{REPOSITORY}/blob/{BRANCH}/notebooks/{notebook.name}"
    colab = page.replace("https://github.com/", "https://colab.research.google.com/github/")
    return (f"[Open in Colab]({colab}) · "
            f"[Open in Kaggle](https://www.kaggle.com/kernels/welcome?src={page})")


def with_links_and_cell(notebook: Path, nb) -> bool:
    """Put the links at the end of the title cell and the install cell right
    after it, replacing older ones; True if anything changed."""
    title = nb.cells[0]
    lines = [line for line in title.source.splitlines()
             if not line.startswith("[Open in Colab]")]
    while lines and not lines[-1].strip():
        lines.pop()
    new_title = "\n".join([*lines, "", links(notebook)])
    changed = new_title != title.source
    title.source = new_title
    second = nb.cells[1] if len(nb.cells) > 1 else None
    if second is not None and second.cell_type == "code" and second.source.startswith(MARKER):
        changed |= second.source != CELL
        second.source = CELL
    else:
        nb.cells.insert(1, nbformat.v4.new_code_cell(CELL, id="install"))
        changed = True
    return changed


def notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9A][0-9]_*.ipynb"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a notebook's links or install cell differ")
    parser.add_argument("names", nargs="*", help="notebook files (default: all)")
    options = parser.parse_args(argv)
    paths = [Path(name) for name in options.names] or notebooks()
    stale = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if with_links_and_cell(path, nb):
            stale.append(path.name)
            if not options.check:
                nbformat.write(nb, path)
    if options.check and stale:
        print("out of date (run python tools/install_cell.py):", *stale)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
