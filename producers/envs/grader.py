"""Math answers graded in a child process, so a reply sympy chokes on cannot stall producers.

GEM and ROLL grade a math answer with math-verify (`parse` the boxed answer and each gold
answer, then `verify(gold, answer)`) in a one-process pool per env and count it wrong when it
takes over a second (`res.get(timeout=1)`, gem-llm 0.0.4 `gem/envs/math_env.py`; ROLL's
`roll/pipeline/agentic/env/gem/math_env.py`). A pool per env would mean a process per env
(thousands per producer); here one grader process serves every math env of a producer
process, one answer at a time. An answer not graded within the timeout counts as wrong, and
the child is killed and started again at the next answer (a stuck sympy call cannot be
interrupted any other way). math-verify's own signal-based timeouts work in the child, whose
main thread runs them; in a producer's worker thread they would not.

Protocol, one JSON line each way: `{"answer": str, "gold": [str, ...]}` ->
`true`/`false`; the child first writes `"ready"` once math-verify is imported.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

logger = logging.getLogger(__name__)

GRADE_TIMEOUT_S = 1.0  # ROLL's and GEM's
START_TIMEOUT_S = 120.0  # importing sympy takes seconds, more on a loaded machine
WORKER_MODULE = "producers.envs.grader_worker"


class GraderError(RuntimeError):
    """The grader process could not be started; the message says why."""


class MathGrader:
    """A math-verify child process: `check(answer, gold)` with a deadline; thread-safe."""

    def __init__(self, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.restarts = 0  # children killed at a timeout or lost

    def check(self, answer: str, gold: Sequence[str],
              timeout_s: float = GRADE_TIMEOUT_S) -> bool:
        """Whether `answer` equals one of `gold` for math-verify; False when grading takes
        longer than `timeout_s` (the child is then killed) or the child dies."""
        request = json.dumps({"answer": answer, "gold": list(gold)}).encode() + b"\n"
        with self._lock:
            proc = self._started()
            try:
                assert proc.stdin is not None
                proc.stdin.write(request)
                proc.stdin.flush()
                line = self._read_line(proc, time.monotonic() + timeout_s)
            except (BrokenPipeError, OSError):
                line = None
            if line is None:
                self._kill(f"did not grade an answer within {timeout_s:.1f}s"
                           if proc.poll() is None else "exited")
                return False
            return json.loads(line) is True

    def close(self) -> None:
        """Stop the child process (a later `check` starts a new one)."""
        with self._lock:
            if self._proc is not None:
                proc, self._proc = self._proc, None
                for stream in (proc.stdin, proc.stdout):
                    if stream is not None:
                        stream.close()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc = None
        self._buffer = b""
        with tempfile.TemporaryFile() as errors:  # the child logs nothing but a crash
            proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=errors, start_new_session=True)
            line = self._read_line(proc, time.monotonic() + self.start_timeout_s)
            if line != b'"ready"':
                proc.kill()
                proc.communicate()
                errors.seek(0)
                text = errors.read().decode(errors="replace").strip()
                last = (text.splitlines() or [f"exit code {proc.returncode}"])[-1]
                raise GraderError(f"the math grader process did not start: {last}")
        self._proc = proc
        return proc

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """The next line from the child, or None at the deadline or its end of output."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.strip()

    def _kill(self, why: str) -> None:
        proc, self._proc = self._proc, None
        self.restarts += 1
        if proc is None:
            return
        logger.info("math grader process %d %s: counted wrong, restarting it", proc.pid, why)
        proc.kill()
        proc.communicate()


_shared: MathGrader | None = None
_shared_lock = threading.Lock()


def shared_grader() -> MathGrader:
    """The grader every math env of this process uses (started at its first answer, stopped
    at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathGrader()
            atexit.register(_shared.close)
        return _shared
