"""Request ids as users type them: the full id, or a unique prefix of it.

The dashboard cuts long request ids with an ellipsis (``cmpl-8f3a2c…``) and vLLM's
server ids run to 40 characters or more, so every command that takes a request id
accepts the start of one, as git does for commits: :func:`resolve_request_id` finds the
run's ids that start with it and returns the one it names.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

from .reader import open_segment
from .rundir import event_files

#: A ``req_id`` field in an event line: the JSON string after it, escapes included.
_REQ_ID = re.compile(rb'"req_id":\s*"((?:[^"\\]|\\.)*)"')
#: Candidates listed when a prefix names several requests.
SHOWN_CANDIDATES = 5


class RequestIdError(ValueError):
    """No request id of the run starts with the given text, or several do."""


def request_ids(run_dir: Path) -> set[str]:
    """Every ``req_id`` in the run's event files (a scan of the raw lines for the field;
    a line that is not valid JSON may contribute an id, which only widens the choice)."""
    ids: set[str] = set()
    for path in event_files(run_dir):
        try:
            with open_segment(path) as f:  # .gz segments included
                for line in f:  # line by line: memory stays flat on a large run
                    match = _REQ_ID.search(line)
                    if match is None:
                        continue
                    raw = match.group(1)
                    try:
                        ids.add(json.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode("utf-8"))
                    except ValueError:
                        continue
        except (OSError, EOFError, zlib.error):  # a damaged .gz: the ids read so far stand
            continue
    return ids


def match_request_id(text: str, ids: set[str]) -> str:
    """The id ``text`` names among ``ids``: itself when it is one, else the only id that
    starts with it.

    Raises:
        RequestIdError: no id starts with ``text``, or several do (some are listed).
    """
    if text in ids:
        return text
    text = text.rstrip("…")  # pasted from the dashboard, ellipsis included
    found = sorted(i for i in ids if i.startswith(text))
    if len(found) == 1:
        return found[0]
    if not found:
        raise RequestIdError(f"no request id starts with {text!r} ({len(ids)} requests in the run)")
    shown = ", ".join(found[:SHOWN_CANDIDATES]) + (f" and {len(found) - SHOWN_CANDIDATES} more"
                                                   if len(found) > SHOWN_CANDIDATES else "")
    raise RequestIdError(f"{text!r} starts {len(found)} request ids ({shown}); give more of it")


def resolve_request_id(run_dir: Path, text: str) -> str:
    """:func:`match_request_id` over the ids of the run in ``run_dir``.

    Raises:
        RequestIdError: as :func:`match_request_id`.
    """
    return match_request_id(text, request_ids(run_dir))
