"""This checkout, copied to a machine over SFTP: the tracked files of the working tree.

Which files: ``git ls-files`` here (tracked files, as they are in the working tree now,
uncommitted edits included; untracked files, ``.venv`` and ``results/`` are not copied),
so the far side needs no git and no network access to a repository. A file is sent only
when its size or modification time there differs from here, and its mode (setup.sh is
executable) and time are set after, so a second ``astral remote setup`` sends nothing: it
is idempotent like setup.sh itself. Files deleted here are left there (the far side's
checkout may hold results and a ``.venv``; nothing there is removed by a copy).
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import paramiko

from topologies.errors import EnvironmentProblem


@dataclass
class Copied:
    """What one copy did."""

    files: int = 0  # tracked files considered
    sent: int = 0  # of them sent (new or changed)
    sent_bytes: int = 0


def tracked_files(repo: Path) -> list[str]:
    """The checkout's tracked files that exist in the working tree (POSIX relative paths)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except FileNotFoundError:
        raise EnvironmentProblem("'git' is not installed: it lists the files to copy") from None
    except subprocess.CalledProcessError as err:
        said = err.stderr.decode(errors="replace").strip()
        raise EnvironmentProblem(f"{repo} is not a git checkout: {said}") from None
    names = [name.decode() for name in listed.split(b"\0") if name]
    return [name for name in names if (repo / name).is_file() and not (repo / name).is_symlink()]


def remote_stat(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPAttributes | None:
    try:
        return sftp.stat(path)
    except FileNotFoundError:
        return None


def make_dirs(sftp: paramiko.SFTPClient, path: PurePosixPath, made: set[PurePosixPath]) -> None:
    """``mkdir -p`` over SFTP, remembering what exists."""
    missing = []
    for parent in (path, *path.parents):
        if parent in made or str(parent) in ("", ".", "/"):
            break
        attributes = remote_stat(sftp, str(parent))
        if attributes is not None:
            if not stat.S_ISDIR(attributes.st_mode or 0):
                raise NotADirectoryError(f"{parent} exists there and is not a directory")
            made.add(parent)
            break
        missing.append(parent)
    for directory in reversed(missing):
        sftp.mkdir(str(directory))
        made.add(directory)


def push_tree(sftp: paramiko.SFTPClient, repo: Path, target: str, files: list[str]) -> Copied:
    """Copy ``files`` (relative to ``repo``) under ``target`` there, skipping unchanged ones."""
    copied = Copied(files=len(files))
    made: set[PurePosixPath] = set()
    root = PurePosixPath(target)
    make_dirs(sftp, root, made)
    for name in files:
        local = repo / name
        there = root / name
        info = local.stat()
        mtime = int(info.st_mtime)
        make_dirs(sftp, there.parent, made)
        attributes = remote_stat(sftp, str(there))
        if (
            attributes is not None
            and attributes.st_size == info.st_size
            and attributes.st_mtime == mtime
        ):
            continue
        sftp.put(str(local), str(there), confirm=True)
        sftp.chmod(str(there), stat.S_IMODE(info.st_mode))
        sftp.utime(str(there), (mtime, mtime))
        copied.sent += 1
        copied.sent_bytes += info.st_size
    return copied


def fetch_tree(sftp: paramiko.SFTPClient, source: str, target: Path) -> int:
    """Copy the directory ``source`` there into ``target`` here, recursively; the number
    of files copied. Files already here with the same size and time are skipped, so a
    second fetch of the same bundle copies nothing."""
    target.mkdir(parents=True, exist_ok=True)
    count = 0
    for entry in sftp.listdir_attr(source):
        mode = entry.st_mode or 0
        there = f"{source}/{entry.filename}"
        here = target / entry.filename
        if stat.S_ISDIR(mode):
            count += fetch_tree(sftp, there, here)
        elif stat.S_ISREG(mode):
            if here.is_file():
                mine = here.stat()
                if mine.st_size == entry.st_size and int(mine.st_mtime) == entry.st_mtime:
                    continue
            sftp.get(there, str(here))
            if entry.st_mtime is not None:
                os.utime(here, (entry.st_mtime, entry.st_mtime))
            count += 1
    return count
