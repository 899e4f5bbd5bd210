"""/debug/memory: where live memory was allocated, when tracing is on; served only when
enabled (`debug_memory`)."""

from __future__ import annotations

import tracemalloc

import aiohttp
import pytest
from aiohttp import web

from dispatcher.health import memory_report, serve


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


async def get_status(runner: web.AppRunner, path: str) -> int:
    port = runner.addresses[0][1]
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status


@pytest.mark.parametrize(
    ("debug_memory", "want"),
    [pytest.param(False, 404, id="off-by-default"), pytest.param(True, 200, id="enabled")],
)
async def test_the_route_is_served_only_when_enabled(debug_memory: bool, want: int) -> None:
    settings = {"debug_memory": True} if debug_memory else {}
    runner = await serve(
        port=0, host="127.0.0.1", ready=lambda: True, metrics=lambda: "", **settings
    )
    try:
        assert await get_status(runner, "/debug/memory") == want
        assert await get_status(runner, "/healthz") == 200
    finally:
        await runner.cleanup()
