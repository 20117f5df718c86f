"""A stand-in for an OpenAI-compatible LLM server, for tests, benchmarks and trying the
pipeline without a GPU: `rollstream fake-llm --port 8000`, then `base_urls:
[http://127.0.0.1:8000/v1]`.

It speaks the subset a producer uses, shaped as vLLM shapes it: `POST /v1/chat/completions`
(non-streaming; `usage`, `logprobs.content[j].logprob`, and with `return_token_ids: true`
the top-level `prompt_token_ids` and `choices[i].token_ids`), `GET /v1/models`, `GET /health`.
Weight updates as a trainer drives them: SGLang's `POST /update_weights_from_disk`
(`model_path`, `weight_version`; the version is reported in each response's
`metadata.weight_version`, as SGLang's chat completions do: "default" until set) and vLLM's
runtime LoRA adapters (`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`; a request
names an adapter as its `model`). While weights load (`load_time_s`), requests in flight end
with `finish_reason: "abort"` and new ones wait (or are aborted too).

The "model" is scripted: it reads the game, its symbols and actions from the env's
instruction (in ROLL's layout, wherever the prompt puts it: the first user message, or the
system message of an env that builds its own chat) and the grid from the last user message,
and plays a good move with
probability `p_good` (FrozenLake: a shortest-path step to the goal around the holes; Sokoban:
a move that does not walk into a wall or push a box into one), else a random action or a
malformed reply (no answer tag). Temperature 0 always plays the good move. The choice is
seeded by the request body, so the same request gets the same reply. Tokens come from a
small deterministic tokenizer (pieces hashed to ids) and a Qwen-like chat template whose
prompts extend the previous prompt and reply token for token; `drop_thinking` removes earlier
`<think>` blocks, as Qwen3's template does, which breaks that.

Latency is lognormal (`latency_s * exp(latency_sigma * z)`). Faults: 500s, hangs and dropped
connections at a rate, or exactly the next N requests (`POST /admin/faults {"kind", "count"}`,
or `FakeLLMServer.fail_next`). `GET /admin/stats` counts requests in flight, completed,
closed by the client before the answer, aborted and faulted. For tests, `hold(marker)` keeps
the requests whose body carries `marker` in flight until `release()` (a weight update aborts
them, a client that leaves closes them), and `answers` lists what each answer said (request
seed, model, weight version, finish reason).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import hashlib
import logging
import math
import os
import random
import re
import signal
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from schemas.errors import ConfigError, RollstreamError

if TYPE_CHECKING:
    from aiohttp import web

logger = logging.getLogger(__name__)

FAULT_KINDS = ("500", "400", "hang", "drop", "bad_shape")
SPECIAL_IDS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
VOCAB_SIZE = 32_000
_PIECES = re.compile(r"<\|[a-z_]+\|>|\w+|\s+|[^\w\s]")
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
# the instruction's symbols and actions, under ROLL's heading lines (its envs' get_instructions)
_SYMBOLS_LINE = re.compile(r"The meaning of each symbol in the state is:\n(.*)")
_SYMBOLS = re.compile(r"(\S): ([a-z][a-z ]*)")
_ACTIONS = re.compile(r"Your available actions are:\n([A-Za-z]+(?:, [A-Za-z]+)+)")
_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_WORDS = ("the", "goal", "is", "near", "so", "I", "move", "carefully", "avoid", "the", "hole",
          "box", "wall", "step", "path", "next", "left", "down", "then", "check")


# -- tokenizer and chat template -------------------------------------------------------------
def pieces(text: str) -> list[str]:
    """The text cut into tokens: words, runs of spaces, single punctuation, special tokens."""
    return _PIECES.findall(text)


@functools.lru_cache(maxsize=1 << 16)
def token_id(piece: str) -> int:
    """A piece's id: fixed for special tokens, else a hash (the same in every process)."""
    special = SPECIAL_IDS.get(piece)
    if special is not None:
        return special
    return 100 + zlib.crc32(piece.encode()) % VOCAB_SIZE


def encode(text: str) -> list[int]:
    return [token_id(p) for p in pieces(text)]


