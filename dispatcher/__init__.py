"""AppWrapper dispatcher: gang dispatch of wrapped Kubernetes workloads.

`__version__` is the installed distribution's version (setup.cfg `version`), read from the
package metadata so that one number is written in one place; a checkout imported without being
installed says `0+unknown`."""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "appwrapper-dispatcher"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # imported from a source tree that was never pip-installed
    __version__ = "0+unknown"
