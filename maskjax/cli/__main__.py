"""python -m maskjax.cli NAME [FLAGS]: the same as the `maskjax` console script."""

import sys

from maskjax.cli import main

sys.exit(main())
