"""The `openai` policy: an LLM behind one or more OpenAI-compatible servers (vLLM, SGLang, a
router) plays the envs through chat completions.

Each episode is one conversation in ROLL's agentic format (see `producers.llm.chat`), built
from the tag's `agent_system_template`, `agent_template` and `max_tokens_per_step`. Each
turn returns a `Turn`: the reply text (the env parses it with its `action_pattern`), the prompt
and response token ids and logprobs as the server produced them (None where the server does
not return them), `finish_reason`, the server that answered, its latency, and the weight
version that generated it. Each turn samples with its mode's settings (`policy.sampling`:
ROLL's train and val `generating_args`) and ROLL's token cap (`producers.llm.sampling`).

Weight versions: the trainer records in `{RUN}:servers` which version each server holds
(`consumer.ModelServers`). The policy reads that hash when the run's version moves (before
its first turn at the new version, one read for all the producer's envs) and every
`SERVERS_POLL_S` (every poll interval while a turn waits for a version), and a turn then names
the model that holds it (a vLLM LoRA adapter per version). A turn records the version the
server reports (SGLang's `weight_version`; source `server`), else the one recorded for the
server that answered (`recorded`), else the producer's (`producer`); a server that lost the
weights it is recorded with (restarted) is set aside by the pool, never labelled. With
`require_version` a turn goes only to a server holding at least the weights of the step its
train episode belongs to (`create(k)`, so the trajectory is at most `async_generation_ratio`
versions stale when handed out; a val turn: `run version - ratio`), and waits while none
does. A turn the server aborted raises
`TurnAborted` (the producer sends it again through its gate), except with
`policy.partial_rollout.in_flight: resume` and token-in/token-out, where it is continued from
the ids its answer carried (`_resume`, `producers.llm.tito.Resumed`); a turn cut short leaves
the conversation as it was.

With `policy.tokenizer` the turns are token-in/token-out (`producers.llm.tito`): the
producer applies the model's chat template, sends the prompt's ids to `/completions`, and
extends each next turn with the ids the model sampled; a tag with tools too: the template
renders its tools, the tag's text parser reads the calls, and each tool round extends the
last by its sampled ids and the tool messages (`producers.llm.tito`, `producers.tools.loop`).

The API key is read at `start()` from the environment variable `api_key_env` names and sent
as `Authorization: Bearer`; it is never logged and never leaves the process otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from producers import metrics
from producers.lifetime import cancel_and_wait
from producers.llm.labels import label_version
from producers.llm.routing import session_key
from producers.llm.sampling import for_turn
from producers.policies.protocol import PolicyContext, StepContext, Turn
from producers.tools.loop import ToolLoop, Tools, request_fields, tools_of
from schemas.envspec import DEFAULT_AGENT_SYSTEM_TEMPLATE, DEFAULT_AGENT_TEMPLATE, AgentPrompt
from schemas.errors import PolicyError, TurnAborted
from schemas.policy import OpenAIPolicyConfig, ServerRecord, read_server_record
from schemas.protocol import Schedule

logger = logging.getLogger(__name__)

# The cyclic GC's default gen-0 threshold (700) makes it run every few requests with
# thousands of replies in flight; measured with 1,000 in flight: 0.47 ms of client CPU per
# request at 700, 0.34 ms at 50,000 (bench/bench_llm.py --compare-clients).
GC_GEN0_THRESHOLD = 50_000
_DEFAULT_PROMPT = AgentPrompt(DEFAULT_AGENT_SYSTEM_TEMPLATE, DEFAULT_AGENT_TEMPLATE)  # an env
# built without `build_env` (no tag)
ABORT_WARN_S = 30.0  # a server that has aborted every turn this long is warned about
SERVERS_POLL_S = 1.0  # `{RUN}:servers` is read at least this often (and on a version change)
Request = Callable[[Any, int | None], dict[str, Any]]  # (prompt ids: None, or an int32 array
# or a list; max_tokens) -> a request's body (`OpenAIPolicy.sample`)
RESUME_WAIT_S = 0.2  # `in_flight: resume`: a continuation aborted with no new token waits
# this long before the next (a server that aborts what comes while it loads)


def sampled_ids(turn: Turn) -> Any:
    """A token-in/token-out turn's response ids (an int32 array, which the next prompt
    extends: `producers.llm.tito.extend`)."""
    assert turn.response_ids is not None  # from the server, else from the tokenizer
    return turn.response_ids


class OpenAIPolicy:
    """See the module docstring. Built by `make_policy` from an `OpenAIPolicyConfig`."""

    def __init__(self, config: OpenAIPolicyConfig):
        try:
            from producers.llm import chat
            from producers.llm.pool import ServerPool
        except ImportError as exc:  # aiohttp and orjson come with the llm extra
            raise PolicyError(f"policy.type openai needs the llm extra (pip install "
                              f"'rollstream[llm]'): {exc}") from None
        self.config = config
        self._chat = chat
        self._pool_class = ServerPool
        self.pool: Any = None
        self._gc_threshold: tuple[int, ...] | None = None  # to restore at close
        self._context: PolicyContext | None = None
        self._ratio = 0  # the run's staleness bound (require_version)
        self._train: Schedule | None = None  # the run's train schedule (require_version)
        self._view_version = -1  # the run version `{RUN}:servers` was last read at
        self._reading: asyncio.Future[None] | None = None  # the read of it under way
        self._follower: asyncio.Task[None] | None = None
        self._bad_records: set[str] = set()  # unreadable `{RUN}:servers` fields, warned once
        # server -> (first abort of the streak, aborts since, warned): its turns keep aborting
        self._aborting: dict[str, tuple[float, int, bool]] = {}
        self._merging: set[str] = set()  # servers warned about merged logprob entries
        self._template: Any = None  # token-in/token-out: the model's chat template
        self._tito: Any = None  # producers.llm.tito when policy.tokenizer is set
        self._tools = ToolLoop()  # a tag's tool calls (producers/tools/loop.py)
        # continue a turn the server aborted from its tokens so far (policy.partial_rollout)
        self._resumes = config.partial_rollout.in_flight == "resume"

    async def start(self, context: PolicyContext | None = None) -> None:
        """Read the API key, open the HTTP session, check that a server serves the model,
        and with a `context` follow the versions the servers hold (`{RUN}:servers`)."""
        config = self.config
        api_key = None
        if config.api_key_env:
            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise PolicyError(f"policy.api_key_env: the environment variable "
                                  f"{config.api_key_env} is not set")
        if config.tokenizer is not None and self._template is None:
            from producers.llm import tito
            from producers.llm.template import ChatTemplate
            self._template, self._tito = ChatTemplate.load(config.tokenizer), tito
        threshold = gc.get_threshold()
        if threshold[0] < GC_GEN0_THRESHOLD:
            self._gc_threshold = threshold
            gc.set_threshold(GC_GEN0_THRESHOLD, *threshold[1:])
        self.pool = self._pool_class(config.base_urls, api_key=api_key,
                                     timeout_s=config.timeout_s, max_retries=config.max_retries,
                                     max_inflight=config.max_inflight, model=config.model,
                                     resolve_wait_s=config.resolve_timeout_s,
                                     sticky=config.routing == "sticky",
                                     load_factor=config.session_load_factor,
                                     session_header=config.session_header)
        await self.pool.start()
        try:
            # what the trainer loaded: SGLang serves a loaded checkpoint under its path
            records = await self._records(context) if context is not None else None
            await self.pool.check_model(config.model, records)
        except BaseException:
            await self.close()
            raise
        if context is not None:
            self._context = context
            self._ratio = context.config.ratio
            self._train = Schedule(context.config.episodes_per_step("train"), self._ratio)
            self._follower = asyncio.create_task(self._follow_servers(context.poll_interval_s))
        logger.info("openai policy: model %r on %d server(s)", config.model,
                    len(self.pool.servers))

    async def close(self) -> None:
        if self._follower is not None:
            await cancel_and_wait(self._follower)
            self._follower = None
        if self.pool is not None:
            await self.pool.close()
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None

    def _min_version(self, ctx: StepContext) -> int:
        """The oldest weights a turn may come from (`require_version`): a train turn, those of
        its episode's step (at most the run's version), so the trajectory is at most `ratio`
        versions stale when handed out; `run version - ratio` was one step short for the
        episodes a new version admits."""
        if ctx.mode == "train" and self._train is not None:
            return self._train.create_step(ctx.episode_id)
        return ctx.version - self._ratio

    def servers_down(self) -> dict[str, str]:
        """The model servers this producer has set aside now: base URL -> why (shown by
        `rollstream status`)."""
        return self.pool.servers_down() if self.pool is not None else {}

    async def act(self, observation: Any, ctx: StepContext) -> tuple[Any, Turn]:
        config, chat = self.config, self._chat
        if ctx.version > self._view_version and self._context is not None:
            await self._read_servers_at(ctx.version)  # what the servers hold after a publish
        env = ctx.env.unwrapped
        prompt: AgentPrompt = getattr(env, "agent_prompt", None) or _DEFAULT_PROMPT
        sampled = for_turn(config.sampling, ctx.mode, prompt.max_tokens_per_step)
        messages = chat.messages_for_turn(ctx, observation, prompt, sampled.max_response_length)
        tools = tools_of(env, self._tito is not None)  # the tag's (producers/tools/loop.py)
        tito = self._tito if tools is None else self._tito_for_tools(ctx, tools)
        extra_body = ({**config.extra_body, **request_fields(*tools)}
                      if tools is not None and tito is None else config.extra_body)
        # a turn's tool rounds extend a copy of the conversation's ids (tito.for_rounds)
        conversation = ctx.scratch if tools is None or tito is None else tito.for_rounds(
            ctx.scratch)
        min_version = self._min_version(ctx) if config.require_version else None
        session = session_key(ctx.mode, ctx.group_id, ctx.episode_id)  # the group's episode
        asked = len(messages)
        answered: list[Any] = []  # the pool's answer of the last reply
        prompt_ids: list[Any] = [None]  # the last reply's prompt ids (tito: an int32 array)

        async def generate() -> tuple[Turn, Any]:
            """One reply to `messages` as they are now."""
            ids = None
            if tito is not None:  # token-in/token-out: the template applied here
                ids = tito.prompt_ids(self._template, conversation, messages,
                                      None if tools is None else tools[1])
            prompt_ids[0] = ids

            def request(prompt: Any, cap: int | None) -> dict[str, Any]:
                return self._body(messages, prompt, sampled.fields(cap), ctx, extra_body)

            turn, answer = await self.sample(request, ids, sampled, ctx, min_version, session)
            answered[:] = [answer]
            if tools is not None:  # a tool round is recorded as it is (model_calls)
                label_version(turn, answer, ctx.version, self._context is not None)
            return turn, answer.data

        def replied(turn: Turn) -> None:  # a tool round's ids: the next prompt extends them
            if tito is not None and prompt_ids[0] is not None:
                tito.remember(conversation, messages, prompt_ids[0], sampled_ids(turn))

        try:
            turn, data = await generate()
            if tools is not None:
                turn = await self._tools.play(env, ctx, messages, turn, data, generate,
                                              tools=tools, replied=replied)
        except BaseException:  # cut short, aborted or failed: no half turn stays behind
            del messages[asked - 1:]
            raise
        answer = answered[0]
        if self._aborting:
            self._aborting.pop(answer.server.base_url, None)
        label_version(turn, answer, ctx.version, self._context is not None)
        messages.append({"role": "assistant", "content": turn.text})
        ids = prompt_ids[0]
        if ids is not None and tito is not None:  # the next turn extends these ids
            tito.remember(ctx.scratch, messages, ids, sampled_ids(turn))
        parse = getattr(env, "parse_action", None)
        action = parse(turn.text) if parse is not None else None
        return (-1 if action is None else action), turn

    async def sample(self, request: Request, ids: Any, sampled: Any,
                     ctx: StepContext, min_version: int | None, session: str
                     ) -> tuple[Turn, Any]:
        """One reply, as a `Turn` and the pool's answer: `request(prompt_ids, max_tokens)`
        builds its body (`ids` None: a chat request; `max_tokens` None: the sampling's own
        cap). Asked again with a smaller cap when ROLL's `sequence_length` says so; a turn
        the server aborted is resumed from its ids (`in_flight: resume`, token-in/token-out),
        else raised as `TurnAborted`. The policy's turns and its tool rounds, and the calls
        of an agent's `context.llm` (`producers.policies.agent`), all go through here."""
        answer = await self.pool.chat(request(ids, None), min_version=min_version,
                                      session=session)
        refit = sampled.refit(answer.data)  # ROLL's sequence_length (llm/sampling.py)
        spent = 0.0  # requests of this turn before the answer (a refit's first)
        if refit is not None:
            spent = answer.latency_s
            answer = await self.pool.chat(request(ids, refit), min_version=min_version,
                                          session=session)
        if ids is not None:
            turn = self._tito.turn_from_completion(answer.data, ids, self._template)
        else:
            turn = self._chat.turn_from_answer(answer.data)
        if turn.logprobs is None:
            self._merged(answer.server.base_url, answer.data)
        if turn.finish_reason == "abort":  # a weight update aborted it
            self._aborted(answer.server.base_url)
            if not (self._resumes and ids is not None and _resumable(turn)):
                raise TurnAborted(f"model server {answer.server.base_url} aborted it",
                                  0 if turn.response_ids is None else len(turn.response_ids))
            turn, answer = await self._resume(turn, answer, ids, sampled, ctx, request,
                                              min_version, session, spent)
        turn.server = answer.server.base_url
        if turn.latency_s is None:  # (a resumed turn's is its pieces' sum)
            turn.latency_s = spent + answer.latency_s  # every request of the turn
        return turn, answer

    async def _resume(self, turn: Turn, answer: Any, ids: Any, sampled: Any,
                      ctx: StepContext, request: Request, min_version: int | None,
                      session: str, spent: float = 0.0) -> tuple[Turn, Any]:
        """`in_flight: resume`: continue the turn the server aborted from the ids its answer
        carried (`producers.llm.tito.Resumed`) until an answer finishes it; the whole turn
        and that answer. Another abort is resumed too; one whose ids come from the
        tokenizer, not the server, cannot be (`TurnAborted`, every piece discarded); a
        continuation cut short or failed discards the pieces (counted, `aborted`). The
        turn's `latency_s` is the sum of its pieces' requests (and `spent`, of requests before
        the first piece: a refit's first)."""
        resumed = self._tito.Resumed.start(ids)
        resumed.add(turn, *_fallback_version(answer, ctx))
        spent += answer.latency_s
        try:
            while True:
                left = resumed.left(sampled.fields()["max_tokens"])
                if left <= 0:  # aborted after its last token: the turn is whole
                    last = Turn(text="", response_ids=[], logprobs=[], finish_reason="length",
                                latency_s=spent)
                    return resumed.finish(last, *_fallback_version(answer, ctx)), answer
                prompt = resumed.next_prompt()
                answer = await self.pool.chat(request(prompt, left), min_version=min_version,
                                              session=session)
                refit = sampled.refit(answer.data)
                if refit is not None:
                    answer = await self.pool.chat(request(prompt, min(refit, left)),
                                                  min_version=min_version, session=session)
                piece = self._tito.turn_from_completion(answer.data, prompt, self._template)
                spent += answer.latency_s
                if piece.finish_reason != "abort":
                    piece.latency_s = spent
                    return resumed.finish(piece, *_fallback_version(answer, ctx)), answer
                self._aborted(answer.server.base_url)
                if not _resumable(piece):
                    raise TurnAborted(f"model server {answer.server.base_url} aborted it",
                                      len(resumed.ids) + len(piece.response_ids or ()))
                resumed.add(piece, *_fallback_version(answer, ctx))
                if not len(piece.response_ids):  # aborted at once (loading): not in a loop
                    await asyncio.sleep(RESUME_WAIT_S)
        except TurnAborted:
            raise
        except BaseException:
            if resumed.ids:  # what the aborted answers had sampled: thrown away
                metrics.tokens_discarded(ctx.mode, "aborted", len(resumed.ids))
            raise

    def _body(self, messages: list[dict[str, str]], ids: Any,
              sampling: dict[str, Any], ctx: StepContext,
              extra_body: dict[str, Any]) -> dict[str, Any]:
        """A turn's request: chat messages, or with `policy.tokenizer` the prompt's ids."""
        config, seed = self.config, self._chat.turn_seed(ctx)
        if ids is not None:
            return self._tito.request_body(config.model, ids, sampling=sampling, seed=seed,
                                           extra_body=extra_body)
        return self._chat.request_body(config.model, messages, sampling=sampling, seed=seed,
                                       extra_body=extra_body)

    def _tito_for_tools(self, ctx: StepContext, tools: Tools) -> Any:
        """A tag with tools goes token-in/token-out with `policy.tokenizer` (its calls read
        from the sampled text by its text parser), else by chat requests. `parser: server`
        there is refused by the config check; a policy built without one is told here."""
        if self._tito is not None and tools[0].parser == "server":
            raise PolicyError(f"custom_envs.{ctx.tag}.tools.parser: server reads the server's "
                              "parsed tool calls, which token-in/token-out turns "
                              "(policy.tokenizer) do not have")
        return self._tito

    def _merged(self, server: str, data: dict[str, Any]) -> None:
        """One warning per server whose logprob entries do not match its tokens (see
        `producers.llm.chat.merged_entries`): such turns carry no ids or logprobs."""
        merged = self._chat.merged_entries(data)
        if merged is None:
            return
        metrics.llm_error(server, "merged_logprobs")
        if server in self._merging:
            return
        self._merging.add(server)
        logger.warning("model server %s gave %d logprob entries for %d generated tokens (it "
                       "merges the tokens of a character split across tokens, as llama-server "
                       "does): such turns carry no token ids or logprobs", server, *merged)

    def _aborted(self, server: str) -> None:
        """One more turn `server` aborted; one warning once it has aborted every turn for
        `ABORT_WARN_S` (a weight load takes seconds: a server aborting for longer is stuck
        loading, or aborts everything)."""
        metrics.llm_error(server, "aborted")
        now = time.monotonic()
        since, count, warned = self._aborting.get(server, (now, 0, False))
        count += 1
        if not warned and now - since >= ABORT_WARN_S:
            warned = True
            logger.warning("model server %s has aborted every turn for %.0fs (%d turns, "
                           "finish_reason abort): still loading weights, or refusing work; "
                           "the turns are sent again", server, now - since, count)
        self._aborting[server] = (since, count, warned)

    # -- the versions the servers hold ---------------------------------------------------
    async def _read_servers_at(self, version: int) -> None:
        """Read `{RUN}:servers` once the run is at `version` (one read for all the envs)."""
        while self._view_version < version:
            reading = self._reading
            if reading is None:
                reading = self._reading = asyncio.ensure_future(self._read_for(version))
            await asyncio.shield(reading)  # a turn cut short leaves the read to the others

    async def _read_for(self, version: int) -> None:
        try:
            await self._read_servers()
        finally:
            self._view_version = max(self._view_version, version)
            self._reading = None

    async def _follow_servers(self, poll_interval_s: float) -> None:
        """Read `{RUN}:servers` every `SERVERS_POLL_S`, every poll interval while turns wait
        for a server to hold their version."""
        while True:
            waiting = self.pool is not None and self.pool.version_waiting > 0
            await asyncio.sleep(poll_interval_s if waiting else SERVERS_POLL_S)
            await self._read_servers()

    async def _read_servers(self) -> None:
        """Tell the pool the version (and model name) each server holds; a Redis error
        keeps what was known (logged)."""
        context = self._context
        if context is None or self.pool is None:
            return
        records = await self._records(context)
        if records is not None:
            self.pool.set_versions(records)

    async def _records(self, context: PolicyContext) -> dict[str, ServerRecord] | None:
        """`{RUN}:servers` by base URL; None when Redis cannot be read (logged)."""
        try:
            raw = await context.redis.hgetall(context.keys.servers)
        except RedisError as exc:
            logger.warning("cannot read %s (%s); turns go on with the versions known",
                           context.keys.servers, exc)
            return None
        records: dict[str, ServerRecord] = {}
        for field, value in raw.items():
            url = field.decode() if isinstance(field, bytes) else str(field)
            record = read_server_record(value)
            if record is not None:
                records[url.rstrip("/")] = record
            elif url not in self._bad_records:
                self._bad_records.add(url)
                logger.warning("%s has an unreadable entry for %s: %r", context.keys.servers,
                               url, value)
        return records


def _resumable(turn: Turn) -> bool:
    """An aborted answer a turn can resume from: its ids are the server's (ids encoded from
    its text would retokenize what was sampled)."""
    return turn.extra.get("response_ids_source") == "server"


def _fallback_version(answer: Any, ctx: StepContext) -> tuple[int, str]:
    """The version of an answer whose own labels say nothing: the one recorded for the
    server that gave it, else the producer's."""
    recorded = answer.version
    return (ctx.version, "producer") if recorded is None else (int(recorded), "recorded")
