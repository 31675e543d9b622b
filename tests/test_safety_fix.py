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


# -- an edit saved while fix runs, and hard-linked files rewritten in place (issue 31) -----------------

def _fixed(path):
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file

    result = fix_file(path, Settings(select=("TC202",)))
    assert result.changed
    return result


def test_an_edit_saved_while_fix_ran_is_kept_and_nothing_is_written(tmp_path):
    from tcaudit.fix.engine import write_fix
    from tcaudit.fix.textio import NotWritable

    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    result = _fixed(path)
    edited = BEFORE + "print('saved by the editor meanwhile')\n"
    path.write_text(edited)
    with pytest.raises(NotWritable, match="changed on disk while fix ran"):
        write_fix(result, path)
    assert path.read_text() == edited
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # no temporary file left


def test_an_unchanged_file_is_written(tmp_path):
    from tcaudit.fix.engine import write_fix

    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    write_fix(_fixed(path), path)
    assert path.read_text() == AFTER


def test_a_hard_linked_file_is_restored_when_the_in_place_write_fails(tmp_path, monkeypatch):
    from tcaudit.fix import textio
    from tcaudit.fix.engine import write_fix

    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    os.link(path, tmp_path / "alias.py")
    result = _fixed(path)
    real_fsync, calls = os.fsync, []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 2:  # the first syncs the backup, the second the new text
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(textio.os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        write_fix(result, path)
    assert path.read_text() == BEFORE and (tmp_path / "alias.py").read_text() == BEFORE
    assert not textio.backup_path(path).exists()


def test_a_backup_left_by_a_killed_fix_stops_the_next_one(tmp_path):
    from tcaudit.fix import textio

    path = tmp_path / "train.py"
    path.write_text(BEFORE + "half-written")
    os.link(path, tmp_path / "alias.py")
    textio.backup_path(path).write_text(BEFORE)
    code, _, err = apply(tmp_path, "train.py")
    assert code == 2
    assert "an interrupted fix left its backup .train.py.tcaudit-backup beside it" in err
    assert path.read_text() == BEFORE + "half-written"
    assert textio.backup_path(path).read_text() == BEFORE


def test_the_cli_reports_a_file_edited_meanwhile_and_fixes_the_others(tmp_path, monkeypatch):
    """Through the command: the first file is edited between its analysis and its write."""
    from tcaudit.fix import engine

    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text(BEFORE)
    second.write_text(BEFORE)
    real_fix_file = engine.fix_file

    def fix_then_edit(path, *args, **kwargs):
        result = real_fix_file(path, *args, **kwargs)
        if path.name == "a.py":
            path.write_text(BEFORE + "# the user's edit\n")
        return result

    monkeypatch.setattr(engine, "fix_file", fix_then_edit)
    from tcaudit.cli.main import main

    monkeypatch.chdir(tmp_path)
    code = main(["fix", ".", "--apply", "--isolated", "--select", "TC202"])
    assert code == 2
    assert first.read_text() == BEFORE + "# the user's edit\n"
    assert second.read_text() == AFTER
