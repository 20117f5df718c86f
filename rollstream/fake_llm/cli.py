"""`rollstream fake-llm`: the command line of the stand-in server (its options, then serving
until SIGTERM or Ctrl+C)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from dataclasses import fields

from rollstream.fake_llm.app import FakeLLMServer
from rollstream.fake_llm.flavors import FLAVORS
from rollstream.fake_llm.options import OPTION_HELP, FakeLLMOptions
from schemas.errors import ConfigError


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
    if values["flavor"] not in FLAVORS:
        raise ConfigError(f"--flavor {values['flavor']!r} is not one of "
                          f"{', '.join(sorted(FLAVORS))}")
    if values["during_load"] not in ("wait", "abort"):
        raise ConfigError(f"--during-load must be wait or abort, got {values['during_load']!r}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} must be a port in 0..65535")
    for name in ("p_good", "malformed_share", "error_rate", "hang_rate", "drop_rate"):
        if not 0.0 <= values[name] <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1]")
    for name in ("think_words", "latency_s", "latency_sigma", "load_time_s",
                 "prefix_cache_tokens", "prefill_s_per_token"):
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
            print(f"fake-llm: serving model {options.model!r} as {server.flavor.title} at "
                  f"{server.base_url}", flush=True)
        await task

    try:
        asyncio.run(main())
    except OSError as exc:  # a port in use or an address not here: the user's choice, exit 2
        raise ConfigError(f"fake-llm cannot listen on {args.host}:{args.port}: "
                          f"{exc.strerror or exc}") from None
    return 130 if received and received[0] == signal.SIGINT else 0