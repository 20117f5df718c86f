"""examples/grpo_frozenlake.py: it learns (clearly better than the random policy), on its own
and under `rollstream up --trainer`, and leaves no process behind, also on Ctrl+C."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import clean_env, wait_for

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "grpo_frozenlake.py"

# short and seeded: 8 groups of 8, 10 updates, 64 val maps
SHORT = ["--seed", "3", "--steps", "10", "--groups", "8", "--val-envs", "64", "--val-every",
         "5", "--timeout-s", "30"]


def run_name() -> str:
    return f"t-grpo-{uuid.uuid4().hex[:8]}"


def processes_of(run: str, redis_dir: str | None = None) -> list[int]:
    """Live processes with ROLLSTREAM_RUN=run in their environment, or `redis_dir` (an
    embedded server's folder) on their command line."""
    mark = f"ROLLSTREAM_RUN={run}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (mark in environ or (redis_dir and redis_dir in cmdline)):
            found.append(int(pid))
    return found


def redis_dir_of(output: str) -> str | None:
    match = re.search(r"embedded Redis at unix://(\S+)/redis\.sock", output)
    return match.group(1) if match else None


def val_success(output: str) -> dict[int, float]:
    return {int(step): float(value) for step, value in re.findall(
        r"^val +step +(\d+) .*val/env/FrozenLake/success=([0-9.]+)", output, re.MULTILINE)}


@pytest.mark.slow
def test_example_learns_clearly_better_than_random_and_leaves_nothing(tmp_path):
    run = run_name()
    done = subprocess.run([sys.executable, str(EXAMPLE), *SHORT, "--run", run, "--out-dir",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                          env=clean_env(), timeout=120)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"final success_rate=[0-9.]+", last), last
    final = float(last.split("=")[1])
    vals = val_success(out)
    # the untrained policy is the random one: ~20% on ROLL's FrozenLake, whose goal is 2.8
    # steps from the start on average
    assert vals[0] < 0.35
    # the val line shows 3 decimals, the final line 4
    assert final == pytest.approx(vals[10], abs=5e-4) and final >= vals[0] + 0.3, vals
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert [int(r["step"]) for r in rows] == list(range(11))
    assert "env/FrozenLake/success" in rows[-1] and "scheduler/stale_dropped" in rows[-1]
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert processes_of(run, redis_dir_of(out)) == []


@pytest.mark.slow
def test_example_interrupted_stops_everything_and_exits_130(tmp_path):
    run = run_name()
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), *SHORT, "--steps", "1000", "--run",
                             run, "--out-dir", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=clean_env())
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("train step   2"):
            break
    assert processes_of(run), "the example's producers should be running"
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out
    assert out.strip().splitlines()[-1] == "interrupted; everything stopped"
    assert "Traceback" not in out
    assert processes_of(run, redis_dir_of(out)) == []


@pytest.mark.slow
def test_up_trainer_runs_the_script_with_the_run_in_its_environment(tmp_path):
    run = run_name()
    trainer = f"{EXAMPLE} --steps 2 --groups 4 --val-envs 16 --timeout-s 30 --out-dir {tmp_path}"
    done = subprocess.run([sys.executable, "-m", "rollstream", "up", "--run", run,
                           "--producers", "1", "--trainer", trainer], capture_output=True,
                          text=True, cwd=tmp_path, env=clean_env(), timeout=120)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # the URL came through the environment (the script started no Redis of its own) and the
    # producer imported the policy module from the script's folder (PYTHONPATH)
    assert f"grpo_frozenlake: run {run!r}, sync, producers elsewhere" in out
    assert re.fullmatch(r"final success_rate=[0-9.]+", out.strip().splitlines()[-1])
    assert processes_of(run) == []


@pytest.mark.slow
def test_up_trainer_hands_the_config_path_and_returns_any_status(tmp_path):
    config = ROOT / "configs" / "frozenlake_sync.yaml"
    done = subprocess.run([sys.executable, "-m", "rollstream", "up", "--config", str(config),
                           "--run", "envcheck", "--producers", "1", "--trainer",
                           f"{ROOT / 'tests' / 'data' / 'env_trainer.py'} 3"],
                          capture_output=True, text=True, cwd=tmp_path, env=clean_env(),
                          timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ROLLSTREAM_RUN=envcheck" in done.stdout
    assert f"ROLLSTREAM_CONFIG={config}" in done.stdout
    assert "url handed: True" in done.stdout


@pytest.mark.slow
def test_up_trainer_returns_the_scripts_status_and_passes_ctrl_c_on(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "rollstream", "up", "--trainer",
                          f"{EXAMPLE} --steps many"], capture_output=True, text=True,
                         cwd=tmp_path, env=clean_env(), timeout=60)
    assert bad.returncode == 2 and "--steps: invalid int value" in bad.stderr
    run = run_name()
    trainer = f"{EXAMPLE} --steps 1000 --groups 4 --val-envs 16 --out-dir {tmp_path}"
    proc = subprocess.Popen([sys.executable, "-m", "rollstream", "up", "--run", run,
                             "--producers", "1", "--trainer", trainer], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=clean_env())
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("train step   2"):
            break
    wait_for(lambda: len(processes_of(run)) >= 2, what="the trainer and its producer")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted; everything stopped" in out and "Traceback" not in out
    assert processes_of(run) == []


def test_plots_without_matplotlib_say_how_to_install_it(tmp_path, monkeypatch):
    from rollstream.plots import plot_series
    from schemas.errors import RollstreamError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(RollstreamError, match=r"pip install 'rollstream\[plot\]'"):
        plot_series(tmp_path / "x.png", {"a": ([0, 1], [0.0, 1.0])})
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
def test_ctrl_c_on_a_trainer_that_ignores_every_signal_is_still_130(monkeypatch, caplog):
    """The trainer ignores SIGINT and SIGTERM, so `up` ends it with SIGKILL: `up` said 137
    (the trainer's death) where Ctrl+C promises 130, and called the trainer a producer.

    It runs `_wait_trainer` under `interrupt_signals()`, as `up` does: pytest started as a
    background job (`&` in a script) inherits SIGINT ignored, the test's Ctrl+C went
    nowhere and the wait went on to the trainer's own end, past the test's timeout. And the
    Ctrl+C comes as `up` waits on the trainer (in its `wait`), not from a timer: a timer's
    signal lands in whatever the main thread runs then, a garbage collection's finalizer
    included, where Python drops the KeyboardInterrupt ("Exception ignored in ...")."""
    from rollstream import launcher, processes

    monkeypatch.setattr(launcher, "TRAINER_STOP_S", 0.5)
    monkeypatch.setattr(processes, "STOP_S", 0.5)  # for SIGTERM, which it ignores too
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('ready', flush=True)\ntime.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    waits: list[float | None] = []

    def wait(timeout: float | None = None) -> int:
        waits.append(timeout)
        if len(waits) == 1:  # the terminal's Ctrl+C, to this process, as `up` waits
            signal.raise_signal(signal.SIGINT)
        return real_wait(timeout)

    real_wait, stubborn.wait = stubborn.wait, wait  # type: ignore[method-assign]
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        with caplog.at_level("WARNING", logger="rollstream.launcher"), \
                launcher.interrupt_signals():
            assert launcher._wait_trainer(stubborn, []) == 130
        assert f"trainer pid {stubborn.pid} ignored SIGTERM; killing it" in caplog.text
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        real_wait()
