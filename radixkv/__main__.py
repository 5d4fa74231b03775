"""`python -m radixkv ...`: the `radixkv` command (radixkv/cli/)."""
import sys

from .cli import main

sys.exit(main())
