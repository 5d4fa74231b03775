"""`python -m radixkv ...`: the `radixkv` command (radixkv/cli.py)."""
import sys

from .cli import main

sys.exit(main())
