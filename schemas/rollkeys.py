"""ROLL's pipeline config keys, and the check that sorts a file's keys three ways.

A ROLL agentic pipeline file holds far more than a rollout service reads: trainer and
inference workers, strategies, loss settings. Every key ROLL's config classes define is
*known*: the ones rollstream reads are taken, the rest are *set aside* quietly (listed at
DEBUG). Any other key is *unknown* and refused, with the known key it is a typo of when one
is close (`rollout_batch_sise (did you mean rollout_batch_size?)`).

The lists are the dataclass fields of ROLL's config classes at alibaba/ROLL 8eb27cc2
(2026-08-19), with their bases:
- `AgenticConfig` (roll/pipeline/agentic/agentic_config.py) <- `PPOConfig`, `BaseConfig`,
  `ScheduleConfig` (roll/configs/base_config.py): the top level;
- `WorkerConfig` (roll/configs/worker_config.py): `actor_infer` and the other workers;
- `EnvManagerConfig` (agentic_config.py) <- `WorkerConfig`: the two env managers;
- `GeneratingArguments` (roll/configs/generating_args.py): every `generating_args` block;
- the keys of a `custom_envs` entry that ROLL's env managers and `make_env_configs` read
  (roll/pipeline/agentic/env_manager/*.py, agentic_config.py).
ROLL's launcher (examples/start_agentic_pipeline.py) also reads `pipeline_cls`, and Hydra
owns `hydra` and `defaults`. A top-level key that the file's interpolations refer to
(`max_actions_per_traj: 10` ... `${max_actions_per_traj}`) is a variable, as are the
top-level names of ROLL's shipped examples/config/*.yaml: set aside too.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# AgenticConfig and its bases (113 fields)
ROLL_TOP_LEVEL = frozenset("""
generate_opt_level is_num_return_sequences_expand max_running_requests is_use_additional_prompts
max_additional_running_prompts user_defined_rollout_loop_cls router_args exp_name seed
rpc_timeout output_dir base_dir logging_dir rollout_dump_dir track_with tracker_kwargs max_steps
save_steps max_ckpt_to_keep logging_steps eval_steps rollout_batch_size val_batch_size local_rank
resume_from_checkpoint checkpoint_config prompt_length response_length sequence_length
val_prompt_length val_sequence_length profiler_timeline profiler_memory report_length_and_rewards
is_offload_states is_offload_optimizer_states_in_train_step length_profiler_dir
profiler_output_dir otlp_output_dir system_envs model_update_buffer_size_mb num_nodes
num_gpus_per_node model_download_type rollout_mock transfer_backend pretrain reward_pretrain
actor_train actor_infer critic reference reward async_generation_ratio ppo_epochs max_grad_norm l2
lambd gamma pg_clip use_pg_clip_range pg_clip_low pg_clip_high value_clip kl_penalty target_kl
init_kl_coef kl_horizon use_reward_scaling add_len_reward reward_clip use_reward_norm
whiten_rewards whiten_advantages advantage_clip adv_estimator norm_mean_type norm_std_type
add_token_level_kl critic_warmup use_kl_loss kl_loss_coef entropy_loss_coef loss_agg_mode
dual_clip_loss enable_reference enable_old_logprobs_recompute
force_disable_old_logprobs_recompute train_infer_correction pure_opd_pipeline_type teacher
student_train student_infer is_pure_opd use_opd custom_envs train_env_manager val_env_manager
render_save_dir reward_normalization env_monitor dirty_data_mask open_feedback_turn
use_token_reward batch_adjust_mode episode_reward_weight step_reward_weight step_reward_gamma
ratio_type exp_mode partial_gpu_mode parse_tool_call_parameter_to_dict skip_mock_system_prompt
""".split())

# WorkerConfig (33 fields)
ROLL_WORKER = frozenset("""
name worker_cls pg_variant model_args training_args data_args generating_args strategy_args
world_size device_mapping num_gpus_per_worker model_update_frequency infer_batch_size
backend_timeout system_envs topr_positive_weight topr_negative_weight max_concurrency
use_dynamic_batching_in_train max_tokens_per_microbatch_in_train sequence_length_round_in_train
use_dynamic_batching_in_infer max_tokens_per_microbatch_in_infer sequence_length_round_in_infer
offload_nccl use_sequence_packing sequence_packing_args logits_in_fp32 router_replay
apply_loss_scale mtp_training_mode opd_kl_coef tag_included
""".split())

# EnvManagerConfig: WorkerConfig's fields and its own ten
ROLL_ENV_MANAGER = ROLL_WORKER | frozenset("""
llm_proxy num_env_groups group_size group_size_redundancy tags num_groups_partition
max_traj_per_env format_penalty max_env_num_per_worker group_filter_cls
""".split())

# GeneratingArguments (13 fields)
ROLL_GENERATING_ARGS = frozenset("""
do_sample temperature top_p top_k num_beams max_length max_new_tokens repetition_penalty
length_penalty num_return_sequences stop_strings include_stop_str_in_output logprobs
""".split())

# what ROLL's env managers read of a custom_envs entry
ROLL_TAG_KEYS = frozenset("""
env_type env_config max_steps max_tokens_per_step env_manager_cls agent_system_template
agent_template history_length use_thread_lock max_env_step_concurrent tool_wrapper
agent_runner_cls proxy_port http_timeout pre_step_template next_step_template
""".split())

ROLL_LAUNCHER = frozenset({"pipeline_cls", "hydra", "defaults"})

# top-level names of ROLL's examples/config/*.yaml, variables for interpolation (a file that
# composes one of them gets them all, used or not)
ROLL_EXAMPLE_VARIABLES = frozenset("""
action_pattern agent_runner_cls agent_system_template agent_template all_response_pattern
code_agent_system_template code_agent_template custom_env default_history_length env_manager_cls
frozen_format_penalty game_agent_system_template game_agent_template gem_code gem_games gem_math
gem_qa gem_rg math_agent_system_template math_agent_template max_actions_per_traj
max_tokens_per_step next_step_template pre_step_template qa_agent_system_template
qa_agent_template rg_agent_system_template rg_agent_template single_prompt_agent_system_template
single_prompt_agent_template sokoban_format_penalty think_action_pattern
""".split())

# ROLL's own keys one edit from one of ours: never offered as "did you mean"
ROLL_NOT_TYPOS = frozenset({"custom_env"})


@dataclass
class KeySort:
    """The outcome of sorting a file's keys: dotted names set aside, and unknown keys as the
    error names them."""

    set_aside: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def section(self, data: Any, prefix: str, ours: Iterable[str], roll: Iterable[str] = (),
                keep: Iterable[str] = ()) -> dict[str, Any]:
        """`data` (a mapping at `prefix`) with only `ours` and `keep` kept: ROLL's other keys
        set aside, anything else unknown. A non-mapping is returned as is (validation names
        it)."""
        if not isinstance(data, dict):
            return data
        ours, roll, keep = set(ours), set(roll), set(keep)
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = str(key)
            if name in ours or name in keep:
                out[name] = value
            elif name in roll:
                self.set_aside.append(f"{prefix}{name}")
            else:
                self.unknown.append(f"{prefix}{suggest(name, ours | roll | keep)}")
        return out


def suggest(key: str, known: Iterable[str]) -> str:
    """An unknown key as the error names it, with the known key it is a typo of if one is
    that close."""
    if key in ROLL_NOT_TYPOS:
        return key
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.85)
    return f"{key} (did you mean {close[0]}?)" if close else key
