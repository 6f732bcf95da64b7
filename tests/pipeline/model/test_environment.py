"""The process's memory between batches: what the C heap freed goes back to the system."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.model.environment import release_freed_memory, status_mib


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident size from Linux's /proc")
def test_memory_a_batch_freed_goes_back_to_the_system():
    """glibc keeps the blocks a program frees for its next allocations: after a batch, a worker held
    its working memory until the next one, ~200 MiB in `bench/serving_memory.py`. The decoder gives
    it back after each batch (and the engine after loading)."""
    if not release_freed_memory():
        pytest.skip("this C library has no malloc_trim")
    blocks = [bytearray(64 * 1024) for _ in range(3200)]  # 200 MiB in blocks the heap serves (no mmap)
    last = bytearray(64 * 1024)  # allocated after them: the heap's top cannot shrink past it on its own
    del blocks
    held = status_mib("VmRSS")
    assert release_freed_memory()
    assert held - status_mib("VmRSS") > 100
    assert len(last) == 64 * 1024
