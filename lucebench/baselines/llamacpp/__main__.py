"""`python -m lucebench.baselines.llamacpp`: the llama.cpp baseline engine process (see adapter.py)."""

import sys

from lucebench.baselines.llamacpp.adapter import main

sys.exit(main())
