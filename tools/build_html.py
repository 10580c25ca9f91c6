"""`make html`: the whole course executed and rendered to HTML, for reading
without running it.

Each notebook in notebooks/ runs top to bottom in a fresh kernel of this
environment (as under `make lab`, from the notebooks folder), with real
workers, so the outputs are this machine's. Then it is written to
build/html/<name>.html with its outputs, and build/html/index.html lists the
notebooks in course order with their titles and first lines.

A cell tagged `raises-exception` may fail (the tag nbval and nbconvert also
honour). Any other error is a bug: the notebook is still rendered, with the
error where it happened, the index marks it, and the build exits non-zero.

    python tools/build_html.py [--out build/html] [notebook.ipynb ...]
"""
import argparse
import datetime
import html
import platform
import re
import sys
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbconvert import HTMLExporter
from nbconvert.filters.markdown import markdown2html

from ddp_teach import system

ROOT = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 600


def title_and_summary(nb) -> tuple[str, str]:
    """The first markdown heading, and the paragraph that follows it."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.strip().splitlines()
        if lines and lines[0].startswith("#"):
            paragraphs = "\n".join(lines[1:]).strip().split("\n\n")
            return lines[0].lstrip("#").strip(), " ".join(paragraphs[0].split())
    return "", ""


def execute(nb, cwd: Path) -> str | None:
    """Run every cell in a fresh kernel; None, or the error that stopped it."""
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute()
    except CellExecutionError as error:
        failed = next((i for i, cell in enumerate(nb.cells, start=1)
                       if "raises-exception" not in cell.metadata.get("tags", [])
                       and any(out.output_type == "error"
                               for out in cell.get("outputs", []))), "?")
        message = f"{error.ename}: {error.evalue}".strip().splitlines()[0]
        return f"cell {failed} (counting from 1): {message}"
    return None


NAV = """<nav class="course-nav"><style>.course-nav {{ font: 14px system-ui,
 sans-serif; padding: 0.5rem 1rem; border-bottom: 1px solid #ddd; }}
 .course-nav a {{ color: #1565c0; }}</style>
<a href="index.html">Course index</a>{links}</nav>"""


def render(nb, path: Path, previous: Path | None, following: Path | None) -> None:
    """The notebook as an HTML page, with links to the index and to the
    notebooks before and after it."""
    page, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    links = "".join(f" · <a href=\"{html.escape(other.stem)}.html\">{label}: "
                    f"{html.escape(other.stem)}</a>"
                    for label, other in (("previous", previous), ("next", following))
                    if other is not None)
    nav = NAV.format(links=links)
    page = re.sub(r"(<body[^>]*>)", lambda m: m[1] + nav, page, count=1)
    page = page.replace("</body>", nav + "</body>", 1)
    path.write_text(page, encoding="utf-8")


INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>ddp_teach: the course</title>
<style>
 body {{ font-family: system-ui, sans-serif; max-width: 50rem; margin: 2rem auto;
        padding: 0 1rem; line-height: 1.45; color: #222; }}
 ul {{ list-style: none; padding: 0; }} li {{ margin: 0 0 1rem 0; }}
 a {{ font-weight: 600; }} li p {{ margin: 0.2rem 0; }}
 .meta, .took {{ color: #666; font-size: 0.9em; }}
 .failed {{ color: #b00; font-weight: 600; }}
</style></head><body>
<h1>ddp_teach: distributed data-parallel training, learnt by running it</h1>
<p>Every notebook of the course, run top to bottom on this machine with its
outputs, to read without running. To run the experiments yourself and move
the widgets, use <code>make lab</code>.</p>
<ul>
{items}
</ul>
<p class="meta">Built {when} with Python {python}, torch {torch}, on
{machine}.</p>
</body></html>
"""

ITEM = """<li><a href="{href}">{title}</a>{failed}
<div>{summary}</div><span class="took">({seconds:.0f} s to run)</span></li>"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "html")
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    notebooks = sorted(args.notebooks or (ROOT / "notebooks").glob("[0-9A]*.ipynb"))
    args.out.mkdir(parents=True, exist_ok=True)
    items, failed = [], []
    for i, path in enumerate(notebooks):
        nb = nbformat.read(path, as_version=4)
        print(f"{path.name}: running ...", flush=True)
        start = time.perf_counter()
        error = execute(nb, path.parent)
        seconds = time.perf_counter() - start
        page = args.out / f"{path.stem}.html"
        render(nb, page, notebooks[i - 1] if i > 0 else None,
               notebooks[i + 1] if i + 1 < len(notebooks) else None)
        print(f"{path.name}: {seconds:.0f} s -> {page}"
              + (f"  FAILED: {error}" if error else ""), flush=True)
        if error:
            failed.append(path.name)
        title, summary = title_and_summary(nb)
        items.append(ITEM.format(
            href=html.escape(page.name), title=html.escape(title or path.stem),
            summary=markdown2html(summary), seconds=seconds,
            failed=f' <span class="failed">failed: {html.escape(error)}</span>'
            if error else ""))

    (args.out / "index.html").write_text(INDEX.format(
        items="\n".join(items), python=platform.python_version(),
        torch=torch.__version__, machine=f"{platform.system()} "
        f"{platform.machine()}, {system.cpu_cores()} CPU cores, "
        f"{system.gpu_count()} CUDA GPUs",
        when=datetime.date.today().isoformat()), encoding="utf-8")
    print(f"index: {args.out / 'index.html'}")
    if failed:
        print(f"errors in: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
