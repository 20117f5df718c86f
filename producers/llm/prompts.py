"""Each turn's prompt, rendered as ROLL's env manager of the tag renders it.

Facts from alibaba/ROLL 8eb27cc2, roll/pipeline/agentic/env_manager/ (the `format_messages` of
each class); the tag's `env_manager_cls` picks one (`AgentPrompt.manager`):

- `traj` (TrajEnvManager): one conversation per episode, kept in `ctx.scratch`. First turn:
  a system message (`agent_system_template`; none when it is null), then a user message that
  opens with the env's instruction and a newline. Every turn's user message is
  `agent_template` filled with `observation`, `turn_idx` (step + 1), `suffix` (the `suffix`
  the env's last reset or step put in its info; "" when none), `actions_left` (max_steps -
  step) and `max_response_length` (the tag's `max_tokens_per_step`). The assistant's replies
  stay in the conversation (the policy appends them).
- `step` (StepEnvManager, GiGPO): a fresh prompt each turn: the system message (none when
  null) and one user message, `agent_template` filled with `env_instruction` (every turn),
  `history`, `step_count` (steps taken), `history_length` (steps shown), `current_step`
  (step + 1), `current_observation` and `max_response_length`. The window is ROLL's
  `history[-history_length:-1]`: the last `history_length - 1` steps (none without
  `history_length`). Each shown step is `(step: N, observation: O, action: A, reward: R)`,
  joined by ", "; A is the step's `action_content` (ROLL's envs put the text their pattern
  captured in the info; "" for a reply it did not match), else the reply, with ROLL's tip
  appended when the action was not valid. ROLL at 8eb27cc2 lists only the steps whose action
  was not valid (an indentation change in refactor 7119efe3); its GiGPO version listed every
  step, and so does rollstream (docs/decisions/config.md).
- `step_concat` (StepConcatEnvManager, GEM): as `step`, with `history` the shown steps'
  observations joined by newlines and `current_observation` the observation, a newline and
  the info's `suffix`.
- `agent_native` (AgentNativeStepEnvManager), and any env that builds its own chat
  (`system_prompt()`, `user_prompt(observation, turn)`: sokoban_native_env): the env's
  messages, one conversation per episode; the templates go unused.

A prompt is built from what the turn's `StepContext` carries: the observation, `info` (the
reset's or the last step's) and `steps` (the episode's steps so far, as recorded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from producers.policies.protocol import StepContext
from schemas.envspec import AgentPrompt

CHAT_KEY = "chat"  # the scratch entry holding a conversation (traj, agent_native)
INSTRUCTION_KEY = "env_instruction"  # the scratch entry holding the reset's env_instruction
# ROLL's words after a shown step whose action was not valid (step_env_manager.py)
INVALID_TIP = ("(IMPORTANT TIPS: this action is not valid, your new response *must* strictly "
               "adhere to the format according to env instructions.)")

Messages = list[dict[str, str]]


def render(ctx: StepContext, observation: Any, prompt: AgentPrompt,
           max_response_length: int) -> Messages:
    """This turn's messages, as the tag's env manager renders them (see the module
    docstring). A conversation (traj, agent_native) is the scratch's list with this turn's
    user message appended; a step manager's prompt is a new list every turn."""
    env = ctx.env.unwrapped
    if callable(getattr(env, "user_prompt", None)):
        return _native(ctx, observation, env)
    renderer = RENDERERS.get(prompt.manager)
    if renderer is None:
        raise ValueError(f"env manager {prompt.manager!r} has no rendering (known: "
                         f"{', '.join(RENDERERS)}, agent_native)")
    return renderer(ctx, observation, prompt, max_response_length)


def _traj(ctx: StepContext, observation: Any, prompt: AgentPrompt,
          max_response_length: int) -> Messages:
    env = ctx.env.unwrapped
    messages: Messages | None = ctx.scratch.get(CHAT_KEY)
    if messages is None:
        messages = ctx.scratch[CHAT_KEY] = _system(prompt)
    max_steps = getattr(env, "max_steps", None)
    if max_steps is None and ctx.env.spec is not None:
        max_steps = ctx.env.spec.max_episode_steps
    actions_left = max(int(max_steps) - ctx.turn, 0) if max_steps else "unknown"
    content = prompt.template.format(
        observation=observation, turn_idx=ctx.turn + 1, suffix=_suffix(ctx),
        actions_left=actions_left, max_response_length=max_response_length)
    instruction = env_instruction(ctx) if ctx.turn == 0 else ""
    if instruction:
        content = f"{instruction}\n{content}"
    messages.append({"role": "user", "content": content})
    return messages