@functools.lru_cache(maxsize=1 << 16)
def _message_pieces(role: str, content: str, drop_thinking: bool) -> tuple[str, ...]:
    """One rendered message (cached: every turn resends the earlier messages)."""
    if drop_thinking and role == "assistant":
        content = _THINK.sub("", content)
    return ("<|im_start|>", role, "\n", *pieces(content), "<|im_end|>", "\n")


def render_prompt(messages: list[dict[str, Any]], *, drop_thinking: bool = False) -> list[str]:
    """The prompt's tokens: `<|im_start|>role\\ncontent<|im_end|>\\n` per message, then the
    generation prompt `<|im_start|>assistant\\n`. A reply's tokens are its content's tokens
    and `<|im_end|>`, so each turn's prompt extends the previous prompt and reply, unless
    `drop_thinking` strips `<think>` blocks from earlier assistant messages."""
    out: list[str] = []
    for message in messages:
        role, content = str(message.get("role", "")), message.get("content") or ""
        if not isinstance(content, str):  # a list of content parts: their text
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        out += _message_pieces(role, content, drop_thinking)
    out += ["<|im_start|>", "assistant", "\n"]
    return out


# -- the scripted model ----------------------------------------------------------------------
@dataclass
class Board:
    """What the model read from the conversation: game, symbols, actions, grid."""

    game: str  # "frozenlake", "sokoban" or ""
    symbols: dict[str, str]  # cell kind -> symbol
    actions: list[str]
    grid: list[str]


def read_board(messages: list[dict[str, Any]]) -> Board:
    """The game as the conversation shows it: the instruction from the system message and
    the first user message, the grid from the last user message."""
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    instruction = "\n".join(str(m.get("content") or "") for m in messages
                            if m.get("role") == "system" or m is first_user)
    user = next((str(m.get("content") or "") for m in reversed(messages)
                 if m.get("role") == "user"), "")
    lowered = instruction.lower()
    game = ("frozenlake" if "frozenlake" in lowered or "frozen lake" in lowered
            else "sokoban" if "sokoban" in lowered else "")
    symbols: dict[str, str] = {}
    line = _SYMBOLS_LINE.search(instruction)
    if line:
        symbols = {name.strip().replace(" ", "_"): sym
                   for sym, name in _SYMBOLS.findall(line.group(1))}
    found = _ACTIONS.search(instruction)
    actions = found.group(1).split(", ") if found else ["Up", "Down", "Left", "Right"]
    return Board(game, symbols, actions, _last_grid(user, set(symbols.values())))


def _last_grid(text: str, alphabet: set[str]) -> list[str]:
    """The last run of >= 2 consecutive lines of equal length made of grid symbols."""
    best: list[str] = []
    run: list[str] = []
    for line in [*text.splitlines(), ""]:
        ok = bool(line) and bool(alphabet) and set(line) <= alphabet
        if ok and (not run or len(line) == len(run[0])):
            run.append(line)
            continue
        if len(run) >= 2:
            best = run
        run = [line] if ok else []
    return best


def _find(grid: list[str], symbols: Iterable[str]) -> tuple[int, int] | None:
    wanted = set(symbols)
    for r, row in enumerate(grid):
        for c, cell in enumerate(row):
            if cell in wanted:
                return r, c
    return None


def good_move(board: Board, rng: random.Random) -> str | None:
    """A sensible action for the board, or None when it cannot tell."""
    moves = [(name, _MOVES[name.lower()]) for name in board.actions if name.lower() in _MOVES]
    if not board.grid or not moves:
        return None
    if board.game == "frozenlake":
        return _lake_move(board, moves)
    if board.game == "sokoban":
        return _sokoban_move(board, moves, rng)
    return None


