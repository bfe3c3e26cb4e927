"""How the daemon's C heap keeps memory it frees (glibc malloc; elsewhere nothing).

Runs once on the daemon's main thread, before anything else starts. A ``status``
answer with 10,000 sessions is a 2.3 MB line, and sending it allocates a few
buffers of that size (the encoded frame, the transport's copy of what the
socket did not take at once). By default glibc serves each from fresh memory
and gives it back when freed (mmap above a sliding threshold, or trimming the
heap top), so every call page-faults and zeroes megabytes again: two thirds of
the call's CPU time was the kernel's. Keeping freed buffers up to
:data:`KEEP_FREED_BYTES` in the heap lets the next call reuse them, at the cost
of that much memory held back per malloc arena. The arenas are capped at
:data:`MALLOC_ARENAS`: each thread that allocates (the loop, the store's writer,
zmq's I/O thread) would otherwise get an arena of its own, each keeping its own
freed memory (a 4 MB answer's turn end grew the daemon's peak by ~60 MiB with
them, ~44 MiB with two).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["KEEP_FREED_BYTES", "MALLOC_ARENAS", "keep_freed_buffers"]

log = logging.getLogger("zeroclaw.heap")

KEEP_FREED_BYTES = 32 * 1024 * 1024
_MMAP_ABOVE_BYTES = 16 * 1024 * 1024  # larger blocks still come from (and go back to) mmap
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def keep_freed_buffers() -> bool:
    """Have glibc keep freed memory for reuse; False where that cannot be set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    kept = bool(mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
                and mallopt(_M_MMAP_THRESHOLD, _MMAP_ABOVE_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))
    if not kept:
        log.debug("mallopt refused: freed buffers go back to the system")
    return kept
