"""An agent loop of one's own (docs/policies.md#your-own-agent-loop): a math solver that asks
the model with a python tool, runs the programs it writes in the sandbox, hands it their
output and lets the env check its boxed answer. Every model call is recorded on the step,
token for token. Config: `policy: {type: python, entrypoint: "agent_policy:make_agent",
llm: {base_urls: [...], model: ...}}` with a math tag (e.g. `env_type: rg:basic_arithmetic`).
"""

from producers.tools.parsers import parse_hermes
from producers.tools.sandbox import run_python
from schemas.tools import PYTHON_SCHEMA, PythonLimits


class Solver:
    def __init__(self, max_calls: int = 3, timeout_s: float = 20.0):
        self.max_calls, self.limits = max_calls, PythonLimits(timeout_s=timeout_s)

    async def start(self, context):
        self.llm = context.llm  # the producer's server pool, one model call per chat()

    async def act(self, question, ctx):
        messages = [{"role": "system", "content": "Solve it. You may run python."},
                    {"role": "user", "content": str(question)}]
        for n in range(self.max_calls):  # chat() appends each reply to messages
            turn = await self.llm.chat(messages, ctx, tools=[PYTHON_SCHEMA], tool_choice="none")
            calls = parse_hermes(turn.text, f"call_{ctx.turn}_{n}").calls
            if not calls or n + 1 == self.max_calls:
                return None, turn  # the env reads the answer out of the last reply
            for call in calls:
                result = await run_python(str(call.arguments.get("code", "")), self.limits)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": result.for_model()})


def make_agent(**kwargs):
    return Solver(**kwargs)
