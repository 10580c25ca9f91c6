"""Run folders and log files are private to the learner, and a folder that
another local user prepared in the shared temporary directory is refused
rather than written through. The other user is simulated: a test TMPDIR
holds what they would have made first."""
import io
import os
import stat

import pytest

from ddp_teach.launcher import rundirs
from ddp_teach.launcher.output import OutputRouter


@pytest.fixture
def tmpdir_of_test(tmp_path, monkeypatch):
    """The system's temporary directory, as new_run_dir sees it."""
    monkeypatch.setattr(rundirs.tempfile, "tempdir", str(tmp_path))
    return tmp_path


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_folder_of_a_run_is_private_to_the_user(tmpdir_of_test):
    run_dir = rundirs.new_run_dir()
    kernel_dir = os.path.dirname(run_dir)
    user_dir = os.path.dirname(kernel_dir)
    assert user_dir == str(tmpdir_of_test / f"ddp_teach-{os.getuid()}")
    assert [mode(d) for d in (user_dir, kernel_dir, run_dir)] == [0o700] * 3


def test_a_folder_other_users_can_write_is_refused(tmpdir_of_test):
    planted = tmpdir_of_test / f"ddp_teach-{os.getuid()}" / f"kernel-{os.getpid()}"
    planted.mkdir(parents=True)
    victim = tmpdir_of_test / "victim.txt"
    victim.write_text("precious")
    for folder in (planted.parent, planted):
        folder.chmod(0o777)  # as another user would leave it, for us to use
    (planted / "rank0.log").symlink_to(victim)
    with pytest.raises(PermissionError, match="can be written by other users"):
        rundirs.new_run_dir()
    assert victim.read_text() == "precious"
    assert os.listdir(planted) == ["rank0.log"]


def test_a_folder_of_another_user_is_refused(tmpdir_of_test, monkeypatch):
    someone_else = os.getuid() + 1  # the folder's real owner is not them
    (tmpdir_of_test / f"ddp_teach-{someone_else}").mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: someone_else)
    with pytest.raises(PermissionError, match="belongs to another user"):
        rundirs.new_run_dir()


def test_a_symbolic_link_in_place_of_the_folder_is_refused(tmpdir_of_test):
    elsewhere = tmpdir_of_test / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmpdir_of_test / f"ddp_teach-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a folder"):
        rundirs.new_run_dir()
    assert os.listdir(elsewhere) == []


def test_the_users_own_folder_from_an_older_version_is_made_private(
        tmpdir_of_test):
    older = tmpdir_of_test / f"ddp_teach-{os.getuid()}"
    older.mkdir()
    older.chmod(0o755)  # what earlier versions made
    run_dir = rundirs.new_run_dir()
    assert run_dir.startswith(str(older))
    assert mode(older) == 0o700


def test_log_files_are_private_and_never_written_through_a_link(tmp_path):
    router = OutputRouter(1, str(tmp_path), io.StringIO(), io.StringIO())
    router.finish()
    assert mode(tmp_path / "rank0.log") == 0o600
    linked = tmp_path / "linked"
    linked.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (linked / "rank0.log").symlink_to(victim)
    with pytest.raises(FileExistsError):
        OutputRouter(1, str(linked), io.StringIO(), io.StringIO())
    assert victim.read_text() == "precious"
