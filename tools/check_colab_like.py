"""`make test-colab`: the notebooks' install cell, then notebooks 00 and 01
(with --all, every notebook after them), in a virtual environment that
holds what Colab's kernel runs on.

Colab's kernel side is old where the course's `make setup` is new: IPython
7.34, ipykernel 6.17, ipywidgets 7.7 and the torch Colab ships. On Colab a
notebook arrives alone, so this copies each notebook it runs into an empty
folder, runs it with that environment's kernel, and lets the first cell of
00 install the package from this checkout (DDP_TEACH_SOURCE) as it would
from the repository; the later notebooks' install cells find it there. It then checks that the install kept the platform's torch,
IPython, ipykernel and ipywidgets, and that no cell failed.

The environment is built once in ~/.cache/ddp_teach/ (XDG_CACHE_HOME), with
pip from PyPI: a few GB for torch's CUDA libraries. Not part of `make test`.

    python tools/check_colab_like.py [--python python3.12] [--torch 2.9.0] [--all]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Colab's kernel-side versions (its runtime's `pip list`), with the oldest
# torch the course supports standing in for "the torch Colab has".
COLAB_KERNEL = {"ipython": "7.34.0", "ipykernel": "6.17.1", "ipywidgets": "7.7.1",
                "numpy": "2.0.2", "matplotlib": "3.10.0"}
NOTEBOOKS = ("00_welcome.ipynb", "01_collectives.ipynb")
# What executes the notebooks, installed beside the kernel (Colab's own
# front end plays this part there).
RUNNER = ("nbclient", "nbformat")
# Jupyter's folders inside this repository (the Makefile's) would hide the
# environment's own kernel.
HIDDEN = ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
          "IPYTHONDIR", "JUPYTER_PATH")

EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
               resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, path)
"""


def failure_report(stderr: str) -> str:
    """The failing cell and its error from nbclient's report, without the
    terminal colours."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", stderr)
    start = plain.find("An error occurred while executing the following cell")
    report = plain[start:] if start >= 0 else plain
    return report[:1500] + ("\n...\n" + report[-2500:] if len(report) > 4000 else report[1500:])


def versions(python: Path, names) -> dict:
    code = ("import importlib.metadata as m, json, sys; print(json.dumps("
            "{n: m.version(n) for n in sys.argv[1:]}))")
    out = subprocess.run([str(python), "-c", code, *names], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def build(venv: Path, python: str, torch: str) -> Path:
    stamp = venv / f".built-with-{Path(python).name}-torch-{torch}"
    if not stamp.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pins = [f"{name}=={version}" for name, version in COLAB_KERNEL.items()]
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        f"torch=={torch}", *pins, *RUNNER], check=True)
        stamp.touch()
    return venv / "bin" / "python"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.12",
                        help="the interpreter of the environment (Colab runs 3.12)")
    parser.add_argument("--torch", default="2.9.0",
                        help="the platform's torch (the oldest the course supports)")
    parser.add_argument("--all", action="store_true",
                        help="after 00 and 01, every other notebook too (minutes more)")
    options = parser.parse_args(argv)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddp_teach"
    python = build(cache / "colab-like", options.python, options.torch)
    watched = ["torch", *COLAB_KERNEL]
    before = versions(python, watched)
    # A fresh copy of the package for every check: uninstall an earlier one.
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "ddp_teach"],
                   check=False, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN}
    env.update(DDP_TEACH_SOURCE=str(ROOT), PATH=f"{python.parent}:{env['PATH']}")
    failed = []
    with tempfile.TemporaryDirectory(prefix="colab-like-") as folder:
        others = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9A][0-9]_*.ipynb")
                        if p.name not in NOTEBOOKS) if options.all else []
        for name in (*NOTEBOOKS, *others):
            copy = Path(folder) / name
            shutil.copy(ROOT / "notebooks" / name, copy)
            run = subprocess.run([str(python), "-c", EXECUTE, str(copy), folder],
                                 env=env, cwd=folder, capture_output=True, text=True)
            print(f"{name}: {'ok' if run.returncode == 0 else 'FAILED'}")
            if run.returncode:
                print(failure_report(run.stderr))
                failed.append(name)
    after = versions(python, watched)
    changed = {name: (before[name], after[name]) for name in watched
               if before[name] != after[name]}
    print("platform packages kept:", ", ".join(f"{k} {v}" for k, v in after.items()))
    if changed:
        print("the install cell CHANGED:", changed)
    return 1 if failed or changed else 0


if __name__ == "__main__":
    sys.exit(main())
