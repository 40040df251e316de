"""The broker's malloc settings: large buffers are recycled in the heap instead of mapped and unmapped each time.

A broker allocates buffers of up to a few MiB all the time: a produce batch is read, copied for in-place offset
stamping and written; a follower reads 1 MiB fetch answers. glibc serves an allocation above its mmap threshold
(128 KiB, raised on the fly to the largest chunk freed) with fresh pages from the kernel, and gives the heap's top
back once twice that is free, so such buffers keep coming back as new zeroed pages: a page fault every 4 KiB
(docs/performance.md#replication). A fixed threshold above the broker's routine buffers and a larger trim threshold
keep that memory in the heap for the next request.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Above the buffers a broker makes routinely (replica.fetch.response.max.bytes is 10 MiB); glibc allows up to 32 MiB.
MMAP_THRESHOLD_BYTES = 16 * 2**20
# Free memory the heap keeps at its top before giving it back to the kernel: a few such buffers.
TRIM_THRESHOLD_BYTES = 64 * 2**20


def keep_large_buffers_in_the_heap() -> bool:
    """Set glibc's mmap and trim thresholds for this process; False, with nothing changed, without glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): that allocator's own policy stays
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
