"""Ports handed to local control-plane processes: outside the kernel's ephemeral range, never
the same for two callers, never one somebody listens on."""

from __future__ import annotations

import multiprocessing
import random
import socket
from pathlib import Path
from typing import Any

import pytest

from testenv import ports


@pytest.mark.parametrize(
    ("ephemeral", "want"),
    [
        pytest.param(range(32768, 61000), [range(10000, 32768), range(61000, 65536)], id="linux"),
        pytest.param(range(49152, 65536), [range(10000, 49152)], id="iana"),
        pytest.param(range(1024, 65536), [], id="everything-ephemeral"),
        pytest.param(range(5000, 20000), [range(20000, 65536)], id="low-range"),
    ],
)
def test_candidates_leave_out_the_ephemeral_range(ephemeral: range, want: list[range]) -> None:
    assert ports.candidate_ranges(ephemeral) == want


def test_ephemeral_range_read_from_the_kernel_file(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("32768\t60999\n")
    assert ports.ephemeral_range(path) == range(32768, 61000)
    assert ports.ephemeral_range(tmp_path / "missing") == range(49152, 65536)


def test_a_port_is_never_handed_out_twice_in_one_process() -> None:
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    ephemeral = ports.ephemeral_range()
    assert not [p for p in got if p in ephemeral]


def _take(count: int, queue: multiprocessing.Queue[list[int]], done: Any) -> None:
    queue.put([ports.free_port(rng=random.Random(7)) for _ in range(count)])
    done.wait(60)  # a claim lasts while its process runs: hold them until all have chosen


def test_processes_choosing_alike_never_get_the_same_port() -> None:
    # The same seed in every process: each tries the same ports in the same order, so only
    # the locks keep them apart.
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[list[int]] = context.Queue()
    done = context.Event()
    workers = [context.Process(target=_take, args=(50, queue, done)) for _ in range(4)]
    for worker in workers:
        worker.start()
    taken = [queue.get(timeout=60) for _ in workers]
    done.set()
    for worker in workers:
        worker.join(timeout=60)
    flat = [p for chunk in taken for p in chunk]
    assert len(flat) == 200
    assert len(set(flat)) == 200


def test_a_port_somebody_listens_on_is_skipped() -> None:
    first = ports.free_port(rng=random.Random(11))
    ports._release(first)  # unlocked again: only the listener below stands in the way
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", first))
        listener.listen()
        # The same choices again: the first candidate is the port that is now listened on.
        assert ports.free_port(rng=random.Random(11)) != first
