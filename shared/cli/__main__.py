"""``python -m shared.cli``."""
import sys

from shared.cli.commands import main

sys.exit(main())
