"""`make test-versions`: the unit tests under the oldest and the newest torch
and Python the course declares known good (ddp_teach/compat.py).

The course is developed on one torch (constraints.txt); learners bring
theirs. This builds one virtual environment per (Python, torch) pair,
installs that torch from PyPI with what the unit tests need, and runs the
unit tests there from this checkout (with --notebooks, every notebook too,
through nbval: a torch older than the course's has broken notebooks whose
unit tests passed; never the browser test), then prints a summary. By
default:

- Python 3.11 with torch 2.14.1, the newest torch the course knows
  (compat.TORCH_NEWEST);
- Python 3.12, as Colab runs, with torch 2.9.0, the oldest it supports
  (compat.TORCH_OLDEST).

The environments are built once in ~/.cache/ddp_teach/versions/
(XDG_CACHE_HOME), a few GB each for torch's CUDA libraries; a CUDA build
runs on the CPU. Not part of `make test`: it takes longer than CI has.

    python tools/check_other_versions.py [--env 3.12:2.9.0 ...] [--notebooks]
        [-- PYTEST ARGS]
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENVS = ("3.11:2.14.1", "3.12:2.9.0")
# what the unit tests import besides torch: pyproject's dependencies, a
# kernel (tests/launcher/test_kernel.py runs one) and pytest
TEST_NEEDS = ("numpy", "matplotlib", "cloudpickle", "psutil", "ipython",
              "ipywidgets", "ipykernel", "nbformat", "nbclient", "nbval", "pytest",
              "pytest-timeout")
UNIT_TESTS = ("tests/test_compat.py", "tests/test_package.py", "tests/test_system.py",
              "tests/course", "tests/sim", "tests/tracing", "tests/launcher",
              "tests/exercises")
NOTEBOOK_ARGS = ("--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=120",
                 "notebooks")


def find_python(version: str) -> str:
    """An interpreter of this version that runs: pythonX.Y on PATH (a pyenv
    shim there may refuse), else pyenv's own copy."""
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}")] + sorted(
        glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin", "python")))
    check = "import sys; print('%d.%d' % sys.version_info[:2])"
    for candidate in filter(None, candidates):
        ran = subprocess.run([candidate, "-c", check], capture_output=True, text=True)
        if ran.returncode == 0 and ran.stdout.strip() == version:
            return candidate
    raise RuntimeError(f"no Python {version} found (neither python{version} on PATH "
                       f"nor pyenv's {version}.x); install one, or choose other "
                       f"environments with --env")


def build(venv: Path, python: str, torch: str, index_url: str | None) -> Path:
    """The environment's python, built once (again when what it should hold
    changed)."""
    stamp = venv / f".built-with-{Path(python).resolve().name}-torch-{torch}"
    if not stamp.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        index = ["--index-url", index_url] if index_url else []
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, *index, f"torch=={torch}"], check=True)
        subprocess.run([*pip, *TEST_NEEDS], check=True)
        stamp.touch()
    return venv / "bin" / "python"


def run_tests(python: Path, report: Path, pytest_args, notebooks=False) -> dict:
    """Run the unit tests (and the notebooks) with this interpreter; the
    counts from its report."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's package, not an installed one
    report.unlink(missing_ok=True)  # a crashed run must not read the last one's
    started = time.monotonic()
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "--timeout=300", f"--junitxml={report}", *pytest_args, *UNIT_TESTS,
         *(NOTEBOOK_ARGS if notebooks else ())],
        cwd=ROOT, env=env)
    counts = {"exit": done.returncode, "seconds": time.monotonic() - started}
    if report.exists():
        suites = list(ElementTree.parse(report).getroot().iter("testsuite"))
        for name in ("tests", "failures", "errors", "skipped"):
            counts[name] = sum(int(suite.get(name, 0)) for suite in suites)
    return counts


def versions(python: Path) -> str:
    code = "import sys, torch; print(sys.version.split()[0], torch.__version__)"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    return f"Python {out[0]}, torch {out[1]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", metavar="PYTHON:TORCH",
                        help=f"an environment to test, e.g. 3.12:2.9.0 (repeatable; "
                             f"default: {' and '.join(DEFAULT_ENVS)})")
    parser.add_argument("--index-url", help="where pip finds torch (e.g. "
                        "https://download.pytorch.org/whl/cpu for CPU builds)")
    parser.add_argument("--notebooks", action="store_true",
                        help="run every notebook too (nbval), about 5 minutes more each")
    parser.add_argument("pytest_args", nargs="*",
                        help="passed to pytest, after --, e.g. -- -x -k ring")
    options = parser.parse_args(argv)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    base = cache / "ddp_teach" / "versions"
    results = []
    for spec in options.env or DEFAULT_ENVS:
        python_version, _, torch_version = spec.partition(":")
        if not torch_version:
            parser.error(f"--env {spec!r}: write PYTHON:TORCH, e.g. 3.12:2.9.0")
        name = f"py{python_version}-torch{torch_version}"
        try:
            python = build(base / name, find_python(python_version), torch_version,
                           options.index_url)
        except (RuntimeError, subprocess.CalledProcessError) as error:
            print(f"\n=== {name}: not built: {error}", flush=True)
            results.append((name, {"exit": "not built", "seconds": 0.0}))
            continue
        print(f"\n=== {name}: {versions(python)}", flush=True)
        results.append((name, run_tests(python, base / name / "report.xml",
                                        options.pytest_args, options.notebooks)))
    print("\nenvironment                 tests  failed  errors  skipped  minutes")
    for name, counts in results:
        print(f"{name:<26} {counts.get('tests', '?'):>6} {counts.get('failures', '?'):>7} "
              f"{counts.get('errors', '?'):>7} {counts.get('skipped', '?'):>8} "
              f"{counts['seconds'] / 60:>8.1f}")
    return 0 if all(counts["exit"] == 0 for _, counts in results) else 1


if __name__ == "__main__":
    sys.exit(main())
