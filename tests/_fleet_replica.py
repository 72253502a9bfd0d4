"""One replica of the fleet test (tests/e2e/test_fleet_prometheus.py), run under ``vllm-probe run
--metrics-port``: the long-prompt example's workload on the tiny model, then idle until
SIGTERM or SIGINT (exit 0), so that Prometheus scrapes the final counts while the
metrics server still runs.

Like a server before its first request, the engine idles :data:`IDLE_BEFORE_S` between
its start and the workload: Prometheus then stores the engine's counters at 0 before
they grow, and ``increase()`` over the run is its total (a counter first seen at N
counts from N).

    python tests/_fleet_replica.py [long_prompts.py ARGS...]
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import threading
import time
from pathlib import Path

#: Printed on stdout once the workload is done (the test waits for it).
DONE = "fleet-replica: workload done"
#: Seconds between the engine's start and the workload (a few scrapes at 1 s).
IDLE_BEFORE_S = 2.5


def main(argv: list[str]) -> int:
    path = Path(__file__).resolve().parents[1] / "examples" / "long_prompts.py"
    spec = importlib.util.spec_from_file_location("long_prompts", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    import vllm

    generate = vllm.LLM.generate

    def generate_after_idling(self, *args, **kwargs):
        time.sleep(IDLE_BEFORE_S)
        return generate(self, *args, **kwargs)

    vllm.LLM.generate = generate_after_idling
    example.main(argv)
    # Python-level handlers (not a blocked mask, which vLLM's processes would inherit):
    # whichever thread the signal reaches, the main thread sees the flag.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(DONE, flush=True)
    while not stop.wait(0.5):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
