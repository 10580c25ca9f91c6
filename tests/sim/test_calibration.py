"""tools/calibrate.py: every calibrated constant is what its evidence rows
give (to the figures it is written with), every "calibrate" row is one a
constant was solved from (as `calibrated.SOLVED_FROM` names them, by id), and every such row, training runs included (on
meta tensors, as benchmarks/sim_vs_published.py runs them), comes back."""
import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "calibrate.py"


@pytest.fixture(scope="module")
def calibrate():
    # tools/ is not a package: load the script as the tests of benchmarks/ do
    spec = importlib.util.spec_from_file_location("calibrate", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(calibrate):
    return calibrate.resolve_all()


def test_every_stored_constant_is_what_its_rows_give(calibrate, result):
    assert calibrate.mismatches(result) == []
    for constant in calibrate.CONSTANTS:
        derived, root = result[constant.name]
        assert abs(derived - constant.stored) <= constant.tolerance, constant.name
        if constant.name in calibrate.PAIRS:
            continue  # its root holds with its partner's root, not its stored value
        # the root reproduces its row: the solver did solve
        with calibrate.with_value(constant, root):
            assert calibrate.ratio(constant.rows[0]) == pytest.approx(1, abs=1e-4)


def test_every_calibrate_row_names_a_constant_and_every_constant_a_calibrate_row(
        calibrate):
    calibrate_rows = {row.id for row in calibrate.ROWS if row.role == "calibrate"}
    named = {row for constant in calibrate.CONSTANTS for row in constant.rows}
    assert named == calibrate_rows
    groups = {calibrate.BY_ID[row].group for row in calibrate_rows}
    assert {"collective", "kernel", "training"} <= groups


def test_every_calibrate_row_comes_back_within_its_constants_tolerance(calibrate, result):
    ratios = calibrate.calibration_ratios()
    tolerance = calibrate.row_tolerances(result)
    assert len(ratios) >= 27
    far = {row: (ratio, tolerance[row]) for row, ratio in ratios.items()
           if abs(ratio - 1) > tolerance[row]}
    assert far == {}
    # and the tolerances are rounding, not slack: under 3% for every row
    assert max(tolerance.values()) < 0.03


def test_a_constant_moved_off_its_rows_is_reported(calibrate):
    # H100's matmul fraction set 5% low in the simulator and in the record:
    # its row gives it back, so the check names it
    matmul = next(c for c in calibrate.CONSTANTS if c.name == "H100 SXM: matmul")
    moved = replace(matmul, stored=round(matmul.stored * 0.95, 3))
    with calibrate.with_value(matmul, moved.stored):
        result = calibrate.resolve_all([moved])
        assert calibrate.ratio(matmul.rows[0]) < 0.96
    messages = calibrate.mismatches(result, [moved])
    assert len(messages) == 1 and "H100 SXM: matmul" in messages[0]
    assert result[moved.name][0] == pytest.approx(matmul.stored, abs=matmul.tolerance)


def test_the_simulator_is_put_back_after_a_solve(calibrate, result):
    from ddp_teach.sim.model import calibrated
    from ddp_teach.sim.model.efficiency import Achieved
    from ddp_teach.sim.model.hardware import DEVICES
    assert all(DEVICES[name].achieved == Achieved(**calibrated.KERNEL_FRACTIONS[name])
               for name in DEVICES)
    stored = {c.name: c.stored for c in calibrate.CONSTANTS}
    assert calibrated.NVLS_CHUNK_S == stored["NVLS_CHUNK_S"]
    assert calibrated.LINK_FRACTIONS["nvls"] == stored["LINK_FRACTIONS['nvls']"]
    assert calibrated.EMULATED == stored["EMULATED"]


def test_the_fractions_the_table_calls_copied_are_copies():
    # calibrated.COPIED_FROM (and calibrate.py's NOT_FROM_ROWS) say these were
    # taken from another preset's, not solved
    from ddp_teach.sim.model.calibrated import COPIED_FROM, KERNEL_FRACTIONS, SOLVED_FROM
    assert set(COPIED_FROM) == {"H100 SXM", "H200 SXM", "B200", "V100 SXM2", "T4", "RTX 4090"}
    for gpu, (origin, fields) in COPIED_FROM.items():
        for field in fields + ("kernel_s",):
            assert KERNEL_FRACTIONS[gpu][field] == KERNEL_FRACTIONS[origin][field], \
                (gpu, field)
        # and a copied field is named by no constant of its own
        assert not {f"{gpu}: {field}" for field in fields} & set(SOLVED_FROM)
