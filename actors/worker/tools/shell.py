"""The ``shell`` tool: ``/bin/sh -c COMMAND`` in the session cwd.

Runs on the session actor's thread. The command runs as a process tree of its own
(:mod:`actors.worker.process_tree`) so that a timeout, a cancelled turn, or the end
of the call kills it and anything it started in the background, even what called
``setsid``; output (stdout and stderr merged) is capped.

The command does not inherit the host's environment, which may hold API keys
and tokens that would then stream to the client and into the store: it gets
only :data:`INHERITED_VARIABLES` (and the locale's ``LC_*`` categories) from
the worker's environment, plus the agent's configured ``env``.

The command runs confined by the OS (:mod:`actors.worker.tools.sandbox`): it writes only
beneath the session's roots and a private temporary directory, cannot read the
forbidden paths, and leaves nothing running. Without a working sandbox the tool
refuses to run unless ``[autonomy] allow_unsandboxed_shell`` is set.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from actors.worker import process_tree
from actors.worker.sandbox import SandboxInfo, worker_sandbox_settings
from actors.worker.tools.base import Tool, ToolEnv, ToolError, ToolResult, require_str
from actors.worker.tools.paths import PathDenied, PathPolicy
from actors.worker.tools.sandbox import Confined, confined

__all__ = ["INHERITED_VARIABLES", "ShellTool", "command_environment"]

#: The host's variables a command sees; nothing else of the host's environment is passed.
INHERITED_VARIABLES = frozenset(
    {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ"})
#: The POSIX and glibc locale categories (``LC_ALL``, ``LC_CTYPE``, …), passed as well.
_LOCALE_CATEGORIES = frozenset({
    "LC_ALL", "LC_ADDRESS", "LC_COLLATE", "LC_CTYPE", "LC_IDENTIFICATION", "LC_MEASUREMENT",
    "LC_MESSAGES", "LC_MONETARY", "LC_NAME", "LC_NUMERIC", "LC_PAPER", "LC_TELEPHONE",
    "LC_TIME"})
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_POLL_SECS = 0.05
_READ_SIZE = 65536


@dataclass(slots=True)
class _Collected:
    output: bytearray
    total: int = 0
    stopped_by: str = ""  # "", "cancelled" or "timeout"


class ShellTool(Tool):
    """Run a shell command; arguments ``command`` and optional ``timeout`` (seconds)."""

    name: ClassVar[str] = "shell"
    kind: ClassVar[str] = "execute"
    mutating: ClassVar[bool] = True

    def __init__(self, *, default_timeout: float = 60.0, max_timeout: float = 600.0,
                 max_output: int = 64 * 1024, sandbox: SandboxInfo | None = None,
                 allow_unsandboxed: bool | None = None) -> None:
        """``sandbox`` and ``allow_unsandboxed`` default to what the host told this process
        (:func:`actors.worker.sandbox.worker_sandbox_settings`), read at the first call."""
        self.default_timeout = default_timeout
        self.max_timeout = max_timeout
        self.max_output = max_output
        self._sandbox = sandbox
        self._allow_unsandboxed = allow_unsandboxed

    def title(self, args: dict[str, Any]) -> str:
        command = args.get("command")
        return f"shell: {command}" if isinstance(command, str) else "shell"

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        command = require_str(args, "command")
        timeout = self._timeout(args)
        try:
            env.paths.check_command(command)
        except PathDenied as exc:
            raise ToolError(str(exc)) from None
        sandbox = self.confinement(env.paths)
        if env.cancelled.is_set():
            raise ToolError("cancelled before the command started")
        with _confined_or_refused(sandbox, env.paths, command) as confinement:
            proc = process_tree.start(
                confinement.argv,
                cwd=env.paths.cwd,
                env={**command_environment(env.agent_env), **confinement.env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            try:
                collected = self._collect(proc, env, time.monotonic() + timeout)
            finally:
                exit_code = process_tree.end(proc)  # all it started ends with it
                assert proc.stdout is not None
                proc.stdout.close()
        return self._result(collected, exit_code, timeout, sandbox.backend)

    def unavailable(self, tenant: bool = False) -> str | None:
        """The refusal when no sandbox works and running unconfined is not allowed
        (never for a gateway tenant's session, whatever the switch says)."""
        sandbox = self._sandbox_settings()
        if sandbox.confines:
            return None
        if tenant:
            return ("shell refused: no OS sandbox is available to confine commands "
                    f"({sandbox.reason}), and a gateway tenant's commands never run unconfined")
        if self._allow_unsandboxed:
            return None
        return ("shell refused: no OS sandbox is available to confine commands "
                f"({sandbox.reason}). Install bubblewrap (bwrap) or use a kernel with "
                "Landlock, or set [autonomy] allow_unsandboxed_shell = true to run commands "
                "unconfined.")

    def _sandbox_settings(self) -> SandboxInfo:
        """The sandbox to run in; what the host told this process fills what was not given."""
        if self._sandbox is None or self._allow_unsandboxed is None:
            sandbox, allowed = worker_sandbox_settings()
            self._sandbox = self._sandbox or sandbox
            if self._allow_unsandboxed is None:
                self._allow_unsandboxed = allowed
        return self._sandbox

    def confinement(self, paths: PathPolicy) -> SandboxInfo:
        """The sandbox a command of the session with ``paths`` runs in (also for another
        runner of commands: a hosted agent's terminals); ToolError when there is no
        sandbox and running unconfined is not allowed."""
        refusal = self.unavailable(paths.tenant)
        if refusal is not None:
            raise ToolError(refusal)
        return self._sandbox_settings()

    def _timeout(self, args: dict[str, Any]) -> float:
        value = args.get("timeout", self.default_timeout)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ToolError("argument 'timeout' must be a positive number of seconds")
        return min(float(value), self.max_timeout)

    def _collect(self, proc: subprocess.Popen[bytes], env: ToolEnv, deadline: float) -> _Collected:
        """Read output until the shell exits and its pipe is drained, or cancel/timeout."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        collected = _Collected(bytearray())
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            eof = False
            while not eof:
                remaining = _time_left(env, deadline, collected)
                if remaining is None:
                    break
                exited = process_tree.has_exited(proc)
                if selector.select(0 if exited else min(_POLL_SECS, remaining)):
                    eof = not self._read_into(fd, collected)
                elif exited:
                    break  # the shell is gone; background children keep the pipe open
        if eof:  # its output ended: its exit, not a SIGTERM from us, says how it went
            _wait_for_exit(proc, env, deadline, collected)
        return collected

    def _read_into(self, fd: int, collected: _Collected) -> bool:
        chunk = os.read(fd, _READ_SIZE)
        if not chunk:
            return False
        collected.total += len(chunk)
        room = self.max_output - len(collected.output)
        if room > 0:
            collected.output += chunk[:room]
        return True

    def _result(self, collected: _Collected, exit_code: int, timeout: float,
                sandbox: str) -> ToolResult:
        output = collected.output.decode("utf-8", errors="replace")
        truncated = collected.total > len(collected.output)
        if truncated:
            output += f"\n[output truncated: {collected.total} bytes, showing {self.max_output}]"
        if collected.stopped_by == "cancelled":
            raise ToolError(f"cancelled: the command was killed\n{output}".rstrip())
        if collected.stopped_by == "timeout":
            message = f"timed out after {timeout:g}s: the command was killed\n{output}"
            raise ToolError(message.rstrip())
        raw = {"exit_code": exit_code, "output": output, "truncated": truncated,
               "sandbox": sandbox}
        text = output if exit_code == 0 else f"{output}\n[exit code {exit_code}]".lstrip("\n")
        return ToolResult(text=text, raw_output=raw, ok=exit_code == 0)


def command_environment(
    agent_env: Mapping[str, str], host_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A command's whole environment: the allowed host variables, then the agent's ``env``
    (which wins). ``PATH`` falls back to the system default when the host has none."""
    host_env = os.environ if host_env is None else host_env
    allowed = INHERITED_VARIABLES | _LOCALE_CATEGORIES
    environment = {name: value for name, value in host_env.items() if name in allowed}
    environment.setdefault("PATH", os.defpath)
    for name, value in agent_env.items():
        if isinstance(value, str) and _VARIABLE_NAME.fullmatch(name) and "\x00" not in value:
            environment[name] = value
    return environment


@contextlib.contextmanager
def _confined_or_refused(sandbox: SandboxInfo, paths: PathPolicy,
                         command: str) -> Iterator[Confined]:
    """:func:`confined`, its refusal (PathDenied) as the call's ToolError."""
    with contextlib.ExitStack() as stack:
        try:
            confinement = stack.enter_context(confined(sandbox, paths, command))
        except PathDenied as exc:
            raise ToolError(f"shell refused: {exc}") from None
        yield confinement


def _wait_for_exit(proc: subprocess.Popen[bytes], env: ToolEnv, deadline: float,
                   collected: _Collected) -> None:
    """After the end of its output, wait (woken by its pidfd) for the launcher to exit
    by itself, so the command's own exit status is what is reported; a command that
    closed its output and runs on is stopped at its timeout or by a cancel."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # already reaped, or no pidfds here: end() reports what it can
        return
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ)
            while not process_tree.has_exited(proc):
                remaining = _time_left(env, deadline, collected)
                if remaining is None:
                    return
                selector.select(min(_POLL_SECS, remaining))
    finally:
        os.close(pidfd)


def _time_left(env: ToolEnv, deadline: float, collected: _Collected) -> float | None:
    """Seconds until the command's timeout; None once it is cancelled or timed out
    (``collected`` then says which)."""
    if env.cancelled.is_set():
        collected.stopped_by = "cancelled"
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        collected.stopped_by = "timeout"
        return None
    return remaining
