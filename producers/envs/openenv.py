"""`env_type: openenv`: an env that lives on OpenEnv env servers, played over their WebSocket.

The protocol, as openenv-core 0.3.0 serves it (openenv/core/env_server/http_server.py,
`websocket_endpoint`; message models in openenv/core/env_server/types.py): an episode is one
WebSocket session on `/ws` (the server builds an env per session; its HTTP `/reset` and
`/step` build a fresh env on every call, so they cannot hold an episode). The client sends
JSON text frames `{"type": "reset", "data": {"seed": N}}`, `{"type": "step", "data":
{<action fields>}}` and `{"type": "close"}`; the server answers `{"type": "observation",
"data": {"observation": {...}, "reward": float | null, "done": bool}}`
(serialization.py `serialize_observation`) or `{"type": "error", "data": {"message", "code"}}`
(codes in types.py `WSErrorCode`: CAPACITY_REACHED when the server already holds
`max_concurrent_envs` sessions, default 1; EXECUTION_ERROR when the env raised). `GET
/schema` gives the JSON schemas of the action and the observation; `GET /health` answers
while the server runs.

This client speaks that protocol with aiohttp (no openenv-core in the producer: it pulls
gradio, fastmcp and more). The env is a gymnasium env whose `areset`/`astep_text`/`astep`
the producer awaits (`producers.rollout.play_episode`); the reply goes into `action_field`
(what the tag's `action_pattern` captures, when it has one; else the whole reply) and the
model is shown `observation_field`, both defaulting to the single string field of the
server's `/schema`. Reward and done come from the server. Sessions per server are capped at
`env_config.max_sessions` (default 1, OpenEnv's default `max_concurrent_envs`): set it to
the server's value. Failures: see `producers.envs.remote`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, SupportsFloat
from urllib.parse import urlsplit

import aiohttp
import gymnasium as gym
from gymnasium import spaces

from producers.envs.remote import RemoteEnvError, Server, ServerPool, drop_pool, pool_for
from producers.envs.text import captured_answer, compile_action_pattern
from producers.lifetime import within
from schemas.envspec import OPENENV_ID

_OWN_FIELDS = ("done", "reward", "metadata")  # the observation fields the server sends apart
CONNECT_TIMEOUT_S = 10.0


def check_urls(base_urls: Any) -> tuple[str, ...]:
    """`base_urls` as a tuple of http(s) URLs without a trailing slash; `ValueError` naming
    the bad entry otherwise."""
    if isinstance(base_urls, str):
        base_urls = [base_urls]
    if not isinstance(base_urls, list | tuple) or not base_urls:
        raise ValueError("env_config.base_urls must list the OpenEnv env servers "
                         "(e.g. [http://envs:8000])")
    urls = []
    for url in base_urls:
        parts = urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"env_config.base_urls: {url!r} is not an http(s) URL")
        try:
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError:
            raise ValueError(f"env_config.base_urls: {url!r} has a bad port") from None
        urls.append(str(url).rstrip("/"))
    return tuple(urls)


def string_field(schema: dict[str, Any], what: str, skip: tuple[str, ...] = ()) -> str:
    """The single string field of a JSON schema; `RemoteEnvError` when there is none or
    several (then the tag must name it)."""
    props = schema.get("properties") or {}
    names = [name for name, prop in props.items()
             if name not in skip and isinstance(prop, dict) and prop.get("type") == "string"]
    if len(names) != 1:
        raise RemoteEnvError(f"the server's {what} schema has {len(names)} string fields "
                             f"({', '.join(names) or 'none'}): set env_config.{what}_field")
    return names[0]


class OpenEnvEnv(gym.Env):
    """One env slot of the producer: an episode is a WebSocket session on one of the servers."""

    metadata = {"render_modes": ["ansi"]}  # noqa: RUF012 (gymnasium's class attribute)

    def __init__(self, base_urls: Any = None, action_field: str | None = None,
                 observation_field: str | None = None, action_pattern: str | None = None,
                 max_sessions: int = 1, max_steps: int | None = None,
                 reset_timeout_s: float = 30.0, step_timeout_s: float = 60.0,
                 down_wait_s: float = 10.0, instruction: str = "",
                 render_mode: str | None = None) -> None:
        self.urls = check_urls(base_urls)
        self.action_field = action_field
        self.observation_field = observation_field
        self.pattern = None if action_pattern is None else compile_action_pattern(action_pattern)
        if int(max_sessions) < 1:
            raise ValueError("env_config.max_sessions must be at least 1 (the servers' "
                             "max_concurrent_envs)")
        self.max_sessions = int(max_sessions)
        self.max_steps = max_steps
        self.reset_timeout_s = float(reset_timeout_s)
        self.step_timeout_s = float(step_timeout_s)
        self.down_wait_s = float(down_wait_s)  # how long every server may be down
        self.instruction = instruction
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=1 << 20)
        self.action_space = spaces.Text(max_length=64)
        self._pool: ServerPool | None = None
        self._server: Server | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._steps = 0
        self._last = ""
        self._checking = False

    # -- the producer awaits these ---------------------------------------------------------
    async def areset(self, *, seed: int | None = None,
                     options: dict | None = None) -> tuple[str, dict[str, Any]]:
        """A fresh session (the last one closed), reset with `seed`."""
        await self._end_session()
        pool = self._pool_here()
        server = await pool.acquire(self.down_wait_s)
        self._server = server
        try:
            await self._fields(pool, server)
            self._ws = await self._connect(pool, server)
            data = await self._call({"type": "reset", "data": {"seed": seed}},
                                    self.reset_timeout_s, "reset")
        except BaseException:
            await self._end_session()
            raise
        self._steps = 0
        observation = self._observation(data)
        return observation, {}

    async def astep_text(self, text: str) -> tuple[str, SupportsFloat, bool, bool, dict]:
        """Step with a model's reply: what `action_pattern` captures, else the whole reply."""
        return await self.astep(self.parse_action(text) or text)

    async def astep(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict]:
        if self._ws is None:
            raise RemoteEnvError("step without an open session (reset first)")
        data = await self._call({"type": "step", "data": {self.action_field: str(action)}},
                                self.step_timeout_s, "step")
        self._steps += 1
        observation = self._observation(data)
        reward = data.get("reward")
        terminated = bool(data.get("done", False))
        truncated = not terminated and self.max_steps is not None and self._steps >= self.max_steps
        if terminated or truncated:
            await self._end_session()
        return observation, 0.0 if reward is None else float(reward), terminated, truncated, {}

    def parse_action(self, text: str) -> str | None:
        """The action of a reply: what `action_pattern` captures (None: no match), or the
        reply itself without a pattern."""
        if self.pattern is None:
            return text
        return captured_answer(text, self.pattern)

    # -- gymnasium's sync API: the producer never calls it; `rollstream config check` does --
    def reset(self, *, seed: int | None = None,
              options: dict | None = None) -> tuple[str, dict[str, Any]]:
        """A reset in a loop of its own (only where no loop runs): opens a session, resets
        and closes it, so `rollstream config check` learns the servers answer."""
        self._checking = True  # a failure is the one line of the caller, not a log line

        async def once() -> tuple[str, dict[str, Any]]:
            try:
                return await self.areset(seed=seed)
            finally:
                pool = self._pool
                await self._end_session()
                self.close()
                if pool is not None:
                    await pool.aclose()
        return asyncio.run(once())

    def step(self, action: Any) -> Any:
        raise RuntimeError("an OpenEnv env is stepped with `await astep(...)` in a loop")

    def render(self) -> str:
        return self._last

    def close(self) -> None:
        """Release the session slot now; the socket closes in the background."""
        ws, server, self._ws, self._server = self._ws, self._server, None, None
        if server is not None and self._pool is not None:
            self._pool.release(server)
        if ws is not None and not ws.closed:
            try:
                asyncio.get_running_loop().create_task(ws.close())
            except RuntimeError:
                pass
        if self._pool is not None:
            drop_pool(self._pool)
            self._pool = None

    # -- inside ---------------------------------------------------------------------------
    def _pool_here(self) -> ServerPool:
        if self._pool is None:
            self._pool = pool_for(self.urls, self.max_sessions)
            self._pool.users += 1
        return self._pool

    async def _fields(self, pool: ServerPool, server: Server) -> None:
        """`action_field`/`observation_field` from the server's /schema when not given."""
        if self.action_field and self.observation_field:
            return
        if server.schema is None:
            try:
                async with pool.session.get(
                        server.url + "/schema",
                        timeout=aiohttp.ClientTimeout(total=self.reset_timeout_s)) as reply:
                    reply.raise_for_status()
                    server.schema = await reply.json()
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                raise self._failed(f"GET /schema: {type(exc).__name__}: {exc}") from None
        if not self.action_field:
            self.action_field = string_field(server.schema.get("action", {}), "action")
        if not self.observation_field:
            self.observation_field = string_field(server.schema.get("observation", {}),
                                                  "observation", _OWN_FIELDS)

    async def _connect(self, pool: ServerPool, server: Server
                       ) -> aiohttp.ClientWebSocketResponse:
        """Open a session's websocket, within `reset_timeout_s`: the upgrade has no deadline
        of its own (aiohttp's default is 300 s), and a server that accepts connections but
        answers nothing (stopped, hung) held the env for five minutes."""
        try:
            return await within(pool.session.ws_connect(
                server.url + "/ws", timeout=aiohttp.ClientWSTimeout(ws_close=1.0),
                heartbeat=None, max_msg_size=0), self.reset_timeout_s)
        except TimeoutError:
            raise self._failed(f"no answer to connect within {self.reset_timeout_s:g} s"
                               ) from None
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            raise self._failed(f"connect: {type(exc).__name__}: {exc}") from None

    async def _call(self, message: dict[str, Any], timeout_s: float,
                    what: str) -> dict[str, Any]:
        """Send one message on the session and read its answer; a dead, slow or refusing
        server is a `RemoteEnvError` (the server set aside unless the env itself raised)."""
        ws = self._ws
        assert ws is not None
        try:
            await ws.send_str(json.dumps(message))
            reply = await within(ws.receive(), timeout_s)
        except TimeoutError:
            raise self._failed(f"no answer to {what} within {timeout_s:g} s") from None
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            raise self._failed(f"{what}: {type(exc).__name__}: {exc}") from None
        if reply.type is not aiohttp.WSMsgType.TEXT:
            raise self._failed(f"session closed during {what} ({reply.type.name})")
        try:
            answer = json.loads(reply.data)
        except ValueError:
            raise self._failed(f"{what}: an answer that is not JSON: {reply.data!r:.80}") from None
        if answer.get("type") == "error":
            info = answer.get("data") or {}
            code = str(info.get("code", ""))
            text = f"{what} refused ({code}): {info.get('message', '')}"
            if "capacity" in code:  # another client holds its sessions: not a dead server
                raise RemoteEnvError(f"env server {self._where()}: {text} (its sessions are "
                                     "taken: lower max_sessions or give it more)")
            raise RemoteEnvError(f"env server {self._where()}: {text}")
        data = answer.get("data")
        if answer.get("type") != "observation" or not isinstance(data, dict):
            raise self._failed(f"{what}: an answer that is not an observation: "
                               f"{reply.data!r:.80}")
        return data

    def _observation(self, data: dict[str, Any]) -> str:
        observation = data.get("observation") or {}
        value = observation.get(self.observation_field)
        if value is None:
            raise RemoteEnvError(f"env server {self._where()}: its observation has no field "
                                 f"{self.observation_field!r} ({', '.join(observation)})")
        self._last = value if isinstance(value, str) else json.dumps(value)
        return self._last

    def _failed(self, reason: str) -> RemoteEnvError:
        """The server of this session failed: set it aside; the error to raise."""
        if self._server is not None and self._pool is not None and not self._checking:
            self._pool.failed(self._server, reason)
        return RemoteEnvError(f"env server {self._where()}: {reason}")

    def _where(self) -> str:
        return self._server.url if self._server is not None else "?"

    async def _end_session(self) -> None:
        """Close the session (telling the server) and give its slot back."""
        ws, server, self._ws, self._server = self._ws, self._server, None, None
        if server is not None and self._pool is not None:
            self._pool.release(server)
        if ws is not None and not ws.closed:
            try:
                await ws.send_str('{"type": "close"}')
                await ws.close()
            except (aiohttp.ClientError, ConnectionError, OSError):
                pass


def is_remote(env: gym.Env) -> bool:
    return isinstance(env.unwrapped, OpenEnvEnv)


__all__ = ["OPENENV_ID", "OpenEnvEnv", "RemoteEnvError", "check_urls", "is_remote",
           "string_field"]
