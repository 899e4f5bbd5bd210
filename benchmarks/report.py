"""Writing a benchmark's results: the figures, the machine they came from, and when.

Side effects: writes one JSON file (its directories created).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def save(result: dict[str, Any], out: Path) -> None:
    result["machine"] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
