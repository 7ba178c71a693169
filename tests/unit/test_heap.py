"""dpsub.training.heap: glibc keeps freed tensor memory (speed only; no number changes)."""

from __future__ import annotations

import sys

import pytest

from dpsub.training import heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_thresholds_are_set_and_can_be_turned_off(monkeypatch):
    calls = []

    class Libc:
        def mallopt(self, key, value):
            calls.append((key.value, value.value))
            return 1

    monkeypatch.setattr(heap.ctypes, "CDLL", lambda name: Libc())
    assert heap.keep_freed_memory() is True
    assert dict(calls) == {heap.M_MMAP_THRESHOLD: heap.MMAP_THRESHOLD,
                           heap.M_TRIM_THRESHOLD: heap.TRIM_THRESHOLD, heap.M_TOP_PAD: heap.TOP_PAD}  # fmt: skip
    monkeypatch.setenv("DPSUB_MALLOC", "default")
    calls.clear()
    assert heap.keep_freed_memory() is False and not calls


def test_real_glibc_accepts_the_values():
    """The values are within glibc's limits (a refused value makes mallopt return 0)."""
    if not sys.platform.startswith("linux"):
        assert heap.keep_freed_memory() is False
        return
    assert heap.keep_freed_memory() in (True, False)  # False only without glibc (musl)
    try:
        import ctypes

        _ = ctypes.CDLL("libc.so.6").gnu_get_libc_version
    except (OSError, AttributeError):
        return
    assert heap.keep_freed_memory() is True
