"""Fixtures for the end-to-end suite.

Every test gets its own config dir (so its own store) and workspace. Hosts are
started through factories that remember them: after the test each host must
have exited cleanly on EOF and left no process behind, and when a test fails
its report carries each host's last frames and stderr.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import pytest

from .model_server import ModelServer
from .procs import host_env
from .rawclient import RawHost
from .sdkhost import SdkHost, spawn_sdk_host

DIAGNOSTICS = pytest.StashKey[list[Callable[[], str]]]()
NO_DIAGNOSTICS: list[Callable[[], str]] = []


class SdkHostFactory(Protocol):
    def __call__(
        self, cfg: Path | None = None, *extra_args: str,
        env_extra: dict[str, str] | None = None,
    ) -> AbstractAsyncContextManager[SdkHost]: ...


class RawHostFactory(Protocol):
    def __call__(
        self, cfg: Path | None = None, *extra_args: str,
        env_extra: dict[str, str] | None = None, config_flag: bool = True,
    ) -> RawHost: ...


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        registered: list[Callable[[], str]] = item.stash.get(DIAGNOSTICS, NO_DIAGNOSTICS)
        for n, diagnostics in enumerate(registered, 1):
            report.sections.append((f"zeroclaw host #{n}", diagnostics()))
    return report


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cfg"
    path.mkdir()
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A working directory for sessions, already canonical (symlinks resolved)."""
    path = tmp_path / "ws"
    path.mkdir()
    return Path(os.path.realpath(path))


def _register(request: pytest.FixtureRequest, diagnostics: Callable[[], str]) -> None:
    request.node.stash.setdefault(DIAGNOSTICS, []).append(diagnostics)


@pytest.fixture
def sdk_hosts(
    request: pytest.FixtureRequest, tmp_path: Path, config_dir: Path
) -> Iterator[SdkHostFactory]:
    """``async with sdk_hosts() as host:`` starts ``zeroclaw acp`` under the ACP SDK."""
    started: list[SdkHost] = []

    def factory(
        cfg: Path | None = None, *extra_args: str, env_extra: dict[str, str] | None = None
    ) -> AbstractAsyncContextManager[SdkHost]:
        stderr_path = tmp_path / f"host-{len(started) + 1}.stderr"

        def on_start(host: SdkHost) -> None:
            started.append(host)
            _register(request, host.diagnostics)

        return spawn_sdk_host(
            cfg or config_dir, stderr_path, *extra_args,
            env=host_env(env_extra), on_start=on_start,
        )

    yield factory
    problems = [p for host in started for p in host.problems]
    assert not problems, "\n".join(problems)


@pytest.fixture
async def host(sdk_hosts: SdkHostFactory) -> AsyncIterator[SdkHost]:
    """One initialized host on the test's config dir."""
    async with sdk_hosts() as running:
        await running.initialize()
        yield running


@pytest.fixture
def raw_hosts(
    request: pytest.FixtureRequest, tmp_path: Path, config_dir: Path
) -> Iterator[RawHostFactory]:
    """``raw_hosts()`` starts ``zeroclaw acp`` spoken to over raw pipes; closed after the test."""
    started: list[RawHost] = []

    def factory(
        cfg: Path | None = None, *extra_args: str, env_extra: dict[str, str] | None = None,
        config_flag: bool = True,
    ) -> RawHost:
        stderr_path = tmp_path / f"raw-host-{len(started) + 1}.stderr"
        flag_dir = (cfg or config_dir) if config_flag else None
        env = {"HOME": str(tmp_path)} if flag_dir is None else {}  # never the real ~/.zeroclaw
        env.update(env_extra or {})
        raw = RawHost(flag_dir, stderr_path, *extra_args, env=host_env(env))
        started.append(raw)
        _register(request, raw.diagnostics)
        return raw

    yield factory
    for raw in started:
        raw.close()
    problems = [p for raw in started for p in raw.problems]
    assert not problems, "\n".join(problems)


@pytest.fixture
def raw_host(raw_hosts: RawHostFactory) -> RawHost:
    """One raw host on the test's config dir, not yet initialized."""
    return raw_hosts()


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A local model API (OpenAI and Anthropic streaming formats) for provider tests."""
    server = ModelServer()
    yield server
    server.close()
