"""``python -m lucebench.baselines.hf``: the HF baseline engine process."""

import sys

from lucebench.baselines.hf.server import main

sys.exit(main())
