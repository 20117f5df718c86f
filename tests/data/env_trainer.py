"""A trainer script for `rollstream up --trainer`: prints what it was handed, exits with the
status given as its first argument."""

import os
import sys

for name in ("ROLLSTREAM_RUN", "ROLLSTREAM_CONFIG"):
    print(f"{name}={os.environ.get(name)}")
print(f"url handed: {bool(os.environ.get('ROLLSTREAM_REDIS_URL'))}")
sys.exit(int(sys.argv[1]))
