"""`python -m dispatcher` is the `appwrapper-dispatcher` command."""

import sys

from dispatcher.cli import main

sys.exit(main())
