"""Group filters against a real Redis: ROLL's `group_filter_cls` by import path and the
built-in `std_filter` (groups whose rewards all agree: DAPO's dynamic sampling), applied at
hand-out. A filtered group is not trained on: it is counted, acked and deleted, and the batch
takes other complete groups of the step in its place, or comes short with a warning."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
from helpers import (
    ROOT,
    add_trajectory,
    get_batch_in_thread,
    publish,
    run_cli,
    small_config,
    stream_lengths,
    wait_for,
)

from consumer import Batcher
from consumer.filters import FILTERED, scores_agree
from consumer.metrics import batcher_families
from schemas.errors import ConfigError, GroupFilterError, StepExhausted
from schemas.keys import CONSUMER_GROUP, Keys

DATA = ROOT / "tests" / "data"
STD = {"group_filter_config": {"type": "std_filter"}}
STD_COUNT = "scheduler/group_filter/std_filter"
CLASS_COUNT = "scheduler/group_filter/group_filter_cls"
AGREE, ZERO, MIXED = [1.0] * 4, [0.0] * 4, [1.0, 0.0, 1.0, 0.0]


@pytest.fixture(autouse=True)
def _filters_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))


def add_scored(r, run: str, group_id: int, episode_id: int, scores: list[float],
               mode: str = "train", **fields: Any) -> None:
    """A complete group whose members scored `scores`."""
    for member, score in enumerate(scores):
        add_trajectory(r, Keys(run), mode, group_id, episode_id, member,
                       group_size=len(scores), episode_score=float(score), **fields)


def pending(r, run: str, config, mode: str = "train") -> int:
    keys = Keys(run)
    return sum(r.xpending(keys.stream(mode, g), CONSUMER_GROUP)["pending"]
               for g in range(config.manager(mode).num_env_groups))


def admitted_all(r, run: str, config, limit: int) -> None:
    """Every train env committed every episode below `limit`, as producers would have."""
    envs = config.train_env_manager.num_envs
    r.hset(Keys(run).cursor("train"), mapping={str(env): limit for env in range(envs)})


def groups_of(batch) -> list[tuple[int, int]]:
    return sorted({(int(k), int(g)) for k, g in zip(batch.episode_ids, batch.group_ids,
                                                    strict=True)})


# -- the built-in filter -------------------------------------------------------------------------
def test_std_filter_judges_the_spread_of_episode_scores():
    group = [{"episode_score": s} for s in (0.1,) * 7]
    assert scores_agree(group, 0.0)  # numpy's std of seven 0.1s is 1.5e-17, not 0
    assert not scores_agree([{"episode_score": s} for s in (1.0, 0.0)], 0.0)
    assert scores_agree([{"episode_score": s} for s in (1.0, 0.9, 1.0)], 0.1)  # std 0.058
    assert not scores_agree([{"episode_score": s} for s in (1.0, 0.5, 1.0)], 0.1)  # 0.29
    assert not scores_agree([{"episode_score": 1.0}], 0.0)  # a group of one is kept


def test_groups_whose_rewards_all_agree_are_filtered_counted_and_deleted(r, run):
    config = small_config(train_env_manager=STD)  # a batch is the step's 4 groups
    batcher = Batcher(r, config, run=run)
    for g, scores in enumerate((AGREE, ZERO, MIXED, MIXED)):
        add_scored(r, run, g, 0, scores)
    batch = batcher.get_batch("train", timeout_s=10)
    assert groups_of(batch) == [(0, 2), (0, 3)]
    assert batch.metrics[FILTERED] == 2 and batch.metrics[STD_COUNT] == 2
    assert batcher.totals[FILTERED] == 2
    # the filtered groups' entries are acked and deleted at once, not left pending
    assert stream_lengths(r, Keys(run), config)[:2] == [0, 0]
    assert pending(r, run, config) == 8  # the batch's own, until the trainer acks it
    batcher.ack(batch)
    assert pending(r, run, config) == 0 and sum(stream_lengths(r, Keys(run), config)) == 0
    families = {f.name: f for f in batcher_families(batcher._shared, r, Keys(run))}
    assert [(s.labels, s.value) for s in families["rollstream_groups_filtered"].samples] \
        == [({"mode": "train", "reason": "std_filter"}, 2.0)]
    batcher.close()


def test_without_a_filter_groups_that_agree_are_trained_on(r, run):
    config = small_config()
    batcher = Batcher(r, config, run=run)
    for g, scores in enumerate((AGREE, ZERO, MIXED, MIXED)):
        add_scored(r, run, g, 0, scores)
    batch = batcher.get_batch("train", timeout_s=10)
    assert groups_of(batch) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert batch.metrics[FILTERED] == 0  # ROLL's metric is always there
    batcher.close()


def test_the_batch_waits_for_other_groups_of_the_step_in_place_of_filtered_ones(r, run):
    config = small_config(rollout_batch_size=8, train_env_manager=STD)
    batcher = Batcher(r, config, run=run)
    add_scored(r, run, 0, 0, AGREE)
    add_scored(r, run, 1, 0, ZERO)
    thread, result = get_batch_in_thread(batcher, timeout_s=30)
    wait_for(lambda: batcher.totals[FILTERED] == 2, what="the two groups filtered")
    assert thread.is_alive()  # not handed out short: the step has two more groups to come
    add_scored(r, run, 2, 0, MIXED)
    add_scored(r, run, 3, 0, MIXED)
    thread.join(30)
    assert groups_of(result["batch"]) == [(0, 2), (0, 3)], result
    batcher.close()


def test_a_step_without_enough_kept_groups_comes_short_with_a_warning(r, run, caplog):
    config = small_config(train_env_manager=STD)  # a batch is all 4 groups of the step
    batcher = Batcher(r, config, run=run)
    caplog.set_level("WARNING", logger="consumer")
    for g, scores in enumerate((AGREE, MIXED, MIXED, MIXED)):
        add_scored(r, run, g, 0, scores)
    started = time.monotonic()
    batch = batcher.get_batch("train", timeout_s=30)
    assert time.monotonic() - started < 10  # not waited out for a group that cannot come
    assert groups_of(batch) == [(0, 1), (0, 2), (0, 3)] and batch.metrics[FILTERED] == 1
    assert "handing out 3 of 4 groups" in caplog.text
    assert "1 filtered by the group filters" in caplog.text
    assert "a batch takes every group of a step: over-sample" in caplog.text  # what to do
    batcher.close()


def test_an_over_sampled_step_with_too_few_kept_groups_comes_short_too(r, run, caplog):
    config = small_config(rollout_batch_size=8, train_env_manager=STD)  # 2 of 4 groups
    batcher = Batcher(r, config, run=run)
    caplog.set_level("WARNING", logger="consumer")
    for g, scores in enumerate((AGREE, ZERO, AGREE, MIXED)):
        add_scored(r, run, g, 0, scores)
    batch = batcher.get_batch("train", timeout_s=30)
    assert groups_of(batch) == [(0, 3)] and batch.metrics[FILTERED] == 3
    assert "handing out 1 of 2 groups" in caplog.text and "3 filtered" in caplog.text
    assert "over-sample" not in caplog.text  # it does already
    batcher.close()


def test_a_step_whose_every_group_is_filtered_says_so_at_once(r, run):
    config = small_config(train_env_manager=STD)
    batcher = Batcher(r, config, run=run)
    for g in range(4):
        add_scored(r, run, g, 0, AGREE if g % 2 else ZERO)
    started = time.monotonic()
    with pytest.raises(StepExhausted, match="4 filtered by the group filters"):
        batcher.get_batch("train", timeout_s=30)
    assert time.monotonic() - started < 10
    assert pending(r, run, config) == 0 and sum(stream_lengths(r, Keys(run), config)) == 0
    batcher.close()


def test_async_fills_from_the_episodes_admitted_ahead_then_comes_short(r, run, caplog):
    """Ratio 1 admits episodes 0 and 1 at version 0: filtered groups of episode 0 are
    replaced by episode 1's, oldest first; once every admitted episode is in and judged, the
    next batch comes short with a warning (admission is not extended for filtered groups)."""
    config = small_config(async_generation_ratio=1, train_env_manager=STD)
    batcher = Batcher(r, config, run=run)
    caplog.set_level("WARNING", logger="consumer")
    for g, scores in enumerate((AGREE, MIXED, MIXED, MIXED)):
        add_scored(r, run, g, 0, scores)
    add_scored(r, run, 0, 1, MIXED)  # one group of the next step is in already
    batch = batcher.get_batch("train", timeout_s=10)
    assert groups_of(batch) == [(0, 1), (0, 2), (0, 3), (1, 0)]
    assert batch.metrics[FILTERED] == 1
    batcher.ack(batch)
    for g, scores in ((1, MIXED), (2, AGREE), (3, ZERO)):
        add_scored(r, run, g, 1, scores)
    admitted_all(r, run, config, limit=2)  # and nothing else is admitted at version 0
    short = batcher.get_batch("train", timeout_s=10)
    assert groups_of(short) == [(1, 1)] and short.metrics[FILTERED] == 2
    assert "handing out 1 of 4 groups" in caplog.text and "2 filtered" in caplog.text
    assert "over-sample" in caplog.text  # filling from the next step only moves the gap
    batcher.ack(short)
    assert pending(r, run, config) == 0 and sum(stream_lengths(r, Keys(run), config)) == 0
    batcher.close()


# -- a user's class by import path -----------------------------------------------------------------
@pytest.mark.parametrize("path", ["group_filters.DropOddGroups", "group_filters:DropOddGroups"])
def test_a_user_class_by_import_path_filters_by_its_own_rule(r, run, path, monkeypatch):
    from group_filters import DropOddGroups

    monkeypatch.setattr(DropOddGroups, "asked", [])
    config = small_config(train_env_manager={"group_filter_cls": path})
    batcher = Batcher(r, config, run=run)
    for g in range(4):
        add_scored(r, run, g, 0, AGREE)  # scores that agree: only the class decides here
    batch = batcher.get_batch("train", timeout_s=10)
    assert groups_of(batch) == [(0, 0), (0, 2)]
    assert batch.metrics[FILTERED] == 2 and batch.metrics[CLASS_COUNT] == 2
    assert STD_COUNT not in batch.metrics
    # asked once about each group, with the group's trajectories in member order
    assert sorted(DropOddGroups.asked) == [("train", g, 0, [0, 1, 2, 3]) for g in range(4)]
    batcher.ack(batch)
    assert pending(r, run, config) == 0 and sum(stream_lengths(r, Keys(run), config)) == 0
    batcher.close()


def test_real_producers_over_sampled_fill_every_batch_with_kept_groups(r, run,
                                                                       producer_thread):
    """Producers play 8 groups a step, a batch takes 4, the class drops the odd ones: every
    sync step's batch is the 4 even groups, whatever order the groups complete in."""
    config = small_config(train_env_manager={
        "num_env_groups": 8, "group_filter_cls": "group_filters.DropOddGroups"})
    batcher = Batcher(r, config, run=run)
    producer_thread()
    for step in range(3):
        batch = batcher.get_batch("train", timeout_s=30)
        assert groups_of(batch) == [(step, g) for g in (0, 2, 4, 6)]
        assert batch.metrics[FILTERED] == batch.metrics[CLASS_COUNT] <= 4
        batcher.ack(batch)
        publish(batcher)
    assert batcher.totals[FILTERED] <= 12  # odd groups judged before the evens were in
    batcher.close()


