"""A turn's sampling as ROLL applies it: the mode's settings, the token cap, the length limit.

Each turn samples with `policy.sampling.mode(mode)` (train or val: ROLL's env managers'
`generating_args`, see `schemas.sampling`), and its new tokens are capped as ROLL's env
managers cap them (`make_decision` in roll/pipeline/agentic/env_manager/traj_env_manager.py,
step_env_manager.py and agent_native_env_manager.py, alibaba/ROLL 8eb27cc2):

    max_new_tokens = min(max_tokens_per_step, generating_args.max_new_tokens,
                         sequence_length - prompt tokens)

and a turn whose prompt has reached `sequence_length` is not generated: the episode ends
there (ROLL's stop reason MAX_LENGTH), with the turns it played.

ROLL tokenizes the prompt before it generates; a producer learns a prompt's length from the
server's answer (`usage.prompt_tokens`). So a turn is sent capped at
`min(max_tokens_per_step, max_new_tokens, sequence_length)` and checked when it comes back
(`TurnSampling.refit`): a prompt at `sequence_length` or past it ends the episode
(`ContextFull`, counted as the context-window ends are); a reply longer than
`sequence_length - prompt tokens` is asked again with that cap (the same request and seed: the
reply ROLL would have got, cut where ROLL cuts it). That second request happens only on the
turn that reaches the limit. A server that reports no prompt length (no `usage`, no prompt
ids) is trusted with the first cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.errors import ContextFull
from schemas.sampling import Sampling, SamplingConfig


@dataclass(frozen=True)
class TurnSampling:
    """One turn's sampling: the mode's settings, the token cap, the length limit."""

    sampling: Sampling
    max_tokens: int  # min(max_tokens_per_step, max_new_tokens): ROLL's cap before the length
    sequence_length: int | None  # prompt and reply together at most this many tokens
    max_response_length: int  # what the prompt's {max_response_length} says: the tag's
    # max_tokens_per_step (ROLL's), else the mode's max_new_tokens

    def fields(self, max_tokens: int | None = None) -> dict[str, Any]:
        """The request body's sampling fields (the server's defaults are left out: top_k
        off, no stop strings, repetition_penalty 1)."""
        s = self.sampling
        cap = self.max_tokens if self.sequence_length is None else min(self.max_tokens,
                                                                       self.sequence_length)
        out: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p,
                               "max_tokens": cap if max_tokens is None else max_tokens}
        if s.top_k > 0:
            out["top_k"] = s.top_k
        if s.stop:
            out["stop"] = list(s.stop)
            if s.include_stop_str_in_output is not None:
                out["include_stop_str_in_output"] = s.include_stop_str_in_output
        if s.repetition_penalty != 1.0:
            out["repetition_penalty"] = s.repetition_penalty
        return out

    def refit(self, answer: dict[str, Any]) -> int | None:
        """After the server answered: `ContextFull` when the prompt had reached
        `sequence_length`; the smaller cap to ask again with when the reply is longer than
        `sequence_length - prompt tokens`; None when the answer stands."""
        if self.sequence_length is None:
            return None
        prompt = prompt_tokens(answer)
        if prompt is None:
            return None
        if prompt >= self.sequence_length:
            raise ContextFull(f"sequence_length {self.sequence_length} reached: the prompt "
                              f"has {prompt} tokens")
        allowed = min(self.max_tokens, self.sequence_length - prompt)
        completion = completion_tokens(answer)
        if completion is not None and completion > allowed:
            return allowed
        return None


def for_turn(config: SamplingConfig, mode: str, max_tokens_per_step: int | None) -> TurnSampling:
    """The sampling of a turn in `mode` (train or val) for a tag with `max_tokens_per_step`
    (None: the mode's max_new_tokens alone)."""
    sampling = config.mode(mode)
    cap = sampling.max_new_tokens
    if max_tokens_per_step is not None:
        cap = min(cap, max_tokens_per_step)
    shown = sampling.max_new_tokens if max_tokens_per_step is None else max_tokens_per_step
    return TurnSampling(sampling, cap, config.sequence_length, shown)


def prompt_tokens(answer: dict[str, Any]) -> int | None:
    """The prompt's length as the server counted it: `usage.prompt_tokens`, else the prompt
    ids it returned (vLLM's top level, SGLang's per choice); None when it says neither."""
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        return int(usage["prompt_tokens"])
    ids = answer.get("prompt_token_ids")
    if ids is None:
        ids = _choice(answer).get("prompt_token_ids")
    return len(ids) if isinstance(ids, list) else None


def completion_tokens(answer: dict[str, Any]) -> int | None:
    """The reply's length: `usage.completion_tokens`, else its token ids, else None."""
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    choice = _choice(answer)
    ids = choice.get("token_ids", choice.get("response_token_ids"))
    return len(ids) if isinstance(ids, list) else None


def _choice(answer: dict[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}
