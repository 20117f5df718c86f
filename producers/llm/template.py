"""A model's chat template and tokenizer, applied by the producer itself (`policy.tokenizer`).

`ChatTemplate.load(PATH_OR_NAME)` reads a Hugging Face tokenizer folder (`tokenizer.json`
and `tokenizer_config.json`, its `chat_template`; or a `chat_template.jinja` beside them, as
transformers >= 4.43 saves it). A name that is not a folder is looked up with transformers'
`AutoTokenizer` (its download cache), only for the template and the tokenizer.json it saves;
the folder layout needs only `tokenizers` and `jinja2` (the `tito` extra).

The template is rendered as transformers renders it (transformers 5.24,
`utils/chat_template_utils.py:563-667`, `_compile_jinja_template`: an immutable sandboxed
jinja2 environment with `trim_blocks`, `lstrip_blocks` and the loop-controls extension,
`raise_exception` and `strftime_now` defined; the special tokens passed by name; its own
`tojson` filter, `json.dumps(x, ensure_ascii=False)`: no sorted keys and no HTML escaping,
unlike jinja2's), and the text is encoded without adding special tokens (the template writes
them). A tag's tools go in as transformers' `apply_chat_template(tools=...)` passes them: the
OpenAI function schemas as the `tools` variable (Qwen2.5's and Qwen3's templates write them in
the system message, `<tools>` one JSON line each `</tools>`, and a `tool` message as a
`<tool_response>` in a user turn).

What token-in/token-out needs of it (`producers.llm.tito`):
- `prompt_ids(messages, tools)`: a first prompt, the template with the generation prompt;
- `close_ids`: what the template writes after an assistant message's content
  (`<|im_end|>\\n` for ChatML), read from a rendering with a marker as the content;
- `suffix_ids(new_messages)`: the tokens of messages after an assistant message, up to the
  generation prompt: rendered after a fixed plain exchange (no thinking, so a template that
  rewrites earlier assistant turns leaves it alone) and cut at its end; where the exchange
  renders otherwise once messages follow it (Qwen3's template: the last reply after the
  last user query gets an empty `<think>` block, a reply with more after it none), cut
  after the reply's close instead, the reply a marker found in the rendering.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from schemas.errors import PolicyError

ENCODE_CACHE = 8192  # texts whose ids are kept (cleared when full)
_MARK = "\x00rollstream-content\x00"  # an assistant content no template writes by itself
# a plain exchange the new messages are rendered after (no thinking, nothing to strip)
_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
# pre-tokenizer split patterns (Qwen2's, Llama 3's) after which a line break followed by a
# printable ASCII character always ends a pre-token (`_line_pieces`)
_LINE_SAFE_PATTERNS = frozenset({
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
})
_LINE_START = re.compile(r"(?<=\n)(?=[!-~])")  # after a line break, before a printable ASCII


class ChatTemplate:
    """A tokenizer (`tokenizers.Tokenizer`) and its chat template (see the module docstring)."""

    def __init__(self, tokenizer: Any, template: str, special: dict[str, Any], source: str):
        try:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise PolicyError(f"policy.tokenizer needs the tito extra (pip install "
                              f"'rollstream[tito]'): {exc}") from None
        self.tokenizer = tokenizer
        self.source = source
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson  # transformers' own, as the server renders tools
        self._template = env.from_string(template)
        self._special = special
        self._encoded: dict[str, list[int]] = {}  # text -> ids (`encode`)
        self._by_lines = _line_pieces(tokenizer)
        # new messages (their items, in order) -> their suffix ids: a repeated observation
        # skips the rendering too
        self._suffixes: dict[tuple[Any, ...], list[int]] = {}
        self._close_text = ""  # what the template writes after a reply (`_close_ids`)
        self._marked = False  # its exchange renders otherwise once messages follow it
        self.close_ids = self._close_ids()
        base = self.render(_BASE, add_generation_prompt=False)
        self._base_len = len(base)
        self._base = base

    @classmethod
    def load(cls, name: str) -> ChatTemplate:
        """The tokenizer and template of a folder, else of a transformers name."""
        folder = Path(name).expanduser()
        if folder.is_dir():
            return cls._from_folder(folder, name)
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise PolicyError(f"policy.tokenizer: {name!r} is not a folder with tokenizer.json "
                              "and tokenizer_config.json, and transformers (to look it up by "
                              "name) is not installed") from None
        try:
            hf = AutoTokenizer.from_pretrained(name)
        except Exception as exc:  # transformers raises many kinds for a name it cannot find
            raise PolicyError(f"policy.tokenizer: cannot load {name!r}: "
                              f"{type(exc).__name__}: {exc}") from None
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            return cls._from_folder(Path(tmp), name)

    @classmethod
    def _from_folder(cls, folder: Path, name: str) -> ChatTemplate:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise PolicyError(f"policy.tokenizer needs the tito extra (pip install "
                              f"'rollstream[tito]'): {exc}") from None
        tok_file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
        if not tok_file.is_file():
            raise PolicyError(f"policy.tokenizer: {folder} has no tokenizer.json")
        try:
            config = json.loads(config_file.read_text()) if config_file.is_file() else {}
            tokenizer = Tokenizer.from_file(str(tok_file))
        except (OSError, ValueError, Exception) as exc:  # tokenizers raises its own Exception
            raise PolicyError(f"policy.tokenizer: cannot read {folder}: {exc}") from None
        template = config.get("chat_template")
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text()
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        if not isinstance(template, str) or not template:
            raise PolicyError(f"policy.tokenizer: {folder} has no chat_template")
        special = {key: _token_text(config.get(key)) for key in
                   ("bos_token", "eos_token", "unk_token", "pad_token")}
        return cls(tokenizer, template, special, name)

    # -- rendering and encoding -------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        return self._template.render(messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt,
                                     **self._special)

    def encode(self, text: str) -> list[int]:
        """The text's ids (read-only: a cached list). The members of a group share their
        first prompt and an env's observations repeat, so the same texts come back: encoding
        costs ~1 us per token here (the Qwen2 split regex), a cache hit nothing."""
        ids = self._encoded.get(text)
        if ids is None:
            pieces = _LINE_START.split(text) if self._by_lines and "\n" in text else ()
            if len(pieces) > 1:  # line by line: an observation's lines come back
                ids = [i for piece in pieces for i in self.encode(piece)]
            else:
                ids = self._encode(text)
            if len(self._encoded) >= ENCODE_CACHE:
                self._encoded.clear()
            self._encoded[text] = ids
        return ids

    def _encode(self, text: str) -> list[int]:
        # tokenizers' encode_batch_fast (0.23 here; older ones lack it) skips the offsets: 100 us
        # where encode takes 133 for a 114-token turn of the tiny model's tokenizer (measured)
        fast = getattr(self.tokenizer, "encode_batch_fast", None)
        if fast is not None:
            return list(fast([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A conversation's prompt as the server would render it, generation prompt added
        (with `tools`, OpenAI function schemas, as a chat request's `tools` renders them)."""
        return self.encode(self.render(messages, add_generation_prompt=True, tools=tools))

    def suffix_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The tokens of `messages` (what follows an assistant message) and the generation
        prompt, as the template writes them after an assistant turn."""
        key: tuple[Any, ...] | None = tuple(tuple(m.items()) for m in messages)
        try:
            ids = self._suffixes.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable value (tool calls): rendered every time
            ids, key = None, None
        if ids is not None:
            return ids
        if not self._marked:
            text = self.render([*_BASE, *messages], add_generation_prompt=True)
            # the reply renders otherwise when messages follow it (Qwen3's): from now on
            # this template's suffixes are cut after a marked reply at once
            self._marked = not text.startswith(self._base)
        if self._marked:
            ids = self.encode(self._after_reply(messages))
        else:
            ids = self.encode(text[self._base_len:])
        if key is not None:
            if len(self._suffixes) >= ENCODE_CACHE:
                self._suffixes.clear()
            self._suffixes[key] = ids
        return ids

    def _after_reply(self, messages: list[dict[str, Any]]) -> str:
        """The text of `messages` and the generation prompt after a reply and its close, for
        a template whose exchange renders otherwise when messages follow it: Qwen3's gives
        the last assistant message after the last user query an empty `<think>` block, and
        none once another message follows. The reply is a marker, found in the rendering;
        what follows it and the close is the suffix."""
        text = self.render([_BASE[0], {"role": "assistant", "content": _MARK}, *messages],
                           add_generation_prompt=True)
        at = text.find(_MARK)
        end = at + len(_MARK) + len(self._close_text)
        if at < 0 or text[at + len(_MARK):end] != self._close_text:
            raise PolicyError(f"policy.tokenizer: the chat template of {self.source} rewrites "
                              "a reply when messages follow it; its turns cannot be extended "
                              "token by token")
        return text[end:]

    def _close_ids(self) -> list[int]:
        """What the template writes after an assistant message's content (`<|im_end|>\\n`)."""
        text = self.render([{"role": "user", "content": "x"},
                            {"role": "assistant", "content": _MARK}],
                           add_generation_prompt=False)
        at = text.rfind(_MARK)
        if at < 0:
            raise PolicyError(f"policy.tokenizer: the chat template of {self.source} does not "
                              "write an assistant message's content as given")
        self._close_text = text[at + len(_MARK):]
        return self.encode(self._close_text)


