"""/debug/memory: where live memory was allocated, when tracing is on."""

from __future__ import annotations

import tracemalloc

from dispatcher.health import memory_report


def test_says_how_to_turn_tracing_on_when_it_is_off() -> None:
    assert not tracemalloc.is_tracing()
    assert "PYTHONTRACEMALLOC=1" in memory_report()


def test_lists_the_biggest_allocation_sites_first() -> None:
    tracemalloc.start()
    try:
        held = [bytearray(1024) for _ in range(2000)]  # ~2 MiB from this line
        report = memory_report(top=5).splitlines()
    finally:
        tracemalloc.stop()
    assert report[0].startswith("traced ")
    assert "test_memory_report.py" in report[1]
    assert len(report) <= 6
    assert len(held) == 2000
