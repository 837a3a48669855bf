"""Arrow schemas of the run tables (documented in docs/logs.md)."""

from __future__ import annotations

import pyarrow as pa

CLIENTS_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("client_id", pa.int32()),
        ("host", pa.int32()),
        ("participated", pa.bool_()),
        ("train_loss", pa.float64()),
        ("num_samples", pa.int32()),
        ("num_test_samples", pa.int32()),
        ("accuracy", pa.float64()),
        ("loss", pa.float64()),
        ("accuracy_own_classes", pa.float64()),
        ("reference", pa.string()),
        ("accuracy_global", pa.float64()),
        ("loss_global", pa.float64()),
        ("accuracy_local", pa.float64()),
        ("loss_local", pa.float64()),
        ("accuracy_personalized", pa.float64()),
        ("loss_personalized", pa.float64()),
        ("group", pa.int32()),
        ("true_group", pa.int32()),
        ("memberships", pa.list_(pa.float64())),
        ("bytes_up", pa.int64()),
        ("bytes_down", pa.int64()),
        ("eval_bytes_down", pa.int64()),
    ]
)

ROUNDS_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("evaluated", pa.bool_()),
        ("num_evaluated", pa.int32()),
        ("num_participants", pa.int32()),
        ("num_rejected", pa.int32()),
        ("num_dropped", pa.int32()),
        ("samples_trained", pa.int64()),
        ("local_steps", pa.int64()),
        ("eval_samples_trained", pa.int64()),
        ("eval_local_steps", pa.int64()),
        ("bytes_up", pa.int64()),
        ("bytes_down", pa.int64()),
        ("eval_bytes_down", pa.int64()),
        ("mean_train_loss", pa.float64()),
        ("mean_accuracy", pa.float64()),
        ("worst_accuracy", pa.float64()),
        ("bottom20_accuracy", pa.float64()),
        ("best_accuracy", pa.float64()),
        ("gap", pa.float64()),
        ("mean_accuracy_global", pa.float64()),
        ("worst_accuracy_global", pa.float64()),
        ("bottom20_accuracy_global", pa.float64()),
        ("mean_accuracy_local", pa.float64()),
        ("mean_accuracy_own_classes", pa.float64()),
        ("personalized", pa.bool_()),
        ("num_groups", pa.int32()),
        ("ari_true", pa.float64()),
        ("virtual_time", pa.float64()),
        ("wall_time_s", pa.float64()),
        ("aggregate_s", pa.float64()),
        ("elapsed_s", pa.float64()),
        # partition.newcomers, at evaluated rounds (null without newcomers): how many were scored,
        # their accuracy by the method's newcomer rule, the ARI of their placement against the
        # planted groups (alone, and with the evaluated clients' groups), their work and bytes
        ("num_newcomers", pa.int32()),
        ("newcomer_mean_accuracy", pa.float64()),
        ("newcomer_worst_accuracy", pa.float64()),
        ("newcomer_bottom20_accuracy", pa.float64()),
        ("newcomer_ari_true", pa.float64()),
        ("newcomer_ari_with_clients", pa.float64()),
        ("newcomer_samples_trained", pa.int64()),
        ("newcomer_local_steps", pa.int64()),
        ("newcomer_bytes_down", pa.int64()),
        ("newcomer_bytes_up", pa.int64()),
        # the privacy section's epsilon spent once the round's releases are counted, by
        # privacy.accountant at privacy.delta (null without privacy, and in runs written before it)
        ("epsilon", pa.float64()),
    ]
)

REFRESH_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("refresh_index", pa.int32()),
        ("descriptor", pa.string()),
        ("effective_rank", pa.int32()),
        ("num_groups", pa.int32()),
        ("num_cached_clients", pa.int32()),
        ("group_sizes", pa.list_(pa.int32())),
        ("silhouette", pa.float64()),
        ("ari_previous", pa.float64()),
        ("ari_true", pa.float64()),
        ("membership_entropy", pa.float64()),
        ("membership_entropy_normalized", pa.float64()),
        ("personalization_gain", pa.float64()),
        ("fraction_helped", pa.float64()),
    ]
)

UPDATES_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("client_id", pa.int32()),
        ("status", pa.string()),
        ("virtual_start", pa.float64()),
        ("virtual_finish", pa.float64()),
        ("staleness", pa.int32()),
        ("train_loss", pa.float64()),
        ("num_samples", pa.int32()),
        ("steps", pa.int32()),
        ("samples_trained", pa.int64()),
        ("local_steps", pa.int64()),
        # the client host that ran the update, and the size of the largest batched group its
        # training ran in there, itself included (1: every `train` call trained alone)
        ("host", pa.int32()),
        ("trained_together", pa.int32()),
    ]
)

# one row per newcomer (partition.newcomers) and evaluated round: what the method's newcomer
# rule placed and scored it with (docs/newcomers.md)
NEWCOMERS_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("client_id", pa.int32()),
        ("host", pa.int32()),
        ("rule", pa.string()),  # the method's newcomer rule as declared, or "no newcomer rule"
        ("reference", pa.string()),  # the reference the rule scored it with (null without a rule)
        ("accuracy", pa.float64()),
        ("loss", pa.float64()),
        ("accuracy_own_classes", pa.float64()),
        ("group", pa.int32()),  # where the rule placed it: a cluster or group (null: no groups)
        ("memberships", pa.list_(pa.float64())),  # soft placement over the groups, where the method has one
        ("true_group", pa.int32()),
        ("num_train_samples", pa.int32()),
        ("num_test_samples", pa.int32()),
        ("samples_trained", pa.int64()),  # training the rule did for it
        ("local_steps", pa.int64()),
        ("bytes_down", pa.int64()),  # what the server sent it to be placed and scored
        ("bytes_up", pa.int64()),  # what it sent (a probe's answer)
    ]
)

EVENTS_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("message", pa.string()),
    ]
)

TABLE_SCHEMAS = {
    "events": EVENTS_SCHEMA,
    "clients": CLIENTS_SCHEMA,
    "rounds": ROUNDS_SCHEMA,
    "refresh": REFRESH_SCHEMA,
    "updates": UPDATES_SCHEMA,
    "newcomers": NEWCOMERS_SCHEMA,
}
