"""pyproject.toml, environment.yml and the Makefile pin the same versions, so
pip and conda learners get the same course."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)\s*$")


def pins_in_pyproject() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        match = PIN.match(dep)
        assert match, f"pyproject.toml dependency {dep!r} is not pinned with =="
        pins[match[1].lower()] = match[2]
    return pins


def pins_in_environment_yml() -> dict[str, str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_section = lines[lines.index("  - pip:") + 1:]
    return {m[1].lower(): m[2] for m in map(PIN.match, pip_section) if m}


def test_environment_yml_pins_exactly_what_pyproject_pins():
    assert pins_in_environment_yml() == pins_in_pyproject()


def test_every_dependency_is_pinned_and_torch_is_2_13():
    assert pins_in_pyproject()["torch"] == "2.13.0"


def test_makefile_installs_the_same_torch():
    makefile = (ROOT / "Makefile").read_text()
    assert f"torch=={pins_in_pyproject()['torch']}" in makefile
