"""``python -m cluster_preflight``: see cluster_preflight.cli; the process exits with main()'s code."""

import sys

from .cli import main
from .verdict import EXIT_INTERRUPTED

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # A Ctrl-C after the run it stopped was ended (cli hands it on), or before any run started.
        sys.exit(EXIT_INTERRUPTED)
