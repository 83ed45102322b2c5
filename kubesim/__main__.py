"""``python -m kubesim``: see ``kubesim.cli``."""

import sys

from kubesim.cli import main

sys.exit(main())
