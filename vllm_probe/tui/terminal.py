"""Terminal control for the live views: a rich ``Live`` redrawn at a bounded rate, and
the keyboard echo switched off while it draws (a ``^C`` would shift the frame)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any
from collections.abc import Callable

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

#: Dashboard redraws per second (default of ``--refresh``).
REFRESH_HZ = 4.0


class Screen:
    """rich ``Live`` redrawn at most ``refresh_hz`` times per second, sized to the terminal.

    On a non-terminal nothing is drawn until :meth:`final`, which prints the last frame
    at its natural height. Never raises from a render: a failing frame is replaced by
    a one-line message (the loop goes on).
    """

    def __init__(self, console: Console, refresh_hz: float = REFRESH_HZ, enabled: bool = True) -> None:
        self.console = console
        self.interval = 1.0 / max(refresh_hz, 0.1)
        self.enabled = enabled
        self.live: Live | None = None
        self._next = 0.0
        self._tty: tuple[int, list] | None = None

    def __enter__(self) -> Screen:
        if self.enabled and self.console.is_terminal:
            self._tty = _echo_off()
            self.live = Live(console=self.console, auto_refresh=False, vertical_overflow="crop",
                             redirect_stdout=False, redirect_stderr=False)
            self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        _echo_restore(self._tty)
        self._tty = None

    def _render(self, make: Callable[[int, int | None], RenderableType], natural: bool) -> RenderableType:
        width, height = self.console.size
        try:
            return make(width, None if natural else max(height - 1, 1))
        except Exception as e:  # a view bug must not kill the loop (nor the run)
            return Text(f"vllm-probe: the dashboard failed to render: {type(e).__name__}: {e}", style="bold red")

    def show(self, make: Callable[[int, int | None], RenderableType], force: bool = False) -> None:
        """Redraw if the refresh interval has passed (or ``force``)."""
        if self.live is None:
            return
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.interval
        self.live.update(self._render(make, natural=False), refresh=True)

    def final(self, make: Callable[[int, int | None], RenderableType]) -> None:
        """Draw the last frame and leave it on the screen."""
        if not self.enabled:
            return
        if self.live is not None:
            self.live.update(self._render(make, natural=False), refresh=True)
            self.live.stop()
            self.live = None
        else:
            self.console.print(self._render(make, natural=True))


def _echo_off() -> tuple[int, list] | None:
    """Stop the terminal from echoing keys (``^C`` would shift the redrawn frame by a line).

    Only when stdin is the terminal and we are its foreground job (changing it from the
    background would stop us with SIGTTOU). Returns what :func:`_echo_restore` needs.
    """
    try:
        import termios

        fd = sys.stdin.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            return None
        old = termios.tcgetattr(fd)
        new = termios.tcgetattr(fd)
        new[3] &= ~(termios.ECHO | termios.ECHOCTL)
        termios.tcsetattr(fd, termios.TCSANOW, new)
        return fd, old
    except Exception:  # no termios, no tty, closed stdin: leave the terminal as it is
        return None


def _echo_restore(saved: tuple[int, list] | None) -> None:
    if saved is None:
        return
    try:
        import termios

        termios.tcsetattr(saved[0], termios.TCSADRAIN, saved[1])
    except Exception:
        pass


