"""The method contract: everything a federated method sees and returns.

Below the runtime (which implements it) and above the maths; it imports neither
Ray nor torch. A method imports what it needs from here:

    from hdcfl_ray.contract import ClientContext, ClientTask, MethodSpec, ModelParams, ...
"""

from hdcfl_ray.contract.context import ClientContext, ModelParts, TrainingSettings
from hdcfl_ray.contract.method import ASYNC_HOOKS, AUTO, AsyncHooks, AutoKnob, ExportHooks, Method, MethodSpec, NoParams, RunInfo, asks_for_probes, doubled_count, never_probes, tenfold
from hdcfl_ray.contract.newcomers import NEWCOMER_HOOKS, NO_NEWCOMER_RULE, NewcomerHooks, NewcomerProbe, newcomer_probe_task
from hdcfl_ray.contract.optimizer import OptimizerConfig
from hdcfl_ray.contract.privacy import AdaptiveClipConfig, PrivacyConfig, PrivacyRule, ResolvedAdaptiveClip, ResolvedPrivacy, one_release_per_round
from hdcfl_ray.contract.regularisers import BatchableRegulariser, LinearTerm, ProximalPull
from hdcfl_ray.contract.section import Section
from hdcfl_ray.contract.server_optimizer import ServerOptimizerConfig
from hdcfl_ray.contract.values import (
    ClientTask,
    EvalResult,
    EvalStats,
    ModelParams,
    GroupingSummary,
    RefreshSummary,
    RoundNotes,
    TrainingBudget,
    TrainStats,
    Upload,
)

__all__ = [
    "ASYNC_HOOKS",
    "AdaptiveClipConfig",
    "AUTO",
    "AutoKnob",
    "doubled_count",
    "tenfold",
    "asks_for_probes",
    "never_probes",
    "one_release_per_round",
    "AsyncHooks",
    "BatchableRegulariser",
    "ClientContext",
    "ClientTask",
    "EvalResult",
    "EvalStats",
    "ExportHooks",
    "GroupingSummary",
    "LinearTerm",
    "Method",
    "MethodSpec",
    "ModelParams",
    "ModelParts",
    "NEWCOMER_HOOKS",
    "NO_NEWCOMER_RULE",
    "NewcomerHooks",
    "NewcomerProbe",
    "newcomer_probe_task",
    "NoParams",
    "OptimizerConfig",
    "PrivacyConfig",
    "PrivacyRule",
    "ProximalPull",
    "RefreshSummary",
    "ResolvedAdaptiveClip",
    "ResolvedPrivacy",
    "RoundNotes",
    "RunInfo",
    "Section",
    "ServerOptimizerConfig",
    "TrainingBudget",
    "TrainStats",
    "TrainingSettings",
    "Upload",
]
