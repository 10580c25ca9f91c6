"""A worker's traceback shows the learner's lines from notebook cells, which
exist only in the kernel's linecache: with IPython 8's entries (no
modification time) and with IPython 7's, which Colab runs (a time stamp that
a worker's linecache.checkcache would drop, as no file is there to stat)."""
import linecache
import time

import pytest

import ddp_teach as dt

CELL = '''def fails_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 got an empty batch")
    return rank
'''


@pytest.mark.parametrize("ipython, mtime", [("8", None), ("7", time.time())],
                         ids=["ipython8", "ipython7"])
def test_a_cells_lines_reach_the_workers_traceback(ipython, mtime):
    name = f"/nonexistent/ipykernel_test/cell_from_ipython_{ipython}.py"
    linecache.cache[name] = (len(CELL), mtime, CELL.splitlines(True), name)
    namespace = {}
    exec(compile(CELL, name, "exec"), namespace)
    try:
        with pytest.raises(dt.WorkerError) as error:
            dt.run(namespace["fails_on_rank_one"], 2, backend="gloo")
    finally:
        linecache.cache.pop(name, None)
    assert 'raise ValueError("rank 1 got an empty batch")' in error.value.failures[1]
