"""The broker's malloc settings (server/allocator.py): buffers of a few MiB come from the heap, where freed ones are
reused, instead of fresh kernel pages for each (a page fault every 4 KiB: docs/performance.md#replication)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Run in a fresh interpreter: mallopt changes the whole process, and a fresh one starts with glibc's defaults.
PROBE = """
import sys

def heap_bytes():
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[heap]"):
            low, high = line.split()[0].split("-")
            return int(high, 16) - int(low, 16)
    return 0

if sys.argv[1] == "tuned":
    from tierlog.server.allocator import keep_large_buffers_in_the_heap
    assert keep_large_buffers_in_the_heap()
before = heap_bytes()
buffer = bytearray(8 * 2**20)
print("heap" if heap_bytes() - before >= 8 * 2**20 else "mapped")
"""


def where_an_8_mib_buffer_lives(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc/self/maps")
def test_a_multi_mib_buffer_comes_from_the_heap_once_the_broker_has_tuned_malloc() -> None:
    assert where_an_8_mib_buffer_lives("default") == "mapped"  # glibc's default: its own mapping, unmapped on free
    assert where_an_8_mib_buffer_lives("tuned") == "heap"
