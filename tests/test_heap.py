"""The daemon's malloc setting: it must take where glibc runs, and be harmless."""

from __future__ import annotations

import platform

import pytest

from supervisor.ops.heap import keep_freed_buffers


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_glibc_keeps_freed_buffers() -> None:
    assert keep_freed_buffers() is True
    buffers = [bytearray(3 * 1024 * 1024) for _ in range(3)]  # served and freed as before
    assert sum(map(len, buffers)) == 9 * 1024 * 1024
