"""Worker output reaches the cell live, per rank, at the file-descriptor
level, and nothing printed before a crash is lost."""
import io
import os

import pytest

import ddp_teach as dt
from ddp_teach.launcher.output import GLOO_CONNECTED, OutputRouter


def test_python_prints_come_back_prefixed_with_their_rank(capsys):
    dt.run(lambda r, w: print(f"hello from {r}"), 3)
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == [f"[rank {r}] hello from {r}" for r in range(3)]


def test_file_descriptor_writes_and_c_printf_are_captured(capsys):
    def low_level(rank, world_size):
        import ctypes
        os.write(1, b"raw fd one\n")
        os.write(2, b"raw fd two\n")
        libc = ctypes.CDLL(None)
        libc.printf(b"from C printf\n")
        libc.fflush(None)

    dt.run(low_level, 1)
    shown = capsys.readouterr()
    assert "[rank 0] raw fd one" in shown.out
    assert "[rank 0] from C printf" in shown.out
    assert "[rank 0] raw fd two" in shown.err  # stderr stays stderr


def test_output_printed_before_a_crash_is_not_lost(capsys):
    def crash(rank, world_size):
        import ctypes
        ctypes.CDLL(None).printf(b"C line, never flushed by hand\n")
        print("a whole line")
        print("an unfinished line", end="")  # no flush: workers are unbuffered
        os._exit(9)

    with pytest.raises(dt.WorkerError, match="exited with code 9"):
        dt.run(crash, 1)
    out = capsys.readouterr().out
    assert "[rank 0] C line, never flushed by hand\n" in out
    assert "[rank 0] a whole line\n" in out
    assert "[rank 0] an unfinished line" in out


def test_every_rank_output_is_kept_in_a_log_file():
    result = dt.run(lambda r, w: print("logged", r), 2)
    for rank in range(2):
        with open(os.path.join(result.log_dir, f"rank{rank}.log")) as log:
            # the log keeps what torch 2.8-2.10's gloo prints at connection too
            assert GLOO_CONNECTED.sub("", log.read()).lstrip("\n") == f"logged {rank}\n"


def test_router_joins_lines_split_across_chunks_and_utf8_characters(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    router = OutputRouter(1, str(tmp_path), out, err)
    snowman = "☃".encode()
    router.feed(0, "out", b"par" + snowman[:1])
    assert out.getvalue() == ""  # nothing shown until the line is complete
    router.feed(0, "out", snowman[1:] + b"tial\nnext")
    router.close(0, "out")
    router.finish()
    assert out.getvalue() == "[rank 0] par☃tial\n[rank 0] next\n"


def test_router_stops_showing_at_the_cell_limit_but_logs_everything(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    router = OutputRouter(1, str(tmp_path), out, err, cell_limit=100)
    for _ in range(10):
        router.feed(0, "out", b"y" * 30 + b"\n")
    router.finish()
    assert len(out.getvalue()) <= 100
    assert "the cell shows only the first 100 bytes" in err.getvalue()
    assert os.path.getsize(tmp_path / "rank0.log") == 310


def test_each_kernel_keeps_its_own_run_folders(tmp_path, monkeypatch):
    from ddp_teach.launcher import rundirs
    monkeypatch.setattr(rundirs.tempfile, "tempdir", str(tmp_path))
    base = tmp_path / f"ddp_teach-{os.getuid()}"
    other_live = base / "kernel-1" / "run-x"   # pid 1 always exists
    gone = base / "kernel-999999999" / "run-y"  # no such process
    base.mkdir(mode=0o700)  # private whatever the umask, as new_run_dir asks
    other_live.mkdir(parents=True)
    gone.mkdir(parents=True)
    dirs = [rundirs.new_run_dir() for _ in range(rundirs.KEEP_RUN_DIRS + 5)]
    assert other_live.exists() and not gone.exists()
    kept = os.listdir(base / f"kernel-{os.getpid()}")
    assert len(kept) == rundirs.KEEP_RUN_DIRS
    assert os.path.basename(dirs[-1]) in kept


def test_cpp_logging_reaches_the_cell_and_import_time_env_is_honoured(capsys):
    from ddp_teach import launcher
    dt.run(lambda r, w: r, 2)
    quiet_server = launcher.current_fork_server().pid
    dt.run(lambda r, w: r, 2, env={"TORCH_CPP_LOG_LEVEL": "INFO"})
    assert launcher.current_fork_server().pid != quiet_server  # torch re-imported with it
    err = capsys.readouterr().err
    assert "[rank 0] [I" in err and "[c10d]" in err  # glog lines from C++
    dt.run(lambda r, w: r, 2)
    assert "[c10d]" not in capsys.readouterr().err  # back to the quiet server


def test_router_keeps_each_ranks_last_stderr_lines_past_the_cell_limit(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    router = OutputRouter(2, str(tmp_path), out, err, cell_limit=100)
    router.feed(1, "err", "".join(f"line {i}\n" for i in range(100)).encode())
    router.feed(1, "out", b"not stderr\n")
    router.feed(1, "err", b"no newline at the end")
    router.close(1, "err")
    router.finish()
    tail = router.last_stderr(1).splitlines()
    assert tail[-2:] == ["line 99", "no newline at the end"]
    assert "not stderr" not in tail and router.last_stderr(0) == ""
