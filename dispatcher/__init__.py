"""AppWrapper dispatcher: gang dispatch of wrapped Kubernetes workloads.

`__version__` is the installed distribution's version (setup.cfg `version`), read from the
package metadata so that one number is written in one place; a checkout imported without being
installed says `0+unknown`. It is read on first use: importlib.metadata costs a tenth of a
second at import, which `kubectl aw` (dispatcher/plugin) would pay on every command."""

from typing import Any

DISTRIBUTION = "appwrapper-dispatcher"


def __getattr__(name: str) -> Any:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version(DISTRIBUTION)
    except PackageNotFoundError:  # imported from a source tree that was never pip-installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
