"""The one search over settings: a batched coordinate descent on replays, used by
``vllm-probe tune`` (SLOs and an objective) and by the doctor's plan (every finding's goal).

From the recorded settings, each round replays every value of every knob with the other
knobs held at the current best (one batch: ``--jobs``/``--ray`` replay a round in parallel),
moves to the best point by the caller's ``key`` (lower is better), and stops when a round
finds nothing better, or at the deadline. Seeds (points worth trying first, e.g. each
finding's own remedy) are replayed in the first batch. A point already replayed is never
replayed again. Why coordinate descent and not the grid: docs/tune.md (measured replays to
the grid's optimum).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .evaluate import Evaluation

#: A point of the search: setting → value, by ``whatif`` names; the recorded settings are {}.
Point = dict[str, Any]


@dataclass
class Descent:
    """What :func:`descend` replayed.

    Attributes:
        seen: every point replayed (normalised: recorded values left out), with its
            evaluation, in the order replayed; the baseline ``()`` first.
        best: the best point's key (``seen``'s).
        rounds: rounds run.
        complete: false when the deadline stopped it.
    """

    seen: dict[tuple[tuple[str, Any], ...], tuple[Point, Evaluation]] = field(default_factory=dict)
    best: tuple[tuple[str, Any], ...] = ()
    rounds: int = 0
    complete: bool = True

    @property
    def replayed(self) -> list[tuple[Point, Evaluation]]:
        """The points replayed by the search (the baseline, given, left out)."""
        return [v for k, v in self.seen.items() if k]


def point_key(p: Point) -> tuple[tuple[str, Any], ...]:
    """A point as a hashable key (sorted items)."""
    return tuple(sorted(p.items()))


def descend(evaluate: Callable[[list[Point]], list[Evaluation]], knobs: Sequence[tuple[str, Sequence[Any]]],
            key: Callable[[Point, Evaluation], tuple], recorded: dict[str, Any], baseline: Evaluation,
            deadline: float, seeds: Iterable[Point] = (), progress: Callable[[str], None] | None = None,
            ) -> Descent:
    """Search ``knobs`` (``(setting, values in the order to try)``) for the point of least
    ``key``.

    Args:
        evaluate: replays a batch of points, results in order.
        key: ``(point, evaluation) -> tuple``, lower is better.
        recorded: the recorded settings (a value equal to one is no change).
        baseline: the replay at the recorded settings (the starting point).
        deadline: ``time.monotonic()`` after which no round starts.
        seeds: points replayed in the first batch beside the first round's.
    """
    result = Descent()
    result.seen[()] = ({}, baseline)
    scores: dict[tuple[tuple[str, Any], ...], tuple] = {(): key({}, baseline)}

    def norm(p: Point) -> Point:
        return {k: v for k, v in p.items() if v != recorded.get(k)}

    def run(batch: list[Point]) -> None:
        todo: list[Point] = []
        for p in batch:
            p = norm(p)
            if point_key(p) not in result.seen and p not in todo:
                todo.append(p)
        if not todo:
            return
        if progress:
            progress(f"round {result.rounds}: replaying {len(todo)} setting(s)")
        for p, ev in zip(todo, evaluate(todo)):
            k = point_key(p)
            result.seen[k] = (p, ev)
            scores[k] = key(p, ev)

    current: Point = {}
    pending = list(seeds)
    while True:
        if time.monotonic() >= deadline:
            result.complete = False
            break
        result.rounds += 1
        run(pending + [{**current, name: v} for name, values in knobs for v in values])
        pending = []
        cand = min(scores, key=lambda k: scores[k])
        if scores[cand] >= scores[result.best]:
            break
        result.best, current = cand, dict(result.seen[cand][0])
    return result


__all__ = ["Descent", "Point", "descend", "point_key"]