def test_with_both_filters_the_built_in_one_judges_first(r, run, monkeypatch):
    from group_filters import DropOddGroups

    monkeypatch.setattr(DropOddGroups, "asked", [])
    config = small_config(train_env_manager={**STD,
                                             "group_filter_cls": "group_filters.DropOddGroups"})
    batcher = Batcher(r, config, run=run)
    for g, scores in enumerate((AGREE, MIXED, MIXED, MIXED)):
        add_scored(r, run, g, 0, scores)
    batch = batcher.get_batch("train", timeout_s=10)
    assert groups_of(batch) == [(0, 2)]
    assert (batch.metrics[FILTERED], batch.metrics[STD_COUNT], batch.metrics[CLASS_COUNT]) \
        == (3, 1, 2)
    assert 0 not in {g for _, g, _, _ in DropOddGroups.asked}  # the built-in one dropped it
    batcher.close()


def test_val_rounds_use_the_val_managers_filter(r, run, caplog, monkeypatch):
    """ROLL builds each mode's filter from that mode's env manager: the train manager's
    filter leaves val alone, and the val manager's (here a class) thins a val round, which
    plays its episodes once: the round comes short with a warning."""
    from group_filters import DropOddGroups

    monkeypatch.setattr(DropOddGroups, "asked", [])
    config = small_config(train_env_manager=STD,
                          val_env_manager={"group_filter_cls": "group_filters.DropOddGroups"})
    batcher = Batcher(r, config, run=run)
    caplog.set_level("WARNING", logger="consumer")
    for g in range(8):
        add_scored(r, run, g, 0, [1.0], mode="val", round=1)
    val = batcher.get_batch("val", timeout_s=30)
    assert sorted(val.group_ids.tolist()) == [0, 2, 4, 6]
    assert val.metrics[FILTERED] == 4 and val.metrics[CLASS_COUNT] == 4
    assert "handing out 4 of 8 groups" in caplog.text and "4 filtered" in caplog.text
    assert {mode for mode, *_ in DropOddGroups.asked} == {"val"}
    assert pending(r, run, config, "val") == 0
    assert sum(stream_lengths(r, Keys(run), config, "val")) == 0
    batcher.close()


