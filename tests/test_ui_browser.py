"""`rollstream ui` in a real browser: Debian's chromium driven by selenium through Debian's
chromedriver, against a live run (`rollstream up` with the stand-in model server), checking
what a person sees: groups arrive, a failed episode reads turn by turn (observation grid,
reply, parsed action or format error), a filter narrows the list, a live number moves.

The browser is found at ROLLSTREAM_CHROMIUM / ROLLSTREAM_CHROMEDRIVER, else on PATH. Without it
(or without selenium) the test skips, unless ROLLSTREAM_REQUIRE_BROWSER=1 (CI sets it after
installing them), where a missing browser fails it: CI must not pass by skipping.
ROLLSTREAM_UI_SCREENSHOT=PATH saves the page as the docs show it (docs/ui.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from helpers import ROOT, clean_env, wait_for
from llm_helpers import MODEL, fake_llm_factory

REQUIRE_ENV = "ROLLSTREAM_REQUIRE_BROWSER"
fake_llm = pytest.fixture(fake_llm_factory)
# what runs Debian's chromium headless here (no GPU, no sandbox as root, nothing fetched)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1500")
WAIT_S = 90.0  # the machine may be shared: generous, and each wait names what it waits for


def missing(why: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {why}")
    pytest.skip(why)


def find(env: str, names: tuple[str, ...]) -> str | None:
    given = os.environ.get(env)
    if given:
        return given if os.access(given, os.X_OK) else None
    return next((path for name in names if (path := shutil.which(name))), None)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium is not installed (pip install -e '.[test]')")
    chromium = find("ROLLSTREAM_CHROMIUM", ("chromium", "chromium-browser"))
    driver = find("ROLLSTREAM_CHROMEDRIVER", ("chromedriver",))
    if chromium is None or driver is None:
        missing("no chromium / chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}")
    session = webdriver.Chrome(options=options, service=Service(driver))
    session.set_page_load_timeout(60)
    try:
        yield session
    finally:
        shot = tmp_path / "page.png"  # what the page showed at the end (a failure's evidence)
        session.save_screenshot(str(shot))
        print(f"the page at the end: {shot}\n{session.find_element('tag name', 'body').text}")
        session.quit()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in reversed(started):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def live_run(tmp_path: Path, base_url: str, redis_url: str, run: str,
             processes: list[subprocess.Popen]) -> None:
    """`rollstream up`: one producer, the stand-in trainer, an LLM policy, two tags."""
    config = {
        "rollout_batch_size": 8, "async_generation_ratio": 1, "seed": 3, "sample_rate": 1.0,
        # every group sampled, and kept for the whole run (the most the stream may keep): on
        # a loaded machine the browser may open a group minutes after the API named it, and a
        # trimmed sample cannot be read
        "sample_stream_len": 10_000,
        "train_env_manager": {"max_env_num_per_worker": 8, "num_env_groups": 2,
                              "group_size": 4, "tags": ["FrozenLake", "SimpleSokoban"]},
        "policy": {"type": "openai", "base_urls": [base_url], "model": MODEL,
                   "max_tokens": 64, "timeout_s": 10.0, "max_retries": 2},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    processes.append(subprocess.Popen(
        [sys.executable, "-m", "rollstream", "up", "--config", str(path), "--run", run,
         "--producers", "1", "--seconds", "300", "--train-step-s", "0.3"],
        cwd=ROOT, env={**clean_env(), "ROLLSTREAM_REDIS_URL": redis_url},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))


def start_ui(redis_url: str, run: str, processes: list[subprocess.Popen]) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollstream", "ui", "--port", "0", "--interval-s", "0.5"],
        cwd=ROOT, env={**clean_env(), "ROLLSTREAM_REDIS_URL": redis_url,
                       "ROLLSTREAM_RUN": run},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    processes.append(proc)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("rollstream ui: http://"):
        proc.kill()
        pytest.fail(f"rollstream ui did not start: {line}{proc.communicate(timeout=10)}")
    return line.split()[2]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_person_watches_groups_arrive_and_reads_a_failed_episode_turn_by_turn(
        browser, fake_llm, r: redis.Redis, redis_url: str, run: str, tmp_path: Path,
        processes) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    server = fake_llm(p_good=0.5, malformed_share=1.0, latency_s=0.01)
    live_run(tmp_path, server.base_url, redis_url, run, processes)
    wait_for(lambda: r.exists(f"{{{run}}}:config"), timeout_s=WAIT_S,
             what="the run's config (`up` publishes it first)")
    page = start_ui(redis_url, run, processes)
    browser.get(page)
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.2,
                         ignored_exceptions=(StaleElementReferenceException,))

    def text(css: str) -> str:
        return browser.find_element(By.CSS_SELECTOR, css).text

    assert wait.until(lambda b: text("#run-name") == run, "the run's name on the page")
    # a live number moves: trajectories committed so far, without reloading the page
    # the counters of generation thrown away and of tool calls are shown (none here yet)
    wait.until(lambda b: text("#stat-discarded") != "–" and text("#stat-tools") == "0 (0)",
               "the discarded-token and tool-call counters")
    first = wait.until(lambda b: _number(text("#stat-committed")), "a committed count")
    wait.until(lambda b: (_number(text("#stat-committed")) or 0) > first,
               f"the committed count to move past {first}")

    # groups arrive on the page
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#groups details.group")) >= 2,
               "sampled groups listed")
    # which failed episode to read: the page's own API names one with a format error (a
    # person would scroll for it); then the browser does what the person does
    key, uid = wait_for(lambda: _failed_with_format_error(page), timeout_s=WAIT_S,
                        what="a whole group with a failed episode that has a format error")
    group = wait.until(lambda b: b.find_element(By.CSS_SELECTOR,
                                                f'#groups details.group[data-key="{key}"]'),
                       f"group {key} listed")
    group.find_element(By.TAG_NAME, "summary").click()
    row = wait.until(lambda b: group.find_element(By.CSS_SELECTOR, f'tr.member[data-uid="{uid}"]'),
                     f"member {uid} shown once its group opens")
    assert row.is_displayed()
    row.click()
    wait.until(lambda b: uid.split(".")[0] in text("#trajectory h3"), f"{uid}'s episode")
    turn = next(t for t in browser.find_elements(By.CSS_SELECTOR, "#trajectory details.turn")
                if t.find_elements(By.CSS_SELECTOR, "summary .badge.bad"))
    assert "failed" in text("#trajectory h3")
    body = turn.find_element(By.CSS_SELECTOR, ".turn-body")
    assert not body.is_displayed()  # a turn is folded until a person opens it
    turn.find_element(By.TAG_NAME, "summary").click()
    wait.until(lambda b: body.is_displayed(), "the turn to expand")
    grid = body.find_element(By.CSS_SELECTOR, "pre.grid-text").text
    assert len(grid.splitlines()) >= 4  # the board, a row per line, as the model saw it
    reply = body.find_element(By.CSS_SELECTOR, "pre.reply").text
    assert len(reply) > 10 and "<answer>" not in reply  # the model's words, as text
    assert body.find_element(By.CSS_SELECTOR, "p.parsed.bad").text.startswith("format error")
    meta = body.find_element(By.CSS_SELECTOR, "table.meta").text
    assert server.base_url in meta and "latency_s" in meta and "finish_reason" in meta
    good = [t for t in browser.find_elements(By.CSS_SELECTOR, "#trajectory details.turn")
            if not t.find_elements(By.CSS_SELECTOR, "summary .badge.bad")]
    good[0].find_element(By.TAG_NAME, "summary").click()  # a well-formed reply: its action
    wait.until(lambda b: good[0].find_element(By.CSS_SELECTOR, "p.parsed").is_displayed(),
               "a well-formed turn to expand")
    parsed = good[0].find_element(By.CSS_SELECTOR, "p.parsed").text
    assert re.fullmatch(r"parsed action: (Up|Down|Left|Right)", parsed), parsed

    # the tag filter narrows the list to that tag's groups
    Select(browser.find_element(By.ID, "filter-tag")).select_by_visible_text("SimpleSokoban")
    wait.until(lambda b: (tags := [e.text for e in b.find_elements(
        By.CSS_SELECTOR, "#groups details.group summary .tag")]) and set(tags) ==
        {"SimpleSokoban"}, "only SimpleSokoban groups listed")
    Select(browser.find_element(By.ID, "filter-tag")).select_by_visible_text("all")
    shot = os.environ.get("ROLLSTREAM_UI_SCREENSHOT")
    if shot:  # the whole page, from the top
        browser.set_window_size(1400, 2000)
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(shot)
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert errors == [], errors  # no script error, no failed request


def _failed_with_format_error(page: str) -> tuple[str, str] | None:
    """(group key, member uid) of a failed episode of several turns in a whole group, with a
    reply that is a format error and one that is not: asked of the ui's JSON API."""
    groups = _get(page + "api/groups?mode=train&outcome=failed&limit=10")["groups"]
    for group in groups:
        if len(group["members"]) != group["expected"]:
            continue
        for member in group["members"]:
            if member["outcome"]["success"] or member["env_failed"] or \
                    member["num_actions"] < 3:
                continue
            steps = _get(page + f"api/trajectory/{member['uid']}")["steps"]
            valid = [s["info"].get("action_is_valid") for s in steps if "response" in s]
            if False in valid and True in valid:
                return group["key"], member["uid"]
    return None


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def _number(shown: str) -> int | None:
    digits = re.sub(r"[^\d]", "", shown)
    return int(digits) if digits else None
