"""What a serving process tunes once it has started: Python's collector and the C allocator.

Both are process-wide and set once (`settle`), by the process that serves (`gateway serve` and
its workers); tests and tools that build an app in-process keep the defaults.
"""

from __future__ import annotations

import ctypes
import gc
import logging

log = logging.getLogger("gateway.process")

# Collections of the youngest generation every 700 allocations cost a server ~20 µs a request;
# 10,000 keeps cyclic garbage bounded at a fraction of that cost.
GC_THRESHOLD = (10_000, 10, 10)

# glibc's mallopt parameters (malloc.h) and the values set.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# Answers of up to a few MB (an embeddings answer of 16 x 1,536 floats is ~0.5 MB) are buffers
# that come and go with each request. By default glibc maps the larger ones afresh (or gives the
# heap's top back to the system when they are freed), so the next one faults its pages in and
# the kernel zeroes them: measured on the bench's float embeddings, 200-350 µs of system time an
# answer, against ~140 µs with these, and 20-30% more answers a second. Below 4 MB a buffer comes
# from the heap and its memory is reused; the heap keeps up to 64 MB free at its top.
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20


def settle() -> None:
    settle_gc()
    tune_allocator()


def settle_gc() -> None:
    """What start-up built lives as long as the process, so full collections need not scan it
    again (vLLM's server does the same)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def tune_allocator() -> bool:
    """The C allocator's thresholds for buffers (above); False where the C library has no
    mallopt (macOS) or refuses it (musl's does nothing), and keeps its own behaviour."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not done:
        log.info("the C library refused the allocator's thresholds: its defaults stay")
    return done