def _lake_move(board: Board, moves: list[tuple[str, tuple[int, int]]]) -> str | None:
    """The first step of a shortest path from the player to the goal around the holes."""
    s, grid = board.symbols, board.grid
    start = _find(grid, [s.get("player", "P")])
    goal = _find(grid, [s.get("goal", "G")])
    if start is None or goal is None:
        return None
    hole = s.get("hole", "O")
    first: dict[tuple[int, int], str] = {start: ""}
    queue = collections.deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return first[cell] or None
        for name, (dr, dc) in moves:
            nxt = (cell[0] + dr, cell[1] + dc)
            if (0 <= nxt[0] < len(grid) and 0 <= nxt[1] < len(grid[0]) and nxt not in first
                    and grid[nxt[0]][nxt[1]] != hole):
                first[nxt] = first[cell] or name
                queue.append(nxt)
    return None


def _sokoban_move(board: Board, moves: list[tuple[str, tuple[int, int]]],
                  rng: random.Random) -> str | None:
    """A move into free floor, or a push of a box onto free floor."""
    s, grid = board.symbols, board.grid
    player = _find(grid, [s.get("player", "P"), s.get("player_on_target", "S")])
    if player is None:
        return None
    free = {s.get("empty", "_"), s.get("target", "O")}
    boxes = {s.get("box", "X"), s.get("box_on_target", "√")}

    def cell(r: int, c: int) -> str:
        return grid[r][c] if 0 <= r < len(grid) and 0 <= c < len(grid[0]) else ""

    legal = []
    for name, (dr, dc) in moves:
        to = cell(player[0] + dr, player[1] + dc)
        if to in free or (to in boxes and cell(player[0] + 2 * dr, player[1] + 2 * dc) in free):
            legal.append(name)
    return rng.choice(legal) if legal else None


# -- the server ------------------------------------------------------------------------------
@dataclass
class FakeLLMOptions:
    """How the stand-in server behaves (all settable from the command line)."""

    model: str = "fake-model"
    p_good: float = 0.8  # probability of a good move at temperature > 0
    malformed_share: float = 0.5  # of the other replies, the share with no answer tag
    think_words: int = 6  # words of "reasoning" in each reply
    latency_s: float = 0.0  # median latency per request
    latency_sigma: float = 0.0  # lognormal spread of the latency
    error_rate: float = 0.0  # share of requests answered 500
    hang_rate: float = 0.0  # share of requests never answered (until the client leaves)
    drop_rate: float = 0.0  # share of requests whose connection is closed unanswered
    seed: int = 0
    token_ids: bool = True  # honour return_token_ids (False: an older server)
    drop_thinking: bool = False  # the template drops earlier <think> blocks (Qwen3-like)
    api_key: str | None = field(default=None, repr=False)  # required bearer token
    weight_version: str = "default"  # SGLang's name before any update (not a number: a
    # client takes no version from it)
    model_path: str = "fake/weights-0"
    load_time_s: float = 0.0  # a weight update takes this long
    during_load: str = "wait"  # new requests while loading: "wait" or "abort"
    max_model_len: int = 32768  # context window: a prompt plus max_tokens past it is refused
    # with vLLM's HTTP 400


@dataclass(eq=False)
class _Pending:
    """A request being answered: its wake-up (the latency timer, or an abort)."""

    done: asyncio.Future[str]
    timer: asyncio.TimerHandle | None = None


