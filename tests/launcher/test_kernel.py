"""The launcher used the way a learner uses it: from a real Jupyter kernel."""
import time

import nbformat
import psutil
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient

CELLS = [
    "import ddp_teach as dt, torch, torch.distributed as dist",
    "offset = 7",
    "def work(rank, world_size):\n"
    "    t = torch.tensor([rank + offset])\n"
    "    dist.all_reduce(t)\n"
    "    print('rank says', rank)\n"
    "    return t.item()",
    "result = dt.run(work, 2)\nassert result == [15, 15], result",
    "assert dt.run(lambda r, w: r * offset, 2) == [0, 7]",
    "%load_ext ddp_teach",
    "%%ddp -n 2\nx = torch.tensor([float(rank)])\ndist.all_reduce(x)\nx.item() + offset",
    "assert _ == [8.0, 8.0], _",
    "def bad(rank, world_size):\n    raise ValueError('cell boom')\n\ndt.run(bad, 2)",
    "%%ddp -n 2\nif rank == 1:\n    raise KeyError('from the ddp cell')",
    "dt.memory.plot_zero_memory(7.5e9)  # no %matplotlib inline needed",
]


def test_a_notebook_runs_cell_defined_functions_on_workers():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    NotebookClient(nb, kernel_name="python3", timeout=120,
                   allow_errors=True).execute()
    outputs = [cell.outputs for cell in nb.cells]
    errors = {i: o for i, outs in enumerate(outputs) for o in outs
              if o.output_type == "error"}
    assert sorted(errors) == [8, 9], f"unexpected errors: {errors}"
    printed = "".join(o.get("text", "") for o in outputs[3])
    assert "[rank 0] rank says 0" in printed and "[rank 1] rank says 1" in printed
    boom = "\n".join(errors[8].traceback)
    assert errors[8].ename == "WorkerError"
    assert "raise ValueError('cell boom')" in boom  # the cell's own source line
    assert "image/png" in outputs[10][0]["data"]  # a figure shows as a picture
    ddp_cell = "\n".join(errors[9].traceback)
    assert "rank 1 failed with KeyError" in ddp_cell
    assert "raise KeyError('from the ddp cell')" in ddp_cell


@pytest.fixture
def kernel():
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    yield manager, client
    client.stop_channels()
    if manager.is_alive():
        manager.shutdown_kernel(now=True)


def execute(client, code, timeout=60):
    """Run code in the kernel; return (reply content, text printed)."""
    printed = []
    reply = client.execute_interactive(
        code, timeout=timeout,
        output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
    return reply["content"], "".join(printed)


def test_interrupting_the_kernel_stops_the_workers_and_the_kernel_survives(kernel):
    manager, client = kernel
    execute(client, "import ddp_teach as dt, time, psutil\n"
                    "from ddp_teach import launcher\n"
                    "dt.run(lambda r, w: r, 2)")
    # stop_on_error=False: else ipykernel aborts a request that arrives just
    # after the interrupted one's reply (a race: the next check saw "aborted")
    msg_id = client.execute("dt.run(lambda r, w: time.sleep(600), 4, timeout=120)",
                            stop_on_error=False)
    time.sleep(3)
    started = time.monotonic()
    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - started < 5
    _, left = execute(client, "print([p.pid for p in psutil.Process()"
                              ".children(recursive=True)"
                              " if p.pid != launcher.current_fork_server().pid])")
    assert left.strip() == "[]"
    content, printed = execute(client, "print(dt.run(lambda r, w: r + 1, 2))")
    assert content["status"] == "ok" and printed.strip() == "[1, 2]"


def test_shutting_down_the_kernel_takes_the_fork_server_with_it(kernel):
    manager, client = kernel
    _, printed = execute(client, "import ddp_teach as dt\nfrom ddp_teach import "
                                 "launcher\ndt.run(lambda r, w: r, 2)\n"
                                 "print(launcher.current_fork_server().pid)")
    server = psutil.Process(int(printed.strip()))
    manager.shutdown_kernel(now=True)  # a kernel restart does the same
    server.wait(timeout=10)
    assert not server.is_running()
