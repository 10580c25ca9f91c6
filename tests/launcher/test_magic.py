"""`%%ddp -n N`: the cell body on every rank, its last value back per rank."""
import pytest
from IPython.core.interactiveshell import InteractiveShell

import ddp_teach as dt


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ddp_teach")
    return ip


def test_last_expression_comes_back_from_every_rank(shell):
    shell.user_ns["base"] = 100  # a notebook variable the cell mentions
    result = shell.run_cell_magic(
        "ddp", "-n 3", "t = torch.tensor([float(rank)])\n"
                       "dist.all_reduce(t)\nbase + t.item() + world_size")
    assert result == [106.0, 106.0, 106.0]


def test_a_cell_without_a_final_expression_returns_none_per_rank(shell):
    assert shell.run_cell_magic("ddp", "-n 2", "x = rank") == [None, None]


def test_options_reach_the_launcher(shell):
    with pytest.raises(dt.WorkerTimeout):
        shell.run_cell_magic("ddp", "-n 2 --timeout 1", "import time\n"
                                                        "time.sleep(60)")


def test_bad_options_and_syntax_errors_are_reported_before_running(shell):
    with pytest.raises(ValueError, match="usage: %%ddp"):
        shell.run_cell_magic("ddp", "-n two", "rank")
    with pytest.raises(SyntaxError):
        shell.run_cell_magic("ddp", "-n 2", "def broken(:")


@pytest.mark.parametrize("line, wrong", [
    ("-n x", "argument -n/--world-size: invalid int value: 'x'"),
    ("-n 2 --colour", "unrecognized arguments: --colour"),
    ("--timeout", "argument --timeout: expected one argument")])
def test_a_bad_option_is_one_error_that_says_what_was_wrong(shell, capsys, line, wrong):
    """One message, with the usage once: none printed by argparse besides."""
    with pytest.raises(ValueError) as error:
        shell.run_cell_magic("ddp", line, "rank")
    printed = capsys.readouterr()
    assert str(error.value).startswith(f"%%ddp: {wrong}\nusage: %%ddp [-n WORLD_SIZE]")
    assert printed.out == printed.err == ""


def test_trace_option_gives_the_cell_a_timeline(shell):
    result = shell.run_cell_magic("ddp", "-n 2 --trace",
                                  "t = torch.ones(8)\ndist.all_reduce(t)\nrank")
    assert result == [0, 1]
    assert {e.name for e in result.timeline.events} == {"all_reduce"}
