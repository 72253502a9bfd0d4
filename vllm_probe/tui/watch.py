"""Watching a run: the follow / replay loops behind ``vllm-probe tail`` and the view loop
of ``vllm-probe run --live``.

:class:`Watcher` reads a run directory (files that appear later included) into a
:class:`~vllm_probe.analysis.state.RunState` and turns it into the dashboard
(:func:`vllm_probe.tui.layout.render_dashboard`) or ``--plain`` lines
(:class:`vllm_probe.tui.plain.PlainFormatter`). :func:`follow` and :func:`replay` drive it
for ``tail``; :func:`run_live` shows it while a command supervised by
:class:`vllm_probe.runs.launcher.SupervisedRun` runs.

The screen is redrawn at most ``refresh_hz`` times per second
(:class:`~vllm_probe.tui.terminal.Screen`: rich's ``Live``, not on the alternate screen,
so the final frame stays in the terminal). When the output is not a terminal the
dashboard is printed once, at the end, at its natural height.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO, Any
from collections.abc import Callable, Iterator

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.text import Text

from ..runs.launcher import (
    GRACE_S, LOG_TAIL_LINES, SupervisedRun, count_events, print_failure_hint, read_log_tail,
)
from ..runs.reader import iter_run
from ..runs.rundir import read_meta
from ..settings import Settings
from ..analysis.moments import notable_moments
from ..analysis.follow import LiveRun
from ..analysis.window import retention_note
from .dashboard import View
from .format import duration
from .layout import render_dashboard
from .plain import PlainFormatter
from .terminal import REFRESH_HZ, Screen

#: Seconds between two looks at the run directory while following.
POLL_S = 0.1
#: Bytes read per file per look (bounds memory on a large finished run).
READ_CHUNK = 4 << 20
#: A replay shortens idle gaps between events longer than this (s of event time).
REPLAY_MAX_GAP_S = 5.0
#: The findings panel is recomputed at most this often while the run goes on (s).
FINDINGS_EVERY_S = 1.0


class Watcher:
    """A run directory read into a :class:`RunState`, shown as a dashboard or plain lines.

    The reading is :class:`~vllm_probe.analysis.follow.LiveRun`'s (one Follower, one
    state, one live doctor): the dashboard and the ``--plain`` lines subscribe to it, and
    so may the metrics server of ``run --live --metrics-port``
    (:meth:`vllm_probe.exporters.prometheus.MetricsServer.attach`).

    Args:
        run_dir: the run directory.
        plain_out: write ``--plain`` lines here as events arrive (None: dashboard only).
        engine: only this data-parallel rank (None: all).
        chart_steps: steps in the rolling chart (None: one per column).
    """

    def __init__(self, run_dir: Path, *, plain_out: IO[str] | None = None, engine: int | None = None,
                 chart_steps: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.live = LiveRun(self.run_dir, step_window=max(chart_steps or 0, 600), engine=engine,
                            findings_every_s=FINDINGS_EVERY_S)
        self.stats = self.live.stats
        self.diagnosis = self.live.diagnosis  # its episodes: the findings' and the notable moments'
        assert self.diagnosis is not None  # made with findings_every_s
        self.episodes = self.diagnosis.episodes
        self.state = self.live.state
        self.follower = self.live.follower
        self.formatter = PlainFormatter(self.state) if plain_out is not None else None
        self.out = plain_out
        self.engine = engine
        self.chart_steps = chart_steps
        self.quiet = False  # apply events without printing plain lines (a replay's fast-forward)
        self._moments: list | None = None
        if self.formatter is not None:
            self.live.subscribe(self._plain_line)

    @property
    def finished(self) -> bool:
        """The run has ended: a partial last line is a truncated one."""
        return self.live.finished

    @finished.setter
    def finished(self, value: bool) -> None:
        self.live.finished = value

    @property
    def behind(self) -> bool:
        """The last pump stopped on its time budget with data left."""
        return self.live.behind

    def _plain_line(self, ev) -> None:
        if self.formatter is not None and self.out is not None and not self.quiet:
            line = self.formatter.format(ev)
            if line is not None:
                self.out.write(line + "\n")

    def apply(self, ev) -> None:
        """Apply one record (:mod:`vllm_probe.schema.records`) to the state and print its
        plain line (if any): a replay's records, which come from :func:`iter_run`, not the
        follower."""
        if self.engine is not None and ev.engine != self.engine:
            return
        self.state.apply(ev)
        if self.formatter is not None:
            self._plain_line(ev)

    def pump(self, budget_s: float | None = None) -> int:
        """Read what the files hold now (in chunks), apply it; returns events read.

        Stops after ``budget_s`` seconds so that a large backlog does not freeze the
        screen (the next call continues).
        """
        total = self.live.pump(budget_s, READ_CHUNK)
        if self.out is not None and total:
            self.out.flush()
        return total

    @property
    def truncated(self) -> int:
        """Incomplete last lines, counted once the run has finished."""
        return self.follower.pending_partial() if self.finished else 0

    def story(self, meta: dict, finished: bool) -> tuple[list, list]:
        """The doctor's findings on the state so far (:class:`LiveDiagnosis`: at most every
        :data:`FINDINGS_EVERY_S` while live), and once finished the notable moments."""
        findings = self.live.findings(meta, finished)
        if not finished:
            return findings, []
        if self._moments is None:
            self._moments = notable_moments(self.state, self.episodes)
        return findings, self._moments

    def frame(self, width: int, height: int | None, *, now: float | None, meta: dict, status: str,
              status_style: str = "bold", log_tail: list[str] | None = None, notice: str | None = None,
              finished: bool = False) -> RenderableType:
        """The dashboard for the current state (``finished``: the run is over; its whole-run
        overview and notable moments are shown)."""
        findings, moments = self.story(meta, finished) if self.state.engines else ([], [])
        view = View(status=status, status_style=status_style, run_dir=str(self.run_dir), truncated=self.truncated,
                    log_tail=log_tail or (), notice=notice, engine=self.engine, chart_steps=self.chart_steps,
                    findings=findings, moments=moments, finished=finished and bool(self.state.engines))
        return render_dashboard(self.state, meta, self.stats, width=width, height=height, now=now, view=view)


def _run_status(meta: dict, now: float) -> tuple[str, str]:
    """Status line and style from ``meta.json``."""
    if not meta:
        return "event files (no meta.json)", "bold"
    end, code = meta.get("end_time"), meta.get("exit_code")
    if end is None:
        return "● live", "bold green"
    dur = end - meta["start_time"] if meta.get("start_time") else None
    if code == 0:
        return f"finished · exit 0 · {duration(dur)}", "bold green"
    return f"finished · exit {code} · {duration(dur)}", "bold red"


def follow(run_dir: Path, *, plain: bool = False, refresh_hz: float = REFRESH_HZ, engine: int | None = None,
           chart_steps: int | None = None, keep_following: bool = True, console: Console | None = None,
           out: IO[str] | None = None) -> int:
    """``vllm-probe tail``: show a run, following it while it is live.

    Follows until ``meta.json`` records the run's end (then shows the final state),
    or until Ctrl-C. Returns 0, or 1 when a finished run holds no events.
    """
    out = out or sys.stdout
    console = console or Console()
    watcher = Watcher(run_dir, plain_out=out if plain else None, engine=engine, chart_steps=chart_steps)
    meta = read_meta(run_dir)
    last_meta = time.monotonic()
    waiting_said = False
    interrupted = False

    def make(width: int, height: int | None) -> RenderableType:
        status, style = _run_status(meta, time.time())
        if interrupted:
            status += " · stopped watching (Ctrl-C)"
        notice = None
        if not watcher.state.engines:
            notice = f"no events yet in {run_dir}" if not _is_finished(meta) else f"no events in {run_dir}"
        done = _is_finished(meta)
        now = meta.get("end_time") if done else time.time()
        return watcher.frame(width, height, now=now or None, meta=meta, status=status, status_style=style,
                             notice=notice, finished=done and watcher.finished)

    with Screen(console, refresh_hz, enabled=not plain) as screen:
        try:
            while True:
                watcher.pump(budget_s=0.2)
                if time.monotonic() - last_meta > 1.0:
                    meta, last_meta = read_meta(run_dir), time.monotonic()
                done = _is_finished(meta) or not keep_following
                if done:
                    watcher.pump()  # drain what the run left behind
                    watcher.finished = True
                    break
                if plain and not watcher.state.events and not waiting_said:
                    print(f"vllm-probe: waiting for events in {run_dir} …", file=sys.stderr, flush=True)
                    waiting_said = True
                screen.show(make)
                if not watcher.behind:
                    time.sleep(POLL_S)
        except KeyboardInterrupt:
            interrupted = True
        screen.final(make)
    if plain and watcher.truncated:
        print(f"vllm-probe: {watcher.truncated} truncated line(s) at the end of the files", file=sys.stderr)
    if plain and (watcher.stats.skipped or watcher.stats.newer_schema or watcher.stats.segments_missed):
        print(f"vllm-probe: {watcher.stats.describe()}", file=sys.stderr)
    retention = retention_note(watcher.state)
    if plain and retention:
        print(f"vllm-probe: note: {retention}", file=sys.stderr)
    if not watcher.state.events and _is_finished(meta) and not interrupted:
        print(f"vllm-probe: no events in {run_dir}", file=sys.stderr)
        return 1
    return 0


def _is_finished(meta: dict) -> bool:
    """A run is over when ``meta.json`` has its end time, or when there is no meta.json."""
    return not meta or meta.get("end_time") is not None


def replay(run_dir: Path, speed: float = 1.0, *, plain: bool = False, refresh_hz: float = REFRESH_HZ,
           engine: int | None = None, chart_steps: int | None = None, console: Console | None = None,
           out: IO[str] | None = None, from_step: int | None = None) -> int:
    """``vllm-probe tail --replay SPEED``: play the run's events back at ``speed``× their pace.

    Events are merged across files in time order; idle gaps longer than
    :data:`REPLAY_MAX_GAP_S` of event time are shortened to it. ``from_step``: the
    events before the first one of that step (any engine core shown) are applied at
    once, without ``--plain`` lines, and the replay plays from there (the step a
    finding or a notable moment names).
    """
    out = out or sys.stdout
    console = console or Console()
    speed = speed if speed and speed > 0 else 1.0
    watcher = Watcher(run_dir, plain_out=out if plain else None, engine=engine, chart_steps=chart_steps)
    meta = read_meta(run_dir)
    events: Iterator = iter_run(run_dir, watcher.stats)
    clock: dict[str, Any] = {"ev": None, "wall": time.monotonic()}
    first_ts = [None]
    interrupted = False
    playing = from_step is None
    watcher.quiet = not playing

    def event_now() -> float | None:
        if clock["ev"] is None:
            return None
        return clock["ev"] + (time.monotonic() - clock["wall"]) * speed

    def make(width: int, height: int | None) -> RenderableType:
        now = event_now()
        pos = f" · t+{duration(now - first_ts[0])}" if now is not None and first_ts[0] is not None else ""
        frm = f" from step {from_step}" if from_step is not None else ""
        status = f"▶ replay {speed:g}×{frm}{pos}" + (" · stopped (Ctrl-C)" if interrupted else "")
        done = watcher.finished and not interrupted
        return watcher.frame(width, height, now=now, meta={**meta, "end_time": None}, status=status,
                             status_style="bold cyan", notice=None if watcher.state.engines else "no events yet",
                             finished=done)

    with Screen(console, refresh_hz, enabled=not plain) as screen:
        try:
            for ev in events:
                ts = ev.ts
                if first_ts[0] is None:
                    first_ts[0] = ts
                if not playing:
                    step = getattr(ev, "step", None)
                    if step is None or step < from_step or (engine is not None and ev.engine != engine):
                        watcher.apply(ev)  # fast-forward: no pacing, no plain line
                        continue
                    playing, watcher.quiet = True, False
                if clock["ev"] is None:
                    clock["ev"], clock["wall"] = ts, time.monotonic()
                now = event_now()
                if ts - now > REPLAY_MAX_GAP_S:  # idle gap: jump ahead
                    clock["ev"], clock["wall"] = ts - REPLAY_MAX_GAP_S, time.monotonic()
                while True:
                    wait = (ts - event_now()) / speed
                    if wait <= 0:
                        break
                    screen.show(make)
                    time.sleep(min(wait, screen.interval, 0.25))
                watcher.apply(ev)
                screen.show(make)
            watcher.finished = True
        except KeyboardInterrupt:
            interrupted = True
        if watcher.out is not None:
            watcher.out.flush()
        if not interrupted:
            clock["ev"], clock["wall"] = watcher.state.last_ts, time.monotonic()
        screen.final(make)
    if not watcher.state.events and not interrupted:
        print(f"vllm-probe: no events in {run_dir}", file=sys.stderr)
        return 1
    if not playing and not interrupted:
        last = max((e.last_step for e in watcher.state.engines.values()), default=-1)
        print(f"vllm-probe: the run has no step {from_step} (its last step is {last}); shown: the end of the run",
              file=sys.stderr)
    return 0


def run_live(command: list[str], settings: Settings, out: Path | str | None = None, *,
             grace_s: float = GRACE_S, refresh_hz: float = REFRESH_HZ, console: Console | None = None,
             on_start: Callable[[Path], None] | None = None,
             on_live: Callable[[LiveRun], None] | None = None) -> int:
    """``vllm-probe run --live``: run ``command`` with the probe, dashboard in this terminal.

    The command's stdout and stderr go to ``command.log`` in the run directory. Ctrl-C
    sends SIGINT to the command, SIGTERM after ``grace_s`` seconds (a second Ctrl-C:
    at once), SIGKILL after another ``grace_s``. When the command fails, the last lines
    of its log are printed. The run directory is completed (``meta.json`` with end time
    and exit code) in every case. Returns the command's exit code (128+N when killed
    by signal N). When stdout is not a terminal, ``--plain`` lines are printed instead.
    ``on_start``: as :func:`vllm_probe.runs.launcher.run_foreground`'s. ``on_live(live)``:
    called with the dashboard's :class:`~vllm_probe.analysis.follow.LiveRun` before the
    first read, for other consumers of the same state (``--metrics-port``'s server
    attaches there: one read, one state).

    Raises:
        LaunchError, RunDirError: as :class:`vllm_probe.runs.launcher.SupervisedRun`.
    """
    console = console or Console()
    plain = not console.is_terminal
    run = SupervisedRun(command, settings, Path(out) if out is not None else None, grace_s, on_start)
    print(f"vllm-probe: events -> {run.run_dir}  (command output -> {run.log_path})", file=sys.stderr, flush=True)
    watcher = Watcher(run.run_dir, plain_out=sys.stdout if plain else None)
    if on_live is not None:
        on_live(watcher.live)
    shown_meta = dict(run.meta)  # what the header shows; gets the end time when the command ends

    def make(width: int, height: int | None) -> RenderableType:
        code = run.exit_code
        if code is None:
            status, style = run.stopper.status()
        else:
            style = "bold green" if code == 0 else "bold red"
            status = f"finished · exit {code} · {duration(time.time() - run.started)}"
            if run.stopper.sent:
                status += f" (stopped: {', '.join(run.stopper.sent)})"
        notice = log_tail = None
        if not watcher.state.engines:
            log_tail = read_log_tail(run.log_path, 8)
            notice = (f"starting: no events yet ({duration(time.time() - run.started)}; vLLM's start-up takes a while)"
                      if code is None else "the command ended before the engine wrote events")
        return watcher.frame(width, height, now=time.time(), meta=shown_meta, status=status, status_style=style,
                             log_tail=log_tail, notice=notice, finished=code is not None and watcher.finished)

    with run.stop_on_signals():
        try:
            with Screen(console, refresh_hz, enabled=not plain) as screen:
                while run.exit_code is None:
                    watcher.pump(budget_s=0.2)
                    run.stopper.tick()
                    screen.show(make)
                    if not watcher.behind:
                        time.sleep(POLL_S)
                code = run.wait()
                shown_meta.update(read_meta(run.run_dir))
                _drain(watcher)
                screen.final(make)
        except Exception as e:  # the dashboard failed: the command must still end properly
            print(f"vllm-probe: live view stopped ({type(e).__name__}: {e}); waiting for the command",
                  file=sys.stderr, flush=True)
            code = _keep_following(run, watcher) if on_live is not None else run.wait()
    if code != 0:
        tail = read_log_tail(run.log_path, LOG_TAIL_LINES)
        err = Console(stderr=True)
        err.print(Panel(Text("\n".join(tail) or "(no output)"), title=f"last lines of {run.log_path}",
                        title_align="left", border_style="red"))
        err.print(f"vllm-probe: the command exited with code {code}", style="bold red", highlight=False)
    counts = count_events(run.run_dir)
    print(f"vllm-probe: {counts.describe()} in {run.run_dir}", file=sys.stderr, flush=True)
    print_failure_hint(run.run_dir, command, code, run.log_path)
    return code


def _keep_following(run: SupervisedRun, watcher: Watcher) -> int:
    """Without a screen, keep reading for the other consumers of the LiveRun until the
    command ends; returns its exit code."""
    watcher.quiet = True  # no more plain lines
    while run.exit_code is None:
        try:
            watcher.live.pump(budget_s=0.2)
        except Exception:  # the reading itself fails: the command must still end properly
            break
        run.stopper.tick()
        time.sleep(POLL_S)
    return run.wait()


def _drain(watcher: Watcher, quiet_s: float = 0.3, max_s: float = 3.0) -> None:
    """Read until no new event arrived for ``quiet_s`` (engine cores flushing at exit)."""
    start = last = time.monotonic()
    while time.monotonic() - start < max_s:
        if watcher.pump():
            last = time.monotonic()
        elif time.monotonic() - last >= quiet_s:
            break
        time.sleep(0.05)
    watcher.finished = True
