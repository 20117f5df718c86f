"""The stand-in's scripted "model": a small deterministic tokenizer, a Qwen-like chat template,
and a player that reads the game from the conversation and picks a move.

It reads the game, its symbols and actions from the env's instruction (in ROLL's layout,
wherever the prompt puts it: the first user message, or the system message of an env that
builds its own chat) and the grid from the last user message, and plays a good move with
probability `p_good` (FrozenLake: a shortest-path step to the goal around the holes; Sokoban:
a move that does not walk into a wall or push a box into one), else a random action or a
malformed reply (no answer tag). Temperature 0 always plays the good move. The choice is
seeded by the caller (the request body), so the same request gets the same reply. Tokens come
from pieces hashed to ids, and the template's prompts extend the previous prompt and reply
token for token; `drop_thinking` removes earlier `<think>` blocks, as Qwen3's template does,
which breaks that.

Every flavor of the stand-in plays with this module; what differs between servers (the shape
of the answers) lives in `rollstream.fake_llm.flavors`.
"""

from __future__ import annotations

import collections
import functools
import json
import random
import re
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


def reply(messages: list[dict[str, Any]], temperature: float, rng: random.Random, *,
          p_good: float, malformed_share: float, think_words: int) -> tuple[str, bool]:
    """(reply text, whether it is a good move)."""
    board = read_board(messages)
    greedy = temperature == 0.0
    good = greedy or rng.random() < p_good
    move = good_move(board, rng) if good else None
    thought = " ".join(rng.choice(_WORDS) for _ in range(think_words))
    if move is not None:
        return f"<think>{thought}</think><answer>{move}</answer>", True
    if rng.random() < malformed_share:
        return f"{thought}, I am not sure which way to go.", False
    return f"<think>{thought}</think><answer>{rng.choice(board.actions)}</answer>", False


# -- scripted tool calls ---------------------------------------------------------------------
# A request that offers a `python` tool gets a Hermes/Qwen reply, as Qwen2.5/Qwen3 write them
# (`<tool_call>\n{json}\n</tool_call>`, the blocks SGLang 0.5.23's qwen25_detector.py and
# vLLM 0.33's hermes_tool_parser.py read): one call per arithmetic expression of the last
# user message, then, once the tool messages answer them, `\boxed{}` the last result.
# `malformed_share` of the calling replies hold a block that is not JSON.
_EXPRESSION = re.compile(r"[-+*/().\d ]*\d[-+*/().\d ]*")
_OPERATION = re.compile(r"\d[\s)]*[-+*/][\s(]*-?\d|\d[\s)]*[-+*/][\s(]*\(")
_PROGRAM = "x = {expr}\nprint(int(x) if x == int(x) else round(x, 6))"


def offers_python(tools: Any) -> bool:
    """Whether a request's `tools` include a function named python."""
    return isinstance(tools, list) and any(
        isinstance(t, dict) and (t.get("function") or {}).get("name") == "python" for t in tools)


def tool_reply(messages: list[dict[str, Any]], rng: random.Random, *,
               malformed_share: float) -> str | None:
    """The scripted model's reply when it has a python tool (see above), or None when the
    conversation gives it nothing to compute."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        result = str(last.get("content") or "").strip().splitlines()
        value = result[0] if result else ""
        return f"<think>the tool printed {value}</think>The answer is \\boxed{{{value}}}."
    expressions = [e.strip().rstrip(".").strip() for e in
                   _EXPRESSION.findall(str(last.get("content") or "")) if _OPERATION.search(e)]
    if not expressions:
        return None
    if rng.random() < malformed_share:
        return ('<think>I will compute it</think><tool_call>\n{"name": "python", '
                '"arguments": {"code": print(' + expressions[0] + ')}\n</tool_call>')
    blocks = [json.dumps({"name": "python", "arguments": {"code": _PROGRAM.format(expr=e)}})
              for e in expressions]
    return "<think>I will compute it</think>" + "".join(
        f"<tool_call>\n{block}\n</tool_call>" for block in blocks)


_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def rendered_tool_turns(messages: list[dict[str, Any]]
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(tools, messages) of a prompt rendered as Qwen2.5/Qwen3 render tools (a token-id
    prompt's ChatML messages): the function schemas of the system message's `<tools>` block
    (one JSON line each), and a user turn made of `<tool_response>` blocks as `tool`
    messages, so the scripted model answers it as it answers a chat request's."""
    tools: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        content = str(message.get("content") or "")
        if message.get("role") == "system" and not tools:
            found = _TOOLS_BLOCK.search(content)
            for line in found.group(1).splitlines() if found else ():
                try:
                    tools.append(json.loads(line))
                except ValueError:
                    continue
        responses = _TOOL_RESPONSE.findall(content) if message.get("role") == "user" else []
        if responses and content.startswith("<tool_response>"):
            out += [{"role": "tool", "content": text} for text in responses]
        else:
            out.append(message)
    return tools, out


def server_tool_calls(text: str, flavor: str) -> tuple[str | None, list[dict[str, Any]]]:
    """What a server started with a tool parser makes of a reply (`content`, `tool_calls`):
    vLLM 0.33 (`--enable-auto-tool-choice --tool-call-parser hermes`) takes every block or,
    when one is not JSON, none (the text stays the content); SGLang 0.5.23
    (`--tool-call-parser qwen25`) skips a bad block. Ids as each makes them (vLLM's
    `chatcmpl-tool-<uuid hex>`, `renderers/chat_utils/tool_call.py`; SGLang's
    `call_<24 hex>`, `serving_chat.py` `_process_tool_call_id`)."""
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    found = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL)
    calls = []
    for closed, open_end in found:
        try:
            obj = json.loads(closed or open_end)
        except ValueError:
            if flavor == "sglang":
                continue
            return text, []
        calls.append(obj)
    out = []
    for obj in calls:
        uid = uuid.uuid4().hex
        out.append({"id": f"call_{uid[:24]}" if flavor == "sglang" else f"chatcmpl-tool-{uid}",
                    "type": "function",
                    "function": {"name": obj.get("name"),
                                 "arguments": json.dumps(obj.get("arguments", {}))}})
    return (text[:start] or None), out


def add_tool_calls(out: dict[str, Any], flavor: str) -> None:
    """Shape a completion as a server with a tool parser answers a request with `tools`
    (tool_choice other than none): the calls read from its content (`server_tool_calls`) as
    `tool_calls`, and `finish_reason` `tool_calls` (vLLM's `resolve_finish_reason`, in
    `entrypoints/serve/utils/tool_calls_utils.py`: only for a reply that stopped on its own)."""
    choice = out["choices"][0]
    message = choice.get("message") or {}
    content, calls = server_tool_calls(message.get("content") or "", flavor)
    if not calls:
        return
    message["content"], message["tool_calls"] = content, calls
    if choice.get("finish_reason") == "stop":
        choice["finish_reason"] = "tool_calls"
