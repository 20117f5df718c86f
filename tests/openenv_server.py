"""A real OpenEnv env server for the tests and benchmarks, built with openenv-core's server API
(openenv-core 0.3.0: `openenv.core.env_server.http_server.create_app`, the `Environment`,
`Action` and `Observation` bases of openenv/core/env_server/interfaces.py and types.py).

The game: guess a digit. `reset(seed)` picks the digit `seed % 10`; each step's `guess` earns
1.0 and ends the episode when right, else 0.0; the episode ends after `TURNS` guesses. Each
reset and step prints one line (`reset SEED`, `step SEED N`) to stdout, flushed, so a test
can act on what really happened (a session open mid-episode) rather than on a timer.

With --stop-when-full it hangs, once, at a point a test can name: in the first step that
finds all its --max-sessions sessions mid-episode (stepped, so their reset was answered, and
not done) it prints `stopped` and SIGSTOPs itself before it answers; SIGCONT continues it.
A client that keeps to that many sessions then awaits only steps from it: none of its
sessions is opening or resetting there. (A SIGSTOP sent by a test on seeing a line lands
some steps later, at a point nobody can tell.) Until it has stopped its episodes end only on
a right guess, not after `TURNS`, so that its sessions do fill up mid-episode.

    python tests/openenv_server.py --port 8000 [--max-sessions 4] [--stop-when-full]
    python tests/openenv_server.py --fork-server FD

The second form is a fork server for the tests (`openenv_servers.ForkServer`): importing
openenv-core costs seconds (its `env_server` package imports gradio and fastmcp), so it
imports once and forks each server from there. FD is its end of an AF_UNIX SOCK_SEQPACKET
socket; each request on it is `{"argv": [...]}` (JSON: the first form's arguments) carrying
one file descriptor, where the server's stdout and stderr go (the write end of the caller's
pipe). It forks a child that serves as the first form does with them, answers `{"pid": PID}`
carrying a pidfd of that child, so the caller signals that very process (SIGSTOP, SIGKILL)
and learns when it is gone, never a process that reused its pid; or `{"error": "..."}`.
It reaps its children as they die; they die with it (killed and reaped when the socket
closes; PR_SET_PDEATHSIG should it be killed). A fork while another thread of the process
runs can leave that thread's locks held forever in the child, so it forks only while it is
one thread (checked in /proc/self/task before each fork); the caller starts it with
OPENBLAS_NUM_THREADS=1 and JE_ARROW_MALLOC_CONF=background_thread:false, else numpy's
OpenBLAS and pyarrow's jemalloc (both imported by gradio) each start a thread.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import signal
import socket
import sys
import threading
import traceback
import uuid
from typing import Any, NoReturn

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

TURNS = 3
_SAYING = threading.Lock()
_PLAYING: set[int] = set()  # sessions (their envs' ids) mid-episode: stepped, not done
stop_at = 0  # SIGSTOP when this many sessions are mid-episode (--stop-when-full); 0: never


def say(line: str, env: GuessEnv | None = None, playing: bool = False) -> None:
    """One whole line on stdout, flushed; `env` is now mid-episode or not. openenv-core runs
    each session's env in a thread of its own: unlocked, two sessions' prints could
    interleave into one line. With --stop-when-full, the first step that finds every
    session mid-episode prints `stopped` and SIGSTOPs this process before it answers."""
    global stop_at
    with _SAYING:
        if env is not None:
            (_PLAYING.add if playing else _PLAYING.discard)(id(env))
        print(line, flush=True)
        if stop_at and line.startswith("step ") and len(_PLAYING) >= stop_at:
            stop_at = 0  # once
            print("stopped", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)  # the lock held: nothing moves until SIGCONT


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    prompt: str
    turn: int = 0


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # no state shared between sessions

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.seed = 0
        self.target = "0"

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> GuessObservation:
        self.seed = int(seed or 0)
        self.target = str(self.seed % 10)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        say(f"reset {self.seed}", self, playing=False)  # mid-episode from its first step
        return GuessObservation(prompt="Guess a digit (0-9).", turn=0)

    def step(self, action: GuessAction, timeout_s: float | None = None,
             **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        turn = self._state.step_count
        right = action.guess.strip() == self.target
        done = right or (turn >= TURNS and not stop_at)  # no turn limit until it stopped
        say(f"step {self.seed} {turn}", self, playing=not done)
        return GuessObservation(prompt="Right." if right else f"Wrong, guess again ({turn}).",
                                turn=turn, reward=1.0 if right else 0.0, done=done)

    def close(self) -> None:
        with _SAYING:
            _PLAYING.discard(id(self))
        super().close()

    @property
    def state(self) -> State:
        return self._state


def main(argv: list[str] | None = None) -> None:
    global stop_at
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=1)
    parser.add_argument("--stop-when-full", action="store_true",
                        help="SIGSTOP itself, once, in the first step that finds all "
                             "--max-sessions sessions mid-episode (a server that hangs)")
    parser.add_argument("--fork-server", type=int, metavar="FD",
                        help="serve fork requests on this socket (see the module doc)")
    args = parser.parse_args(argv)
    if args.fork_server is not None:
        fork_server(socket.socket(fileno=args.fork_server))
    stop_at = args.max_sessions if args.stop_when_full else 0
    app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess",
                     max_concurrent_envs=args.max_sessions)
    print(f"serving on {args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", ws_max_size=1 << 20)


def threads() -> list[str]:
    """The names of this process's OS threads (Python's and native ones alike)."""
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        with open(f"/proc/self/task/{task}/comm") as comm:
            names.append(comm.read().strip())
    return names


def fork_server(control: socket.socket) -> NoReturn:
    """Answer fork requests on `control` until its other end closes (see the module doc)."""
    children: set[int] = set()

    def reap(signum: int, frame: Any) -> None:
        try:
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                children.discard(pid)
        except ChildProcessError:
            pass

    signal.signal(signal.SIGCHLD, reap)
    while True:
        message, fds, _, _ = socket.recv_fds(control, 4096, 1)
        if not message:  # the tests are done (or gone): so are the servers, reaped here
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            for pid in children:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            sys.stdout.flush()
            os._exit(0)  # nothing to finalize: skips unwinding gradio & co (most of a second)
        try:
            request = json.loads(message)
            (out,) = fds
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": f"a bad request {message!r}: {exc}"}).encode())
            continue
        running = threads()
        if len(running) != 1:
            os.close(out)
            control.send(json.dumps({"error": f"will not fork while {len(running)} threads "
                                              f"run: {running}"}).encode())
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # the imported objects: a child's collections leave them (and their pages) be
        # SIGCHLD held until the pidfd is open: a child that dies at once stays a zombie
        # (its pid taken) until then, so the pidfd is of this child, never of another process
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            serve_forked(control, out, request, mask, me)
        children.add(pid)
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(out)
        try:
            socket.send_fds(control, [json.dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)


def serve_forked(control: socket.socket, out: int, request: dict[str, Any],
                 mask: set[int | signal.Signals], parent: int) -> NoReturn:
    """The forked child: output to `out`, die with the fork server, serve; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        control.close()
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the fork server died before the prctl
            os._exit(1)
        main([str(arg) for arg in request["argv"]])
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
