"""`python -m rollstream` is the `rollstream` command."""

import sys

from rollstream.cli import main

sys.exit(main())
