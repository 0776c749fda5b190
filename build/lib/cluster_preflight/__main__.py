"""``python -m cluster_preflight``: see cluster_preflight.cli.main; the process exits with main()'s code."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
