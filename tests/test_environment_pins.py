"""The package declares ranges; `make setup`, CI and conda learners install
the exact versions of constraints.txt. These tests keep the four files in
step: pyproject.toml's ranges, constraints.txt's pins, environment.yml's
mirror of them, and the Makefile's torch."""
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)\s*$")


def declared_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(text) for text in
            [*project["dependencies"], *extras["lab"], *extras["test"]]]


def pins(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return {canonicalize_name(m[1]): m[2] for m in map(PIN.match, lines) if m}


def test_the_package_declares_ranges_with_a_floor_not_exact_pins():
    for requirement in declared_requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert ">=" in operators and "==" not in operators, (
            f"{requirement}: declare a floor (>=), not an exact pin; exact "
            "versions belong in constraints.txt")


def test_constraints_pin_every_declared_package_inside_its_range():
    pinned = pins(ROOT / "constraints.txt")
    for requirement in declared_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"constraints.txt does not pin {name}"
        assert requirement.specifier.contains(pinned[name]), (
            f"constraints.txt pins {name}=={pinned[name]}, outside "
            f"pyproject.toml's {requirement}")


def test_environment_yml_mirrors_the_constraints_of_the_declared_packages():
    pinned = pins(ROOT / "constraints.txt")
    declared = {canonicalize_name(r.name) for r in declared_requirements()}
    assert pins(ROOT / "environment.yml") == {name: pinned[name] for name in declared}


def test_makefile_installs_the_constrained_torch_with_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    assert f"torch=={pins(ROOT / 'constraints.txt')['torch']}" in makefile
    assert "-c constraints.txt" in makefile


def test_the_declared_torch_floor_is_the_oldest_the_import_check_accepts():
    from ddp_teach import compat
    [torch] = [r for r in declared_requirements() if r.name == "torch"]
    floor = ".".join(map(str, compat.TORCH_OLDEST))
    assert str(torch.specifier) == f">={floor}", (
        f"pyproject.toml says {torch}; ddp_teach.compat accepts torch {floor} and newer")
