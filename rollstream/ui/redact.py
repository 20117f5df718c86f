"""What leaves `rollstream ui` carries no secret: every string of every answer goes through
`redact`, and the run's config is shown only through `config_summary`, an allow-list.

Masked wherever they occur in a string: the user part of a URL (`user:***@`, or `***@`
for a bare token), `password=` options in a URL's query, and `Bearer` tokens. The published
config holds no Redis URL and no API key (the policy names the environment variable that
holds it), but a model server's base URL may carry credentials: they are masked too.
"""

from __future__ import annotations

import math
import re
from typing import Any

from schemas.config import RolloutConfig
from schemas.redisconn import mask_url

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_EXACT = 2**53  # integers a JavaScript number holds exactly
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def mask_text(text: str) -> str:
    """`text` with the credentials of every URL in it, and bearer tokens, masked."""
    if "://" in text:
        text = _URL.sub(lambda m: _mask_one(m.group(0)), text)
    if "earer" in text:
        text = _BEARER.sub(r"\1***", text)
    return text


def _mask_one(url: str) -> str:
    masked = mask_url(url)
    scheme, _, rest = masked.partition("://")
    before_query, mark, query = rest.partition("?")
    userinfo, at, host = before_query.rpartition("@")
    if at and ":" not in userinfo and userinfo != "***":  # a bare token as the user
        before_query = f"***@{host}"
    return f"{scheme}://{before_query}{mark}{query}"


def redact(value: Any) -> Any:
    """`value` (JSON-ready) with every string masked (`mask_text`), map keys included; NaN,
    infinity and integers past 2**53 as text (JSON has no NaN, JavaScript rounds those)."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or infinity
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _EXACT:
        return str(value)  # a 64-bit seed: JavaScript's numbers would round it
    return value


def config_summary(config: RolloutConfig, run: str) -> dict[str, Any]:
    """What the page shows of the run's config: the layout, the schedule, the policy's type,
    model and servers (masked); nothing else of it."""
    policy = config.policy
    shown: dict[str, Any] = {"type": getattr(policy, "type", None)}
    for name in ("model", "base_urls", "latency_s", "entrypoint"):
        value = getattr(policy, name, None)
        if value is not None:
            shown[name] = value
    modes = {}
    for mode in config.modes():
        manager = config.manager(mode)
        modes[mode] = {"tags": list(manager.tags), "groups": manager.num_env_groups,
                       "group_size": manager.group_size, "members": manager.members,
                       "envs": manager.num_envs, "shards": manager.num_shards,
                       "batch_size": config.batch_size(mode)}
    return redact({
        "run": run, "seed": config.seed, "sync": config.is_sync, "ratio": config.ratio,
        "modes": modes, "policy": shown, "sample_rate": config.sample_rate,
        "sample_stream_len": config.sample_stream_len,
    })
