"""`python -m radixkv.cli ...`: the `radixkv` command."""
import sys

from radixkv.cli import main

sys.exit(main())