def test_a_filtered_groups_late_member_is_dropped_not_left_behind(r, run):
    """With redundancy the first group_size finishers make the group; a member finishing
    after its group was filtered is late: acked and deleted, nothing lingers."""
    config = small_config(rollout_batch_size=8, train_env_manager={
        **STD, "num_env_groups": 2, "group_size_redundancy": 1})
    batcher = Batcher(r, config, run=run)
    for member in range(4):
        add_trajectory(r, Keys(run), "train", 0, 0, member, group_size=5, episode_score=1.0)
    add_scored(r, run, 1, 0, MIXED)
    batch = batcher.get_batch("train", timeout_s=10)
    assert groups_of(batch) == [(0, 1)] and batch.metrics[FILTERED] == 1
    batcher.ack(batch)
    add_trajectory(r, Keys(run), "train", 0, 0, 4, group_size=5, episode_score=1.0)
    with pytest.raises(StepExhausted):
        batcher.get_batch("train", timeout_s=0)
    assert batcher.totals["scheduler/late_dropped"] == 1
    assert pending(r, run, config) == 0 and sum(stream_lengths(r, Keys(run), config)) == 0
    batcher.close()


# -- a filter that fails, restarts ---------------------------------------------------------------
@pytest.mark.parametrize(("path", "needle"), [
    ("group_filters.RaisesOnGroupTwo",
     "filter() raised KeyError: \"no such reward key 'acc'\" on train group 2 episode 0"),
    ("group_filters.AnswersGarbage",
     "filter() returned str 'drop' on train group 0 episode 0, not True (drop), False or None"),
])
def test_a_filter_that_raises_or_answers_garbage_stops_get_batch_in_one_line(r, run, path,
                                                                             needle):
    config = small_config(rollout_batch_size=4, train_env_manager={"group_filter_cls": path})
    batcher = Batcher(r, config, run=run)
    add_scored(r, run, 2 if "Raises" in path else 0, 0, MIXED)
    with pytest.raises(GroupFilterError) as info:
        batcher.get_batch("train", timeout_s=10)
    text = str(info.value)
    assert text.startswith(f"group_filter_cls {path}: ") and needle in text, text
    assert "\n" not in text
    # the group is neither dropped nor lost: asked again, it fails the same way
    assert pending(r, run, config) == 4
    with pytest.raises(GroupFilterError):
        batcher.get_batch("train", timeout_s=0)
    batcher.close()


