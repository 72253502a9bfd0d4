"""Token ids for replayed requests that share exactly the blocks the recorded ones did.

A replay has no text: each request's prompt and answer are rebuilt from its recorded block
digests (:class:`PromptBuilder`), and the replay's fake model samples the answer's planned
tokens (:class:`TokenPlan`), so a prompt that repeats an earlier answer hits that answer's
cached blocks as in the engine. The scheduler only hashes the ids: they are plain integers
far above any vocabulary.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence


class PromptBuilder:
    """Token ids for replayed requests that share exactly the blocks the recorded ones did.

    Each distinct block id (a ``block_digests`` or ``output_block_digests`` entry, or a
    trace's hash id) gets a block of ``block_tokens`` ids of its own. A request's tokens,
    prompt then output, are the blocks of its ids in order (its prompt's digests, then the
    digests of its answer's blocks), then tokens unique to it. Two rebuilt requests
    therefore share exactly the leading blocks whose ids were equal: prompt blocks, and the
    blocks of an earlier answer that a later prompt repeats (a conversation's next turn) or
    that an identical prompt's identical answer fills. vLLM's KV-cache manager then hits
    (and evicts) where the recorded one did, provided the replay's fake model samples the
    planned output tokens (:meth:`plan`, :meth:`TokenPlan.output_token`). Ids are plain
    integers far above any vocabulary (the scheduler only hashes them). ``partial``: a
    trailing id covering fewer than ``block_tokens`` tokens gets its own tokens per length
    (vLLM's ``TimedTrace`` keys partial chunks by ``hash:size``).
    """

    _BLOCK_BASE = 1 << 32
    _TAIL_BASE = 1 << 48

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._index: dict[Any, int] = {}
        #: (block's first token id, offset) -> the token sampled there instead (a stop token)
        self._override: dict[tuple[int, int], int] = {}
        self._overridden: set[int] = set()  # the first token ids of those blocks

    def _block_base(self, key: Any, size: int) -> int:
        idx = self._index.setdefault((key, size), len(self._index))
        return self._BLOCK_BASE + idx * self.block_tokens

    def plan(self, order: int, prompt_len: int, ids: Sequence[Any] | None, output_ids: Sequence[Any] | None = None,
             output_len: int = 0, stop_token: int | None = None) -> TokenPlan:
        """The tokens of request ``order``: ``prompt_len`` prompt tokens from ``ids``, then
        ``output_len`` output tokens, from ``output_ids`` where its answer filled blocks
        (used only when ``ids`` covers exactly the prompt's full blocks, as recorded);
        ``stop_token``: its last output token (a ``stop`` request's)."""
        bt = self.block_tokens
        blocks: list[tuple[int, int]] = []  # (first token id, tokens) per block of ids, in order
        covered = 0
        for key in ids or ():
            if covered >= prompt_len:
                break
            size = min(bt, prompt_len - covered)
            blocks.append((self._block_base(key, size), size))
            covered += size
        if output_ids and len(ids or ()) == prompt_len // bt == len(blocks):
            total = prompt_len + output_len
            for key in output_ids:
                if covered + bt > total:
                    break
                blocks.append((self._block_base(key, bt), bt))
                covered += bt
        plan = TokenPlan(self, prompt_len, blocks, covered, self._TAIL_BASE + order * (1 << 24), output_len)
        if stop_token is not None and output_len > 0:
            plan.set_last(stop_token)
        return plan

    def tokens(self, order: int, prompt_len: int, ids: Sequence[Any] | None) -> list[int]:
        """``prompt_len`` token ids for request ``order`` whose blocks are ``ids``."""
        return self.plan(order, prompt_len, ids).prompt()


class TokenPlan:
    """One replayed request's tokens (:meth:`PromptBuilder.plan`): position -> token id,
    computed when asked (a prompt is built once; an output token each time it is sampled)."""

    __slots__ = ("builder", "prompt_len", "blocks", "covered", "tail", "output_len", "last")

    def __init__(self, builder: PromptBuilder, prompt_len: int, blocks: list[tuple[int, int]], covered: int,
                 tail: int, output_len: int) -> None:
        self.builder = builder
        self.prompt_len = prompt_len
        self.blocks = blocks
        self.covered = covered  # tokens covered by blocks; the rest are the request's own (tail + position)
        self.tail = tail
        self.output_len = output_len
        self.last: int | None = None  # the last output token when it is set apart (a stop token)

    def token(self, pos: int) -> int:
        """The token id at position ``pos`` (prompt positions first)."""
        if pos >= self.covered:
            return self.tail + pos - self.covered
        bt = self.builder.block_tokens
        base = self.blocks[pos // bt][0]
        override = self.builder._override
        return override.get((base, pos % bt), base + pos % bt) if override else base + pos % bt

    def prompt(self) -> list[int]:
        """The prompt's token ids."""
        n = self.prompt_len
        out: list[int] = []
        for base, size in self.blocks:
            first = len(out)
            if first >= n:
                break
            take = min(size, n - first)
            if base in self.builder._overridden:
                out += [self.token(first + j) for j in range(take)]
            else:
                out += range(base, base + take)
        if len(out) < n:  # past its blocks, a prompt's tokens are its own
            out += range(self.tail, self.tail + n - len(out))
        return out

    def set_last(self, token: int) -> None:
        """Make the last output token ``token``; where it lies in a block of ids, every
        request with that block gets it there (the block hashes as it did)."""
        pos = self.prompt_len + self.output_len - 1
        self.last = token
        if pos < self.covered:
            base, _ = self.blocks[pos // self.builder.block_tokens]
            self.builder._override[(base, pos % self.builder.block_tokens)] = token
            self.builder._overridden.add(base)

    def output_token(self, index: int, default: int) -> int:
        """The token the fake model samples as output ``index`` (0-based): the plan's;
        past the planned output (a request aborted later than recorded), ``default``; a
        request's own stop token anywhere but at its end would stop it early, so
        ``default`` there too."""
        if index >= self.output_len:
            return default
        if index == self.output_len - 1 and self.last is not None:
            return self.last
        tok = self.token(self.prompt_len + index)
        return default if tok == self.last else tok


__all__ = ["PromptBuilder", "TokenPlan"]
