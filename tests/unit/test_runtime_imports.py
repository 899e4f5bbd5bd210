"""The runtime never imports what the image leaves out.

The image (Dockerfile, .dockerignore) and the wheel (setup.cfg) ship the package without
`testenv` (the test kit and the demo): it needs the local control plane's binaries
and is for tests, the demo and the benchmarks only. A runtime module that imported it
would start on a laptop and fail in the cluster, so every runtime module is imported here in
a fresh interpreter in which it cannot be imported (a meta path hook, installed by a
`sitecustomize` before anything else runs), and the command is run there as the image runs
it; an import inside a function, which importing the module does not reach, is caught by
reading each module's source."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dispatcher

PACKAGE_DIR = Path(dispatcher.__file__).parent
LEFT_OUT = ("testenv",)
"""Modules the image does not contain (with everything under them)."""

HOOK = f"""
import importlib.abc
import sys

LEFT_OUT = {LEFT_OUT!r}


class LeftOutOfTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in LEFT_OUT or name.startswith(tuple(m + "." for m in LEFT_OUT)):
            raise ModuleNotFoundError(f"{{name}} is not in the image", name=name)
        return None


sys.meta_path.insert(0, LeftOutOfTheImage())
"""


def left_out(module: str) -> bool:
    return module in LEFT_OUT or module.startswith(tuple(m + "." for m in LEFT_OUT))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runtime_modules() -> list[str]:
    """Every module of the package the image holds. `dispatcher.__main__` is left to the
    `python -m dispatcher` run below: importing it runs the command."""
    names = (module_name(path) for path in sorted(PACKAGE_DIR.rglob("*.py")))
    return [name for name in names if not left_out(name) and name != "dispatcher.__main__"]


def imported_names(path: Path, module: str) -> list[str]:
    """Absolute names of every module `path` imports, wherever in it the import stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


@pytest.fixture(scope="module")
def image_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of an interpreter in which the left-out modules cannot be imported."""
    hook_dir = tmp_path_factory.mktemp("image-hook")
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH")]))
    return env


def run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_hook_keeps_the_left_out_modules_from_being_imported(
    image_env: dict[str, str],
) -> None:
    # Without this, the tests below could pass with a hook that never ran.
    for module in LEFT_OUT:
        result = run(image_env, sys.executable, "-c", f"import {module}")
        assert result.returncode == 1, result.stderr
        assert f"ModuleNotFoundError: {module} is not in the image" in result.stderr


def test_every_runtime_module_imports_without_the_left_out_ones(
    image_env: dict[str, str],
) -> None:
    modules = runtime_modules()
    assert "dispatcher.app" in modules  # what `run` imports once the arguments are read
    assert "testenv.fakekube" not in modules
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"assert not [m for m in sys.modules if m.startswith({LEFT_OUT!r})]\n"
        "print(len(sys.modules))\n"
    )
    result = run(image_env, sys.executable, "-c", script)
    assert result.returncode == 0, result.stderr


def test_no_runtime_module_imports_the_left_out_ones_anywhere_in_its_source() -> None:
    offenders = [
        f"{module} imports {name}"
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if not left_out(module := module_name(path))
        for name in imported_names(path, module)
        if left_out(name)
    ]
    assert offenders == []


def test_imports_read_from_source_resolve_relative_names(tmp_path: Path) -> None:
    # The check above is only as good as this resolution.
    source = tmp_path / "x.py"
    source.write_text(
        "from testenv import fakekube\nfrom . import api\ndef later():\n    import testenv.demo\n"
    )
    names = imported_names(source, "dispatcher.kube.x")
    assert names == [
        "testenv",
        "testenv.fakekube",
        "dispatcher.kube",
        "dispatcher.kube.api",
        "testenv.demo",
    ]
    assert [name for name in names if left_out(name)] == [
        "testenv",
        "testenv.fakekube",
        "testenv.demo",
    ]
    assert module_name(PACKAGE_DIR / "kube" / "__init__.py") == "dispatcher.kube"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["{script}", "--help"], id="appwrapper-dispatcher --help"),
        pytest.param(["{script}", "run", "--help"], id="appwrapper-dispatcher run --help"),
        pytest.param(["{python}", "-m", "dispatcher", "--help"], id="python -m dispatcher --help"),
    ],
)
def test_the_command_runs_without_the_left_out_modules(
    image_env: dict[str, str], argv: list[str]
) -> None:
    script = Path(sys.executable).with_name("appwrapper-dispatcher")
    assert script.exists(), "the console script is installed with the package (make venv)"
    command = [a.format(script=script, python=sys.executable) for a in argv]
    result = run(image_env, *command)
    assert result.returncode == 0, result.stderr
    assert "usage: appwrapper-dispatcher" in result.stdout


def test_version_is_the_installed_distributions(image_env: dict[str, str]) -> None:
    script = Path(sys.executable).with_name("appwrapper-dispatcher")
    result = run(image_env, str(script), "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"appwrapper-dispatcher {dispatcher.__version__}\n"
    assert dispatcher.__version__ != "0+unknown"
