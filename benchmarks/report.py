"""Writing a benchmark's results: the figures, the machine they came from, and when; and
where a benchmark keeps its cluster's and dispatcher's logs.

Side effects: writes one JSON file (its directories created); makes the log directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any


def workdir(stack: contextlib.ExitStack, given: Path | None, prefix: str) -> Path:
    """`--workdir` made and resolved (the logs are kept), else a temporary directory that
    `stack` removes."""
    if given:
        given.mkdir(parents=True, exist_ok=True)
        return given.resolve()
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))


def save(result: dict[str, Any], out: Path) -> None:
    result["machine"] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
