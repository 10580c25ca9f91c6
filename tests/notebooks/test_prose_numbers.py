"""Every number in a notebook's prose is in its code or is a cited fact.

The course's rule is that prose never types a number a cell does not
compute and print (and assert, where it is a claim). tools/prose_numbers.py
finds the prose numbers that none of the notebook's code cells holds,
without running anything (nbval runs the notebooks already): see its doc
for what it leaves out as "not a claim" and why a number found anywhere in
the code counts as traced.

A flagged number is fixed by printing it from a cell (and asserting it
where it is a claim: the assert puts it in the code), by rewording the
prose, or, for a fact from outside the course, by a FACTS entry that says
where it comes from; a FACTS entry no longer needed fails the test too.
`python tools/prose_numbers.py NN` shows a notebook's flags in context.
"""
import datetime
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import prose_numbers  # noqa: E402  (tools/ is not a package)

NOTEBOOKS = prose_numbers.notebooks()

# Facts from outside the course, as the prose writes them, with their source.
FACTS = {
    "00_welcome": {
        "16": "fp16 and bf16 are 16-bit formats; mixed-precision Adam keeps 16 "
              "bytes per parameter (Rajbhandari et al., ZeRO, SC'20, section 3.1)",
        "2.5": "a study time in the course map: the course's estimate for a newcomer "
               "who reads, runs and does the exercises (tools/notebook_stats.py gives "
               "each notebook's words, cells and exercises it rests on)",
    },
    "05_mixed_precision": {
        "32": "fp32 is IEEE 754 binary32, 32 bits",
        "15": "fp16's exponent bias, 01111 (IEEE 754 binary16)",
        "11111": "fp16's all-ones exponent field, kept for inf and NaN (IEEE 754 binary16)",
        "6e-8": "2^-24, fp16's smallest subnormal (IEEE 754 binary16), rounded",
        "12": "bytes per parameter of fp32 master weights and Adam's two moments "
              "(ZeRO, section 3.1: K = 12)",
        "7.5": "the 7.5-billion-parameter model of ZeRO's Table 1",
    },
    "06_sharding": {
        "80": "the calculator's reference device, 80 GB (dt.widgets.zero_calculator's "
              "device_gb default: an A100 80GB or an H100 SXM, NVIDIA's datasheets)",
    },
    "A4_sharding_at_scale": {
        "7.5": "the 7.5-billion-parameter model of ZeRO's Table 1, which notebook 06's "
               "GPT-like stack is sized after (Rajbhandari et al., ZeRO, SC'20)",
    },
    "07_launching_at_scale": {
        "30": "gloo's default timeout, 30 minutes (torch/distributed/constants.py, "
              "default_pg_timeout)",
    },
    "08_the_real_job": {
        "96": "the H100s of TorchTitan's published Llama 3.1 8B runs: 96 GB of HBM2e each, "
              "on Meta's Grand Teton hosts (pytorch/torchtitan, docs/performance.md)",
        "82.4": "the memory per GPU of TorchTitan's 8-GPU FSDP run of Llama 3.1 8B with "
                "selective activation checkpointing, Table 1 (pytorch/torchtitan, "
                "docs/performance.md)",
    },
    "09_beyond_data_parallel": {
        "1.5": "ZeRO-3 moves 1.5 times DDP's communication volume (ZeRO, section 7.2)",
    },
    "11_capstone": {
        "1024": "the largest world size the step-time exercise's checker tries "
                "(ddp_teach/exercises/nb11_capstone.py, CASES; test_the_checkable_facts_hold)",
    },
    "A3_trusting_the_simulator": {
        "70": "the T4's maximum power, 70 W (NVIDIA T4 Tensor Core GPU datasheet)",
    },
}

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_prose_number_is_in_the_code_or_a_cited_fact(path):
    facts = FACTS.get(path.stem, {})
    untraced = prose_numbers.untraced_numbers(path)
    flagged = [n for n in untraced if n.text not in facts]
    assert not flagged, (
        f"{path.name}: numbers in prose that no code cell holds (print them "
        "from a cell, assert them where they are claims, reword, or cite a "
        "fact in FACTS): " + "; ".join(
            f"{n.text}{' ' + n.unit if n.unit else ''} in cell {n.cell} "
            f"({n.context[:80]!r})" for n in flagged))
    unused = sorted(set(facts) - {n.text for n in untraced})
    assert not unused, f"{path.name}: FACTS {unused} are no longer used: remove them"


