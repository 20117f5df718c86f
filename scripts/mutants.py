"""Mutation check of the protocol's guards: remove each guard in turn, the tests must notice.

    python scripts/mutants.py            # every mutant (a baseline run first)
    python scripts/mutants.py --list     # the mutants, one line each
    python scripts/mutants.py --only commit-lease --only batcher-is-stale

For each mutant: copy the tree (`git ls-files`, untracked files included) into a temporary
folder, replace one exact snippet of one file (it must occur exactly once, or the run stops
with an error), and run the mutant's tests there with this interpreter and the copy as the
working folder, so the copy's packages are the ones imported (the `import-canary` mutant
proves it: it makes a module raise at import and must be caught). A mutant is *caught* when
pytest fails, *survived* when it passes. Before the mutants, the union of their tests runs
once on the unmodified copy and must pass, or nothing would mean anything.

Exit status: 0 when every mutant was caught; 1 when one survived or could not be applied or
run; 2 when the baseline fails. `tests/test_mutants.py` checks that every snippet still
occurs exactly once in its file, so this list cannot silently drift from the code: when a
guard's code changes, update its snippet here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUARDS = "tests/test_guards.py"
OPS = "tests/test_operations.py"
GEN = "tests/test_generation_control.py"
CONN = "tests/test_redisconn.py"
DEPLOY = "tests/test_deployments.py"
FILTERS = "tests/test_group_filters.py"
TOOLS = "tests/test_tools.py"
PARTIAL = "tests/test_partial_rollout.py"
PROVENANCE = "tests/test_token_provenance.py"
TITO = "tests/test_tito.py"
STICKY = "tests/test_sticky_sessions.py"
RESUME = "tests/test_resume.py"
TOOLS_TITO = "tests/test_tools_tito.py"
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache",
             ".ruff_cache"}


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the repository root
    snippet: str  # exact original text; must occur exactly once in `file`
    replacement: str
    guard: str  # what the mutant removes
    tests: tuple[str, ...]  # pytest node ids that must catch it
    signature: str = ""  # if set, any failing exit whose output shows this text is a catch


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "commit-lease", "producers/commit.py",
        "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end",
        "-- (mutant) no lease check",
        "fencing: the commit script's check that the shard's lease still names the producer",
        (f"{GUARDS}::test_a_zombie_producers_commit_is_fenced_once_its_lease_moved",),
    ),
    Mutant(
        "commit-pause", "producers/commit.py",
        "if redis.call('SCARD', KEYS[3]) > 0 then return {-2} end",
        "-- (mutant) no pause check",
        "the commit script refuses train commits while paused (not even the step in flight)",
        (f"{GUARDS}::test_a_pause_landing_mid_episode_keeps_its_commit_out_until_resume",),
    ),
    Mutant(
        "commit-val-round", "producers/commit.py",
        "if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[3]) then return {-3} end",
        "-- (mutant) no val round check",
        "the commit script refuses a val commit of a round that is over",
        (f"{GUARDS}::test_a_val_commit_of_an_older_round_is_refused",),
    ),
    Mutant(
        "commit-cursor-advance", "producers/commit.py",
        "if #fields > 0 then redis.call('HSET', KEYS[2], unpack(fields)) end",
        "-- (mutant) cursor not advanced",
        "the commit advances the env's cursor, so a resend or a replay is a no-op",
        (f"{GUARDS}::test_a_commit_resent_after_a_lost_reply_is_in_the_stream_once",
         f"{GUARDS}::test_an_episode_replayed_after_a_takeover_is_in_the_streams_once"),
    ),
    Mutant(
        "commit-cursor-check", "producers/commit.py",
        "if cursor[env] > k then",
        "if false then",
        "the commit is skipped when the cursor is already past the episode",
        (f"{GUARDS}::test_a_commit_resent_after_a_lost_reply_is_in_the_stream_once",),
    ),
    Mutant(
        "commit-sample-only-if-landed", "producers/commit.py",
        "if out[i] == 1 then  -- only a commit that landed leaves a sample",
        "if true then  -- (mutant) every sampled commit leaves a sample",
        "the commit script writes a trajectory's sample only when its commit lands (a "
        "duplicate leaves none)",
        ("tests/test_ui_samples.py::test_a_sample_is_written_only_with_a_commit_that_lands",),
    ),
    Mutant(
        "batcher-is-stale", "consumer/assembly.py",
        "return schedule.expired(k, version) or version - version_start > schedule.bound",
        "return False",
        "Assembly._is_stale: a trajectory that arrives expired or too stale is dropped",
        (f"{GUARDS}::test_the_batcher_drops_trajectories_that_arrive_already_stale",),
    ),
    Mutant(
        "batcher-staleness-bound", "consumer/assembly.py",
        "return schedule.expired(k, version) or version - version_start > schedule.bound",
        "return schedule.expired(k, version)",
        "Assembly._is_stale's bound on version_start (staleness <= ratio at hand-out)",
        (f"{GUARDS}::test_the_batcher_drops_trajectories_that_arrive_already_stale",),
    ),
    Mutant(
        "batcher-oldest-first", "consumer/assembly.py",
        "heapq.heappush(state.ready, (0 if slot.priority else 1, k, order, key))",
        "heapq.heappush(state.ready, (0 if slot.priority else 1, order, k, key))",
        "complete groups are handed out oldest episode first (not in arrival order)",
        (f"{GUARDS}::test_groups_completing_out_of_order_are_delivered_oldest_episode_first",),
    ),
    Mutant(
        "batcher-inflight-priority", "consumer/assembly.py",
        "slot.priority = slot.priority or priority",
        "slot.priority = False",
        "a restarted Batcher hands out the batch recorded in flight before anything else",
        (f"{GUARDS}::test_a_restarted_batcher_hands_out_its_batch_in_flight_first",),
    ),
    Mutant(
        "batcher-group-complete", "consumer/assembly.py",
        "if len(slot.members) == state.group_size:",
        "if len(slot.members) == state.group_size - 1:",
        "a group is handed out only when all group_size members are there (off by one)",
        (f"{GUARDS}::test_a_group_completed_over_several_reads_is_delivered_only_when_whole",),
    ),
    Mutant(
        "batcher-member-dedup", "consumer/assembly.py",
        'if len(slot.members) >= state.group_size or msg["member"] in slot.members:',
        "if len(slot.members) >= state.group_size:",
        "a member's second copy is dropped (acked and deleted), not left pending forever",
        (f"{GUARDS}::test_a_trajectory_in_the_stream_twice_is_delivered_once_and_its_copy_"
         "deleted",),
    ),
    Mutant(
        "batcher-sync-pause", "consumer/handout.py",
        "    redis.call('SADD', KEYS[3], 'sync')",
        "    -- (mutant) no sync pause",
        "sync mode: handing out a train batch sets the sync pause (once every batcher has one)",
        ("tests/test_rollout.py::test_sync_pause_stops_xadds_and_next_get_batch_resumes",
         "tests/test_rollout.py::test_two_batchers_split_the_groups"),
    ),
    Mutant(
        "producer-retry-count", "producers/shard_runner.py",
        "attempts = self.config.env_max_retries + 1",
        "attempts = self.config.env_max_retries + 2",
        "an episode whose env raises is retried env_max_retries times, no more",
        ("tests/test_rollout.py::test_failing_env_drops_its_group_and_counts_it",),
    ),
    Mutant(
        "producer-retry-seed", "producers/shard_runner.py",
        "play_episode(\n                    slot, seed=self.config.seed,",
        "play_episode(\n                    slot, seed=self.config.seed + attempt + 1,",
        "a retried episode is reset with the same seed",
        ("tests/test_rollout.py::test_failing_env_drops_its_group_and_counts_it",),
    ),
    Mutant(
        "batcher-read-before-hand-out", "consumer/waiting.py",
        "assembly.read(state, block_ms=None)",
        "pass  # (mutant) no read before a hand-out from held groups",
        "oldest-first also across groups completed in Redis since the last read",
        (f"{GUARDS}::test_an_older_group_completed_in_redis_goes_before_a_newer_one_already_"
         "held",),
    ),
    Mutant(
        "batcher-hand-out-undo", "consumer/handout.py",
        "for item, _ in chosen:  # nothing handed out: the groups stay ready\n"
        "                    heapq.heappush(state.ready, item)",
        "pass  # (mutant) a failed hand-out loses its groups",
        "a hand-out whose Redis write fails hands nothing out (the batch cannot vanish)",
        (f"{OPS}::test_a_sync_batch_survives_a_connection_lost_at_hand_out",),
    ),
    Mutant(
        "batcher-sync-all-batchers", "consumer/handout.py",
        "if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[4]) then",
        "if true then",
        "several sync batchers pause the producers only once every one has its batch",
        (f"{OPS}::test_two_sync_batchers_do_not_deadlock_when_one_finishes_first",),
    ),
    Mutant(
        "publish-retry-noop", "consumer/publishing.py",
        "if cur == v then return {0, cur} end",
        "-- (mutant) publishing v again is not a no-op",
        "publish_version(v) again (a retry after a lost reply) changes nothing",
        (f"{OPS}::test_publish_version_is_a_compare_and_set",
         f"{OPS}::test_publish_version_retried_after_a_lost_reply_moves_one_version"),
    ),
    Mutant(
        "publish-no-gap", "consumer/publishing.py",
        "if cur ~= v - 1 then return {-1, cur} end",
        "-- (mutant) versions may skip",
        "publish_version refuses a version that does not follow the run's",
        (f"{OPS}::test_publish_version_is_a_compare_and_set",),
    ),
    Mutant(
        "run-conflict", "consumer/publishing.py",
        "        if conflicts:\n",
        "        if False:\n",
        "a reused run name with another layout, seed, ratio or batch size is refused",
        (f"{OPS}::test_batcher_refuses_a_conflicting_config_but_takes_policy_changes",),
    ),
    Mutant(
        "config-no-url", "schemas/config.py",
        'return self.model_dump_json(exclude={"redis_url"})',
        "return self.model_dump_json()",
        "the published config never holds the Redis URL (it can hold a password)",
        (f"{OPS}::test_the_published_config_holds_no_redis_url",),
    ),
    Mutant(
        "live-by-heartbeat", "schemas/liveness.py",
        'client.zrangebyscore(keys.producers, now, "+inf", withscores=True)',
        'client.zrangebyscore(keys.producers, "-inf", "+inf", withscores=True)',
        "live producers are counted by fresh heartbeats, not by the heartbeat set's size",
        (f"{OPS}::test_stale_heartbeats_do_not_count_as_live_producers",),
    ),
    Mutant(
        "producer-sync-weights", "producers/weights.py",
        "        return self.version < run_version if self.sync else self.looked < floor\n",
        "        return False if self.sync else self.looked < floor\n",
        "sync mode acts only with the weights of the run's version",
        ("tests/test_weights.py::test_sync_steps_wait_for_the_weights_of_the_current_version",),
    ),
    Mutant(
        "producer-4xx-no-retry", "producers/shard_runner.py",
        "                                      f\"failed: {error}\")\n                break\n",
        "                                      f\"failed: {error}\")\n",
        "an episode failed by a model server's 4xx is not retried (no retry storm)",
        ("tests/test_llm_policy.py::test_a_4xx_fails_the_episode_without_retries",),
    ),
    Mutant(
        "tag-max-steps", "producers/envs/__init__.py",
        "    if spec.max_steps is not None:\n",
        "    if False:\n",
        "a tag's max_steps (ROLL's custom_envs key) is the env's step budget",
        ("tests/test_roll_config.py::test_frozenlake_plays_at_most_the_tags_max_steps",),
    ),
    Mutant(
        "producer-interrupt", "producers/rollout.py",
        'task.cancel("interrupted: the turn is sent again after the gate")',
        "pass  # (mutant) nothing cut short",
        "a pause or an expiry cuts the policy call in flight short (its HTTP request closes)",
        (f"{GEN}::test_a_sync_pause_closes_generations_and_nothing_runs_until_the_publish",
         f"{GEN}::test_an_operator_pause_closes_turns_that_are_sent_again_after_it"),
    ),
    Mutant(
        "inflight-foreign-cancel", "producers/rollout.py",
        "        return task.uncancel() == 0\n",
        "        task.uncancel()\n        return True  # (mutant)\n",
        "a task also cancelled by someone else (a stop) stays cancelled after an interrupt",
        (f"{GEN}::test_in_flight_takes_back_only_its_own_cancellation",),
    ),
    Mutant(
        "producer-interrupt-expiry", "producers/shard_runner.py",
        '"must_stop": lambda: self._verdict(run, slot, slot.k) is not True,',
        '"must_stop": lambda: bool(self.state.paused),',
        "an episode expiring mid-request has its request closed, not only a pause",
        (f"{GEN}::test_an_episode_expiring_mid_request_is_abandoned_and_its_request_closed",),
    ),
    Mutant(
        "producer-abort-resend", "producers/rollout.py",
        "        await asyncio.sleep(ABORT_RETRY_S)\n        return None\n",
        "        raise  # (mutant) an aborted turn fails its episode attempt\n",
        "a turn the server aborted is sent again, not the whole episode replayed",
        (f"{GEN}::test_sglang_updates_while_producers_run",),
    ),
    Mutant(
        "openai-no-half-turn", "producers/policies/openai.py",
        "            del messages[asked - 1:]\n",
        "            pass  # (mutant) the half turn stays\n",
        "a turn cut short or aborted leaves no user message behind in the conversation",
        (f"{GEN}::test_an_operator_pause_closes_turns_that_are_sent_again_after_it",
         "tests/test_llm_policy.py::test_a_turn_aborted_by_a_weight_update_leaves_no_half_"
         "turn"),
    ),
    Mutant(
        "openai-require-version", "producers/policies/openai.py",
        "min_version = self._min_version(ctx) if config.require_version else None",
        "min_version = None",
        "require_version: a turn goes only to a server within the staleness bound",
        (f"{GEN}::test_require_version_holds_turns_until_a_server_catches_up",),
    ),
    Mutant(
        "pool-min-version", "producers/llm/servers.py",
        "and (min_version is None or (s.version or 0) >= min_version)]",
        "]",
        "the pool picks only servers holding the version a turn requires",
        (f"{GEN}::test_require_version_holds_turns_until_a_server_catches_up",),
    ),
    Mutant(
        "openai-recorded-version", "producers/llm/labels.py",
        "if answer.version is not None:",
        "if False:",
        "a turn the server does not version records the version recorded for its server",
        (f"{GEN}::test_vllm_lora_updates_while_producers_run",),
    ),
    Mutant(
        "openai-servers-on-version", "producers/policies/openai.py",
        "if ctx.version > self._view_version and self._context is not None:",
        "if False:",
        "after a publish, turns name what the servers hold now (no wait for the next poll)",
        (f"{GEN}::test_a_sync_pause_closes_generations_and_nothing_runs_until_the_publish",
         f"{GEN}::test_vllm_lora_updates_while_producers_run"),
    ),
    Mutant(
        "servers-lora-unload", "consumer/servers.py",
        "            if old < oldest_kept:",
        "            if False:",
        "LoRA adapters older than the staleness window are unloaded",
        (f"{GEN}::test_vllm_lora_updates_while_producers_run",),
    ),
    Mutant(
        "servers-sglang-version", "consumer/loaders.py",
        '"model_path": checkpoint, "weight_version": str(version),',
        '"model_path": checkpoint,',
        "SGLang is told the version it loads, so its answers report it",
        (f"{GEN}::test_sglang_updates_while_producers_run",),
    ),
    Mutant(
        "pool-sets-aside-launch-weights", "producers/llm/pool.py",
        "            if lost is not None:  # not a version we loaded: its launch weights",
        "            if False:",
        "an SGLang answer reporting no version where one was loaded (a restart) is not used",
        (f"{GEN}::test_a_restarted_sglang_server_is_set_aside_until_its_weights_are_loaded_again",),
    ),
    Mutant(
        "pool-lost-adapter-is-transient", "producers/llm/pool.py",
        "        if status == 404 and model is not None:",
        "        if False:",
        "a 404 for the LoRA adapter a turn names sets the server aside, the episode goes on",
        (f"{GEN}::test_a_restarted_vllm_server_loses_no_group_and_the_watch_loads_its_adapter",),
    ),
    Mutant(
        "servers-heal-reloads", "consumer/servers.py",
        "            lacking = [url for url in self.base_urls if not self._holds(url, newest)]",
        "            lacking = []",
        "heal() loads the recorded checkpoint again into a server that lost it",
        (f"{GEN}::test_a_restarted_sglang_server_is_set_aside_until_its_weights_are_loaded_again",
         f"{GEN}::test_a_restarted_vllm_server_loses_no_group_and_the_watch_loads_its_adapter",
         f"{GEN}::test_heal_asks_what_each_server_holds"),
    ),
    Mutant(
        "batcher-claims-only-the-dead", "consumer/liveness.py",
        "            elif word is not None:  # alive\n",
        "            elif False:\n",
        "a batcher claims pending entries only from a batcher whose liveness key expired",
        ("tests/test_rollout.py::"
         "test_a_live_batchers_batch_is_never_claimed_and_a_killed_ones_is",
         "tests/test_rollout.py::"
         "test_a_batcher_whose_key_lapsed_in_an_outage_keeps_its_batch"),
    ),
    Mutant(
        "batcher-closed-is-gone", "consumer/liveness.py",
        "            if word == CLOSED:\n",
        "            if False:\n",
        "a batcher that closed gives its unacked batch up at once, without a ttl of grace",
        ("tests/test_rollout.py::"
         "test_a_closed_batchers_pending_entries_are_claimed_at_once",),
    ),
    Mutant(
        "batcher-claim-grace", "consumer/liveness.py",
        "            elif now - self.suspects.setdefault((state.mode, name), now) >= grace:",
        "            elif now - self.suspects.setdefault((state.mode, name), now) >= 0:",
        "a liveness key missing at one look is not enough to claim: a whole ttl of looking",
        ("tests/test_rollout.py::"
         "test_a_batcher_whose_key_lapsed_in_an_outage_keeps_its_batch",),
    ),
    Mutant(
        "batcher-heartbeat", "consumer/liveness.py",
        "        self._beats.start()\n",
        "        pass\n",
        "the liveness key is refreshed while the trainer trains between calls",
        ("tests/test_rollout.py::"
         "test_a_live_batchers_batch_is_never_claimed_and_a_killed_ones_is",),
    ),
    Mutant(
        "periodic-outlives-errors", "consumer/periodic.py",
        "            except Exception as exc:",
        "            except ZeroDivisionError as exc:",
        "nothing a round raises ends a periodic thread (a heartbeat, the model servers' watch)",
        ("tests/test_rollout.py::test_the_heartbeat_outlives_whatever_a_beat_raises",),
    ),
    Mutant(
        "batcher-sees-nothing-more-can-come", "consumer/waiting.py",
        "                if assembly.nothing_more(state):",
        "                if False:",
        "a batcher whose envs committed every admitted episode hands out what it holds, or "
        "says StepExhausted, at once",
        ("tests/test_rollout.py::"
         "test_a_batcher_restarted_in_a_sync_step_knows_what_the_step_lost",
         "tests/test_rollout.py::"
         "test_async_steps_taken_without_a_publish_end_in_step_exhausted"),
    ),
    Mutant(
        "batcher-nothing-more-counts-streams", "consumer/assembly.py",
        "        return sum(lengths) <= len(state.held) + len(state.handed)",
        "        return True",
        "entries in the streams that another consumer holds can still come: not exhausted",
        ("tests/test_rollout.py::"
         "test_a_sync_batch_held_by_a_killed_batcher_goes_to_another_consumer",),
    ),
    Mutant(
        "batcher-rank-awaits-publish", "consumer/assembly.py",
        "        return deliverable <= 0 and self.count > 1",
        "        return False",
        "with several batchers, one with nothing left waits for another's publish",
        ("tests/test_rollout.py::test_a_rank_that_does_not_publish_waits_for_the_one_that_does",),
    ),
    Mutant(
        "batcher-rank-sees-publish-before-read", "consumer/waiting.py",
        "                if assembly.awaits_publish(deliverable) and "
        "assembly.version_moved(state):",
        "                if False:",
        "a rank waiting for another's publish learns of it before its next read, not at its "
        "next look at its envs (a sync step's groups are deliverable only at the new version)",
        ("tests/test_rollout.py::test_a_rank_that_does_not_publish_waits_for_the_one_that_does",),
    ),
    Mutant(
        "train-publishes-an-exhausted-step", "rollstream/trainer.py",
        "        except StepExhausted as exc:",
        "        except ZeroDivisionError as exc:",
        "the stand-in trainer publishes past a sync step that has nothing left",
        ("tests/test_cli_admin.py::"
         "test_train_restarted_between_an_ack_and_its_publish_goes_on",),
    ),
    Mutant(
        "servers-heal-to-newest", "consumer/servers.py",
        "            newest = max((record for url in self.base_urls",
        "            newest = min((record for url in self.base_urls",
        "heal() brings every server to the newest checkpoint recorded, not an older one",
        (f"{GEN}::test_heal_brings_every_server_to_the_newest_checkpoint",),
    ),
    Mutant(
        "servers-check-may-raise", "consumer/servers.py",
        "        except Exception as exc:  # a user's check: whatever it raised, it cannot tell",
        "        except ZeroDivisionError as exc:  # (mutant)",
        "a check callable that raises is one warning, not a heal (or watch pass) that fails",
        (f"{GEN}::test_heal_asks_what_each_server_holds",),
    ),
    Mutant(
        "pool-retries-on-a-new-record", "producers/llm/servers.py",
        "                if server.down:  # set aside for weights it lacked (or lost in a restart,",
        "                if False:  # (never)",
        "a set-aside server is tried at once when its record changes",
        ("tests/test_llm_pool.py::"
         "test_a_set_aside_server_is_tried_at_once_when_its_record_changes",),
    ),
    Mutant(
        "status-shows-set-aside-servers", "producers/producer.py",
        "            held.servers_down = servers_down()",
        "            pass",
        "rollstream status shows which producers set a model server aside, and why",
        (f"{GEN}::test_a_restarted_sglang_server_is_set_aside_until_its_weights_are_loaded_again",),
    ),
    Mutant(
        "commit-waits-for-replicas", "producers/commit.py",
        "        if self._replicas is None:\n",
        "        if True:  # (mutant) no WAIT\n",
        "min_replicas: a commit counts only once WAIT says the replicas have it",
        (f"{CONN}::test_commits_count_only_once_a_replica_has_them",
         f"{CONN}::test_a_resend_answered_duplicate_waits_for_replicas_too"),
    ),
    Mutant(
        "batcher-waits-for-replicas", "consumer/writes.py",
        "short = (self._replicas.shortfall(sent_to, replies) if self._replicas.enabled\n"
        "                         else None)",
        "short = None  # (mutant) acks and version publishes ignore the WAIT",
        "min_replicas: an ack or a version publish returns only once the replicas have it",
        (f"{CONN}::test_acks_and_version_publishes_wait_for_replicas",),
    ),
    Mutant(
        "cluster-sharded-subscribe", "schemas/redisconn/ops.py",
        "await self._pubsub.ssubscribe(self.channel)",
        "await self._pubsub.subscribe(self.channel)",
        "on a cluster the control channel is heard with SSUBSCRIBE on the run's node",
        (f"{DEPLOY}::test_two_runs_on_two_nodes_through_one_node_url",),
    ),
    Mutant(
        "cluster-sharded-publish", "schemas/redisconn/ops.py",
        "        return client.spublish(channel, message)\n",
        "        return client.publish(channel, message)\n",
        "on a cluster control messages go out with SPUBLISH (they stay on the run's shard)",
        (f"{DEPLOY}::test_two_runs_on_two_nodes_through_one_node_url",),
    ),
    Mutant(
        "producer-background-check", "producers/lease_loop.py",
        "            self._check_background(background)\n",
        "            pass  # (mutant) a dead control loop goes unnoticed\n",
        "a producer whose control poll or committer died exits 1 instead of running blind",
        (f"{CONN}::test_a_producer_whose_control_loop_dies_exits_1",),
    ),
    Mutant(
        "metrics-committed", "producers/metrics.py",
        "        counts.committed += 1\n        counts.recent_committed += 1\n",
        "        counts.recent_committed += 1\n",
        "the producer's metrics page counts every committed trajectory",
        ("tests/test_metrics.py::test_metrics_pages_of_a_live_run_show_the_counters_moving",),
    ),
    Mutant(
        "status-gone", "rollstream/status/snapshot.py",
        '"id": pid, "state": "live" if pid in live else "gone",',
        '"id": pid, "state": "live",',
        "rollstream status shows a producer without a fresh heartbeat as gone",
        ("tests/test_watch.py::test_status_json_of_a_live_run_and_of_a_killed_producer",),
    ),
    Mutant(
        "claim-yields-to-heartbeat", "producers/lease_loop.py",
        "            if wanted <= 0 or self._stopping or time.monotonic() > until:",
        "            if wanted <= 0 or self._stopping:",
        "a claim pass longer than a third of the lease ttl yields to the heartbeat",
        ("tests/test_rollout.py::test_a_claim_longer_than_the_lease_ttl_loses_no_lease",),
    ),
    Mutant(
        "control-wake-in-chunks", "producers/control.py",
        "        for _ in range(min(self.wake_chunk, len(waiters))):",
        "        for _ in range(len(waiters)):",
        "waiting env tasks wake in chunks, with other work (the committer) between chunks",
        ("tests/test_control.py::test_waiters_wake_in_chunks_with_other_work_between_and_none_is_lost",),
    ),
    Mutant(
        "control-sync-wake-chunk", "producers/serving.py",
        "ControlState(SYNC_WAKE_CHUNK if config.is_sync else WAKE_CHUNK)",
        "ControlState(WAKE_CHUNK)",
        "a sync producer wakes its envs in the smaller chunks of its mode",
        ("tests/test_control.py::test_a_producer_wakes_its_envs_in_the_chunks_of_its_mode",),
    ),
    Mutant(
        "producer-stop-while-starting", "producers/startup.py",
        "        task = asyncio.ensure_future(step)\n",
        "        await step\n        return True\n        task = asyncio.ensure_future(step)\n",
        "a stop while the policy starts (model servers not answering) ends the producer",
        ("tests/test_llm_policy.py::test_sigterm_while_waiting_for_model_servers_exits_0",),
    ),
    Mutant(
        "producer-lets-trajectory-go", "producers/shard_runner.py",
        '                data = b""\n',
        "                pass\n",
        "an env's loop lets its committed trajectory's bytes go before the next episode "
        "(memory per env)",
        ("tests/test_rollout.py::test_a_committed_trajectory_is_let_go_while_the_env_plays_on",),
    ),
    Mutant(
        "producer-commits-bytes-only", "producers/shard_runner.py",
        "                traj = None\n                while True:",
        "                pass\n                while True:",
        "a commit waits with the encoded bytes only, the trajectory's objects already let go",
        ("tests/test_rollout.py::test_a_trajectory_waits_for_its_commit_as_bytes_only",),
    ),
    Mutant(
        "batcher-reads-after-unblocked", "consumer/waiting.py",
        'str(exc).startswith("UNBLOCKED")',
        "False",
        "a read that Redis 7 ends with UNBLOCKED (the slot migrated, the stream deleted) is "
        "read again, not a trainer failure",
        (f"{OPS}::test_get_batch_reads_again_when_a_stream_it_waits_on_leaves_the_node",
         f"{DEPLOY}::test_a_trainer_waiting_when_its_slot_moves_follows_it"),
    ),
    Mutant(
        "url-raw-slash-in-password", "schemas/redisconn/urls.py",
        '    if scheme != "unix":\n        _check_user_part(url)\n',
        "",
        "a password with a raw '/' is refused before redis-py's parser quotes a piece of it",
        ("tests/test_user_edges.py::test_a_raw_slash_in_the_password_is_masked_and_refused",),
    ),
    Mutant(
        "run-name-empty-flag", "schemas/config.py",
        "    if cli_run is not None:\n",
        "    if cli_run:\n",
        "`--run ''` is refused, not taken as the default run",
        ("tests/test_user_edges.py::test_a_bad_run_name_is_one_line_and_exit_2",),
    ),
    Mutant(
        "up-watches-producers", "rollstream/launcher.py",
        "            with producers_watched(procs):\n",
        "            if True:\n",
        "`up` ends (exit 1) once every producer has exited, not after get_batch's timeout",
        ("tests/test_user_edges.py::test_up_ends_once_every_producer_has_exited",),
    ),
    Mutant(
        "batcher-sync-short-batch", "consumer/assembly.py",
        "        return min(wanted, self.most_groups(state) - done)\n",
        "        return wanted\n",
        "a sync step whose group was dropped (a member failed) is handed out without it, "
        "not waited for forever",
        ("tests/test_rollout.py::test_a_sync_step_whose_group_failed_is_handed_out_without_it",
         f"{OPS}::test_get_batch_with_no_time_to_wait_looks_once"),
    ),
    Mutant(
        "batcher-hand-out-waits-for-replicas", "consumer/handout.py",
        "        if not self._replicas.enabled:\n            self._record_hand_out(",
        "        if True:\n            self._record_hand_out(",
        "with min_replicas a batch is handed out only once replicas hold its trajectories",
        (f"{CONN}::test_a_batch_is_handed_out_only_once_replicas_hold_it",),
    ),
    Mutant(
        "reset-escapes-globs", "schemas/keys.py",
        '        return "".join("\\\\" + c if c in _GLOB else c for c in self.prefix) + ":*"',
        '        return self.prefix + ":*"',
        "reset --run 'exp*' deletes that run's keys only, not every run the glob matches",
        (f"{OPS}::test_reset_of_a_run_named_with_glob_characters_deletes_only_that_run",),
    ),
    Mutant(
        "train-skips-within-timeout", "rollstream/trainer.py",
        "        waiting = waiting or _StepWait(batcher.version, opts.timeout_s)\n",
        "        waiting = _StepWait(batcher.version, opts.timeout_s)\n",
        "the stand-in trainer's skipped steps count against --timeout-s (a run whose every "
        "group fails ends)",
        ("tests/test_cli_admin.py::test_train_whose_every_group_fails_ends_at_its_timeout",),
    ),
    Mutant(
        "publish-restores-lost-run", "consumer/publishing.py",
        "        if code == -2 or (code == -1 and int(current) < self._shared.version):\n",
        "        if code == -1 and int(current) < self._shared.version:\n",
        "a publish after Redis lost the run's keys puts them back (not VersionConflict)",
        ("tests/test_redis_crash.py::"
         "test_redis_losing_all_data_heals_without_doubles[before publish]",),
    ),
    Mutant(
        "fair-share-covers-capped", "producers/leases.py",
        "    while level < total_shards and any(",
        "    while False and level < total_shards and any(",
        "what a --max-shards producer cannot take raises the others' share: no shard unleased",
        ("tests/test_rollout.py::test_what_a_capped_producer_leaves_falls_to_the_others",),
    ),
    Mutant(
        "heartbeat-scores-its-expiry", "producers/leases.py",
        "redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])",
        "redis.call('ZADD', KEYS[1], now, ARGV[1])",
        "a heartbeat is live by its own producer's ttl, not by the reader's",
        ("tests/test_rollout.py::test_a_long_ttl_producer_is_live_between_its_beats_whatever_"
         "ttl_the_reader_has",),
    ),
    Mutant(
        "heartbeat-set-outlives-latest", "producers/leases.py",
        "redis.call('PEXPIREAT', KEYS[1], latest + 9 * ttl)",
        "redis.call('PEXPIRE', KEYS[1], 10 * ttl)",
        "a short-ttl heartbeat does not expire the set holding a long-ttl producer's entry",
        ("tests/test_rollout.py::test_a_short_ttl_beat_does_not_expire_the_heartbeat_set_"
         "under_a_long_one",),
    ),
    Mutant(
        "producer-watches-its-loop", "producers/producer.py",
        "        watch.start()\n",
        "        pass  # (mutant) the loop is not watched\n",
        "a producer warns (log, status, metrics) when a blocking act holds its event loop",
        ("tests/test_stall.py::test_a_producer_whose_policy_blocks_says_where_in_its_log_"
         "status_and_metrics",),
    ),
    Mutant(
        "stall-names-the-blocking-code", "producers/stall.py",
        "        if not _in_stdlib(code.co_filename):\n            named.append(text)",
        "        named.append(text)",
        "the stall warning names the user's frames, not the standard library's",
        ("tests/test_stall.py::test_a_blocked_loop_is_warned_about_naming_the_code_that_"
         "blocks_it",),
    ),
    Mutant(
        "batcher-val-round-short", "consumer/assembly.py",
        "            return min(wanted, self.most_groups(state) - dropped)\n",
        "            return wanted\n",
        "a val round whose group was dropped is handed out without it, not waited on",
        ("tests/test_rollout.py::test_a_val_round_whose_group_failed_is_handed_out_without_it",),
    ),
    Mutant(
        "context-full-truncates", "producers/llm/pool.py",
        "        if status >= 400 and is_context_overflow(status, raw):\n",
        "        if False:\n",
        "a turn refused for the context window ends its episode truncated, not failed",
        ("tests/test_llm_policy.py::test_an_episode_that_outgrows_the_context_window_ends_"
         "truncated_with_its_turns",),
    ),
    Mutant(
        "pool-sets-aside-hung-server", "producers/llm/pool.py",
        "            self._servers.mark_down(server, exc)  # hung: set aside, one request "
        "probes it later\n",
        "            pass\n",
        "a server that hung past the timeout is set aside, not tried first by every turn",
        ("tests/test_llm_pool.py::test_a_hung_server_is_set_aside_so_later_turns_do_not_wait_on_"
         "it",),
    ),
    Mutant(
        "pool-unrecorded-launch-weights", "producers/llm/servers.py",
        "        return self._run_loads and server.version is None\n",
        "        return False\n",
        "a server with launch weights and no record, where others have loaded ones, is not "
        "used (its turns would be labelled with the run's version)",
        ("tests/test_generation_control.py::test_a_server_that_missed_every_update_is_set_"
         "aside_not_mislabelled",),
    ),
    Mutant(
        "pool-reason-is-current", "producers/llm/servers.py",
        "        server.down_reason = str(exc)  # why now: the record may have moved on since\n",
        "",
        "a set-aside server's reason is its last failure's, not its first's",
        ("tests/test_llm_pool.py::test_a_set_aside_server_names_what_it_lacks_now_not_when_it_"
         "was_set_aside",),
    ),
    Mutant(
        "async-weights-of-the-step", "producers/weights.py",
        "        return self.version < run_version if self.sync else self.looked < floor\n",
        "        return self.version < run_version if self.sync else False\n",
        "async: an episode a new version admitted waits for that version's weights (else it "
        "is handed out ratio + 1 versions stale)",
        ("tests/test_weights.py::test_async_episodes_wait_for_the_weights_of_their_step",),
    ),
    Mutant(
        "async-no-wait-for-weights-never-published", "producers/weights.py",
        "        return self.version < run_version if self.sync else self.looked < floor\n",
        "        return self.version < run_version if self.sync else self.version < floor\n",
        "async: a version published without weights holds none of its episodes (it hung the "
        "run with a trainer that publishes no weights)",
        ("tests/test_weights.py::test_steps_record_the_loaded_version_not_the_runs",),
    ),
    Mutant(
        "require-version-of-the-step", "producers/policies/openai.py",
        "        if ctx.mode == \"train\" and self._train is not None:\n",
        "        if False:\n",
        "require_version: a train turn goes to a server holding its episode's step",
        (f"{GEN}::test_require_version_keeps_a_new_versions_episodes_within_the_ratio",),
    ),
    Mutant(
        "up-seconds-caps-the-wait", "rollstream/trainer.py",
        "            batch = batcher.get_batch(\"train\", timeout_s=wait_s(waiting.left()))\n",
        "            batch = batcher.get_batch(\"train\", timeout_s=waiting.left())\n",
        "up/train --seconds ends a batch wait that would outlast it",
        ("tests/test_cli_admin.py::test_up_seconds_ends_a_batch_wait_that_would_outlast_it",),
    ),
    Mutant(
        "status-stopped-run-orphans", "rollstream/status/warnings.py",
        "        if orphans and not snap[\"stopped\"]:",
        "        if orphans:",
        "status does not warn of shards with no live producer on a stopped run",
        ("tests/test_watch.py::test_a_stopped_run_is_not_warned_about_shards_its_producers_left",),
    ),
    Mutant(
        "config-did-you-mean", "schemas/rollkeys.py",
        "    return f\"{key} (did you mean {close[0]}?)\" if close else key\n",
        "    return key\n",
        "an unknown config key one typo from a known one is named with it",
        ("tests/test_config.py::test_an_unknown_key_is_refused_naming_the_key_it_is_a_typo_of",),
    ),
    Mutant(
        "config-unused-envs-unbuilt", "schemas/config.py",
        "        return {**data, \"custom_envs\": {tag: merged[tag] for tag in used if tag in "
        "merged}}\n",
        "        return {**data, \"custom_envs\": merged}\n",
        "custom_envs entries no env manager uses are not built or checked (as in ROLL)",
        ("tests/test_roll_config.py::test_unused_custom_envs_entries_are_neither_built_nor_"
         "checked",),
    ),
    Mutant(
        "sampling-actor-infer-wins", "schemas/sampling.py",
        "    if roll.actor_infer is not None:\n",
        "    if False:\n",
        "actor_infer.generating_args, when given, samples both modes (ROLL's precedence)",
        ("tests/test_sampling.py::test_actor_infer_samples_both_modes_over_the_managers_"
         "blocks",),
    ),
    Mutant(
        "config-unknown-refused", "schemas/rollmap.py",
        "    if sort.unknown:\n",
        "    if False:\n",
        "a key that is neither rollstream's nor ROLL's is refused, not dropped",
        ("tests/test_config.py::test_an_unknown_key_is_refused_naming_the_key_it_is_a_typo_of",),
    ),
    Mutant(
        "repeated-warnings-held-back", "schemas/repeats.py",
        "        if seen is not None and now - seen[0] < self.every_s:\n",
        "        if False:\n",
        "a warning repeated for every failed episode or dropped group is logged once per 30 s",
        ("tests/test_repeats.py::test_an_env_that_always_raises_is_not_a_line_per_episode",),
    ),
    Mutant(
        "batcher-refuses-a-live-namesake", "consumer/liveness.py",
        "        self._take_name()\n",
        "        self._redis.set(self._key, self._token, px=self._ttl_ms)\n",
        "a second live batcher of one name is refused, not handed the first one's batch",
        ("tests/test_rollout.py::test_a_second_live_batcher_of_the_same_name_is_refused_not_"
         "handed_the_batch",),
    ),
    Mutant(
        "batcher-puts-the-version-back", "consumer/publishing.py",
        "        if raw is not None and int(raw) < self._shared.version and self._owns_config:\n",
        "        if False:\n",
        "a Redis back from an older snapshot does not take a live trainer's run back in time",
        ("tests/test_redis_crash.py::test_redis_back_from_an_older_snapshot_does_not_take_the_"
         "run_back_in_time",),
    ),
    Mutant(
        "orphaned-producers-reachable", "rollstream/cli/operating.py",
        "    if not needed:\n        return None\n",
        "    if False:\n        return None\n",
        "stop/pause reach producers whose run's config Redis lost",
        ("tests/test_redis_crash.py::test_producers_that_outlived_their_runs_config_can_still_"
         "be_stopped",),
    ),
    Mutant(
        "lease-lost-said-once-a-shard", "producers/shard_runner.py",
        "                        if run.lease_lost == 1:",
        "                        if True:",
        "a shard's lost lease is logged once, not by each of its envs' fenced commits",
        ("tests/test_metrics.py::test_a_commit_fenced_by_a_lost_lease_is_counted_refused",),
    ),
    Mutant(
        "batcher-fenced-once-its-name-is-taken", "consumer/liveness.py",
        "        if self.lost:\n            raise BatcherConflict(\n",
        "        if False:\n            raise BatcherConflict(\n",
        "a batcher frozen past its ttl whose name another took publishes nothing",
        ("tests/test_rollout.py::test_a_trainer_frozen_past_its_ttl_is_fenced_once_another_"
         "took_its_name",),
    ),
    Mutant(
        "stand-in-skips-said-once", "rollstream/trainer.py",
        "            skips.warning(f\"{exc}: publishing version {batcher.version + 1}\")\n",
        "            logger.warning(f\"{exc}: publishing version {batcher.version + 1}\")\n",
        "the stand-in trainer's skip of an exhausted step is not a line per second",
        ("tests/test_cli_admin.py::test_train_whose_every_group_fails_ends_at_its_timeout",),
    ),
    Mutant(
        "batcher-frozen-waiter-reads-nothing", "consumer/assembly.py",
        "        self._alive.guard()  # not into the name's pending entries once another "
        "holds it\n",
        "",
        "a trainer frozen in get_batch past its ttl reads nothing once another took its name",
        ("tests/test_rollout.py::test_a_trainer_frozen_while_waiting_reads_nothing_once_"
         "another_took_its_name",),
    ),
    Mutant(
        "name-check-rides-out-redis-away", "consumer/liveness.py",
        "            except REDIS_ERRORS:  # Redis away: the write that follows retries",
        "            except ZeroDivisionError:  # Redis away: the write that follows retries",
        "ack and publish_version ride out a short Redis outage (the name check does not end them)",
        ("tests/test_redis_crash.py::test_ack_and_publish_ride_out_a_redis_restart",),
    ),
    Mutant(
        "held-group-weights-fell-behind", "consumer/assembly.py",
        "                 or slot.oldest_start < oldest]",
        "                 ]",
        "a held group whose weights fell more than ratio behind is not handed out",
        ("tests/test_weights.py::test_a_held_group_whose_weights_fell_behind_is_not_handed_out",),
    ),
    Mutant(
        "namesake-refused-before-the-pause-lifts", "consumer/waiting.py",
        "        self._alive.start()  # the name first: a namesake refused lifts no pause of the "
        "other's\n",
        "",
        "a refused namesake does not lift the holder's sync pause",
        ("tests/test_rollout.py::test_a_second_live_batcher_of_the_same_name_is_refused_not_"
         "handed_the_batch",),
    ),
    Mutant(
        "pool-checks-the-choice", "producers/llm/pool.py",
        "            if not isinstance(choice, dict) or not (\n",
        "            if False and (\n",
        "a 200 whose choice is no message fails the episode naming the server",
        ("tests/test_llm_pool.py::test_a_200_that_is_no_completion_fails_the_episode_naming_the_"
         "server",),
    ),
    Mutant(
        "pool-fails-a-poisoned-request", "producers/llm/pool.py",
        "                            if refused > self._refusal_limit:\n",
        "                            if False:\n",
        "a request the servers fail while answering others fails its episode, not for ever",
        ("tests/test_llm_pool.py::test_a_request_the_servers_cannot_serve_fails_its_episode_"
         "while_others_pass",),
    ),
    Mutant(
        "policy-warns-of-endless-aborts", "producers/policies/openai.py",
        "        if not warned and now - since >= ABORT_WARN_S:\n",
        "        if False:\n",
        "a server that aborts every turn for long is warned about",
        ("tests/test_llm_policy.py::test_a_server_that_keeps_aborting_turns_is_warned_about_"
         "once",),
    ),
    Mutant(
        "batcher-sees-the-stop", "consumer/waiting.py",
        "        if self.redis.exists(self.keys.stop):\n",
        "        if False:\n",
        "a get_batch waiting on a stopped run raises RunStopped instead of timing out",
        ("tests/test_cli_admin.py::test_a_waiting_get_batch_raises_run_stopped_when_the_run_is_"
         "stopped",),
    ),
    Mutant(
        "up-ends-at-a-stop", "rollstream/trainer.py",
        "        if isinstance(exc, ProducersExited) and not client.exists(batcher.keys.stop):\n",
        "        if isinstance(exc, ProducersExited):\n",
        "rollstream up ends with 0 when its producers exit because the run was stopped",
        ("tests/test_cli_admin.py::test_up_takes_every_producer_gone_at_a_stop_as_the_end",),
    ),
    Mutant(
        "status-reads-batcher-liveness", "rollstream/status/snapshot.py",
        "        elif since > record.ttl_s or not isinstance(key, bytes):\n",
        "        elif since > record.ttl_s:\n",
        "status shows a trainer whose process died as gone (its liveness key), with a warning",
        ("tests/test_watch.py::test_status_shows_a_killed_trainer_as_gone_and_a_closed_one_as_"
         "closed",),
    ),
    Mutant(
        "reset-waits-for-trainers", "rollstream/cli/operating.py",
        "    trainers = _live_batchers(client, keys)\n",
        "    trainers: list[str] = []\n",
        "reset refuses while a trainer that would put the run back is alive",
        ("tests/test_cli_admin.py::test_reset_refuses_while_a_trainer_that_does_not_wait_is_"
         "alive",),
    ),
    Mutant(
        "pool-waits-out-an-outage", "producers/llm/pool.py",
        "                        if exc.status in (500, 502) and (server.served > before\n",
        "                        if exc.status in (500, 502) and (server.served > 0\n",
        "an outage that starts while other requests finish is waited out, not failed",
        ("tests/test_llm_pool.py::test_an_outage_that_starts_while_others_finish_is_waited_"
         "out",),
    ),
    Mutant(
        "pool-500-counts-with-health-check", "producers/llm/pool.py",
        "                                                         or await self._healthy(server, "
        "exc)):\n",
        "                                                         or False):\n",
        "a 500 on every try while the server's health check answers fails its episode after the "
        "retry budget, with one server too (it was retried for ever)",
        ("tests/test_llm_pool.py::test_a_500_on_every_try_while_the_health_check_answers_fails_"
         "with_one_server",),
    ),
    Mutant(
        "pool-drops-a-refused-field", "producers/llm/pool.py",
        "        if refused:\n            adapt.drop(server, refused, status, error_text(raw))\n",
        "        if False:\n            adapt.drop(server, refused, status, error_text(raw))\n",
        "a field a server refuses by name (transformers serve's 422) is dropped for it and the "
        "request sent again, not every episode failed",
        ("tests/test_llm_servers.py::test_a_strict_server_gets_its_refused_field_dropped_once",),
    ),
    Mutant(
        "pool-turn-cut-to-fit-is-context-full", "producers/llm/pool.py",
        "            adapt.check_cut(server, sent, data)\n",
        "            pass\n",
        "a turn the server cut to fit its context (vLLM 0.33's shortened max_tokens) ends the "
        "episode truncated, not trained as a format-penalised reply",
        ("tests/test_llm_servers.py::test_a_turn_the_server_cut_to_fit_its_context_ends_the_"
         "episode",),
    ),
    Mutant(
        "pool-model-check-takes-the-checkpoint", "producers/llm/pool.py",
        "                ours = model in names or (record is not None and record.checkpoint in "
        "names)\n",
        "                ours = model in names\n",
        "a producer started after an SGLang update (served as the checkpoint path) still starts",
        ("tests/test_llm_servers.py::test_sglang_serves_the_checkpoint_path_after_an_update_and_a_"
         "producer_still_starts",),
    ),
    Mutant(
        "turn-version-only-ours", "producers/llm/chat.py",
        "    labels = weight_labels(data)\n",
        "    labels = [span for span in weight_labels(data) if span[0].isdigit()]\n",
        "a turn is never labelled with a version it did not come from: some tokens from launch "
        "weights ('default') leave it unversioned by the server",
        ("tests/test_llm_prompts.py::test_the_weight_version_a_server_reports",),
    ),
    Mutant(
        "turn-no-ids-from-merged-entries", "producers/llm/chat.py",
        "    if content and merged_entries(data) is not None:\n",
        "    if False:\n",
        "a reply whose logprob entries merged tokens (llama-server, a split character) carries "
        "no ids or logprobs, not a shorter, wrong list",
        ("tests/test_llm_prompts.py::test_logprob_entries_that_merged_tokens_give_no_ids_or_"
         "logprobs",),
    ),
    Mutant(
        "turn-version-is-the-oldest", "producers/llm/chat.py",
        "turn.version, turn.version_source = min(int(label) for label, _, _ in labels), \"server\"",
        "turn.version, turn.version_source = max(int(label) for label, _, _ in labels), \"server\"",
        "a turn generated by two versions records the older one (the staleness bound counts a "
        "turn's oldest token)",
        ("tests/test_llm_prompts.py::test_the_weight_version_a_server_reports",
         "tests/test_model_servers.py::test_a_pause_that_keeps_turns_finishes_them_under_both_"
         "versions"),
    ),
    Mutant(
        "pool-probes-hung-with-health-check", "producers/llm/servers.py",
        "            ready = [s for s in ready if not s.hung]\n",
        "            ready = [s for s in ready if True]\n",
        "a server down for a timeout is checked with GET /models, not with a turn",
        ("tests/test_llm_pool.py::test_a_sigstopped_server_is_checked_with_get_models_not_with_"
         "turns",),
    ),
    Mutant(
        "group-filter-judged-at-hand-out", "consumer/waiting.py",
        "                    if not assembly.judge(state, deliverable):\n",
        "                    if True:\n",
        "the group filters judge the groups a batch is about to take: a filtered one is not "
        "trained on",
        (f"{FILTERS}::test_groups_whose_rewards_all_agree_are_filtered_counted_and_deleted",
         f"{FILTERS}::test_a_user_class_by_import_path_filters_by_its_own_rule"),
    ),
    Mutant(
        "group-filter-acks-and-deletes", "consumer/assembly.py",
        "            self.drop_groups(state, filtered, counter=None, tokens=\"filtered\")\n",
        "            for slot in filtered:\n                state.finish(slot)\n",
        "a filtered group's entries are acked and deleted at once, not left pending",
        (f"{FILTERS}::test_groups_whose_rewards_all_agree_are_filtered_counted_and_deleted",),
    ),
    Mutant(
        "group-filter-fills-from-others", "consumer/waiting.py",
        "                    # filtered groups left the step: others take their place, if any "
        "can come\n                    deliverable = assembly.deliverable(state, wanted)\n",
        "                    deliverable = min(deliverable, state.ready_count)\n",
        "a filtered group's place in the batch goes to another group of the step, waited for",
        (f"{FILTERS}::test_the_batch_waits_for_other_groups_of_the_step_in_place_of_filtered_"
         "ones",),
    ),
    Mutant(
        "group-filter-inflight-not-judged-again", "consumer/assembly.py",
        "                if not (slot.judged or slot.priority):\n",
        "                if not slot.judged:\n",
        "a batch handed out before a restart goes out again whole, not judged a second time",
        (f"{FILTERS}::test_a_restart_mid_filter_loses_and_doubles_nothing",),
    ),
    Mutant(
        "group-filter-error-keeps-the-group", "consumer/assembly.py",
        "                        kept.append(item)  # not judged: back into the heap as it was\n",
        "                        pass\n",
        "a group whose filter raised stays ready: asked again, it is judged again, not lost",
        (f"{FILTERS}::test_a_filter_that_raises_or_answers_garbage_stops_get_batch_in_one_line",),
    ),
    Mutant(
        "group-filter-verdict-checked", "consumer/filters.py",
        "        if isinstance(verdict, bool | np.bool_):\n            return bool(verdict)\n",
        "        return bool(verdict)\n",
        "a filter answering something but True, False or None stops the run in one line",
        (f"{FILTERS}::test_a_filter_that_raises_or_answers_garbage_stops_get_batch_in_one_line",),
    ),
    # partial rollouts (policy.partial_rollout; tests/test_partial_rollout.py)
    Mutant(
        "sync-carry-by-default", "schemas/config.py",
        "return int(partial.sync_carry_over) if self.is_sync else partial.async_carry_over",
        "return 1 if self.is_sync else partial.async_carry_over",
        "sync mode stays on-policy by default: the carry-over only when asked for",
        (f"{PARTIAL}::test_sync_stays_on_policy_unless_the_carry_over_is_asked_for[False]",),
    ),
    Mutant(
        "async-carry-over", "schemas/config.py",
        "return int(partial.sync_carry_over) if self.is_sync else partial.async_carry_over",
        "return int(partial.sync_carry_over) if self.is_sync else 0",
        "async carry-over: an admitted episode lives on past the ratio instead of expiring",
        (f"{PARTIAL}::test_async_carry_over_keeps_an_admitted_episode_past_the_ratio[1]",),
    ),
    Mutant(
        "async-carry-counted", "consumer/assembly.py",
        'self._shared.version - msg["version_start"] > state.schedule.ratio:',
        'self._shared.version - msg["version_start"] > 0:',
        "only a trajectory older than the ratio lets counts as carried over (async mode)",
        (f"{PARTIAL}::test_async_carry_over_keeps_an_admitted_episode_past_the_ratio[1]",),
    ),
    Mutant(
        "sync-carry-stale", "consumer/assembly.py",
        "or version - version_start > schedule.bound",
        "or version - version_start > schedule.ratio",
        "a carried-over trajectory (started a version back) is not dropped as stale",
        (f"{PARTIAL}::test_sync_stays_on_policy_unless_the_carry_over_is_asked_for[True]",),
    ),
    Mutant(
        "kept-turn-cut", "producers/partial.py",
        "return SYNC in paused and not self.sync_survives",
        "return True",
        "a kept turn is never doubled: a pause that keeps turns does not close them (they "
        "would be sent again)",
        (f"{PARTIAL}::test_an_operator_pause_lets_turns_in_flight_finish",
         f"{PARTIAL}::test_sync_stays_on_policy_unless_the_carry_over_is_asked_for[True]"),
    ),
    Mutant(
        "kept-update-aborts", "consumer/partial.py",
        'KEEPING = {"vllm": "keep", "sglang": "retract"}',
        'KEEPING = {"vllm": "abort"}',
        "a kept turn is never doubled: an update with in_flight keep pauses in a keeping mode",
        (f"{PARTIAL}::test_an_async_update_keeps_a_turn_in_flight_or_sends_it_again"
         "[keep-vllm]",
         f"{PARTIAL}::test_an_async_update_keeps_a_turn_in_flight_or_sends_it_again"
         "[keep-sglang]"),
    ),
    Mutant(
        "kept-turn-lost-weights", "producers/llm/pool.py",
        "lost = labels[-1][0] if labels and not labels[-1][0].isdigit() else None",
        "lost = next((lb for lb, _, _ in labels if not lb.isdigit()), None)",
        "a kept turn is never doubled: one that began on the launch weights is not taken for "
        "a server that lost its weights (set aside, the turn sent again)",
        (f"{PARTIAL}::test_a_turn_kept_through_the_first_update_is_used_not_sent_again",),
    ),
    Mutant(
        "kept-turn-launch-label", "producers/llm/chat.py",
        'labels = [(label if label.isdigit() else "0", start, end)',
        'labels = [(label, start, end)',
        "a turn kept from the launch weights into version 1 is labelled 0 (its oldest token), "
        "not with the version recorded when it answered",
        (f"{PARTIAL}::test_a_turn_kept_through_the_first_update_is_used_not_sent_again",),
    ),
    Mutant(
        "replay-compares-reward", "rollstream/replay.py",
        '            if not same(step["reward"], float(reward)):\n',
        "            if False:\n",
        "replay reports a recorded reward the env does not give again (exit 1)",
        ("tests/test_store.py::test_a_replayed_sokoban_run_is_identical_and_a_tampered_one_differs",),
    ),
    Mutant(
        "replay-compares-exactly", "rollstream/replay.py",
        "    return _equal(recorded, unpack(pack(replayed)))\n",
        "    return True\n",
        "replay's comparison of a recorded and a replayed observation or reward",
        ("tests/test_store.py::test_a_replayed_sokoban_run_is_identical_and_a_tampered_one_differs",),
    ),
    Mutant(
        "store-write-atomic", "consumer/store.py",
        '    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")\n',
        "    tmp = final\n",
        "a batch file is written under a hidden temporary name and linked into place: a crash "
        "mid-write leaves no partial batch file",
        ("tests/test_store.py::test_a_crash_mid_write_leaves_no_partial_batch_file",),
    ),
    Mutant(
        "token-version-spans", "consumer/batch.py",
        "            out[int(start):int(end)] = int(version)",
        "            pass  # (mutant) every token labelled with the turn's oldest version",
        "per-token versions: each token of a turn kept through an update carries the version "
        "of the span that sampled it",
        (f"{PROVENANCE}::test_trajectory_tokens_line_up_turns_versions_rewards_and_logprobs",
         f"{PARTIAL}::test_an_async_update_keeps_a_turn_in_flight_or_sends_it_again"),
    ),
    Mutant(
        "oldest-token-staleness", "producers/rollout.py",
        '"version_start": min(map(_oldest, steps)) if steps else control.version,',
        '"version_start": max(map(_newest, steps)) if steps else control.version,',
        "the staleness bound counts a trajectory's oldest token, not its newest",
        (f"{PROVENANCE}::test_the_staleness_bound_counts_a_trajectorys_oldest_token",),
    ),
    Mutant(
        "mid-turn-version-newest", "producers/llm/pool.py",
        "version = end if version is None or end is None else min(version, end)",
        "version = end",
        "a full-weights turn updated mid-turn (no spans) is never labelled with the newer "
        "weights alone",
        (f"{PROVENANCE}::test_a_full_weights_turn_updated_mid_turn_records_both_ends",),
    ),
    Mutant(
        "discarded-tokens-expired", "consumer/assembly.py",
        'self.drop_groups(state, stale, counter="scheduler/stale_dropped", tokens="stale")',
        'self.drop_groups(state, stale, counter="scheduler/stale_dropped")',
        "the generated tokens of a group expired at a publish are counted as discarded",
        (f"{PROVENANCE}::test_a_held_group_expired_by_a_publish_counts_its_tokens",),
    ),
    Mutant(
        "ui-tool-counts", "rollstream/ui/view.py",
        '            malformed += int(step.get("tool_malformed") or 0)\n',
        "            pass\n",
        "the rollout browser counts the malformed tool calls of its samples",
        ("tests/test_ui_api.py::test_the_state_counts_the_samples_tool_calls_and_the_runs_"
         "discarded_tokens",),
    ),
    Mutant(
        "tito-extends-sampled", "producers/llm/tito.py",
        "        return extend(template, state.prompt, state.sampled, messages[state.covered:])\n",
        "        return as_ids(template.prompt_ids(messages))\n",
        "token-in/token-out: a next turn extends the previous prompt and sampled ids, never a "
        "re-rendering (a Qwen3-style template rewrites earlier turns)",
        (f"{TITO}::test_thinking_template_turns_extend_what_was_sampled",),
    ),
    Mutant(
        "tito-close-overlap", "producers/llm/tito.py",
        "            overlap = k\n",
        "            overlap = 0\n",
        "the template's close of a reply is not doubled when the sampled ids end with it",
        (f"{TITO}::test_chatml_turns_are_the_rendered_conversation",),
    ),
    Mutant(
        "tito-close-added", "producers/llm/tito.py",
        "np.concatenate((prompt, sampled, as_ids(close[overlap:]),\n",
        "np.concatenate((prompt, sampled,\n",
        "a reply without its end-of-turn token (llama-server's OpenAI ids, a cut reply) is "
        "closed as the template closes it",
        (f"{TITO}::test_a_reply_without_its_end_token_is_closed_by_the_template",),
    ),
    Mutant(
        "tito-same-conversation", "producers/llm/tito.py",
        "if (state is not None and state.messages is messages and",
        "if (state is not None and",
        "only the same conversation is extended: a step manager's fresh prompt is encoded "
        "afresh",
        (f"{TITO}::test_a_fresh_message_list_is_encoded_afresh",),
    ),
    Mutant(
        "tito-echo-key-only", "producers/llm/tito.py",
        ' and raw[before:before + 1] in (b"{", b","):\n',
        ":\n",
        "the prompt echo is cut only where it is a key of the answer, never where the name "
        "ends another key",
        (f"{TITO}::test_the_prompt_echo_is_cut_before_parsing_and_nothing_else_changes",),
    ),
    Mutant(
        "tito-echo-cut", "producers/llm/pool.py",
        "                raw = tito.without_prompt_echo(raw)\n",
        "                pass\n",
        "a token-id request's answer is parsed without the prompt ids the server echoes",
        (f"{TITO}::test_a_token_in_token_out_answer_arrives_without_its_echo",),
    ),
    Mutant(
        "tito-server-ids", "producers/llm/tito.py",
        '    response_ids = choice.get("token_ids")\n    if response_ids is None:\n'
        '        response_ids = choice.get("response_token_ids")\n',
        "    response_ids = None\n",
        "a reply's ids are the server's where it gives them (the tokenizer's only otherwise)",
        (f"{TITO}::test_reply_ids_from_the_server_else_the_tokenizer",
         f"{TITO}::test_a_run_token_in_token_out_through_the_stand_in"),
    ),
    Mutant(
        "tito-llama-native", "producers/llm/servers.py",
        "        if self.dialect is LLAMA_SERVER:\n            root = ",
        "        if False:\n            root = ",
        "llama-server gets token-id prompts at its own /completion (exact ids in `tokens`)",
        (f"{TITO}::test_a_run_token_in_token_out_through_the_stand_in",),
    ),
    Mutant(
        "sticky-rank", "producers/llm/routing.py",
        "return sorted(servers, key=lambda s: score(key, s.base_url), reverse=True)",
        "return list(servers)",
        "sticky sessions: each session ranks the servers by its own rendezvous weights",
        (f"{STICKY}::test_an_episodes_turns_and_its_groups_members_go_to_one_server",
         f"{STICKY}::test_a_server_taken_down_moves_only_its_sessions_and_they_come_back"),
    ),
    Mutant(
        "sticky-load-bound", "producers/llm/routing.py",
        "chosen = next((s for s in order if s.inflight + 1 <= limit), order[0])",
        "chosen = order[0]",
        "sticky sessions: a server over the load bound does not take the session's request",
        (f"{STICKY}::test_the_load_bound_spills_a_session_to_its_next_server",),
    ),
    Mutant(
        "sticky-pick", "producers/llm/servers.py",
        "if up and session is not None and self.sticky:",
        "if False:",
        "sticky sessions: the pool sends a session's request to the session's server",
        (f"{STICKY}::test_an_episodes_turns_and_its_groups_members_go_to_one_server",),
    ),
    Mutant(
        "sticky-header", "producers/llm/pool.py",
        "if session is not None and self.session_header:",
        "if False:",
        "sticky sessions: every request of a session names it in the session header",
        (f"{STICKY}::test_every_request_names_its_session_in_the_configured_header",),
    ),
    Mutant(
        "sticky-group-key", "producers/policies/openai.py",
        "session = session_key(ctx.mode, ctx.group_id, ctx.episode_id)",
        "session = session_key(ctx.mode, ctx.group_id * 1000 + ctx.member, ctx.episode_id)",
        "sticky sessions: a group's members share their episode's session (one server)",
        (f"{STICKY}::test_the_policy_sends_a_groups_members_and_turns_to_one_server",),
    ),
    Mutant(
        "import-canary", "schemas/keys.py",
        'CONSUMER_GROUP = "batcher"',
        'raise RuntimeError("mutant canary: the copy is what gets imported")\n'
        'CONSUMER_GROUP = "batcher"',
        "none: proves the tests import the mutated copy, not the installed tree",
        (f"{GUARDS}::test_a_group_completed_over_several_reads_is_delivered_only_when_whole",),
        signature="mutant canary: the copy is what gets imported",
    ),
    Mutant(
        "openenv-session-cap", "producers/envs/remote.py",
        "free = [s for s in up if s.in_use < s.cap]",
        "free = up",
        "remote envs: a producer opens no more sessions on an env server than its cap "
        "(OpenEnv's max_concurrent_envs)",
        ("tests/test_envs_openenv.py::test_episodes_end_to_end_through_rollstream",),
    ),
    Mutant(
        "openenv-step-deadline", "producers/envs/openenv.py",
        "reply = await within(ws.receive(), timeout_s)",
        "reply = await ws.receive()",
        "remote envs: a server that answers nothing misses its reset/step deadline, is set "
        "aside and its episodes are replayed elsewhere",
        ("tests/test_envs_openenv.py::"
         "test_a_hung_server_misses_its_step_deadline_and_is_set_aside",),
    ),
    Mutant(
        "openenv-replay-bound", "producers/shard_runner.py",
        "attempts = self.config.env_max_retries + 1",
        "attempts = self.config.env_max_retries + 2",
        "remote envs: an episode whose env server died is replayed env_max_retries times on "
        "a fresh session, then its group fails with the server's reason",
        ("tests/test_envs_openenv.py::"
         "test_a_server_that_stays_down_fails_the_group_after_the_bounded_replays",),
    ),
    Mutant(
        "tools-call-cap", "producers/tools/loop.py",
        "            run, over = parsed.calls[:cap], parsed.calls[cap:]\n",
        "            run, over = parsed.calls, []\n",
        "a reply's tool calls run only up to max_calls_per_turn; the rest are answered not run",
        (f"{TOOLS}::test_several_calls_in_one_turn_run_up_to_the_cap",),
    ),
    Mutant(
        "tools-no-half-turn", "producers/policies/openai.py",
        "            del messages[asked - 1:]\n",
        "            del messages[-1]\n",
        "a turn that fails between tool rounds leaves none of its messages behind",
        (f"{TOOLS}::test_a_turn_that_fails_between_tool_rounds_leaves_no_half_turn",),
    ),
    Mutant(
        "tools-malformed-counted", "producers/tools/loop.py",
        "                malformed += len(parsed.malformed)\n",
        "                pass\n",
        "a malformed tool call is counted on its step (tools/malformed per batch)",
        (f"{TOOLS}::test_a_malformed_call_ends_the_turn_counted_and_first_logged",),
    ),
    Mutant(
        "tools-sandbox-parallel", "producers/tools/loop.py",
        "            async with slots:\n",
        "            if slots:\n",
        "a tag's python sandboxes run at most python.max_parallel at once in a producer",
        (f"{TOOLS}::test_a_tags_sandboxes_run_at_most_max_parallel_at_once",),
    ),
    Mutant(
        "sandbox-killed-when-cut-short", "producers/tools/sandbox.py",
        "            if proc.returncode is None:\n                _kill(proc)\n"
        "            returncode: int | None\n",
        "            returncode: int | None\n",
        "a tool call cut short (timeout, a cancelled turn) kills its program",
        (f"{TOOLS}::test_a_call_cut_short_kills_its_program",
         f"{TOOLS}::test_a_sleeping_program_is_killed_at_its_timeout"),
    ),
    Mutant(
        "sandbox-cpu-limit", "producers/tools/sandbox.py",
        '    "r.setrlimit(r.RLIMIT_CPU, (cpu, cpu + 1))\\n"\n',
        "",
        "the python tool's CPU-time limit kills an infinite loop",
        (f"{TOOLS}::test_an_infinite_loop_is_killed_by_its_cpu_limit",),
    ),
    Mutant(
        "sandbox-memory-limit", "producers/tools/sandbox.py",
        '    "r.setrlimit(r.RLIMIT_AS, (memory, memory))\\n"\n',
        "",
        "the python tool's memory limit stops a memory hog",
        (f"{TOOLS}::test_a_memory_hog_gets_a_memory_error",),
    ),
    Mutant(
        "sandbox-output-cap", "producers/tools/sandbox.py",
        '            return bytes(out[:cap]), "output_limit"\n',
        '            return bytes(out), "output_limit"\n',
        "the python tool's output is cut at output_bytes",
        (f"{TOOLS}::test_output_is_capped_and_the_writer_killed",),
    ),
    Mutant(
        "sandbox-no-network", "producers/tools/sandbox.py",
        '            argv = ["unshare", *UNSHARE_ARGS, *argv]\n',
        "            pass\n",
        "the python tool runs in a network namespace of its own: connects fail",
        (f"{TOOLS}::test_the_sandbox_has_no_network",),
    ),
    Mutant(
        "sandbox-own-environment", "producers/tools/sandbox.py",
        "            *argv, cwd=work, env=env,",
        "            *argv, cwd=work, env=None,",
        "none of the producer's environment variables (API keys) reach the python tool",
        (f"{TOOLS}::test_each_call_gets_a_fresh_directory_and_none_of_our_environment",),
    ),
    Mutant(
        "within-loses-a-cancellation", "producers/lifetime.py",
        "    async with asyncio.timeout(timeout_s):\n        return await awaitable\n",
        "    return await asyncio.wait_for(awaitable, timeout_s)\n",
        "a producer's deadline wait keeps a cancellation that lands with the awaited result",
        (f"{GUARDS}::test_a_cancellation_that_lands_with_the_awaited_result_is_never_lost",),
    ),
    Mutant(
        "commit-after-close-waits", "producers/commit.py",
        "        if self.closed:  # the producer is stopping",
        "        if False:  # the producer is stopping",
        "a commit submitted after the committer stopped fails at once, never hangs",
        (f"{GUARDS}::test_a_commit_submitted_after_the_committer_stopped_fails_at_once",),
    ),
    Mutant(
        "sentinel-auth-retried", "schemas/redisconn/clients.py",
        "        if is_auth_error(exc):\n            return False\n",
        "",
        "refused sentinel credentials are said at once, not retried with backoff",
        (f"{CONN}::test_sentinels_that_want_a_password_say_so",),
    ),
    # -- a python policy's own agent loop (policy.llm, producers/policies/agent.py) ----------
    Mutant(
        "agent-records-calls", "producers/policies/agent.py",
        "        calls[index] = turn\n",
        "",
        "every model call an agent makes during an act is recorded on the step",
        ("tests/test_agent_policy.py::test_the_example_agent_solves_with_the_tool_and_records_every_call",
         "tests/test_agent_policy.py::test_token_in_token_out_calls_extend_their_own_conversation"),
    ),
    Mutant(
        "agent-call-order", "producers/policies/agent.py",
        "        own, earlier = made[-1], made[:-1]\n",
        "        own, earlier = made[0], made[1:]\n",
        "an agent's calls are recorded in call order, the last one the step's own",
        ("tests/test_agent_policy.py::test_token_in_token_out_calls_extend_their_own_conversation",),
    ),
    Mutant(
        "agent-labels-version", "producers/policies/agent.py",
        "        label_version(turn, answer, ctx.version, host._context is not None)\n",
        "        turn.version, turn.version_source = ctx.version, \"producer\"\n",
        "an agent's call is labelled with the weights that generated it (as the openai "
        "policy's turns)",
        ("tests/test_agent_policy.py::test_token_in_token_out_calls_extend_their_own_conversation",),
    ),
    Mutant(
        "agent-conversation-extends", "producers/policies/agent.py",
        "            conversations[id(messages)] = state\n",
        "",
        "token-in/token-out: an agent's next call on a message list extends its ids exactly",
        ("tests/test_agent_policy.py::test_token_in_token_out_calls_extend_their_own_conversation",),
    ),
    Mutant(
        "agent-sticky-session", "producers/policies/agent.py",
        "        session = session_key(ctx.mode, ctx.group_id, ctx.episode_id)",
        "        session = None",
        "an agent's calls go to the episode's sticky server, as the openai policy's turns",
        ("tests/test_agent_policy.py::test_token_in_token_out_calls_extend_their_own_conversation",),
    ),
    Mutant(
        "agent-no-half-turn", "producers/policies/agent.py",
        "            if saved is None:\n                scratch.pop(CONVERSATIONS_KEY, None)\n",
        "            if saved is None:\n                pass\n",
        "an act that fails leaves the agent's conversations' ids as they were",
        ("tests/test_agent_policy.py::test_a_failed_act_records_nothing_and_leaves_the_ids_as_they_were",),
    ),
    Mutant(
        "codec-call-arrays", "schemas/codec.py",
        "                        call[name] = _as_array(call[name])\n",
        "                        pass\n",
        "an agent's earlier calls' token arrays come back as arrays from the wire",
        ("tests/test_agent_policy.py::test_the_example_agent_solves_with_the_tool_and_records_every_call",),
    ),
    Mutant(
        "batch-expands-model-calls", "consumer/batch.py",
        "    calls = step.get(\"model_calls\")\n    if not calls:\n",
        "    calls = step.get(\"model_calls\")\n    if True:\n",
        "turn_tokens and trajectory_tokens give every model call of a step, in order",
        ("tests/test_agent_policy.py::test_the_example_agent_solves_with_the_tool_and_records_every_call",),
    ),
    Mutant(
        "rollout-oldest-call", "producers/rollout.py",
        "    return min(oldest, *map(_oldest, calls)) if calls else oldest\n",
        "    return oldest\n",
        "the staleness bound counts a step's oldest model call",
        ("tests/test_agent_policy.py::test_the_staleness_bound_counts_an_agents_oldest_call",),
    ),
    Mutant(
        "discarded-counts-calls", "consumer/assembly.py",
        "                     for call in (*step.get(\"model_calls\", ()), step)\n",
        "                     for call in (step,)\n",
        "a dropped trajectory's discarded tokens count an agent's earlier calls",
        ("tests/test_agent_policy.py::test_the_staleness_bound_counts_an_agents_oldest_call",),
    ),
    Mutant(
        "model-servers-of-an-agent", "consumer/servers.py",
        "            policy = llm\n",
        "            pass\n",
        "ModelServers.for_batcher takes a python policy's agent servers (policy.llm)",
        ("tests/test_agent_policy.py::test_the_trainers_model_servers_are_the_agents",),
    ),
    Mutant(
        "schemas-names-eager", "schemas/__init__.py",
        "if TYPE_CHECKING:  # what type checkers and readers see",
        "if True:  # what type checkers and readers see",
        "the command line starts without numpy and the wire format (schemas' names lazy)",
        ("tests/test_layout.py::test_the_command_line_starts_without_the_heavy_parts",),
    ),
    Mutant(
        "cli-store-eager", "rollstream/cli/store.py",
        "from rollstream.cli.errors import UsageError\n",
        "from consumer.store import batch_files, read_batch  # noqa: F401\n"
        "from rollstream.cli.errors import UsageError\n",
        "the command line starts without the consumer (export/replay import it when run)",
        ("tests/test_layout.py::test_the_command_line_starts_without_the_heavy_parts",),
    ),
    # partial rollouts, in_flight resume (tests/test_resume.py)
    Mutant(
        "resume-from-scratch", "producers/llm/tito.py",
        "        return [*self.prompt, *self.ids]\n",
        "        return list(self.prompt)\n",
        "a resumed turn is never doubled: the continuation's prompt is the turn's prompt and "
        "the ids sampled so far, not the prompt alone (a reply sampled again from scratch "
        "after the partial)",
        (f"{RESUME}::test_an_aborted_turn_resumes_from_its_tokens_never_doubled[vllm]",
         f"{RESUME}::test_a_resumed_turn_is_its_pieces_once_each_with_their_versions"),
    ),
    Mutant(
        "resume-latency-sum", "producers/policies/openai.py",
        "                    piece.latency_s = spent\n",
        "",
        "a resumed turn's latency is its pieces' requests, not the last piece's alone",
        (f"{RESUME}::test_an_aborted_turn_resumes_from_its_tokens_never_doubled[vllm]",),
    ),
    Mutant(
        "refit-latency-sum", "producers/policies/openai.py",
        "            turn.latency_s = spent + answer.latency_s  # every request of the turn\n",
        "            turn.latency_s = answer.latency_s\n",
        "a turn asked again within sequence_length records both requests' latency",
        ("tests/test_llm_sampling.py::test_a_reply_past_sequence_length_is_asked_again_within_it",),
    ),
    Mutant(
        "claims-stop-at-seconds", "producers/lease_loop.py",
        "        return self.life.stop.is_set() or self.life.out_of_time()\n",
        "        return self.life.stop.is_set()\n",
        "`seconds` ends a producer midway through its claims, not after a whole claim pass",
        ("tests/test_producer_ends.py::test_seconds_ends_a_producer_midway_through_its_claims",),
    ),
    Mutant(
        "reload-tried-at-once", "producers/llm/servers.py",
        "                record.version, record.model, record.reports, record.loaded_at)\n",
        "                record.version, record.model, record.reports, server.loaded_at)\n",
        "a server set aside and loaded again with the same version is tried at once",
        ("tests/test_llm_pool.py::test_a_set_aside_server_is_tried_at_once_when_its_record_"
         "changes",),
    ),
    Mutant(
        "stop-wakes-lease-loop", "producers/control.py",
        "        if self.state.stopped:  # the lease loop ends the producer now, not at its "
        "next beat\n            self.leases_changed.set()\n",
        "",
        "a run's stop ends a producer at once, not at its next lease beat",
        ("tests/test_producer_ends.py::test_a_runs_stop_ends_a_producer_before_its_next_lease_"
         "beat",),
    ),
    Mutant(
        "start-backoff-cut-short", "producers/startup.py",
        "                                    f\"{exc}\", life.sleep)",
        "                                    f\"{exc}\")",
        "a stop or `seconds` ends a producer's start mid-backoff, not after the sleep",
        ("tests/test_producer_ends.py::test_a_producer_retrying_an_unreachable_redis_ends_mid_"
         "backoff",),
    ),
    Mutant(
        "life-sleep-ends-at-deadline", "producers/lifetime.py",
        "            seconds = max(0.0, min(seconds, self.deadline - time.monotonic()))\n",
        "            pass\n",
        "a producer's sleeps end at its `seconds` deadline",
        ("tests/test_producer_ends.py::test_a_producer_retrying_an_unreachable_redis_ends_mid_"
         "backoff[seconds]",),
    ),
    Mutant(
        "watch-setup-inside-try", "rollstream/processes.py",
        "    try:\n        previous = signal.signal(signal.SIGUSR1, raise_gone)\n"
        "        watcher.start()\n        yield\n",
        "    previous = signal.signal(signal.SIGUSR1, raise_gone)\n    watcher.start()\n"
        "    try:\n        yield\n",
        "a Ctrl+C as up starts watching its producers leaves no armed watch behind (exit 130)",
        ("tests/test_processes.py::test_ctrl_c_as_the_producer_watch_starts_leaves_no_watch_"
         "behind",),
    ),
    Mutant(
        "watch-wakes-at-its-end", "rollstream/processes.py",
        "            if ended.wait(PRODUCER_WATCH_S):  # (the block's end wakes it: no sleep to\n"
        "                return  # wait out when `up` ends)\n",
        "            time.sleep(PRODUCER_WATCH_S)\n            if ended.is_set():\n"
        "                return\n",
        "up's producer watch ends with its block at once, not after the rest of a sleep",
        ("tests/test_processes.py::test_the_producer_watch_ends_with_its_block_at_once",),
    ),
    Mutant(
        "resume-piece-twice", "producers/llm/tito.py",
        "        self._append(last, version, source)\n        turn = Turn(",
        "        self._append(last, version, source)\n        self._append(last, version, "
        "source)\n        turn = Turn(",
        "a resumed turn is never doubled: the finishing answer's tokens are added once",
        (f"{RESUME}::test_an_aborted_turn_resumes_from_its_tokens_never_doubled[sglang]",
         f"{RESUME}::test_a_resumed_turn_is_its_pieces_once_each_with_their_versions"),
    ),
    Mutant(
        "resume-partial-version", "producers/llm/tito.py",
        "if self.spans and self.spans[-1][0] == version and self.spans[-1][2] == start:",
        "if self.spans and self.spans[-1][2] == start:",
        "a resumed turn's partial tokens keep the version that sampled them (the new weights' "
        "tokens get their own span)",
        (f"{RESUME}::test_an_aborted_turn_resumes_from_its_tokens_never_doubled[vllm]",
         f"{RESUME}::test_a_resumed_turn_is_its_pieces_once_each_with_their_versions"),
    ),
    Mutant(
        "resume-needs-tokenizer", "schemas/policy.py",
        'if (self.partial_rollout.in_flight == "resume" and not own\n',
        'if (False\n',
        "in_flight resume is refused without policy.tokenizer (one line, exit 2): resuming "
        "from text would retokenize",
        (f"{RESUME}::test_resume_needs_token_in_token_out",
         f"{RESUME}::test_the_cli_refuses_resume_without_a_tokenizer_in_one_line"),
    ),
    Mutant(
        "resume-pause-aborts", "consumer/partial.py",
        'keep = partial is None or partial.in_flight == "keep"',
        'keep = partial is None or partial.in_flight != "abort"',
        "in_flight resume updates the servers in a pause mode that aborts (their answers carry "
        "the tokens to resume from)",
        (f"{RESUME}::test_resume_needs_token_in_token_out",
         f"{RESUME}::test_an_aborted_turn_resumes_from_its_tokens_never_doubled[sglang]"),
    ),
    Mutant(
        "resume-waits-while-loading", "producers/policies/openai.py",
        "                    await asyncio.sleep(RESUME_WAIT_S)\n",
        "                    pass\n",
        "a continuation the server aborts at once (loading) waits before the next: no busy "
        "loop of requests",
        (f"{RESUME}::test_a_continuation_aborted_while_the_server_loads_waits_and_resumes",),
    ),
    Mutant(
        "agent-resumes", "producers/policies/__init__.py",
        """        return AgentPolicy(policy, config.llm.model_copy(
            update={"partial_rollout": config.partial_rollout}))""",
        "        return AgentPolicy(policy, config.llm)",
        "a python policy's partial_rollout rules its agent's calls: with in_flight resume an "
        "aborted call is continued from its tokens, not sampled again from scratch",
        ("tests/test_agent_policy.py::"
         "test_an_agents_call_aborted_by_an_update_resumes_from_its_tokens",),
    ),
    Mutant(
        "cancel-again", "producers/lifetime.py",
        "        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)\n",
        "        await asyncio.wait(pending)\n        pending = set()\n",
        "a task whose cancellation redis-py's client dropped is cancelled again until it "
        "ends (one cancel: a loop over Redis commands played on, its awaiter hung)",
        (f"{GUARDS}::test_a_task_looping_on_redis_commands_ends_when_cancelled",),
    ),
    Mutant(
        "openenv-connect-deadline", "producers/envs/openenv.py",
        "                heartbeat=None, max_msg_size=0), self.reset_timeout_s)",
        "                heartbeat=None, max_msg_size=0), None)",
        "a session's websocket upgrade is bounded by reset_timeout_s: a server that accepts "
        "connections and answers nothing is set aside, not waited on for aiohttp's 300 s",
        ("tests/test_envs_openenv.py::"
         "test_a_server_hung_before_the_first_session_is_set_aside_at_connect",),
    ),
    Mutant(
        "turns-kept-counted", "producers/rollout.py",
        "    elif _newest(step) != _oldest(step):\n",
        "    elif False:\n",
        "a turn kept through a weight update (its tokens span versions) is counted "
        "(rollstream_turns_kept, status)",
        (f"{PARTIAL}::test_an_async_update_keeps_a_turn_in_flight_or_sends_it_again"
         "[keep-vllm]",),
    ),
    Mutant(
        "tito-renders-tools", "producers/policies/openai.py",
        "                                      None if tools is None else tools[1])\n",
        "                                      None)\n",
        "token-in/token-out: a tag's tools are rendered into the first prompt",
        (f"{TOOLS_TITO}::test_the_math_task_with_the_python_tool_token_in_token_out[clean]",),
    ),
    Mutant(
        "tito-tojson", "producers/llm/template.py",
        "        env.filters[\"tojson\"] = _tojson",
        "        pass",
        "tools rendered with transformers' tojson (no sorted keys, no HTML escaping)",
        (f"{TOOLS_TITO}::test_tools_render_as_transformers_renders_them",),
    ),
    Mutant(
        "tito-no-tools-field", "producers/policies/openai.py",
        "                      if tools is not None and tito is None else config.extra_body)",
        "                      if tools is not None else config.extra_body)",
        "a token-id completion request carries no chat `tools` or `tool_choice`",
        (f"{TOOLS_TITO}::test_the_math_task_with_the_python_tool_token_in_token_out[clean]",),
    ),
    Mutant(
        "tito-round-extends", "producers/tools/loop.py",
        "            if replied is not None:\n                replied(turn)\n",
        "            pass\n",
        "a tool round's next prompt extends the round's prompt and sampled ids exactly",
        (f"{TOOLS_TITO}::test_the_math_task_with_the_python_tool_token_in_token_out[spelled]",),
    ),
    Mutant(
        "tito-rounds-apart", "producers/llm/tito.py",
        "    return {TITO_KEY: scratch[TITO_KEY]} if TITO_KEY in scratch else {}\n",
        "    return scratch\n",
        "a turn cut short between tool rounds leaves the episode's conversation ids",
        (f"{TOOLS_TITO}::test_a_turn_cut_short_between_rounds_leaves_the_conversation_ids",),
    ),
    Mutant(
        "tool-round-label", "producers/policies/openai.py",
        "            if tools is not None:  # a tool round is recorded as it is (model_calls)\n",
        "            if False:\n",
        "each tool round is labelled with its version as it comes",
        (f"{TOOLS_TITO}::test_the_math_task_with_the_python_tool_token_in_token_out[clean]",),
    ),
    Mutant(
        "tool-rounds-as-calls", "producers/tools/loop.py",
        "            turn.extra[\"model_calls\"] = calls\n",
        "            pass\n",
        "a turn's tool rounds are recorded as model calls (trainable, with their prompts)",
        (f"{TOOLS_TITO}::test_the_math_task_with_the_python_tool_token_in_token_out[clean]",),
    ),
    Mutant(
        "tito-reads-text", "schemas/tools.py",
        "        return DEFAULT_TEXT_PARSER if token_exact else \"server\"\n",
        "        return \"server\"\n",
        "an unset tools.parser reads token-in/token-out replies with a text parser",
        (f"{TOOLS_TITO}::test_an_unset_parser_reads_by_the_turns_kind_and_server_needs_chat",),
    ),
    Mutant(
        "tito-server-parser-config", "schemas/config.py",
        "        _check_tool_parsers(self)\n",
        "",
        "tools.parser server under policy.tokenizer is a config error (exit 2)",
        (f"{TOOLS_TITO}::test_the_server_parser_under_a_tokenizer_is_one_line_and_exit_2",),
    ),
    Mutant(
        "tito-server-parser-policy", "producers/policies/openai.py",
        "        if self._tito is not None and tools[0].parser == \"server\":\n",
        "        if False:\n",
        "a policy built without the config check refuses the server parser under a tokenizer",
        (f"{TOOLS_TITO}::test_a_policy_built_without_a_config_check_refuses_the_server_parser",),
    ),
    Mutant(
        "tito-qwen3-suffix", "producers/llm/template.py",
        "            ids = self.encode(self._after_reply(messages))\n",
        "            raise PolicyError(\"rewrites a plain exchange\")\n",
        "a template whose last reply renders otherwise (Qwen3's) still extends its turns",
        (f"{TOOLS_TITO}::test_a_qwen3_template_extends_its_turns",),
    ),
    Mutant(
        "agent-tito-tools", "producers/policies/agent.py",
        "            ids = tito.prompt_ids(host._template, state, messages, tools)\n",
        "            ids = tito.prompt_ids(host._template, state, messages)\n",
        "an agent's tools under policy.llm.tokenizer are rendered into its first prompt",
        (f"{TOOLS_TITO}::test_the_example_agent_under_a_tokenizer_renders_its_tools",),
    ),
    Mutant(
        "agent-tito-no-tools-field", "producers/policies/agent.py",
        "        if tools is not None and tito is None:  # token-in/token-out: in the prompt",
        "        if tools is not None:  # token-in/token-out: in the prompt",
        "an agent's token-id completion request carries no chat `tools`",
        (f"{TOOLS_TITO}::test_the_example_agent_under_a_tokenizer_renders_its_tools",),
    ),
    Mutant(
        "tito-encode-line-start", "producers/llm/template.py",
        '_LINE_START = re.compile(r"(?<=\\n)(?=[!-~])")',
        '_LINE_START = re.compile(r"(?<=\\n)")',
        "a text is cut into lines only where a pre-token must end (before a printable ASCII)",
        ("tests/test_tito_lines.py::test_the_tiny_tokenizer_is_encoded_by_lines",
         "tests/test_tito_lines.py::test_the_llama3_split_pattern_is_encoded_by_lines"),
    ),
    Mutant(
        "tito-encode-lines-normalizer", "producers/llm/template.py",
        'if spec.get("normalizer") is not None or not isinstance(steps, list)',
        'if not isinstance(steps, list)',
        "a tokenizer with a normalizer is encoded whole, not line by line",
        ("tests/test_tito_lines.py::test_other_tokenizers_are_encoded_whole",),
    ),
)


class MutantError(Exception):
    """A mutant could not be applied (its snippet is missing or ambiguous)."""


def tracked_files(root: Path) -> list[str]:
    """The files of the tree: git's tracked and untracked-but-not-ignored files."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root, capture_output=True, check=True)
        return [name for name in out.stdout.decode().split("\0")
                if name and (root / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and not SKIP_DIRS.intersection(rel.parts):
                names.append(str(rel))
        return names


def copy_tree(root: Path, dest: Path) -> None:
    for name in tracked_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


def apply(mutant: Mutant, tree: Path) -> None:
    """Replace the mutant's snippet in `tree`; it must occur exactly once."""
    path = tree / mutant.file
    if not path.is_file():
        raise MutantError(f"{mutant.id}: {mutant.file} does not exist")
    text = path.read_text(encoding="utf-8")
    found = text.count(mutant.snippet)
    if found != 1:
        raise MutantError(f"{mutant.id}: snippet found {found} times in {mutant.file} "
                          f"(expected once): {mutant.snippet!r}")
    text = text.replace(mutant.snippet, mutant.replacement)
    if path.suffix == ".py":
        compile(text, str(path), "exec")  # a mutant must fail tests, not the parser
    path.write_text(text, encoding="utf-8")


def run_tests(tree: Path, tests: tuple[str, ...],
              timeout_s: float) -> tuple[int, str, str]:
    """pytest on `tests` inside `tree`, with this interpreter: exit status, summary line and
    the whole output."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 1, f"timed out after {timeout_s:g}s", ""
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else proc.stderr.strip()[-200:]
    return proc.returncode, summary, output


def run_mutant(mutant: Mutant, timeout_s: float, show: bool = False) -> tuple[str, str]:
    """('caught' | 'survived' | 'error', detail)."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.id}-") as tmp:
        tree = Path(tmp)
        copy_tree(ROOT, tree)
        try:
            apply(mutant, tree)
        except (MutantError, SyntaxError) as exc:
            return "error", str(exc)
        status, summary, output = run_tests(tree, mutant.tests, timeout_s)
    if show:
        failures = [line for line in output.splitlines() if line.startswith(("E ", "FAILED"))]
        print("\n".join(f"    | {line}" for line in failures[:12]), flush=True)
    if status == 0:
        return "survived", summary
    if mutant.signature:  # caught only by the failure it is built to cause
        if mutant.signature in output:
            return "caught", f"pytest exit status {status}, output shows {mutant.signature!r}"
        return "error", f"pytest exit status {status} without {mutant.signature!r}: {summary}"
    if status == 1:  # tests failed (2, 3, 4, 5: interrupted, internal or usage error, none)
        return "caught", summary
    return "error", f"pytest exit status {status}: {summary}"


def baseline(mutants: list[Mutant], timeout_s: float) -> tuple[int, str]:
    tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as tmp:
        copy_tree(ROOT, Path(tmp))
        status, summary, _ = run_tests(Path(tmp), tests, timeout_s)
        return status, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", action="append", metavar="ID", help="run only this mutant "
                        "(repeatable)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the run on the unmodified tree")
    parser.add_argument("--show", action="store_true",
                        help="print how each mutant failed (pytest's E and FAILED lines)")
    parser.add_argument("--timeout-s", type=float, default=600.0,
                        help="per pytest run (default 600)")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.id:26} {m.file:22} {m.guard}")
        return 0
    chosen = list(MUTANTS)
    if args.only:
        known = {m.id for m in MUTANTS}
        unknown = sorted(set(args.only) - known)
        if unknown:
            parser.error(f"unknown mutant id(s): {', '.join(unknown)} (see --list)")
        chosen = [m for m in MUTANTS if m.id in args.only]
    if not args.no_baseline:
        status, summary = baseline(chosen, args.timeout_s)
        print(f"{'baseline':9} {'(unmodified tree)':26} {summary}", flush=True)
        if status != 0:
            print("mutants: the baseline fails; fix the tests first", file=sys.stderr)
            return 2
    results: dict[str, int] = {"caught": 0, "survived": 0, "error": 0}
    started = time.monotonic()
    for mutant in chosen:
        outcome, detail = run_mutant(mutant, args.timeout_s, args.show)
        results[outcome] += 1
        print(f"{outcome:9} {mutant.id:26} {detail}", flush=True)
    print(f"mutants: {results['caught']} caught, {results['survived']} survived, "
          f"{results['error']} errors, of {len(chosen)} in {time.monotonic() - started:.0f}s")
    return 0 if results["caught"] == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