def test_rollstream_train_exits_1_with_one_line_when_the_filter_raises(r, run, redis_url,
                                                                       tmp_path):
    config = small_config(run=run, train_env_manager={
        "group_filter_cls": "group_filters.RaisesOnGroupTwo"})
    path = tmp_path / "filtered.yaml"
    path.write_text(config.to_json())
    Batcher(r, config, run=run).close()  # the run's streams and consumer groups
    for g in range(4):
        add_scored(r, run, g, 0, MIXED)
    out = subprocess.run(
        [sys.executable, "-m", "rollstream", "train", "--config", str(path), "--redis-url",
         redis_url, "--run", run, "--steps", "1", "--timeout-s", "20"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(DATA)})
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "GroupFilterError" in lines[0], out.stderr
    assert "group_filter_cls group_filters.RaisesOnGroupTwo: filter() raised KeyError" in lines[0]
    assert pending(r, run, config) == 16  # nothing dropped, nothing acked: all still there


def test_a_restart_after_the_filter_raised_loses_and_doubles_nothing(r, run):
    """The trainer stops on its filter's error (exit 1) with groups judged and filtered
    before the error; started again (here with the built-in filter instead: a run resumes
    across a change of filters), every group is trained on or filtered, once."""
    config = small_config(train_env_manager={
        **STD, "group_filter_cls": "group_filters.RaisesOnGroupTwo"})
    first = Batcher(r, config, run=run)
    for g, scores in enumerate((AGREE, MIXED, MIXED, MIXED)):
        add_scored(r, run, g, 0, scores)
    with pytest.raises(GroupFilterError):
        first.get_batch("train", timeout_s=10)
    first.close()
    again = Batcher(r, small_config(train_env_manager=STD), run=run)
    batch = again.get_batch("train", timeout_s=10)
    assert groups_of(batch) == [(0, 1), (0, 2), (0, 3)]
    assert len(set(batch.traj_ids)) == len(batch) == 12
    again.ack(batch)
    assert pending(r, run, config) == 0 and sum(stream_lengths(r, Keys(run), config)) == 0
    again.close()


