"""`python -m rollstream` is the `rollstream` command."""

import sys

from rollstream.entry import main

sys.exit(main())
