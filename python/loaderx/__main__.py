"""``python -m loaderx``: the same as the ``loaderx`` command."""

import sys

from .cli import main

sys.exit(main())
