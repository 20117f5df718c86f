"""Running a model's Python program on one test input, in a limited child process.

What GEM does (gem-llm 0.0.4 `gem/utils/sandbox.py`, `sandbox_type: none`, the default ROLL's
configs use): refuse a program that names a dangerous module or call (a plain text check),
run it with `python` in a fresh temporary folder with a minimal environment, the test input
on stdin, a 10 second timeout; a program that fails with "is not defined" is run once more
with common imports in front. The program passes when it exits 0.

Ours in addition, so a program cannot take the producer down with it: CPU time, address space
and output-file limits (set by a small launcher that then execs the program, since a
`preexec_fn` is unsafe in a threaded process), its own process group killed at the timeout,
and stdout to a file (capped by the file-size limit) instead of an unbounded pipe. The
program can still reach the network and the filesystem as the producer's user: a sandbox
proper (a network namespace, a read-only root) is the tool sandbox's job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 10.0  # GEM's DEFAULT_TIMEOUT
MEMORY_MB = 2048
OUTPUT_MB = 16
# GEM's text check, module and call names from `check_forbidden_imports`.
FORBIDDEN_MODULES = ("subprocess", "multiprocessing", "threading", "socket", "psutil",
                     "resource", "ctypes")
FORBIDDEN_CALLS = ("os.system", "os.popen", "os.spawn", "os.fork", "os.exec", "sys.exit",
                   "os._exit", "os.kill")
# Common standard-library imports, put in front of a program that failed with "is not
# defined" (GEM's retry; its header also imports numpy and pandas, which we do not assume).
COMMON_IMPORTS = """\
import bisect, collections, copy, functools, heapq, io, itertools, math, operator, os, random
import re, string, sys
from bisect import bisect_left, bisect_right, insort
from collections import Counter, OrderedDict, defaultdict, deque
from functools import cache, cmp_to_key, lru_cache, reduce
from heapq import heapify, heappop, heappush
from itertools import accumulate, chain, combinations, permutations, product
from math import ceil, comb, factorial, floor, gcd, inf, isqrt, log, log2, sqrt
from typing import Any, Dict, List, Optional, Set, Tuple
"""
# Sets the limits, then becomes the program (argv: cpu seconds, memory MB, output MB, file).
_LAUNCHER = """\
import os, resource, sys
cpu, memory, output = (int(v) for v in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory << 20, memory << 20))
resource.setrlimit(resource.RLIMIT_FSIZE, (output << 20, output << 20))
os.execv(sys.executable, [sys.executable, "-I", sys.argv[4]])
"""
_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


@dataclass(frozen=True)
class RunResult:
    """How one run ended: `ok` (exit 0), stdout, the end of stderr, and why it failed."""

    ok: bool
    stdout: str
    stderr: str = ""
    reason: str = ""


def forbidden(code: str) -> str | None:
    """The dangerous name `code` mentions (GEM's check), or None."""
    for module in FORBIDDEN_MODULES:
        if f"import {module}" in code or f"from {module}" in code:
            return module
    for call in FORBIDDEN_CALLS:
        if call in code:
            return call
    return None


def run_program(code: str, stdin: str, *, timeout_s: float = TIMEOUT_S,
                memory_mb: int = MEMORY_MB) -> RunResult:
    """Run `code` on `stdin` as GEM does, within the limits."""
    name = forbidden(code)
    if name is not None:
        return RunResult(False, "", reason=f"refused: the program uses {name}")
    result = _run_once(code, stdin, timeout_s, memory_mb)
    if not result.ok and "is not defined" in result.stderr:
        result = _run_once(COMMON_IMPORTS + code, stdin, timeout_s, memory_mb)
    return result


def _run_once(code: str, stdin: str, timeout_s: float, memory_mb: int) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="rollstream-code-") as folder:
        work = Path(folder)
        program, out_path, err_path = work / "program.py", work / "stdout", work / "stderr"
        program.write_text(code, encoding="utf-8")
        env = {key: os.environ[key] for key in _ENV_KEYS if key in os.environ}
        env.update(HOME=folder, TMPDIR=folder, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   PYTHONIOENCODING="utf-8")
        cpu_s = max(1, int(timeout_s + 0.999))
        argv = [sys.executable, "-I", "-c", _LAUNCHER, str(cpu_s), str(memory_mb),
                str(OUTPUT_MB), str(program)]
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, start_new_session=True)
            reason = ""
            try:
                proc.communicate(stdin.encode("utf-8", errors="replace"), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                reason = f"timed out after {timeout_s:g}s"
            finally:
                _kill_group(proc)
        stdout = out_path.read_bytes().decode("utf-8", errors="replace")
        stderr = err_path.read_bytes()[-4096:].decode("utf-8", errors="replace").strip()
    if not reason and proc.returncode != 0:
        reason = f"exit code {proc.returncode}"
    return RunResult(not reason, stdout, stderr, reason)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the program's process group (whatever it started too) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
