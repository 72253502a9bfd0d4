"""``python -m vllm_probe`` is the ``vllm-probe`` command."""

import sys

from .cli import main

sys.exit(main())
