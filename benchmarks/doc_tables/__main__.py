"""``python -m benchmarks.doc_tables``: rewrite (or ``--check``) every table."""

import sys

from . import main

sys.exit(main())
