"""`make plugin`: `kubectl aw` as one file that needs only a Python 3.11+ interpreter.

    python -m dispatcher.plugin.bundle --version 0.1.0 --out dist

writes `dist/kubectl-aw`, a zipapp (`python -m zipapp`'s format: a `#!/usr/bin/env python3`
line, then a zip) holding the plugin's modules, the two it imports from the package
(`dispatcher/__init__.py`, `dispatcher/api/constants.py`) and PyYAML's pure-Python parser
(its C extension cannot load from a zip; its licence goes with it), each with a
hash-checked-never .pyc beside its source so nothing is compiled at start (another Python
version ignores those and compiles the sources); and `dist/kubectl_complete-aw`, the
script kubectl runs to complete `kubectl aw` (dispatcher/plugin/complete.py). Nothing of the
controller goes in: not kubernetes-asyncio, aiohttp, pydantic, nor the rest of the package.

Side effects: writes the two files (executable) and a temporary directory. Not part of what
the zipapp holds.
"""

from __future__ import annotations

import argparse
import py_compile
import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "dispatcher/__init__.py",
    "dispatcher/api/__init__.py",
    "dispatcher/api/constants.py",
    "dispatcher/plugin/__init__.py",
    "dispatcher/plugin/complete.py",
    "dispatcher/plugin/errors.py",
    "dispatcher/plugin/kubeconfig.py",
    "dispatcher/plugin/main.py",
    "dispatcher/plugin/proxy.py",
    "dispatcher/plugin/queuetables.py",
    "dispatcher/plugin/selector.py",
    "dispatcher/plugin/watch.py",
)
MAIN = """import sys

from dispatcher.plugin.main import main

sys.exit(main(version={version!r}))
"""
COMPLETE = """#!/bin/sh
# kubectl runs this to complete `kubectl aw ...` (kubectl 1.26+); it asks the zipapp beside it.
exec "$(dirname "$0")/kubectl-aw" __complete "$@"
"""


def build(out: Path, *, version: str) -> Path:
    """Write `out/kubectl-aw` and `out/kubectl_complete-aw`; return the zipapp's path."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kubectl-aw-") as staging:
        root = Path(staging)
        for name in MODULES:
            _stage(PACKAGE_ROOT / name, root, name)
        parser = Path(yaml.__file__).parent
        for source in sorted(parser.glob("*.py")):
            _stage(source, root, f"yaml/{source.name}")
        for licence in _licences(parser):
            shutil.copyfile(licence, root / "yaml" / f"PyYAML-{licence.name}")
        (root / "__main__.py").write_text(MAIN.format(version=version))
        target = out / "kubectl-aw"
        zipapp.create_archive(root, target, interpreter="/usr/bin/env python3")
    target.chmod(0o755)
    complete = out / "kubectl_complete-aw"
    complete.write_text(COMPLETE)
    complete.chmod(0o755)
    return target


def _stage(source: Path, root: Path, name: str) -> None:
    """`source` copied to `root/name`, its bytecode beside it (where zipimport looks)."""
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    py_compile.compile(
        str(target),
        cfile=str(target.with_suffix(".pyc")),
        dfile=name,
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )


def _licences(parser: Path) -> list[Path]:
    found: list[Path] = []
    for info in parser.parent.glob("[Pp][Yy][Yy][Aa][Mm][Ll]-*.dist-info"):
        found += [p for p in info.rglob("LICENSE*") if p.is_file()]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build kubectl-aw as a zipapp.")
    parser.add_argument("--version", required=True, help="the plugin's version to print")
    parser.add_argument("--out", type=Path, default=Path("dist"))
    args = parser.parse_args(argv)
    target = build(args.out, version=args.version)
    print(f"{target} ({target.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
