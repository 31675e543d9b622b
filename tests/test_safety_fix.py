"""``fix --apply`` on symlinks, modes and owners: the real file is fixed once, in place of nothing
else; its mode and owner stay; a file that must not be written is a per-file error (exit 2 at the
end, the other files still fixed); a symlink out of the project root is followed only when asked."""

from __future__ import annotations

import os
import stat

import pytest

from conftest import run_cli

BEFORE = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
AFTER = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'


def apply(cwd, *args):
    return run_cli("fix", *args, "--apply", "--isolated", "--select", "TC202", cwd=cwd)


def test_a_symlink_is_written_through_once_and_stays_a_symlink(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text(BEFORE)
    os.symlink("real/train.py", tmp_path / "link.py")
    code, _, err = apply(tmp_path, ".")
    assert code == 0, err
    assert os.path.islink(tmp_path / "link.py")
    assert (tmp_path / "real" / "train.py").read_text() == AFTER
    assert err.count("fixed ") == 1, err


def test_a_symlink_named_alone_fixes_its_target(tmp_path):
    (tmp_path / "real.py").write_text(BEFORE)
    os.symlink("real.py", tmp_path / "link.py")
    code, _, err = apply(tmp_path, "link.py")
    assert code == 0, err
    assert os.path.islink(tmp_path / "link.py") and (tmp_path / "real.py").read_text() == AFTER


def test_mode_is_kept(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    os.chmod(path, 0o751)
    assert apply(tmp_path, ".")[0] == 0
    assert path.read_text() == AFTER and stat.S_IMODE(os.stat(path).st_mode) == 0o751


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_owner_is_kept(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    os.chown(path, 4321, 4321)
    assert apply(tmp_path, ".")[0] == 0
    assert path.read_text() == AFTER and (os.stat(path).st_uid, os.stat(path).st_gid) == (4321, 4321)


def test_a_hard_link_stays_one_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    os.link(path, tmp_path / "alias.txt")
    assert apply(tmp_path, "train.py")[0] == 0
    assert (tmp_path / "alias.txt").read_text() == AFTER


def test_a_read_only_file_is_refused_and_the_others_are_fixed(tmp_path):
    locked, other = tmp_path / "a_locked.py", tmp_path / "b_other.py"
    locked.write_text(BEFORE)
    other.write_text(BEFORE)
    os.chmod(locked, 0o444)
    code, _, err = apply(tmp_path, ".")
    assert code == 2
    assert locked.read_text() == BEFORE and stat.S_IMODE(os.stat(locked).st_mode) == 0o444
    assert other.read_text() == AFTER
    assert "a_locked.py: not fixed: the file is read-only (mode 0444)" in err


def test_a_symlink_out_of_the_project_is_followed_only_when_asked(tmp_path):
    outside = tmp_path / "outside"
    project = tmp_path / "project"
    outside.mkdir()
    project.mkdir()
    (outside / "shared.py").write_text(BEFORE)
    os.symlink(outside / "shared.py", project / "shared.py")
    (project / "own.py").write_text(BEFORE)
    code, _, err = apply(project, ".")
    assert code == 0, err
    assert (outside / "shared.py").read_text() == BEFORE and (project / "own.py").read_text() == AFTER
    assert "shared.py: not fixed: it is a symlink to" in err and "--follow-external-symlinks" in err
    code, _, err = apply(project, ".", "--follow-external-symlinks")
    assert code == 0, err
    assert (outside / "shared.py").read_text() == AFTER and os.path.islink(project / "shared.py")
