"""Run a command under Landlock: ``python -I -S landlock_exec.py SPEC_FILE``.

Started by the ``shell`` tool (never imported by it: a threaded worker must not
restrict itself, and ``preexec_fn`` is unsafe there). This process marks itself a
child subreaper and forks; the child drops every capability from its bounding set,
sets ``no_new_privs``, applies the ruleset of ``SPEC_FILE`` (JSON ``{"abi": N,
"rules": [[path, rights], ...], "argv": [...]}``, built by
:func:`actors.worker.tools.sandbox.landlock_rules`) and execs ``argv``. When it exits, the
parent kills every descendant left behind (they were re-parented to it) and exits
with the child's status. Any failure to confine is fatal: the command never runs
unconfined. Standard library only; single-threaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import stat
import struct
import sys

_ADD_RULE, _RESTRICT_SELF, _CREATE_RULESET = 445, 446, 444
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_SET_CHILD_SUBREAPER = 38, 24, 36
_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2
_ABI1_ALL = (1 << 13) - 1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
    return result


def _handled(abi: int) -> int:
    rights = _ABI1_ALL
    for version, bit in ((2, 13), (3, 14), (5, 15)):
        if abi >= version:
            rights |= 1 << bit
    return rights


def _create_ruleset(abi: int) -> int:
    if abi >= 6:  # handled_access_fs, handled_access_net, scoped
        attr = struct.pack("=QQQ", _handled(abi), 0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    else:
        attr = struct.pack("=Q", _handled(abi))
    buffer = ctypes.create_string_buffer(attr, len(attr))
    return _check(_libc.syscall(_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), 0),
                  "landlock_create_ruleset")


def _add_rule(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone since the rules were built: nothing to allow
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            return  # swapped for a link since the rules were built: allow nothing through it
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        attr = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
        _check(_libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, attr, 0),
               f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def _confine(spec: dict) -> None:
    """In the child: no capabilities, no new privileges, then the ruleset."""
    for capability in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() not in (
                22, 1):  # EINVAL: no such capability; EPERM: not privileged (nothing to drop)
            _check(-1, "drop capabilities")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    ruleset = _create_ruleset(int(spec["abi"]))
    for path, rights in spec["rules"]:
        _add_rule(ruleset, path, int(rights & _handled(int(spec["abi"]))))
    _check(_libc.syscall(_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(p) for p in listing.read().split()]
    except OSError:
        return []


def _end_leftovers() -> None:
    """Kill and reap every descendant re-parented to this subreaper, until none is left."""
    while True:
        for child in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


class _Stopped(Exception):
    """SIGTERM: the caller stops the command (timeout, cancelled turn)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as spec_file:
        spec = json.load(spec_file)
    os.unlink(sys.argv[1])  # the command's tmp holds it: gone before the command starts
    argv = spec["argv"]
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "child subreaper")
    signal.signal(signal.SIGTERM, _stop)
    child = os.fork()
    if child == 0:
        try:
            _confine(spec)
            os.execv(argv[0], argv)
        except BaseException as exc:  # never run the command unconfined
            os.write(2, f"sandbox: cannot confine the command: {exc}\n".encode())
        os._exit(126)
    try:
        _, status = os.waitpid(child, 0)
    except _Stopped:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        status = 15  # as if killed by SIGTERM; the child goes with the leftovers
    _end_leftovers()
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
