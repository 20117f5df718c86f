"""The `python` tool's sandbox: each call is a fresh process that cannot hurt the producer.

A call writes the code to `main.py` in a fresh temporary directory (removed after) and runs
it there (`python -I`, `LAUNCHER`) as a child process of its own session, through asyncio's
subprocess API (the event loop never waits on it), with:
- resource limits the child sets before the program runs (`resource.setrlimit`): CPU seconds
  (`RLIMIT_CPU`: SIGXCPU at the limit), address space (`RLIMIT_AS`: a `MemoryError` in the
  program), file size (`RLIMIT_FSIZE`) and core files off;
- its output (stdout and stderr, interleaved) read as it comes and capped at
  `output_bytes`: the program is killed once it writes more;
- a wall-clock timeout: its whole process group is killed (SIGKILL) at `timeout_s`;
- an environment of its own (PATH, HOME in the temporary directory): none of the producer's
  variables (API keys) reach it;
- no network: it runs under `unshare -rnp --fork` (new user, network and PID namespaces: the
  network namespace has only a loopback that is down, so every connect fails; in its own PID
  namespace it cannot signal the producer or any process outside, though it runs as the
  producer's user) where the machine allows it. Where it does not
  (no `unshare`, or user namespaces disabled: some containers), `network_available()` says why
  once and the program runs with the machine's network (warned once per process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

from producers.lifetime import within
from schemas.tools import PythonLimits

logger = logging.getLogger(__name__)

READ_CHUNK = 4096
REAP_WAIT_S = 5.0  # for a killed program's output pipe to close
# new user, network and PID namespaces: no network, and no process of ours to signal (the
# program's pids are its own: the producer's pid means nothing there); --kill-child: the
# program dies with unshare
UNSHARE_ARGS = ("-rnp", "--fork", "--kill-child")
_isolation: str | None = None  # "" when unshare -rn works here, else why not (checked once)
_warned = False


@dataclass
class SandboxResult:
    output: str  # what the program printed, capped
    status: str  # ok, error (non-zero exit), timeout, cpu_limit, output_limit
    returncode: int | None
    wall_s: float
    isolated: bool  # ran without network

    def for_model(self) -> str:
        """The tool message's text: the output, and a last line saying why it stopped."""
        notes = {"timeout": "[killed: wall-clock timeout]",
                 "cpu_limit": "[killed: CPU time limit]",
                 "output_limit": "[killed: output limit]",
                 "error": f"[exit code {self.returncode}]"}
        note = notes.get(self.status)
        return f"{self.output}\n{note}" if note else self.output


async def network_isolation() -> str:
    """"" when `unshare -rn` runs here, else the reason it does not (checked once)."""
    global _isolation
    if _isolation is None:
        unshare = shutil.which("unshare")
        if unshare is None:
            _isolation = "no unshare command"
        else:
            proc = await asyncio.create_subprocess_exec(
                unshare, *UNSHARE_ARGS, "true", stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
            _, err = await proc.communicate()
            _isolation = "" if proc.returncode == 0 else (
                err.decode(errors="replace").strip() or f"exit {proc.returncode}")
    return _isolation


# The exit status of a program stopped by its CPU limit: the launcher turns SIGXCPU into it
# (unshare 2.38 --fork reports a child killed by a signal as exit 1, so the signal itself
# would be lost; a program stuck in C code past the hard limit gets SIGKILL: status error)
CPU_EXIT = 128 + signal.SIGXCPU
# What the child runs first: its limits, then the program (as `__main__`, named main.py in
# tracebacks). Set in the child rather than in a `preexec_fn`, which would make every call
# fork the whole producer (measured: 6.6 ms of producer CPU per call with it, see
# bench/bench_tools.py); without one, the child is spawned with vfork.
LAUNCHER = (
    "import os, resource as r, signal, sys\n"
    f"signal.signal(signal.SIGXCPU, lambda *_, end=os._exit: end({CPU_EXIT}))\n"
    "cpu, memory, fsize = map(int, sys.argv[1:4])\n"
    "r.setrlimit(r.RLIMIT_CPU, (cpu, cpu + 1))\n"
    "r.setrlimit(r.RLIMIT_AS, (memory, memory))\n"
    "r.setrlimit(r.RLIMIT_FSIZE, (fsize, fsize))\n"
    "r.setrlimit(r.RLIMIT_CORE, (0, 0))\n"
    "del os, r, signal, cpu, memory, fsize\n"
    "sys.argv = ['main.py']\n"
    "source = open('main.py', encoding='utf-8').read()\n"
    "exec(compile(source, 'main.py', 'exec'), {'__name__': '__main__'})\n"
)


def launcher_argv(limits: PythonLimits) -> list[str]:
    """`python -I -c LAUNCHER cpu_s memory_bytes file_bytes`."""
    return [sys.executable, "-I", "-c", LAUNCHER, str(limits.cpu_s),
            str(limits.memory_mb * 1024 * 1024), str(limits.output_bytes * 16)]


async def run_python(code: str, limits: PythonLimits) -> SandboxResult:
    """Run `code` in the sandbox (see the module docstring)."""
    global _warned
    argv = launcher_argv(limits)
    isolated = False
    if not limits.network:
        why = await network_isolation()
        if why:
            if not _warned:
                _warned = True
                logger.warning("python tool: no network namespace here (unshare -rn: %s); "
                               "the sandbox runs with the machine's network", why)
        else:
            argv = ["unshare", *UNSHARE_ARGS, *argv]
            isolated = True
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rollstream-py-") as work:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work,
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True)
        try:
            output, status = await within(_read(proc, limits.output_bytes),
                                            limits.timeout_s)
        except asyncio.TimeoutError:
            output, status = None, "timeout"
        finally:
            if proc.returncode is None:
                _kill(proc)
            returncode: int | None
            try:
                returncode = await within(_reap(proc), REAP_WAIT_S)
            except asyncio.TimeoutError:  # a process it started keeps the pipe: left behind
                logger.warning("python tool: a process the program started outlived it and "
                               "holds its output open (no PID namespace here to end it)")
                returncode = proc.returncode
        if output is None:
            output = b""
        if status == "ok":
            if returncode in (CPU_EXIT, -signal.SIGXCPU):
                status = "cpu_limit"
            elif returncode != 0:
                status = "error"
    text = output.decode("utf-8", errors="replace")
    return SandboxResult(text, status, returncode, time.perf_counter() - started, isolated)


async def _read(proc: asyncio.subprocess.Process, cap: int) -> tuple[bytes, str]:
    """The child's output until it closes it, or the first `cap` bytes once it writes more
    (the child is killed)."""
    assert proc.stdout is not None
    out = bytearray()
    while True:
        chunk = await proc.stdout.read(READ_CHUNK)
        if not chunk:
            await proc.wait()
            return bytes(out), "ok"
        out += chunk
        if len(out) > cap:
            _kill(proc)
            return bytes(out[:cap]), "output_limit"


async def _reap(proc: asyncio.subprocess.Process) -> int:
    """The killed or finished child's exit status, once its output pipe is drained to the
    end: asyncio (3.11, `base_subprocess.py`) wakes `wait()` only when every pipe has closed,
    and a stream left unread above its limit stops reading, so `wait()` alone would hang
    after a cap cut the reading short."""
    assert proc.stdout is not None
    while await proc.stdout.read(1 << 16):
        pass
    return await proc.wait()


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the child's whole session (start_new_session: its pid is the group's)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
