"""Write the event log out when the engine core is told to stop.

vLLM 0.32's engine core turns SIGTERM/SIGINT into a shutdown, but its parent may
SIGKILL it moments later (``[shutdown] Process manager: force killing remaining
processes``), before ``atexit`` handlers run. Chaining a handler in front of vLLM's
own lets the sink write everything queued, plus a ``probe_stats`` line, at the signal.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_CHAINED = "__vllm_probe_chained__"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(callback: Callable[[], None]) -> bool:
    """Run ``callback`` first whenever SIGTERM or SIGINT arrives, then the handler that
    was installed before (vLLM's, Python's default ``KeyboardInterrupt``, or the default
    action, re-delivered). Installs once per signal; returns False where handlers
    cannot be set (not the main thread). ``callback`` must not raise.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in STOP_SIGNALS:
        previous = signal.getsignal(sig)
        if getattr(previous, _CHAINED, False):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> Any:
            callback()
            if callable(previous):
                return previous(signum, frame)
            if previous == signal.SIG_IGN:
                return None
            signal.signal(signum, signal.SIG_DFL)  # default action: terminate, as before
            os.kill(os.getpid(), signum)
            return None

        setattr(handler, _CHAINED, True)
        signal.signal(sig, handler)
    return True