def test_the_tables_name_only_notebooks_that_exist():
    stems = {path.stem for path in NOTEBOOKS}
    assert set(FACTS) <= stems


def test_the_checkable_facts_hold():
    """The FACTS that the pinned torch or the course can confirm."""
    from ddp_teach.exercises.nb11_capstone import CASES  # notebook 11: "1 to 1024 GPUs"
    assert max(world_size for _, _, world_size, _ in CASES) == 1024
    from torch.distributed.constants import default_pg_timeout
    assert default_pg_timeout == datetime.timedelta(minutes=30)
    smallest_subnormal = 2.0 ** -24
    assert torch.tensor(smallest_subnormal, dtype=torch.float16).item() == smallest_subnormal
    assert torch.tensor(smallest_subnormal / 2, dtype=torch.float16).item() == 0
    assert f"{smallest_subnormal:.0e}" == "6e-08"
    assert torch.finfo(torch.float32).bits == 32


def flags(markdown: str, code: str = "") -> list[str]:
    """The numbers of `markdown` that `code` does not hold."""
    known = prose_numbers.code_values([code])
    return [n.text for n in prose_numbers.prose_numbers(markdown) if not n.found_in(known)]


def test_measured_values_typed_into_prose_are_flagged():
    assert flags("The next cell measures 10.6 us, not the 2 us we promised.") == ["10.6", "2"]
    assert flags("The outputs are x0.94 and ×0.89.") == ["0.94", "0.89"]
    assert flags("about 120 thousand parameters, 6,093 tok/s") == ["120", "6,093"]
    assert flags("each launch costs 5 µs") == ["5"]


def test_numbers_the_code_holds_are_not_flagged():
    code = "STEPS = 60\nCAP_MB = 25\nassert ratio > 0.45\nprint(6_093, 0.020, 1e-4)"
    assert flags("60 steps, 25 MiB buckets, 45% at least, 6,093 tokens, "
                 "20 ms, a gap below 1e-4", code) == []


def test_a_table_cell_of_notebooks_is_no_claim_but_other_cells_are():
    assert flags("| `11_capstone` | 12 layers | 1 h | 04, 11 |") == ["12"]


def test_format_widths_in_f_strings_are_not_values():
    assert flags("it took 12 ms", 'print(f"{seconds * 1e3:>12.3f}")') == ["12"]


@pytest.mark.parametrize("prose", [
    "## 12. The same step", "see section 13 and notebooks 00 to 07", "§11",
    "rank 0 and ranks 12 to 15", "torch 2.13", "torch before 2.13",
    "Python 3.11 or later", "in 2019", "`WORLD = 42`", "```\nx = 33.5\n```",
    "[the paper](https://arxiv.org/abs/2006.15704)", "at 127.0.0.1",
    "fp32, H100, ZeRO-3 and GPT-2 on AVX-512", "2 ranks", "PCIe 4 x16",
    "IEEE 754", "at step 25", "Study time: about 2.5 hours, with the exercises.",
    "**Study time:** about 3 hours", "## Further reading\n\n- VLDB 13, 2020, pp. 3005",
    "| `A3_x` | the map | 1 h | 11 |", "| `10_y` | bugs | 04, 11 |",
])
def test_what_is_no_claim_is_left_out(prose):
    known = prose_numbers.code_values([""])
    cells = [{"cell_type": "markdown", "source": prose}]
    found = [n.text for index, text in prose_numbers.prose_cells(cells)
             for n in prose_numbers.prose_numbers(text, index) if not n.found_in(known)]
    assert found == [], found


def test_a_unit_may_scale_the_number_as_the_code_writes_it():
    number, = prose_numbers.prose_numbers("a 25 MiB bucket")
    assert any(math.isclose(v, 25 * 2 ** 20) for v in number.values)
