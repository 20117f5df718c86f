"""`python -m rollstream.cli` is the `rollstream` command too (as when the CLI was one module)."""

import sys

from rollstream.cli import main

sys.exit(main())
