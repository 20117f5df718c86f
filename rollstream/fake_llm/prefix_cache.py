"""The stand-in's prefix cache: one per server process, so routing that keeps a session on
one server is measurably faster than routing that scatters it.

Modelled on vLLM's automatic prefix caching (docs "Automatic Prefix Caching": KV blocks of
`block_size` tokens, each named by a hash of its tokens and of every block before it, kept
in an LRU and matched block by block from the start of the prompt). A prompt's leading
blocks found here are cached; the rest must be computed: the answer takes
`prefill_s_per_token` seconds more per uncached prompt token. A prompt's blocks are cached
when it arrives (its prefill is under way: a request after it with the same prefix, a group
member's, shares it, as SGLang's radix cache shares a prefix in flight), and the reply's
after the answer (vLLM keeps the blocks of generated tokens too), so the next turn of the
conversation, which extends both, finds them. The count of cached prompt
tokens is reported as vLLM reports it: `usage.prompt_tokens_details.cached_tokens`.

Off (`prefix_cache_tokens` 0): nothing is cached, no time is added for the prompt unless
`prefill_s_per_token` is set (then every prompt token costs it), and usage is unchanged.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

BLOCK_TOKENS = 16  # vLLM's default block_size


class PrefixCache:
    """An LRU of prompt-prefix blocks (`capacity_tokens` / `BLOCK_TOKENS` of them)."""

    def __init__(self, capacity_tokens: int, prefill_s_per_token: float = 0.0,
                 block_tokens: int = BLOCK_TOKENS):
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self.prefill_s_per_token = prefill_s_per_token
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.prompt_tokens = 0  # totals since start: the hit rate is cached / prompt
        self.cached_tokens = 0

    @property
    def on(self) -> bool:
        return self.capacity_blocks > 0

    def _hashes(self, tokens: list[str]) -> list[bytes]:
        """The chained hash of each full block of `tokens`."""
        out: list[bytes] = []
        parent = b""
        size = self.block_tokens
        for start in range(0, len(tokens) - size + 1, size):
            h = hashlib.blake2b(parent, digest_size=16)
            for token in tokens[start:start + size]:
                h.update(token.encode())
                h.update(b"\x00")
            parent = h.digest()
            out.append(parent)
        return out

    def lookup(self, prompt: list[str]) -> int:
        """Prompt tokens found cached (whole leading blocks); marks them recently used."""
        self.prompt_tokens += len(prompt)
        if not self.on:
            return 0
        found = 0
        for block in self._hashes(prompt):
            if block not in self._blocks:
                break
            self._blocks.move_to_end(block)
            found += 1
        cached = found * self.block_tokens
        self.cached_tokens += cached
        self.store(prompt)  # its prefill is under way: requests after it share it
        return cached

    def prefill_s(self, prompt: list[str], cached: int) -> float:
        """Seconds the uncached part of the prompt adds to the answer."""
        return self.prefill_s_per_token * (len(prompt) - cached)

    def store(self, tokens: list[str]) -> None:
        """Cache the full blocks of a conversation so far (prompt + reply), oldest out."""
        if not self.on:
            return
        for block in self._hashes(tokens):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def report(self, out: dict[str, Any], cached: int) -> None:
        """Write `cached` into an answer's usage, as vLLM does."""
        usage = out.get("usage")
        if self.on and isinstance(usage, dict):
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
