"""Keep freed tensor memory in the process instead of handing it back to the OS every step.

glibc's allocator returns a large freed block to the operating system (blocks above its
mmap threshold are unmapped; the top of the heap is trimmed above 128 KiB), and the next
step's tensors of the same size fault fresh zeroed pages in again. On one CPU thread that
page-fault work cost ResNet20 at batch 256 about 12% of a non-private step and 40% of a
ghost-clipped one (docs/speed.md, results/bench/): the ratio of ghost DP-SGD to non-private
training read 1.41x in a process of its own and 1.13x when other runs had warmed the heap.
:func:`keep_freed_memory` raises the thresholds (``mallopt``) so that the memory of one step
is reused by the next. It changes no number a run computes, only where memory comes from.
Off with ``DPSUB_MALLOC=default``; a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters
#: glibc's ceiling for the mmap threshold on 64-bit systems (larger values are refused)
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**31 - 1  # keep up to 2 GiB of free heap top
TOP_PAD = 64 * 2**20  # grow the heap 64 MiB at a time


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if it took effect."""
    if os.environ.get("DPSUB_MALLOC", "") == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): nothing to tune
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (M_TOP_PAD, TOP_PAD))  # fmt: skip
    return all(mallopt(ctypes.c_int(k), ctypes.c_int(v)) == 1 for k, v in settings)