def test_a_restart_mid_filter_loses_and_doubles_nothing(r, run, monkeypatch):
    """A trainer dies holding a batch whose step had a group filtered. Restarted, it gets
    the very batch again, not judged again (even by a filter that would now drop it: the
    batch was kept when it went out); the filtered group never comes back; the step's
    unjudged group is judged now. Every trajectory is trained on or filtered, once."""
    from group_filters import DropListed

    monkeypatch.setattr(DropListed, "drop", {1})
    config = small_config(rollout_batch_size=8, train_env_manager={
        "group_filter_cls": "group_filters.DropListed"})
    first = Batcher(r, config, run=run)
    add_scored(r, run, 0, 0, MIXED)
    add_scored(r, run, 1, 0, MIXED)
    thread, result = get_batch_in_thread(first, timeout_s=30)
    wait_for(lambda: first.totals[FILTERED] == 1, what="group 1 filtered")
    add_scored(r, run, 2, 0, MIXED)
    thread.join(30)
    batch = result["batch"]
    assert groups_of(batch) == [(0, 0), (0, 2)] and batch.metrics[FILTERED] == 1
    add_scored(r, run, 3, 0, MIXED)
    admitted_all(r, run, config, limit=1)  # the step's episodes are all in
    first.close()  # the trainer dies before ack
    DropListed.drop = {0, 2, 3}
    again = Batcher(r, config, run=run)
    redelivered = again.get_batch("train", timeout_s=10)
    assert sorted(redelivered.traj_ids) == sorted(batch.traj_ids)
    assert redelivered.metrics[FILTERED] == 0
    again.ack(redelivered)
    with pytest.raises(StepExhausted, match="1 filtered"):  # group 3, judged now
        again.get_batch("train", timeout_s=10)
    assert pending(r, run, config) == 0 and sum(stream_lengths(r, Keys(run), config)) == 0
    again.close()


# -- the class path checked before the run ---------------------------------------------------------
@pytest.mark.parametrize(("path", "needle"), [
    ("no_such_filters.Drop", "no module named 'no_such_filters' (the trainer imports it"),
    ("group_filters.Missing", "module group_filters has no attribute 'Missing'"),
    ("group_filters.WithoutFilter", "a WithoutFilter has no filter(group_id, episode_id, "
                                    "group) method"),
    ("group_filters.TakesNoArguments", "building it as Class(config, env_manager_config, "
                                       "mode) raised TypeError"),
])
def test_a_class_that_cannot_be_built_is_refused_in_one_line(r, run, tmp_path, path, needle):
    config = small_config(train_env_manager={"group_filter_cls": path})
    with pytest.raises(ConfigError, match="train_env_manager.group_filter_cls") as info:
        Batcher(r, config, run=run)
    assert needle in str(info.value)
    assert r.get(Keys(run).config) is None  # refused before anything was published
    file = tmp_path / "bad.yaml"
    file.write_text(config.to_json())
    out = run_cli("config", "check", str(file),
                  env={**os.environ, "PYTHONPATH": str(DATA)})
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and needle in out.stderr, out.stderr
    assert f"{file}: train_env_manager.group_filter_cls {path}: " in out.stderr


def test_config_check_builds_a_good_filter(tmp_path):
    config = small_config(train_env_manager={"group_filter_cls": "group_filters.DropOddGroups"},
                          val_env_manager=STD)
    file = tmp_path / "good.yaml"
    file.write_text(config.to_json())
    out = run_cli("config", "check", str(file), env={**os.environ, "PYTHONPATH": str(DATA)})
    assert out.returncode == 0, out.stderr


def test_a_run_resumes_across_a_change_of_group_filters():
    plain = small_config()
    filtered = small_config(train_env_manager={
        **STD, "group_filter_cls": "group_filters.DropOddGroups"})
    assert plain.resume_conflicts(filtered) == [] == filtered.resume_conflicts(plain)
    assert small_config(seed=8, train_env_manager=STD).resume_conflicts(plain) == ["seed 7 -> 8"]
