"""Ways to make a running host's session store unwritable (issue 4: fault injection).

Each is a context manager that undoes its fault on exit, also when the test
fails. They need no mount and work for any user, root included (root ignores
file modes, so ``chmod`` cannot do it):

* :func:`exclusive_lock`: another connection holds SQLite's write lock; the
  host's writer gets "database is locked" after its busy timeout (5 s).
* :func:`file_size_limit`: the disk is full for the host process: its
  ``RLIMIT_FSIZE`` soft limit becomes the WAL's current size, so no commit can
  append to the WAL (``write`` fails with EFBIG; Python ignores SIGXFSZ).
* :func:`full_disk_for_new_processes`: a host started inside it finds the disk
  full from its first write (file size limit 0, inherited); :func:`lift_file_size_limit`
  gives it room again later.
* :func:`immutable_files`: the store's files become read-only: ``chattr +i``,
  which on ext4 also stops writes through descriptors already open (EPERM).
  It needs CAP_LINUX_IMMUTABLE (often dropped in containers) and such a file
  system (tmpfs accepts the flag but still lets open descriptors write); call
  :func:`immutable_unsupported` first and skip when it gives a reason.

:func:`stored_user_turns` and :func:`assert_store_intact` check the store afterwards. Runs on the
test's main thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil

from ipc.events import TextItem

from .helpers import stored_session
from .procs import descendants

__all__ = [
    "UNWRITABLE_MESSAGE",
    "assert_store_intact",
    "exclusive_lock",
    "file_size_limit",
    "full_disk_for_new_processes",
    "immutable_files",
    "immutable_unsupported",
    "lift_file_size_limit",
    "store_path",
    "stored_user_turns",
    "wal_path",
]

#: What a client reads when a write hit a full or read-only disk: SQLite's
#: SQLITE_IOERR_WRITE (EFBIG or EPERM; only ENOSPC is its "database or disk is full").
UNWRITABLE_MESSAGE = ("store write failed: disk I/O error "
                      "(the disk may be full or read-only, or the file too large)")


def store_path(config_dir: Path) -> Path:
    """The store of a host run with ``--config-dir config_dir``."""
    return config_dir / "data" / "sessions" / "acp-sessions.db"


def wal_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + "-wal")


def assert_store_intact(db_path: Path) -> None:
    """SQLite finds nothing wrong in the store (its WAL included)."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()


def stored_user_turns(config_dir: Path, sid: str) -> list[str]:
    """Read by this process: the user text of each turn the store holds for ``sid``."""
    info, items = stored_session(config_dir, sid)
    assert info is not None, f"session {sid} is not in the store"
    user_texts = [i.text for i in items if isinstance(i, TextItem) and i.role == "user"]
    assert info.turn_count == len(user_texts), (info, items)
    return user_texts


@contextlib.contextmanager
def exclusive_lock(db_path: Path) -> Iterator[None]:
    """Hold SQLite's write lock on ``db_path`` (other writers get "database is locked")."""
    db = sqlite3.connect(db_path, timeout=10, isolation_level=None)
    try:
        db.execute("BEGIN EXCLUSIVE")
        yield
        db.execute("ROLLBACK")
    finally:
        db.close()


@contextlib.contextmanager
def file_size_limit(pid: int, db_path: Path) -> Iterator[None]:
    """No file of process ``pid`` may grow past the store's WAL as it is now.

    Until the WAL reaches its checkpoint size (1000 pages) SQLite only appends
    to it, so the next commit needs it to grow and fails. Only the soft limit
    is lowered; on exit it is restored on ``pid`` and on the children started
    meanwhile (they inherited it).
    """
    wal = wal_path(db_path)
    assert wal.exists(), f"{wal} does not exist: the host has not opened its store yet"
    limit = wal.stat().st_size
    host = psutil.Process(pid)
    soft, hard = host.rlimit(psutil.RLIMIT_FSIZE)
    host.rlimit(psutil.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        for proc in (host, *descendants(pid)):
            with contextlib.suppress(psutil.Error):
                if proc.rlimit(psutil.RLIMIT_FSIZE)[0] == limit:
                    proc.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))


@contextlib.contextmanager
def full_disk_for_new_processes() -> Iterator[None]:
    """Processes started inside inherit a file size limit of 0: for them the disk is
    full from the start (every write that grows a file fails with EFBIG).

    The limit is this process's own soft limit while inside, so keep the body to
    starting the process (no file writes of the test's own).
    """
    me = psutil.Process()
    soft, hard = me.rlimit(psutil.RLIMIT_FSIZE)
    me.rlimit(psutil.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        me.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))


def lift_file_size_limit(pid: int) -> None:
    """The disk has room again for ``pid`` and its children: their file size limit
    goes back to this process's own."""
    limits = psutil.Process().rlimit(psutil.RLIMIT_FSIZE)
    for proc in (psutil.Process(pid), *descendants(pid)):
        with contextlib.suppress(psutil.Error):
            proc.rlimit(psutil.RLIMIT_FSIZE, limits)


def _chattr(flag: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True,
                          timeout=10, check=False)


def immutable_unsupported(directory: Path) -> str | None:
    """Why :func:`immutable_files` cannot make files read-only in ``directory``, or None.

    Tries it on a scratch file: ``chattr +i`` must succeed, and a write through a
    descriptor opened before must then fail.
    """
    if shutil.which("chattr") is None:
        return "chattr (e2fsprogs) is not installed"
    probe = directory / "immutable-probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        done = _chattr("+i", probe)
        if done.returncode != 0:
            return (f"chattr +i failed ({done.stderr.strip()}): needs CAP_LINUX_IMMUTABLE "
                    "and a file system with the immutable attribute")
        try:
            os.pwrite(fd, b"x", 0)
        except PermissionError:
            return None
        return "this file system lets descriptors opened before write to immutable files"
    finally:
        _chattr("-i", probe)
        os.close(fd)
        probe.unlink()


@contextlib.contextmanager
def immutable_files(db_path: Path) -> Iterator[None]:
    """The store's file and its WAL are read-only, even for root, until exit."""
    files = [path for path in (db_path, wal_path(db_path)) if path.exists()]
    done = _chattr("+i", *files)
    try:
        assert done.returncode == 0, f"chattr +i failed: {done.stderr}"
        yield
    finally:
        _chattr("-i", *files)
