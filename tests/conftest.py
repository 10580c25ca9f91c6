"""Shared checks: after every test, no worker process may be left behind."""
import psutil
import pytest

from ddp_teach import launcher


def leftover_processes() -> list[psutil.Process]:
    """Descendants of this test process other than the fork server itself."""
    server = launcher.current_fork_server()
    server_pid = server.pid if server else None
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid != server_pid]


@pytest.fixture(autouse=True)
def no_process_left_behind():
    yield
    left = leftover_processes()
    assert not left, f"processes left behind: {[(p.pid, p.status()) for p in left]}"


@pytest.fixture
def verdict(capsys):
    """Run an exercise check as a learner would: (passed, what it printed)."""
    from ddp_teach import exercises

    def check(name, fn):
        passed = exercises.check(name, fn)
        return passed, capsys.readouterr().out
    return check