def _step(ctx: StepContext, observation: Any, prompt: AgentPrompt,
          max_response_length: int) -> Messages:
    window = history_window(ctx, prompt.history_length)
    first = ctx.turn - len(window)  # the index of the first shown step
    shown = [f"(step: {first + i + 1}, observation: {step['observation']}, "
             f"action: {shown_action(ctx, step)}, reward: {step['reward']})"
             for i, step in enumerate(window)]
    content = prompt.template.format(
        env_instruction=env_instruction(ctx), history=", ".join(shown), step_count=ctx.turn,
        history_length=len(window), current_step=ctx.turn + 1,
        current_observation=observation, max_response_length=max_response_length)
    return [*_system(prompt), {"role": "user", "content": content}]


def _step_concat(ctx: StepContext, observation: Any, prompt: AgentPrompt,
                 max_response_length: int) -> Messages:
    window = history_window(ctx, prompt.history_length)
    content = prompt.template.format(
        history="\n".join(str(step["observation"]) for step in window),
        current_observation=f"{observation}\n{_suffix(ctx)}")
    return [*_system(prompt), {"role": "user", "content": content}]


def _native(ctx: StepContext, observation: Any, env: Any) -> Messages:
    messages: Messages | None = ctx.scratch.get(CHAT_KEY)
    if messages is None:
        messages = ctx.scratch[CHAT_KEY] = [{"role": "system", "content": env.system_prompt()}]
    messages.append({"role": "user", "content": env.user_prompt(observation, ctx.turn)})
    return messages


RENDERERS: dict[str, Callable[[StepContext, Any, AgentPrompt, int], Messages]] = {
    "traj": _traj, "step": _step, "step_concat": _step_concat}


def _system(prompt: AgentPrompt) -> Messages:
    """The system message, or none when the tag's template is null."""
    if prompt.system_template is None:
        return []
    return [{"role": "system", "content": prompt.system_template}]


def _suffix(ctx: StepContext) -> str:
    """ROLL's `suffix`: what the env's reset (first turn) or last step put in its info."""
    suffix = ctx.info.get("suffix")
    return "" if suffix is None else str(suffix)


def env_instruction(ctx: StepContext) -> str:
    """The env's instruction: `env_instruction` of the reset's info (ROLL's envs give it
    there; kept for the later turns of a step manager), else the env's `instruction`."""
    if ctx.turn == 0 and "env_instruction" in ctx.info:
        ctx.scratch[INSTRUCTION_KEY] = str(ctx.info["env_instruction"])
    if INSTRUCTION_KEY in ctx.scratch:
        return str(ctx.scratch[INSTRUCTION_KEY])
    return str(getattr(ctx.env.unwrapped, "instruction", "") or "")


def history_window(ctx: StepContext, history_length: int | None) -> list[dict[str, Any]]:
    """The steps a step manager shows: ROLL's `history[-history_length:-1]` over the steps so
    far and the current one, so at most `history_length - 1` steps; none without it."""
    if not history_length:
        return []
    steps = ctx.steps
    return steps[max(0, len(steps) + 1 - history_length):]


def shown_action(ctx: StepContext, step: dict[str, Any]) -> str:
    """A shown step's action as ROLL writes it: the `action_content` of its info (or what the
    env's pattern captured of the reply), else the reply; ROLL's tip when it was not valid."""
    info = step.get("info") or {}
    reply = step.get("response")
    if "action_content" in info:
        action = str(info["action_content"])
    else:
        content = getattr(ctx.env.unwrapped, "action_content", None)
        action = str(content(reply)) if callable(content) and isinstance(reply, str) \
            else str(reply if reply is not None else step.get("action"))
    if not info.get("action_is_valid", True):
        action += INVALID_TIP
    return action
