"""The published measurements the simulator is held to (`dt.sim.published`):
well-formed rows, calibration rows reproduced, misses explained, and the
validation error no worse than the table the course shows."""
import statistics

import pytest

from ddp_teach.sim.evidence import published
from ddp_teach.sim.evidence.measurement import HIGH, LOW

ROWS = published.table()


def test_every_row_names_its_configuration_source_and_role():
    assert len(ROWS) >= 30
    for measurement, simulated, ratio in ROWS:
        assert measurement.group in ("collective", "kernel")
        assert measurement.role in ("calibrate", "validate")
        assert measurement.what and measurement.config and measurement.unit
        assert measurement.source, measurement.what
        assert measurement.published > 0 and simulated > 0
        assert ratio == pytest.approx(simulated / measurement.published)
    names = [m.what for m, _, _ in ROWS]
    assert len(set(names)) == len(names)


def test_the_rows_a_constant_was_solved_from_come_back_within_one_percent():
    calibrated = [(m.what, ratio) for m, _, ratio in ROWS if m.role == "calibrate"]
    assert len(calibrated) >= 8
    assert all(abs(ratio - 1) < 0.01 for _, ratio in calibrated), calibrated


def test_every_row_out_of_tolerance_says_why():
    for measurement, _, ratio in ROWS:
        if not LOW <= ratio <= HIGH:
            assert len(measurement.note) > 40, measurement.what


def test_the_validation_rows_stay_as_close_as_the_course_says():
    # notebook 11 asserts the same bounds on the table it shows
    checked = [ratio for m, _, ratio in ROWS if m.role == "validate"]
    inside = sum(LOW <= r <= HIGH for r in checked)
    assert len(checked) >= 20
    assert statistics.median(abs(r - 1) for r in checked) < 0.15
    assert inside >= 0.75 * len(checked)


def test_a_rate_row_and_a_time_row_are_simulated_in_their_own_units():
    by_name = {m.what: (m, s) for m, s, _ in ROWS}
    ring, ring_busbw = by_name["all-reduce 16 GiB, 8 GPUs, ring"]
    assert ring.unit == "GB/s busbw" and 300 < ring_busbw < 450
    small, small_us = by_name["all-reduce 1 KiB, 8 GPUs, NVLS"]
    assert small.unit == "us" and 5 < small_us < 100
