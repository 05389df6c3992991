"""`python -m gateway`: the command line (gateway.server.cli)."""

import sys

from gateway.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
