"""``python -m cluster_preflight``: see cluster_preflight.cli; the process exits with main()'s code."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
