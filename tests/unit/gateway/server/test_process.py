"""gateway.server.process: the allocator's thresholds, seen from where a buffer lands in memory.

Each case runs in a fresh interpreter: the thresholds are process-wide, and glibc's dynamic
threshold depends on what the process freed before.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.server import process

ROOT = Path(__file__).resolve().parents[4]

# Prints whether a fresh 1 MB buffer lies inside the heap ([heap] in /proc/self/maps), after
# tuning or not.
WHERE = """
import ctypes, sys
from gateway.server import process
tuned = sys.argv[1] == "tuned" and process.tune_allocator()
buffer = bytearray(1 << 20)
at = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        print("tuned" if tuned else "default", "heap" if start <= at < end else "mapped")
        break
else:
    print("tuned" if tuned else "default", "mapped")
"""


def where(mode: str) -> str:
    cmd = [sys.executable, "-c", WHERE, mode]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_a_buffer_of_an_answer_comes_from_the_heap_once_tuned() -> None:
    assert where("default") == "default mapped"  # glibc maps it afresh by default
    assert where("tuned") == "tuned heap"  # reused from the heap, its pages already in


def test_settle_freezes_what_start_up_built_and_raises_the_collectors_threshold() -> None:
    threshold = gc.get_threshold()
    try:
        process.settle_gc()
        assert gc.get_threshold() == process.GC_THRESHOLD
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
