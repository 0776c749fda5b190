"""``python -m cluster_preflight``: see cluster_preflight.cli.main; the process exits with main()'s code."""

import sys

from .cli.main import main
from .verdict.value import EXIT_INTERRUPTED

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # A Ctrl-C after the run it stopped was ended (cli hands it on), or before any run started.
        sys.exit(EXIT_INTERRUPTED)