class FakeLLMServer:
    """The stand-in server. `start()` serves on a thread of its own (tests), `serve()` in the
    caller's loop (the command line). `stats`, `requests` and `fail_next` for tests."""

    def __init__(self, options: FakeLLMOptions | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, keep_requests: int = 1000):
        self.options = options or FakeLLMOptions()
        self.host, self.port = host, port
        self.stats: collections.Counter[str] = collections.Counter()
        self.requests: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=keep_requests)  # bodies of recent chat requests
        self.answers: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=keep_requests)  # seed, model, weight_version, finish_reason of each answer
        self._hold: bytes | None = None  # requests whose body carries this wait for release()
        self._held: set[_Pending] = set()
        self.adapters: dict[str, str] = {}  # LoRA adapter name -> path
        self._scripted: collections.deque[str] = collections.deque()
        self._marked: bytes | None = None  # requests carrying this are answered 502
        self._fault_rng = random.Random(self.options.seed ^ 0xFA17)
        self._pending: set[_Pending] = set()
        self._loaded: asyncio.Event | None = None  # cleared while weights load
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- public --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What a policy's `base_urls` takes."""
        return f"{self.url}/v1"

    @property
    def in_flight(self) -> int:
        return self.stats["in_flight"]

    @property
    def loading(self) -> bool:
        """A weight update is loading now."""
        return self._loaded is not None and not self._loaded.is_set()

    def fail_next(self, kind: str, count: int = 1) -> None:
        """Answer the next `count` chat requests with a fault: 500, 400, hang, drop, or
        bad_shape (HTTP 200, JSON that is no completion: `{"choices": ["x"]}`)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r} is not one of {', '.join(FAULT_KINDS)}")
        with self._lock:
            self._scripted.extend([kind] * count)

    def fail_marked(self, marker: bytes | str | None) -> None:
        """Answer every chat request whose body carries `marker` with HTTP 502 (a request the
        server cannot serve, whatever the retries); None: stop."""
        self._marked = marker.encode() if isinstance(marker, str) else marker

    def hold(self, marker: bytes | str = b"") -> None:
        """Keep the chat requests whose body carries `marker` (b"": every one) in flight
        until `release()` (`stats["held"]` counts them); a weight update aborts them and a
        client that leaves closes them, as with any request in flight."""
        self._hold = marker.encode() if isinstance(marker, str) else marker

    def release(self) -> None:
        """Stop holding; the held requests are answered now (after their latency)."""
        self._hold = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._release_held)

    def _release_held(self) -> None:
        for pending in list(self._held):
            _settle(pending, "done")

    def start(self) -> FakeLLMServer:
        """Serve on a daemon thread; returns once listening (`port` is then the real one)."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=main, daemon=True, name="fake-llm")
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        """Stop serving (the port refuses connections, open connections are closed). The same
        object can `start()` again on the same port: a server that comes back."""
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop = self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def serve(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Serve in the running loop until `stop` is set; `ready` is set once listening."""
        self._loop = asyncio.get_running_loop()
        await self._open()
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            await self._close()

    # -- lifecycle -----------------------------------------------------------------------
    async def _open(self) -> None:
        from aiohttp import web  # imported here: the command line stays quick without it

        _raise_fd_limit()
        self._loaded = asyncio.Event()
        self._loaded.set()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_post("/update_weights_from_disk", self._update_weights)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        app.router.add_post("/admin/faults", self._admin_faults)
        app.router.add_get("/admin/stats", self._admin_stats)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, backlog=4096)
        await site.start()
        server = getattr(site, "_server", None)
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        for pending in list(self._pending):
            _settle(pending, "stop")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- endpoints -----------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return _text("")

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _unauthorized()
        now = int(time.time())
        cards = [{"id": self.options.model, "object": "model", "created": now,
                  "owned_by": "vllm", "root": self.options.model_path, "parent": None,
                  "max_model_len": self.options.max_model_len}]
        cards += [{"id": name, "object": "model", "created": now, "owned_by": "vllm",
                   "root": path, "parent": self.options.model,
                   "max_model_len": self.options.max_model_len}
                  for name, path in self.adapters.items()]
        return _json({"object": "list", "data": cards})

    async def _model_info(self, request: web.Request) -> web.Response:
        return _json({"model_path": self.options.model_path,
                                  "weight_version": self.options.weight_version,
                                  "is_generation": True})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return _unauthorized()
        import orjson

        raw = await request.read()
        try:
            body = orjson.loads(raw)
            model = body["model"]
            if not isinstance(body["messages"], list):
                raise TypeError("messages is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"bad request: {exc}", "BadRequestError")
        if model != self.options.model and model not in self.adapters:
            self.stats["unknown_model"] += 1
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        stats = self.stats
        stats["requests"] += 1
        stats[f"model:{model}"] += 1
        self.requests.append(body)
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            return await self._answer(request, body, raw, model)
        except asyncio.CancelledError:
            stats["cancelled"] += 1  # the client closed the request before the answer
            raise
        finally:
            stats["in_flight"] -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any], raw: bytes,
                      model: str) -> web.StreamResponse:
        if self._marked is not None and self._marked in raw:
            self.stats["fault:marked"] += 1
            return _error(502, "upstream worker crashed", "InternalServerError")
        fault = self._fault()
        if fault is not None:
            self.stats[f"fault:{fault}"] += 1
            if fault == "500":
                return _error(500, "injected fault", "InternalServerError")
            if fault == "400":
                return _error(400, "injected bad request", "BadRequestError")
            if fault == "bad_shape":
                return _json({"choices": ["x"]})
            if fault == "drop":
                if request.transport is not None:
                    request.transport.close()
                await asyncio.sleep(3600)  # cancelled once aiohttp sees the closed connection
        overflow = self._overflow(body)
        if overflow is not None:
            self.stats["context_overflow"] += 1
            return _error(400, overflow, "BadRequestError")
        assert self._loaded is not None
        if not self._loaded.is_set():
            if self.options.during_load == "abort":
                return self._completion(body, model, "", [], [], "abort")
            await self._loaded.wait()
        if self._hold is not None and self._hold in raw:
            self.stats["held"] += 1
            try:
                why = await self._wait(None, held=True)
            finally:
                self.stats["held"] -= 1
            if why != "done":
                self.stats["aborted"] += 1
                return self._completion(body, model, "", [], [], "abort")
        rng = random.Random(int.from_bytes(
            hashlib.blake2b(raw, digest_size=8, key=str(self.options.seed).encode()).digest(),
            "little"))
        text, good = self._reply(body, rng)
        reply = pieces(text) + ["<|im_end|>"]
        finish = "stop"
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and 0 < limit < len(reply):
            reply, finish = reply[:limit], "length"
            text = "".join(p for p in reply if p not in SPECIAL_IDS)
        low, high = (-0.4, -0.01) if good else (-3.0, -0.3)
        logprobs = [round(rng.uniform(low, high), 4) for _ in reply]
        delay = self.options.latency_s * math.exp(self.options.latency_sigma * rng.gauss(0, 1))
        why = await self._wait(None if fault == "hang" else delay)
        if why != "done":
            self.stats["aborted"] += 1
            return self._completion(body, model, "", [], [], "abort")
        self.stats["completed"] += 1
        return self._completion(body, model, text, reply, logprobs, finish)

    def _overflow(self, body: dict[str, Any]) -> str | None:
        """vLLM's refusal of a prompt plus `max_tokens` longer than the context window."""
        prompt = len(render_prompt(body["messages"], drop_thinking=self.options.drop_thinking))
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        wanted = prompt + (limit if isinstance(limit, int) else 0)
        if wanted <= self.options.max_model_len:
            return None
        return (f"This model's maximum context length is {self.options.max_model_len} tokens. "
                f"However, you requested {wanted} tokens ({prompt} in the messages, "
                f"{wanted - prompt} in the completion). Please reduce the length of the "
                "messages or completion.")

    def _reply(self, body: dict[str, Any], rng: random.Random) -> tuple[str, bool]:
        """(reply text, whether it is a good move)."""
        board = read_board(body["messages"])
        greedy = float(body.get("temperature", 1.0) or 0.0) == 0.0
        good = greedy or rng.random() < self.options.p_good
        move = good_move(board, rng) if good else None
        thought = " ".join(rng.choice(_WORDS) for _ in range(self.options.think_words))
        if move is not None:
            return f"<think>{thought}</think><answer>{move}</answer>", True
        if rng.random() < self.options.malformed_share:
            return f"{thought}, I am not sure which way to go.", False
        return f"<think>{thought}</think><answer>{rng.choice(board.actions)}</answer>", False

    async def _wait(self, delay_s: float | None, held: bool = False) -> str:
        """Sleep `delay_s` (None: until aborted, or released when `held`); "done", or why it
        ended early."""
        assert self._loop is not None
        pending = _Pending(self._loop.create_future())
        if delay_s is not None:
            pending.timer = self._loop.call_later(delay_s, _settle, pending, "done")
        self._pending.add(pending)
        if held:
            self._held.add(pending)
        try:
            return await pending.done
        finally:
            self._pending.discard(pending)
            self._held.discard(pending)
            if pending.timer is not None:
                pending.timer.cancel()

    def _completion(self, body: dict[str, Any], model: str, text: str, reply: list[str],
                    logprobs: list[float], finish: str) -> web.Response:
        """A chat completion shaped as vLLM's (plus SGLang's `metadata.weight_version`)."""
        prompt = render_prompt(body["messages"], drop_thinking=self.options.drop_thinking)
        ids = self.options.token_ids and bool(body.get("return_token_ids"))
        content = None
        if body.get("logprobs"):
            content = [{"token": p, "logprob": lp, "bytes": list(p.encode()),
                        "top_logprobs": []} for p, lp in zip(reply, logprobs, strict=True)]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None,
                        "annotations": None, "audio": None, "function_call": None,
                        "tool_calls": [], "reasoning_content": None},
            "logprobs": None if content is None else {"content": content},
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": [token_id(p) for p in reply] if ids else None,
        }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{random.getrandbits(64):016x}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(reply),
                      "completion_tokens": len(reply), "prompt_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_ids": [token_id(p) for p in prompt] if ids else None,
            "kv_transfer_params": None,
        }
        if model == self.options.model:  # an adapter's reply carries no base weight version
            out["metadata"] = {"weight_version": self.options.weight_version}
        self.answers.append({"seed": body.get("seed"), "model": model, "finish_reason": finish,
                             "weight_version": self.options.weight_version})
        return _json(out)

    def _fault(self) -> str | None:
        with self._lock:
            if self._scripted:
                return self._scripted.popleft()
        opts = self.options
        if opts.error_rate or opts.hang_rate or opts.drop_rate:
            x = self._fault_rng.random()
            for kind, rate in (("500", opts.error_rate), ("hang", opts.hang_rate),
                               ("drop", opts.drop_rate)):
                if x < rate:
                    return kind
                x -= rate
        return None

    def _authorized(self, request: web.Request) -> bool:
        key = self.options.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    # -- weight updates ------------------------------------------------------------------
    async def _update_weights(self, request: web.Request) -> web.Response:
        """SGLang's update from disk: abort what is in flight, load, take the new version."""
        try:
            body = await request.json()
            path = str(body["model_path"])
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"bad request: {exc}", "BadRequestError")
        assert self._loaded is not None
        self._loaded.clear()
        aborted = len(self._pending)
        for pending in list(self._pending):
            _settle(pending, "abort")
        await asyncio.sleep(self.options.load_time_s)
        self.options.model_path = path
        if body.get("weight_version") is not None:
            self.options.weight_version = str(body["weight_version"])
        self.stats["weight_updates"] += 1
        self._loaded.set()
        return _json({"success": True, "message": "Succeeded to update model "
                                  "weights.", "num_paused_requests": aborted})

    async def _load_lora(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            name, path = str(body["lora_name"]), str(body["lora_path"])
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"bad request: {exc}", "BadRequestError")
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.",
                          "InvalidUserInput")
        await asyncio.sleep(self.options.load_time_s)
        self.adapters[name] = path
        return _text(f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        try:
            name = str((await request.json())["lora_name"])
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"bad request: {exc}", "BadRequestError")
        if self.adapters.pop(name, None) is None:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return _text(f"Success: LoRA adapter '{name}' removed successfully.")

    # -- admin ---------------------------------------------------------------------------
    async def _admin_faults(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            self.fail_next(str(body["kind"]), int(body.get("count", 1)))
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"bad request: {exc}", "BadRequestError")
        return _json({"scripted": len(self._scripted)})

    async def _admin_stats(self, request: web.Request) -> web.Response:
        return _json({**self.stats, "weight_version": self.options.weight_version,
                                  "adapters": sorted(self.adapters)})