def _line_pieces(tokenizer: Any) -> bool:
    """Whether the tokenizer's ids of a text are the concatenation of its ids of the text's
    lines (cut after a line break followed by a printable ASCII character). True for a BPE
    tokenizer without normalizer whose pre-tokenizer is a Qwen2 or Llama 3 split pattern and
    a byte-level step without its own regex, and no added token holding a line break or
    taking the whitespace before it (`lstrip`): every alternative of those patterns that
    covers a line break ends at the last line break of a run (the other alternatives hold no
    line break, or only whitespace), so a pre-token ends there, and each pre-token is encoded
    alone. Anything else (or a tokenizer that cannot say): encoded whole."""
    try:
        spec = json.loads(tokenizer.to_str())
    except Exception:  # not a tokenizers.Tokenizer (a stand-in): encoded whole
        return False
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if spec.get("normalizer") is not None or not isinstance(steps, list) or len(steps) != 2:
        return False
    split, byte_level = steps
    if not (split.get("type") == "Split" and split.get("behavior") == "Isolated"
            and not split.get("invert")
            and (split.get("pattern") or {}).get("Regex") in _LINE_SAFE_PATTERNS):
        return False
    if not (byte_level.get("type") == "ByteLevel" and not byte_level.get("add_prefix_space")
            and not byte_level.get("use_regex")):
        return False
    return all("\n" not in str(token.get("content")) and not token.get("lstrip")
               for token in spec.get("added_tokens") or [])


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json gives it (a string, or an AddedToken dict)."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    """transformers' `tojson` filter (`_compile_jinja_template`): plain `json.dumps`."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError
    raise TemplateError(message)
