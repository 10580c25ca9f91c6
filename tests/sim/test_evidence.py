"""The evidence files (ddp_teach/sim/evidence/*.toml): every file is in the
manifest and ships with the package, every row reads back whole, every
source a row cites is in the manifest and every source is cited, and a
malformed row is refused with a message that names it."""
import tomllib
from pathlib import Path

import pytest

from ddp_teach.sim.model import calibrated
from ddp_teach.sim.evidence import loader

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "ddp_teach" / "sim" / "evidence"


def test_every_file_is_in_the_manifest_and_ships_with_the_package():
    data = sorted(p.name for p in EVIDENCE.glob("*.toml") if p.name != "manifest.toml")
    assert sorted(loader.manifest()["files"]) == data
    assert set(loader.manifest()["package_files"]) < set(data)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["ddp_teach.sim.evidence"]
    assert all(any(Path(name).match(pattern) for pattern in shipped)
               for name in data + ["manifest.toml"])


def test_every_row_reads_back_as_its_file_holds_it():
    for name in loader.manifest()["files"]:
        raw = tomllib.loads((EVIDENCE / name).read_text())["row"]
        rows = loader.rows(name)
        assert [r["id"] for r in raw] == [row.id for row in rows]
        for fields, row in zip(raw, rows):
            assert row.figure == fields["figure"] and row.unit == fields["unit"]
            assert row.source == loader.manifest()["sources"][fields["source"]]
            assert row.simulate == fields["simulate"]
            assert row.note == fields.get("note", "")
    ids = [row.id for row in loader.every_row()]
    assert len(ids) == len(set(ids)) >= 100


def test_every_source_is_cited_and_every_citation_has_a_source():
    cited = {row.source_key for row in loader.every_row()}
    assert cited == set(loader.manifest()["sources"])


def test_the_calibrated_constants_name_calibrate_rows_and_every_calibrate_row_is_named():
    by_id = loader.by_id()
    named = {row_id for rows in calibrated.SOLVED_FROM.values() for row_id in rows}
    assert named <= set(by_id)
    assert named == {row.id for row in by_id.values() if row.role == "calibrate"}


def test_the_capstone_step_is_the_row_it_comes_from():
    from ddp_teach.sim.evidence import published
    row = loader.by_id()["capstone-ddp-step-width-64-1-h100-ours"]
    assert published.CAPSTONE_STEP_H100["step"] == pytest.approx(row.figure * 1e-3)
    assert set(published.CAPSTONE_STEP_H100) == {"step", "forward", "backward", "optimizer"}


@pytest.mark.parametrize("change, message", [
    (lambda row: row.pop("unit"), "lacks unit"),
    (lambda row: row.update(role="fit"), "role 'fit' is not one of"),
    (lambda row: row.update(figure=-1), "figure must be a number > 0"),
    (lambda row: row.update(source="a blog"), "no source 'a blog'"),
])
def test_a_malformed_row_is_refused_with_its_file_and_id(change, message):
    fields = dict(tomllib.loads((EVIDENCE / "kernels.toml").read_text())["row"][0])
    change(fields)
    with pytest.raises(ValueError, match=message) as error:
        loader.parse_row("kernels.toml", 0, fields)
    assert "kernels.toml, row 1" in str(error.value)


def test_a_row_simulated_by_an_unknown_function_is_refused():
    with pytest.raises(ValueError, match="not among the functions given"):
        loader.measurements(["kernels.toml"], {"busbw": lambda **_: 1.0})
