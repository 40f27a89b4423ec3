"""``python -m lbtestbed.cli``: the same as ``lbt``."""

import sys

from lbtestbed.cli import main

sys.exit(main())
