"""Pictures of a run: `up --plot` and `train --plot` write a PNG that opens; `up` on a
terminal redraws one progress line."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env, small_config
from helpers import run_cli as cli

from rollstream.plots import Panel, plot_panels
from rollstream.progress import Progress, StepPoint, write_plot

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
image = pytest.importorskip("matplotlib.image")


def assert_png(path: Path, min_height: int = 300) -> None:
    """A PNG that matplotlib reads back, with more than one colour in it."""
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] >= min_height and pixels.shape[1] >= 500
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::97]}) > 3


def test_panels_stack_and_the_single_panel_api_stays(tmp_path):
    png = plot_panels(tmp_path / "sub" / "p.png", [
        Panel({"a": ([0, 1, 2], [1.0, 2.0, 3.0])}, "one", "x"),
        Panel({"b": ([0, 1, 2], [0.1, 0.5, 0.2]), "c": ([0, 2], [0.3, 0.4])}, "two", "y",
              (0.0, 1.0)),
    ], title="t")
    assert_png(png, min_height=500)  # two panels of 2.6 in at 100 dpi
    with pytest.raises(ValueError, match="at least one panel"):
        plot_panels(tmp_path / "none.png", [])
    with pytest.raises(ValueError, match="2 x values, 1 y values"):
        plot_panels(tmp_path / "bad.png", [Panel({"a": ([0, 1], [1.0])})])


def test_the_run_plot_has_throughput_wait_and_success(tmp_path):
    progress = Progress(out=io.StringIO())
    progress.train = [StepPoint(i, 0.1 * i, 100.0 + i, {"FrozenLake": 0.1 * i}) for i in range(5)]
    progress.val = [StepPoint(4, 0.3, 50.0, {"FrozenLake": 0.5})]
    write_plot(str(tmp_path / "run.png"), progress, "run x")
    assert_png(tmp_path / "run.png", min_height=700)  # three panels


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(small_config(async_generation_ratio=1).to_json())  # JSON is YAML
    return path


@pytest.mark.slow
def test_up_on_a_terminal_redraws_one_line_and_writes_the_plot(tmp_path, redis_url, run):
    png = tmp_path / "run.png"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "up", "--config", str(write_config(tmp_path)),
         "--redis-url", redis_url, "--run", run, "--producers", "1", "--steps", "4",
         "--plot", str(png)],
        cwd=ROOT, env=clean_env(), stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    _, err = proc.communicate(timeout=60)
    out = b"".join(chunks).decode()
    assert proc.returncode == 0, err.decode() + out
    assert out.count("\r\x1b[2K") >= 4  # the line is redrawn in place, step after step
    # the step numbered as the plain lines number it (it said "step 4" for the pipe's "step 3")
    assert "step 3 v3" in out and "step 4 " not in out
    assert "traj/s" in out and "done: 4 steps" in out
    assert "step 0    v0" not in out  # not the plain line per step
    assert f"plot: {png}" in out
    assert_png(png, min_height=700)


@pytest.mark.slow
def test_train_writes_the_plot_and_plain_lines_through_a_pipe(tmp_path, redis_url, run,
                                                              producer_thread):
    png = tmp_path / "train.png"
    thread = producer_thread()
    out = cli("train", "--config", str(write_config(tmp_path)), "--redis-url", redis_url,
              "--run", run, "--steps", "3", "--val-every", "2", "--plot", str(png))
    thread.stop()
    assert out.returncode == 0, out.stderr
    assert [line.split()[:2] for line in out.stdout.splitlines() if line.startswith("step")] == [
        ["step", "0"], ["step", "1"], ["step", "2"]]
    assert "\x1b" not in out.stdout and f"plot: {png}" in out.stdout
    assert_png(png, min_height=700)


def test_a_plot_into_a_missing_folder_is_refused_before_the_run(tmp_path):
    out = cli("up", "--config", "configs/frozenlake_async.yaml", "--steps", "1",
              "--plot", str(tmp_path / "no" / "such" / "run.png"))
    assert out.returncode == 2
    assert "--plot" in out.stderr and "does not exist or is not writable" in out.stderr


def test_progress_keeps_no_point_per_step_unless_a_plot_wants_them() -> None:
    """`rollstream train` (compose's trainer) kept ~400 bytes per step for a plot nobody
    asked for: it grew without bound over a long run."""
    from types import SimpleNamespace

    import numpy as np

    batch = SimpleNamespace(mode="train", version=1, metrics={
        "time/get_batch_cost": 0.1, "env/FrozenLake/success": 0.5}, num_actions=np.ones(4),
        scores=np.zeros(4))
    for keep in (False, True):
        progress = Progress(out=io.StringIO(), keep=keep)
        for step in range(3):
            progress.batch(f"step {step}", step, _Sized(batch))
        assert len(progress.train) == (3 if keep else 0)


class _Sized:
    def __init__(self, inner: object):
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return 4
