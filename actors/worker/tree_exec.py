"""Root of one process tree: ``python -I -S tree_exec.py PARENT_PID GRACE_SECS ARGV...``.

Started by :func:`actors.worker.process_tree.start` (never imported: a threaded worker
must not fork with ``preexec_fn``). This process asks for SIGTERM when the thread that
forked it ends (``PR_SET_PDEATHSIG``: its worker died, even by SIGKILL), exits at once
when ``PARENT_PID`` is already gone, marks itself a *child subreaper* (every orphan of
the tree, even one that called ``setsid``, is re-parented here instead of leaving the
tree), forks, and the child execs ``ARGV``. This process keeps none of the child's
descriptors open (its stdio becomes ``/dev/null``), so the child's pipes end with it.

When the child exits, every descendant left behind is killed (SIGKILL) and reaped, and
this process exits with the child's status (killed by a signal: by the same signal). On
SIGTERM it sends SIGTERM to its process group (the child and what did not leave it),
waits up to ``GRACE_SECS`` for the child, then ends everything the same way. SIGTERM
and SIGCHLD stay blocked and are taken with ``sigwaitinfo`` (no handler can run between
reaping the child and acting on it); orphans that exit meanwhile are reaped. Standard
library only; single-threaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


_TAKEN = {signal.SIGTERM, signal.SIGCHLD}  # blocked, and taken synchronously


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as listing:
            return [int(p) for p in listing.read().split()]
    except OSError:
        return []


def _end_leftovers() -> None:
    """Kill and reap every descendant re-parented here, until none is left."""
    while True:
        for child in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _wait_child(child: int, grace: float) -> int:
    """The child's wait status (leftovers that exit meanwhile are reaped). On SIGTERM
    the group is asked to end and the child gets ``grace`` seconds (then it goes with
    the leftovers, reported as killed by SIGTERM). A SIGTERM once the child was reaped
    changes nothing: its status stands."""
    deadline: float | None = None
    while True:
        status = _reap_until(child)
        if status is not None:
            return status
        if deadline is None:
            if signal.sigwaitinfo(_TAKEN).si_signo == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgrp(), signal.SIGTERM)  # stays pending here: blocked
                deadline = time.monotonic() + grace
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return int(signal.SIGTERM)
        signal.sigtimedwait({signal.SIGCHLD}, remaining)


def _reap_until(child: int) -> int | None:
    """Reap what has exited; the child's wait status once it is among them."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return int(signal.SIGKILL)  # no child at all: cannot happen before it is reaped
        if pid == 0:
            return None
        if pid == child:
            return status


def _exit_like(status: int) -> None:
    """Exit as the child did: with its code, or killed by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def main() -> None:
    parent, grace, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, _TAKEN)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)  # the worker is already gone: start nothing
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(2, b"process tree: cannot become a child subreaper\n")
        os._exit(126)
    child = os.fork()
    if child == 0:
        try:
            for ignored in (signal.SIGPIPE, signal.SIGXFSZ):  # as Python found them
                signal.signal(ignored, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _TAKEN)
            os.execv(argv[0], argv)
        except BaseException as exc:
            os.write(2, f"process tree: cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    status = _wait_child(child, grace)
    _end_leftovers()
    _exit_like(status)


if __name__ == "__main__":
    main()
