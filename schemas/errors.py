"""Project exceptions, in one place: every part raises these, never bare Exceptions."""

from __future__ import annotations


class RollstreamError(Exception):
    """Base of every rollstream error."""


class ConfigError(RollstreamError, ValueError):
    """A config that cannot run; the message names the field."""


class DecodeError(RollstreamError, ValueError):
    """A stream entry that is not a valid trajectory message; the message says why."""


class BatchTimeout(RollstreamError, TimeoutError):
    """`get_batch` ran out of time; the message says what it was waiting for."""


class RunStopped(RollstreamError):
    """The run was stopped (`rollstream stop`) while `get_batch` waited: its producers exit
    and nothing more comes. A trainer started again resumes the run."""


class StepExhausted(BatchTimeout):
    """Sync mode: every group of this step was handed out or dropped (a member failed), so
    no batch can come before `publish_version` moves the run to the next step (raised at
    once, e.g. to a trainer restarted between `ack` and `publish_version`)."""


class GroupFilterError(RollstreamError):
    """A group filter class (`group_filter_cls`) raised, or returned something that is not
    True, False or None: `get_batch` raises it with one line naming the class; the group stays
    pending, so a trainer started again with the filter fixed gets it (exit 1 from `train` and
    `up`)."""


class RedisSetupError(RollstreamError):
    """The Redis server could not be reached or started; the message names the URL."""


class PolicyError(RollstreamError):
    """A policy that cannot be built or started (a bad entrypoint, a model no server knows);
    the producer exits 1 with this one line."""


class RunConflict(ConfigError):
    """A run name already in use with a config that cannot resume it; names the differences
    and the command that resets the run."""


class BatcherConflict(RollstreamError):
    """Another live batcher holds this batcher's name on the run (two trainers started with
    the same `index`/`consumer`): they would take each other's unacked batches."""


class VersionConflict(RollstreamError):
    """`publish_version(v)` when the run is not at v - 1 (nor already at v)."""


class EpisodeFailed(RollstreamError):
    """An episode that retrying cannot save (a model server refused its request with a 4xx,
    or answered something that is not a completion): the member commits it failed at once,
    without the env retries, so its group is dropped and counted."""


class ContextFull(RollstreamError):
    """The model's context window cannot hold the next turn: a server refused the request for
    its length (the conversation outgrew `max_model_len`). The episode ends truncated with
    the turns it played (`context_full` in its trajectory), as a length stop ends it in
    ROLL; a python policy may raise it from `act` for the same end."""


class TurnAborted(RollstreamError):
    """A model turn that was not generated (the server aborted it, as SGLang does while it
    loads new weights): the producer sends it again after its gate (pause, expiry) passes.
    `tokens`: how many tokens the server says it had generated (discarded: counted)."""

    def __init__(self, message: str, tokens: int = 0):
        super().__init__(message)
        self.tokens = tokens


class ServerUpdateError(RollstreamError):
    """A model server that did not take new weights; the message names the server."""


class NotReplicated(RollstreamError):
    """A write the primary made that fewer than `min_replicas` replicas confirmed in time
    (WAIT): it does not count as acknowledged; sending it again is safe."""


class WorkerFailure(RollstreamError):
    """A producer's background loop (control poll, commits, weights) ended on an unexpected
    error; the producer exits 1 rather than run on without it."""


class ProducersExited(RollstreamError):
    """Every producer that `rollstream up` started has exited while its trainer still waits:
    nothing will fill the batch; the message gives their exit codes."""
