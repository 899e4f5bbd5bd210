"""The image's dependency lock (requirements/image.txt) is whole, and the release is one number.

The Dockerfile installs exactly the lock, every line pinned and hash-checked (`pip install
--require-hashes`), then the package with `--no-deps`. So a runtime dependency of setup.cfg
missing from the lock, or a locked version its specifier refuses, or a module the runtime
imports from a distribution the lock does not name, would only show when the image runs: these
tests make it show here. The version is written once (setup.cfg); the package, the image tag
and the CHANGELOG must agree with it."""

from __future__ import annotations

import ast
import configparser
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from setuptools import find_packages

import dispatcher
from tests.unit.test_runtime_imports import PACKAGE_DIR, left_out, module_name

ROOT = PACKAGE_DIR.parent
LOCK = ROOT / "requirements" / "image.txt"
AGAIN = "regenerate requirements/image.txt with the pip-compile command at its top"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def runtime_requirements() -> list[Requirement]:
    text = setup_cfg()["options"]["install_requires"]
    return [Requirement(line) for line in text.splitlines() if line.strip()]


def read_lock(text: str) -> dict[str, tuple[str, int]]:
    """Each pinned distribution: its version and how many hashes allow it."""
    pins: dict[str, tuple[str, int]] = {}
    current = ""
    for line in text.splitlines():
        if match := PIN.match(line):
            current = canonicalize_name(match.group(1))
            pins[current] = (match.group(2), 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        elif line.strip() and not line.lstrip().startswith("#"):
            current = ""
            if not line.startswith("    "):
                raise AssertionError(f"not a pin, hash or comment: {line!r}")
    return pins


def lock() -> dict[str, tuple[str, int]]:
    return read_lock(LOCK.read_text())


def test_the_lock_reader_sees_pins_and_their_hashes() -> None:
    text = (
        "# a comment\n"
        "aiohttp==3.14.5 \\\n"
        "    --hash=sha256:aa \\\n"
        "    --hash=sha256:bb\n"
        "    # via appwrapper-dispatcher (setup.cfg)\n"
        "PyYAML==6.0.4\n"
    )
    assert read_lock(text) == {"aiohttp": ("3.14.5", 2), "pyyaml": ("6.0.4", 0)}


def test_every_line_of_the_lock_is_an_exact_version_with_hashes() -> None:
    pins = lock()
    assert len(pins) >= len(runtime_requirements())
    assert {name: hashes for name, (_, hashes) in pins.items() if hashes == 0} == {}
    assert "--find-links" not in LOCK.read_text()  # a path of one machine, not the image's


def test_the_lock_names_every_runtime_dependency_of_setup_cfg_at_an_allowed_version() -> None:
    pins = lock()
    wrong = {
        str(req): pins.get(canonicalize_name(req.name), ("missing", 0))[0]
        for req in runtime_requirements()
        if canonicalize_name(req.name) not in pins
        or not req.specifier.contains(pins[canonicalize_name(req.name)][0], prereleases=True)
    }
    assert wrong == {}, AGAIN


def test_the_lock_holds_every_dependency_of_what_it_locks() -> None:
    # pip --require-hashes refuses to install a dependency the file does not name, so the lock
    # must be closed; read from the installed distributions' metadata (this interpreter is the
    # image's Python on Linux, so markers evaluate as there). Only where the installed version
    # is the locked one: `make venv` takes the newest each dependency allows, whose own
    # dependencies may differ from the locked version's, and the lock is judged on its own.
    pins = lock()
    missing: set[str] = set()
    seen: set[str] = set()
    todo = [canonicalize_name(req.name) for req in runtime_requirements()]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            if name in pins and version(name) != pins[name][0]:
                continue  # another version installed: its requirements say nothing of the lock
            reqs = [Requirement(text) for text in requires(name) or []]
        except PackageNotFoundError:
            missing.add(f"{name} (not installed here: make venv)")
            continue
        for req in reqs:
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                dep = canonicalize_name(req.name)
                if dep not in pins:
                    missing.add(f"{dep} (needed by {name})")
                todo.append(dep)
    assert missing == set(), AGAIN


def third_party_imports() -> dict[str, str]:
    """Top-level modules outside the standard library and the package that runtime modules
    import, each with one module that imports it."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = module_name(path)
        if left_out(module):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in ("dispatcher", "__future__"):
                    found.setdefault(top, module)
    return found


def test_every_module_the_runtime_imports_comes_from_a_locked_distribution() -> None:
    imports = third_party_imports()
    assert "aiohttp" in imports  # the scan sees what is there
    pins = lock()
    owners = packages_distributions()
    unlocked = {
        f"{top} (imported by {module})": owners.get(top, ["no installed distribution"])
        for top, module in imports.items()
        if not any(canonicalize_name(dist) in pins for dist in owners.get(top, []))
    }
    assert unlocked == {}, "add the distribution to setup.cfg install_requires, then " + AGAIN


def test_the_dockerfile_installs_the_lock_and_leaves_testing_and_the_demo_out() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes --only-binary :all: -r /tmp/image.txt" in dockerfile
    assert "COPY requirements/image.txt /tmp/image.txt" in dockerfile
    assert "pip install --no-cache-dir --no-deps /tmp/wheels/*.whl" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    # Everything is left out but what is let back in: the test kit (testenv/) never is.
    assert ignored[ignored.index("*") :][:1] == ["*"]
    assert not [line for line in ignored if line.startswith("!testenv")]
    assert "!dispatcher" in ignored
    assert "!requirements/image.txt" in ignored


def test_the_wheel_leaves_the_test_kit_and_the_demo_out() -> None:
    """setup.cfg's package list, as setuptools finds it: `pip wheel .` (and so the image's
    wheel stage) builds exactly these; the demo lives in the test kit."""
    found = setup_cfg()["options.packages.find"]
    packages = find_packages(str(ROOT), include=found["include"].split())
    assert "dispatcher" in packages
    assert "dispatcher.controller" in packages
    assert [p for p in packages if left_out(p)] == []
    assert not (PACKAGE_DIR / "demo.py").exists()
    assert (ROOT / "testenv" / "demo.py").exists()


def test_one_version_for_the_package_the_image_and_the_changelog() -> None:
    version = setup_cfg()["metadata"]["version"]
    assert dispatcher.__version__ == version  # installed metadata: make venv after a change
    makefile = (ROOT / "Makefile").read_text()
    assert "IMAGE ?= appwrapper-dispatcher:$(VERSION)" in makefile
    assert re.search(r"^VERSION \?= .*setup\.cfg", makefile, re.MULTILINE)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d[^\]]*)\] - \d{4}-\d{2}-\d{2}$", changelog, re.MULTILINE)
    assert releases[:1] == [version]
