"""`python -m kvcache_spec.cpp --includes`: the same as `kvcache cpp`."""

import sys

from . import main

sys.exit(main())
