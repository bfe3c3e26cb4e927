"""Run a command under Landlock: ``python -I -S landlock_exec.py SPEC_FILE``.

Started by the ``shell`` tool (never imported by it: a threaded worker must not
restrict itself, and ``preexec_fn`` is unsafe there). This process marks itself a
child subreaper and forks; the child drops every capability from its bounding set,
sets ``no_new_privs``, applies the ruleset of ``SPEC_FILE`` (JSON ``{"abi": N,
"rules": [[path, rights], ...], "argv": [...], "deny_unix_sockets": bool}``, built by
:func:`actors.worker.tools.sandbox.confined_argv`), with ``deny_unix_sockets`` a seccomp
filter that refuses new ``AF_UNIX`` sockets and io_uring (Landlock does not cover
``connect`` to a socket's path, so the host's sockets are out of reach only this way;
``socketpair`` stays allowed), and execs ``argv``. When it exits, the
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
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_EACCES, _AF_UNIX = 13, 1
#: (audit arch, socket, io_uring_setup) by machine; the x32 ABI's numbers are refused.
_SYSCALLS = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}

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


def _deny_unix_sockets() -> None:
    """A seccomp filter: ``socket(AF_UNIX, ...)`` and ``io_uring_setup`` fail with EACCES
    (as does any syscall of another ABI on this machine); everything else is allowed."""
    machine = os.uname().machine
    if machine not in _SYSCALLS:
        raise OSError(0, f"no seccomp filter for {machine}")
    arch, socket_nr, uring_nr = _SYSCALLS[machine]
    deny, allow = _SECCOMP_RET_ERRNO | _EACCES, _SECCOMP_RET_ALLOW
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny),  # another ABI: refused
        (ld, 0, 0, 0), (jge, 4, 0, 0x40000000),  # x32 numbers: refused
        (jeq, 1, 0, socket_nr), (jeq, 2, 3, uring_nr),
        (ld, 0, 0, 16), (jeq, 0, 1, _AF_UNIX),  # socket's family (low 32 bits)
        (ret, 0, 0, deny), (ret, 0, 0, allow),
    ]
    filters = b"".join(struct.pack("=HBBI", *op) for op in program)
    buffer = ctypes.create_string_buffer(filters, len(filters))
    prog = struct.pack("@HP", len(program), ctypes.addressof(buffer))
    prog_buffer = ctypes.create_string_buffer(prog, len(prog))
    _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, prog_buffer, 0, 0), "seccomp")


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
    if spec.get("deny_unix_sockets"):
        _deny_unix_sockets()


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
