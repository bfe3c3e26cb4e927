"""How a stdio MCP server of a session is started: its command line and environment.

Built on the session actor's thread (:func:`stdio_launch`), used on the MCP loop
thread by the SDK's ``stdio_client``. The server runs

- as a process tree of its own (:mod:`actors.worker.tree_exec`, the launcher every
  session process uses: what the server starts ends with it, and it ends when its
  worker dies);
- inside the session's sandbox, as the shell tool's commands do
  (:mod:`actors.worker.tools.sandbox`: writes only beneath the session's roots and a
  private tmp, the forbidden and host paths masked); without a sandbox it runs only
  where the shell may run unconfined (``[autonomy] allow_unsandboxed_shell``, never
  for a gateway tenant), else it is refused with the shell's reason;
- in a clean environment: the shell's inherited variables (PATH, HOME, locale, …),
  the agent's ``env``, then the server's own ``env`` entries. Nothing else of the
  worker's environment (API keys, tenant tokens) reaches it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from actors.worker.mcp.specs import McpServerSpec
from actors.worker.tools import PathPolicy, ShellTool, ToolError
from actors.worker.tools.paths import PathDenied
from actors.worker.tools.sandbox import confined_argv
from actors.worker.tools.shell import command_environment

__all__ = ["Launch", "LaunchRefused", "stdio_launch"]

_TREE_LAUNCHER = Path(__file__).resolve().parents[1] / "tree_exec.py"
#: What the launcher gives the server after SIGTERM before it kills the tree.
STOP_GRACE_SECS = 1.0


class LaunchRefused(Exception):
    """The server cannot be started here; the message says why."""


@dataclass(frozen=True, slots=True)
class Launch:
    """``argv`` (launcher, sandbox, command), its ``env`` and ``cwd``; ``private_tmp``
    (Landlock's private tmp) is removed by :meth:`cleanup`. ``backend`` confines it."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    backend: str
    private_tmp: str = ""
    server_env: dict[str, str] = field(default_factory=dict)

    def cleanup(self) -> None:
        if self.private_tmp:
            shutil.rmtree(self.private_tmp, ignore_errors=True)


def stdio_launch(spec: McpServerSpec, paths: PathPolicy, agent_env: dict[str, str],
                 shell: ShellTool | None = None) -> Launch:
    """The launch of ``spec`` for a session with ``paths``; :class:`LaunchRefused`."""
    label = f"MCP server {spec.name!r}"
    environment = command_environment(agent_env)
    environment.update(dict(spec.env))
    command = _resolve(spec.command, environment.get("PATH", os.defpath), label)
    try:
        sandbox = (shell or ShellTool()).confinement(paths)
    except ToolError as exc:
        raise LaunchRefused(f"{label} refused: {exc}".replace("shell refused: ", "")) from None
    private_tmp = tempfile.mkdtemp(prefix="zeroclaw-mcp-") if sandbox.backend == "landlock" \
        else ""
    try:
        confinement = confined_argv(sandbox, paths, [command, *spec.args],
                                    Path(private_tmp or "/tmp"))
    except (PathDenied, ToolError) as exc:
        if private_tmp:
            shutil.rmtree(private_tmp, ignore_errors=True)
        raise LaunchRefused(f"{label} refused: {exc}") from None
    launcher = (sys.executable, "-I", "-S", str(_TREE_LAUNCHER), str(os.getpid()),
                f"{STOP_GRACE_SECS:g}")
    return Launch((*launcher, *confinement.argv), {**environment, **confinement.env},
                  str(paths.cwd), sandbox.backend, private_tmp, dict(spec.env))


def _resolve(command: str, path: str, label: str) -> str:
    """``command`` as an absolute path (looked up on the server's PATH)."""
    found = shutil.which(command, path=path) if not os.path.isabs(command) else command
    if found is None or not os.access(found, os.X_OK):
        raise LaunchRefused(f"{label} could not start: command {command!r} not found "
                            "(or not executable)")
    return os.path.abspath(found)
