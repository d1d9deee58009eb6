"""`python -m ablate.cli …` is the `ablate` command (the tests run it this way)."""

import sys

from ablate.cli import main

sys.exit(main())
