"""The `python` tool's sandbox: each call is a fresh process that cannot hurt the producer.

A call writes the code to `main.py` in a fresh temporary directory (removed after) and runs
`python -I main.py` there as a child process of its own session, through asyncio's
subprocess API (the event loop never waits on it), with:
- resource limits set in the child before exec (`resource.setrlimit`): CPU seconds
  (`RLIMIT_CPU`: SIGXCPU at the limit), address space (`RLIMIT_AS`: a `MemoryError` in the
  program), file size (`RLIMIT_FSIZE`) and core files off;
- its output (stdout and stderr, interleaved) read as it comes and capped at
  `output_bytes`: the program is killed once it writes more;
- a wall-clock timeout: its whole process group is killed (SIGKILL) at `timeout_s`;
- an environment of its own (PATH, HOME in the temporary directory): none of the producer's
  variables (API keys) reach it;
- no network: it runs under `unshare -rn` (a new user and network namespace, which has only a
  loopback that is down: every connect fails) where the machine allows it. Where it does not
  (no `unshare`, or user namespaces disabled: some containers), `network_available()` says why
  once and the program runs with the machine's network (warned once per process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

from schemas.tools import PythonLimits

logger = logging.getLogger(__name__)

READ_CHUNK = 4096
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
                unshare, "-rn", "true", stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
            _, err = await proc.communicate()
            _isolation = "" if proc.returncode == 0 else (
                err.decode(errors="replace").strip() or f"exit {proc.returncode}")
    return _isolation


def _limits(limits: PythonLimits) -> None:
    """In the child, before exec: the resource limits (runs after fork: no logging here)."""
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    memory = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.output_bytes * 16,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


async def run_python(code: str, limits: PythonLimits) -> SandboxResult:
    """Run `code` in the sandbox (see the module docstring)."""
    global _warned
    argv = [sys.executable, "-I", "main.py"]
    isolated = False
    if not limits.network:
        why = await network_isolation()
        if why:
            if not _warned:
                _warned = True
                logger.warning("python tool: no network namespace here (unshare -rn: %s); "
                               "the sandbox runs with the machine's network", why)
        else:
            argv = ["unshare", "-rn", *argv]
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
            start_new_session=True, preexec_fn=lambda: _limits(limits))
        try:
            output, status = await asyncio.wait_for(_read(proc, limits.output_bytes),
                                                    timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            output, status = None, "timeout"
        finally:
            if proc.returncode is None:
                _kill(proc)
            returncode = await proc.wait()
        if output is None:
            output = b""
        if status == "ok":
            if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
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


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the child's whole session (start_new_session: its pid is the group's)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
