"""``python -m vllm_probe.analysis.doctor.rules`` prints docs/doctor.md's rule reference."""

import sys

from ..reference import reference

sys.stdout.write(reference())
