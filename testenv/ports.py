"""Loopback ports for the processes the local control planes start, chosen so that two
callers on one machine never get the same one.

Side effects: creates lock files in a shared directory and holds them open (locked) until
this process exits.

Asking the kernel for a free port (bind to port 0, read it, close) and handing it to a child
process races: between the close and the child's bind, the port is free for anyone, and the
kernel hands out the same range to every outgoing connection (the ephemeral range, often
32768-60999). Several control planes starting at once (tests, `make demo-multi`) then lose
the race now and again: `bind: address already in use`. Here a port is taken from outside
the ephemeral range, so no outgoing connection can be given it, and claimed with an
exclusive lock on a file named after it, so no other caller of this module (in this process
or another) picks it while the lock is held. A port some unrelated program listens on is
skipped by a test bind. What is left is a program outside this module binding the very port
in the moment before the child does: `LocalCluster` retries a component that fails so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

LOCK_DIR = Path(os.environ.get("APPWRAPPER_PORT_LOCKS", Path(tempfile.gettempdir()) / "aw-ports"))
LOWEST = 10000
"""Below this, ports are the well-known and registered ones of real services."""
TRIES = 500

_held: dict[int, int] = {}
"""Port -> the open, locked file descriptor that claims it (kept until the process ends)."""


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The ports the kernel gives outgoing connections (Linux; elsewhere the IANA range)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535
    return range(low, high + 1)


def candidate_ranges(ephemeral: range) -> list[range]:
    """The ports to choose from: from LOWEST up, without the ephemeral range."""
    ranges = [
        range(LOWEST, max(LOWEST, ephemeral.start)),
        range(max(LOWEST, ephemeral.stop), 65536),
    ]
    return [r for r in ranges if len(r) > 0]


def free_port(*, rng: random.Random | None = None) -> int:
    """A loopback TCP port that is free now and that no other caller will be given while
    this process runs. Raises OSError when none could be found."""
    choose = rng or random.SystemRandom()
    ranges = candidate_ranges(ephemeral_range())
    if not LOCK_DIR.exists():
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        # Shared by every user of the machine, like /tmp itself.
        with contextlib.suppress(OSError):
            LOCK_DIR.chmod(0o1777)
    for _ in range(TRIES):
        chosen = choose.choice(ranges)
        port = chosen.start + choose.randrange(len(chosen))
        if port in _held or not _claim(port):
            continue
        if _bindable(port):
            return port
        _release(port)
    raise OSError(errno.EADDRINUSE, f"no free port found in {TRIES} tries")


def _claim(port: int) -> bool:
    try:
        fd = os.open(LOCK_DIR / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # another user's lock file we may not open: theirs, then
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held[port] = fd
    return True


def _release(port: int) -> None:
    fd = _held.pop(port, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing drops the lock


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
