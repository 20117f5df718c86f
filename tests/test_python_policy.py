"""`policy: {type: python, entrypoint: ...}`: a user's policy by import path or file path;
every way it can fail is one line naming the entrypoint, and a producer exits 1 with it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import clean_env, run_cli, small_config

from consumer import Batcher
from producers.policies import make_policy
from schemas.config import RolloutConfig
from schemas.errors import BatchTimeout, PolicyError
from schemas.policy import PythonPolicyConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def python_policy(entrypoint: str, **kwargs: object) -> PythonPolicyConfig:
    return PythonPolicyConfig(type="python", entrypoint=entrypoint, **kwargs)


def load_error(entrypoint: str, **kwargs: object) -> str:
    with pytest.raises(PolicyError) as info:
        make_policy(python_policy(entrypoint, **kwargs))
    text = str(info.value)
    assert "\n" not in text
    assert f"policy.entrypoint {entrypoint!r}" in text
    return text


def test_module_path_builds_the_policy_with_the_blocks_other_keys(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    policy = make_policy(python_policy("toy_policies:make_weighted", action=2))
    assert type(policy).__name__ == "WeightedPolicy"
    assert policy.action == 2  # type: ignore[attr-defined]


def test_file_path_is_resolved_against_the_config_folder(tmp_path, monkeypatch):
    folder = tmp_path / "cfg"
    (folder / "agents").mkdir(parents=True)
    shutil.copy(DATA / "toy_policies.py", folder / "agents" / "mine.py")
    (folder / "run.yaml").write_text(
        "train_env_manager: {max_env_num_per_worker: 4, num_env_groups: 1, group_size: 4, "
        "tags: [FrozenLake]}\n"
        "policy: {type: python, entrypoint: 'agents/mine.py:make_weighted', action: 3}\n")
    monkeypatch.chdir(tmp_path)  # not the config's folder: the path must not depend on it
    config = RolloutConfig.from_yaml(folder / "run.yaml")
    assert config.policy.entrypoint == f"{folder / 'agents' / 'mine.py'}:make_weighted"
    policy = make_policy(config.policy)
    assert policy.action == 3  # type: ignore[attr-defined]


def test_missing_module_is_named():
    text = load_error("rollstream_no_such_policy:make")
    assert "no module named 'rollstream_no_such_policy'" in text
    assert "PYTHONPATH" in text


def test_module_whose_import_fails_names_the_missing_dependency(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    text = load_error("broken_policy:make")
    assert "importing 'broken_policy' failed" in text
    assert "rollstream_no_such_dependency" in text


def test_missing_attribute_is_named(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    assert "module 'toy_policies' has no attribute 'nope'" in load_error("toy_policies:nope")


def test_missing_file_is_named(tmp_path):
    text = load_error(f"{tmp_path}/absent.py:make")
    assert f"no file '{tmp_path}/absent.py'" in text


def test_factory_that_raises_gives_one_line(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    text = load_error("toy_policies:make_raising")
    assert text.endswith("the factory raised RuntimeError: no model file here, look elsewhere")


def test_unknown_factory_argument_is_named(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    text = load_error("toy_policies:make_weighted", bogus=1)
    assert "TypeError" in text and "bogus" in text


def test_not_a_factory_and_not_a_policy(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    assert "'NOT_A_FACTORY' is a int, not a callable factory" in load_error(
        "toy_policies:NOT_A_FACTORY")
    assert "returned a object without an act method" in load_error(
        "toy_policies:make_actless")


def run_producer(redis_url: str, run: str, entrypoint: str) -> subprocess.CompletedProcess:
    """A real producer process for a run whose config names `entrypoint`."""
    import redis

    config = small_config(policy={"type": "python", "entrypoint": entrypoint})
    client = redis.Redis.from_url(redis_url)
    Batcher(client, config, run=run)
    client.close()
    env = {**clean_env(), "ROLLSTREAM_REDIS_URL": redis_url, "ROLLSTREAM_RUN": run,
           "PYTHONPATH": str(DATA)}
    return subprocess.run([sys.executable, "-m", "rollstream", "--log-level", "WARNING",
                           "produce"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize(("entrypoint", "expected"), [
    ("rollstream_no_such_policy:make", "no module named 'rollstream_no_such_policy'"),
    ("toy_policies:make_raising", "the factory raised RuntimeError: no model file here"),
])
def test_producer_process_exits_1_with_one_line(redis_url, run, entrypoint, expected):
    done = run_producer(redis_url, run, entrypoint)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, output
    assert len(output.splitlines()) == 1, output
    assert expected in output and f"policy.entrypoint {entrypoint!r}" in output
    assert "Traceback" not in output


def test_config_check_warns_when_the_entrypoint_does_not_import_here(tmp_path):
    """A warning, exit 0: the producers may run where it imports (another image or path)."""
    shutil.copy(DATA / "toy_policies.py", tmp_path / "mine.py")
    block = ("train_env_manager: {max_env_num_per_worker: 4, num_env_groups: 1, group_size: 4, "
             "tags: [FrozenLake]}\npolicy: {type: python, entrypoint: '%s'}\n")
    for entrypoint, warned in (("mine.py:make_weighted", None),
                               ("mine.py:make_nothing", "has no attribute 'make_nothing'"),
                               ("rollstream_no_such_policy:make", "no module named")):
        path = tmp_path / "run.yaml"
        path.write_text(block % entrypoint)
        out = run_cli("config", "check", str(path))
        assert out.returncode == 0, out.stderr
        if warned is None:
            assert "warning" not in out.stderr, out.stderr
        else:
            assert out.stderr.startswith("warning: policy.entrypoint '"), out.stderr
            assert warned in out.stderr and "producers that cannot import it exit 1" \
                in out.stderr, out.stderr


@pytest.mark.parametrize("bare, said", [
    (False, "ForgetfulPolicy.act returned None: it must return (action, response)"),
    (True, "ForgetfulPolicy.act returned 1: it must return (action, response)"),
])
def test_an_act_that_returns_no_pair_is_named_and_stops_nothing(r, run, monkeypatch, caplog,
                                                                producer_thread, bare, said):
    """A forgotten `return` gave None, which the episode loop read as "cut short, ask again":
    the producer spun at 100% CPU and no stop reached it. A bare action was blamed on the
    env. Both are named now; the groups fail with that reason and the producer stops."""
    monkeypatch.syspath_prepend(str(DATA))
    config = small_config(policy={"type": "python", "entrypoint": "toy_policies:make_forgetful",
                                  "bare": bare})
    batcher = Batcher(r, config, run=run)
    caplog.set_level("WARNING")
    thread = producer_thread()
    with pytest.raises(BatchTimeout):  # every group of the step failed
        batcher.get_batch(timeout_s=3)
    assert any(said in rec.getMessage() for rec in caplog.records), caplog.text
    started = time.monotonic()
    assert thread.stop() == 0
    assert time.monotonic() - started < 10
