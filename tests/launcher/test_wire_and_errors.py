"""Unit tests of the launcher's pieces that need no worker processes."""
import os

from ddp_teach.launcher import errors, wire
from ddp_teach.launcher.protocol import Failed


def test_message_buffer_returns_only_whole_messages():
    data = wire.encode({"a": 1}) + wire.encode([2, 3])
    buffer = wire.MessageBuffer()
    assert buffer.feed(data[:5]) == [] and buffer.partial
    assert buffer.feed(data[5:-1]) == [{"a": 1}]
    assert buffer.feed(data[-1:]) == [[2, 3]] and not buffer.partial


def test_messages_round_trip_through_a_pipe():
    r, w = os.pipe()
    wire.write_message(w, ("hello", 42))
    os.close(w)
    assert wire.read_message(r) == ("hello", 42)
    assert wire.read_message(r) is None  # end of file: the writer is gone
    os.close(r)


DUMP = '''Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000002 (most recent call first):
  File "/site/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/site/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/tmp/cell.py", line 7 in train
  File "{launcher}worker.py", line 92 in _run
  File "{launcher}worker.py", line 110 in main
  File "<string>", line 1 in <module>
'''.format(launcher=errors.LAUNCHER_DIR)


def test_parse_stack_keeps_the_main_thread_outermost_first_without_launcher():
    frames = errors.parse_stack(DUMP)
    assert [f[2] for f in frames] == ["train", "wrapper", "all_reduce"]
    assert frames[0] == ("/tmp/cell.py", 7, "train")


def test_collective_of_names_the_torch_distributed_call():
    assert errors.collective_of(errors.parse_stack(DUMP)) == "all_reduce"
    assert errors.collective_of([("/tmp/cell.py", 3, "train")]) is None


def test_failure_message_leads_with_the_first_rank_and_mentions_the_rest():
    failures = {1: Failed("ValueError", "bad\nsecond line",
                          "Traceback...\nValueError: bad"),
                0: Failed("RuntimeError", "peer closed",
                          'File "/x/torch/distributed/c10d.py"')}
    text = errors.failure_message(failures, [1, 0], stopped=[2], returned=[3])
    assert "rank 3 had already returned" not in text  # rank 1 was not in one
    text = errors.failure_message(failures, [0, 1], stopped=[2], returned=[3])
    assert text.startswith("rank 0 failed with RuntimeError: peer closed\n")
    assert "rank 3 had already returned while rank 0 was in a collective" in text
    assert "rank 2 was still running" in text
    text = errors.failure_message(failures, [1, 0], stopped=[2, 4], returned=[])
    assert text.startswith("rank 1 failed with ValueError: bad\n")
    assert "rank 0 failed too, later: RuntimeError: peer closed" in text
    assert "ranks 2, 4 were still running" in text


def test_failure_message_of_a_rank_that_died_shows_its_last_stderr_lines():
    died = Failed("WorkerDied", "the process was killed by signal SIGABRT",
                  last_stderr="terminate called after throwing\n  what(): boom")
    text = errors.failure_message({0: died}, [0], stopped=[1], returned=[])
    assert "\n\n\n" not in text  # no run of empty lines where a traceback is not
    assert "  what(): boom" in text.split("rank 0 wrote to stderr")[1]
    assert "rank 1 was still running" in text
    assert "what(): boom" in errors.failure_details(died)
