"""Agent policies of the tests (`policy.llm`, producers/policies/agent.py), loaded by
entrypoint (`tests/agent_policies.py:make_reconsider`)."""

from __future__ import annotations

from typing import Any


class Reconsider:
    """Each step: the episode's conversation asks for a move, then asks "are you sure?" on the
    same list (the second call extends the first), with `subcall` a one-off call on a fresh
    list in between (its own conversation). `fail_after` raises after that many calls of
    the first step (a failed act)."""

    def __init__(self, subcall: bool = False, fail_after: int = 0):
        self.subcall, self.fail_after = subcall, fail_after

    async def start(self, context: Any) -> None:
        self.llm = context.llm

    async def act(self, observation: Any, ctx: Any) -> Any:
        instruction = str(getattr(ctx.env.unwrapped, "instruction", "") or "Play FrozenLake.")
        messages = ctx.scratch.setdefault("messages", [{"role": "system",
                                                        "content": instruction}])
        asked = len(messages)
        try:
            messages.append({"role": "user", "content": str(observation)})
            await self.llm.chat(messages, ctx)
            if self.fail_after == 1:
                raise RuntimeError("failed after one call")
            if self.subcall:
                await self.llm.chat([{"role": "system", "content": instruction},
                                     {"role": "user", "content": str(observation)}], ctx,
                                    temperature=0.0)
            messages.append({"role": "user", "content": f"{observation}\nAre you sure? "
                                                        "Answer again."})
            final = await self.llm.chat(messages, ctx, max_tokens=48)
        except BaseException:  # no half turn: the conversation as it was
            del messages[asked:]
            raise
        return None, final


def make_reconsider(**kwargs: Any) -> Reconsider:
    return Reconsider(**kwargs)