def _settle(pending: _Pending, why: str) -> None:
    if not pending.done.done():
        pending.done.set_result(why)


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """An error in vLLM's shape."""
    return _json({"error": {"message": message, "type": kind, "param": param,
                                        "code": status}}, status=status)


def _json(data: Any, status: int = 200) -> web.Response:
    import orjson
    from aiohttp import web

    return web.Response(body=orjson.dumps(data), status=status,
                        content_type="application/json")


def _text(text: str) -> web.Response:
    from aiohttp import web

    return web.Response(text=text)


def _unauthorized() -> web.Response:
    return _json({"error": "Unauthorized"}, status=401)


def _raise_fd_limit() -> None:
    """Thousands of connections need more file descriptors than a shell's usual 1024."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


# -- command line ----------------------------------------------------------------------------
OPTION_HELP = {  # `rollstream fake-llm --help`, one line per FakeLLMOptions field
    "model": "the model name it serves (GET /v1/models; requests naming another get 404)",
    "p_good": "probability of a good move at temperature > 0 (at 0: always good)",
    "malformed_share": "share of the other replies with no <answer> tag",
    "think_words": "words of <think> reasoning in each reply",
    "latency_s": "median seconds per request",
    "latency_sigma": "lognormal spread of the latency (0: always latency_s)",
    "error_rate": "share of requests answered HTTP 500",
    "hang_rate": "share of requests never answered (until the client gives up)",
    "drop_rate": "share of requests whose connection is closed unanswered",
    "seed": "seed of the replies (with each request's own seed)",
    "token_ids": "honour return_token_ids (--no-token-ids: an older server)",
    "drop_thinking": "the chat template drops earlier <think> blocks (Qwen3-like)",
    "weight_version": "the weight_version it reports before any update (SGLang: 'default')",
    "model_path": "the weights it says it holds before any update",
    "load_time_s": "seconds a weight update takes",
    "during_load": "requests that come while weights load: wait or abort",
    "max_model_len": "context window: a prompt plus max_tokens past it gets vLLM's HTTP 400",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`rollstream fake-llm` options."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    parser.add_argument("--api-key-env", default=None,
                        help="require the bearer token held by this environment variable")
    defaults = FakeLLMOptions()
    for spec in fields(FakeLLMOptions):
        if spec.name == "api_key":
            continue
        flag = "--" + spec.name.replace("_", "-")
        value = getattr(defaults, spec.name)
        described = f"{OPTION_HELP[spec.name]} (default: {value})"
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value,
                                help=OPTION_HELP[spec.name])
        else:
            parser.add_argument(flag, type=type(value), default=value, help=described)


def options_from_args(args: argparse.Namespace) -> FakeLLMOptions:
    values = {spec.name: getattr(args, spec.name) for spec in fields(FakeLLMOptions)
              if spec.name != "api_key"}
    if values["during_load"] not in ("wait", "abort"):
        raise ConfigError(f"--during-load must be wait or abort, got {values['during_load']!r}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} must be a port in 0..65535")
    for name in ("p_good", "malformed_share", "error_rate", "hang_rate", "drop_rate"):
        if not 0.0 <= values[name] <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1]")
    for name in ("think_words", "latency_s", "latency_sigma", "load_time_s"):
        if values[name] < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be non-negative, got "
                              f"{values[name]}")
    options = FakeLLMOptions(**values)
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ConfigError(f"--api-key-env {args.api_key_env}: the variable is not set")
        options.api_key = key
    return options


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM (exit 0) or SIGINT (exit 130)."""
    options = options_from_args(args)
    server = FakeLLMServer(options, host=args.host, port=args.port)
    received: list[int] = []

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        def on_signal(sig: int) -> None:
            received.append(sig)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        ready = asyncio.Event()
        task = asyncio.create_task(server.serve(stop, ready))
        await asyncio.wait([task, asyncio.create_task(ready.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            print(f"fake-llm: serving model {options.model!r} at {server.base_url}", flush=True)
        await task

    try:
        asyncio.run(main())
    except OSError as exc:
        raise RollstreamError(f"fake-llm cannot listen on {args.host}:{args.port}: "
                              f"{exc.strerror or exc}") from None
    return 130 if received and received[0] == signal.SIGINT else 0
