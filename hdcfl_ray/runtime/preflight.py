"""Preflight: where a scenario meets the machine and its data, before a run folder
exists or Ray starts. `prepare_run` (what `hdcfl-ray validate` runs) loads the dataset,
builds the partition, checks the runtime against this machine, builds the method with its
settings (auto knobs at a value they may take), resolves its privacy section (z, q:
privacy_plan.py) and collects the notices a run prints at start; a `PreparedRun` is what every command then runs (the driver, candidate runs of auto
knobs, replays)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hdcfl_ray.algorithms.registry import method_names, supports_async
from hdcfl_ray.config.methods import build_algorithm
from hdcfl_ray.config.schema import Scenario
from hdcfl_ray.contract import ResolvedPrivacy
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.partitions import check_partition_against_dataset, partition_dataset
from hdcfl_ray.data.partitions.client_data import Partition
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.errors import ScenarioError

if TYPE_CHECKING:
    from hdcfl_ray.auto_knobs.plan import AutoPlan
    from hdcfl_ray.auto_knobs.record import AutoKnobsRecord


@dataclass(frozen=True)
class PreparedRun:
    scenario: Scenario
    dataset: ImageDataset
    partition: Partition
    # what the run does differently from what the scenario may suggest (a capped value,
    # clients a trace leaves out): printed by the CLI, never an error
    notices: tuple[str, ...] = ()
    # the method's knobs set to `auto` (hdcfl_ray/auto_knobs): what choosing them runs;
    # once chosen, `scenario` holds the chosen values, `written` the scenario as written
    # and `auto_knobs` the record of the choice
    auto_plan: AutoPlan | None = None
    written: Scenario | None = None
    auto_knobs: AutoKnobsRecord | None = None
    # the scenario's privacy section resolved (z, C, q, ...; runtime/privacy_plan.py): what the
    # method is built with and the server samples and accounts by; None = no privacy
    privacy: ResolvedPrivacy | None = None

    @property
    def as_written(self) -> Scenario:
        """The scenario as the user wrote it, `auto` kept: what the run folder's
        scenario.yaml, the manifest and the checkpoints record, and what a rerun or a
        resume is compared with."""
        return self.written if self.written is not None else self.scenario


def prepare_run(scenario: Scenario, dataset: ImageDataset | None = None) -> PreparedRun:
    """Everything that can fail because of the user's input, before a run directory
    exists or Ray starts (`validate` is this function).
    `dataset`: an already loaded copy of `scenario.dataset` (sweeps load each once)."""
    from hdcfl_ray.auto_knobs.plan import auto_plan, check_validation_split, stand_ins, with_values
    from hdcfl_ray.runtime.batching_record import batching_notices
    from hdcfl_ray.runtime.newcomer_facts import newcomer_notices
    from hdcfl_ray.runtime.privacy_plan import resolve_privacy
    from hdcfl_ray.runtime.machine_checks import check_model_memory, check_runtime, check_synthetic_memory
    from hdcfl_ray.config.pinned_knobs import pinned_knob_notices
    from hdcfl_ray.data.augmentation import check_augmentation
    from hdcfl_ray.data.partitions.checks import check_text_unshifted, id_column_notices, test_proportion_notices, test_size_notices
    from hdcfl_ray.models.encoders import check_encoder_reads
    from hdcfl_ray.models.pretrained import check_pretrained
    from hdcfl_ray.models.pretrained import check_pool_held_out
    from hdcfl_ray.runtime.server.virtual_clock import check_trace

    counted = isinstance(scenario.partition.num_clients, int)  # else all: counted once the ids are read
    notices = check_runtime(scenario.runtime, scenario.partition.client_count()) if counted else []
    if dataset is None:
        check_synthetic_memory(scenario.dataset)
        dataset = load_dataset(scenario.dataset, scenario.seed, scenario.partition.partition_by)
    written: Scenario | None = None
    if not counted:
        written = scenario
        scenario, resolved = with_client_count(scenario, dataset)
        notices += [resolved, *check_runtime(scenario.runtime, scenario.partition.client_count())]
    notices += [*dataset.notices, *id_column_notices(scenario.partition, scenario.dataset)]
    check_partition_against_dataset(
        scenario.partition, num_classes=dataset.num_classes, num_train=int(dataset.train_labels.shape[0]), dataset_name=dataset.name
    )
    check_encoder_reads(scenario.model, dataset)
    check_augmentation(scenario.dataset.augmentation, dataset)
    check_model_memory(scenario.model, dataset.channels, scenario.algorithm)
    plan = auto_plan(scenario)  # the knobs set to `auto`, chosen when the run starts (hdcfl_ray/auto_knobs)
    buildable = scenario if plan is None else with_values(scenario, stand_ins(scenario))
    # z from privacy.target_epsilon, q from the counts now known (exit 2 without the dp extra)
    privacy, privacy_notices = resolve_privacy(buildable)
    notices += privacy_notices
    try:
        # a method may refuse its settings here (exit 2, before anything starts); auto knobs stand at a value they may take
        build_algorithm(buildable, privacy)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from exc
    if scenario.protocol.mode == "async" and not supports_async(scenario.algorithm.name):
        capable = ", ".join(name for name in method_names() if supports_async(name))
        raise ScenarioError(
            f"protocol.mode: 'async' works with {capable}; {scenario.algorithm.name} runs "
            f"synchronous rounds only (set protocol.mode: sync)"
        )
    notices += check_trace(scenario.protocol.system, scenario.partition.num_clients)
    check_pretrained(scenario.model, dataset.channels)
    check_pool_held_out(scenario)
    if scenario.output.trackers:  # a tracker's package is missing: say so before anything starts
        from hdcfl_ray.trackers import check_trackers_installed

        check_trackers_installed(scenario.output.trackers)
    try:
        partition = partition_dataset(scenario.partition, dataset, scenario.seed)
    except ValueError as exc:
        raise ScenarioError(f"partition: {exc}") from exc
    check_text_unshifted(scenario.partition, partition, dataset)
    notices += test_size_notices(scenario.partition, partition)
    notices += test_proportion_notices(partition, dataset)
    if plan is not None:
        check_validation_split(scenario, plan, dataset)
        notices += [f"{knob.key}: auto cannot use {value:g} ({why})" for knob in plan.knobs for value, why in knob.skipped]
    notices += pinned_knob_notices(scenario)  # a pinned value chosen for another data setting
    notices += batching_notices(scenario)  # batched training asked for, but the scenario trains one client at a time
    notices += newcomer_notices(scenario)  # partition.newcomers: who is held out, and the method's rule (or none)
    return PreparedRun(
        scenario=scenario, dataset=dataset, partition=partition, notices=tuple(notices), auto_plan=plan, written=written, privacy=privacy
    )


def with_client_count(scenario: Scenario, dataset: ImageDataset) -> tuple[Scenario, str]:
    """`scenario` with `partition.num_clients: all` (and its sample_fraction) replaced by
    the count it stands for on this data, validated as a file would be; and the line that
    says how the count was found."""
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.data.partitions.build import sample_ids
    from hdcfl_ray.data.partitions.client_count import resolved_client_count

    count, line = resolved_client_count(scenario.partition, sample_ids(dataset), scenario.seed)
    raw = scenario.model_dump(mode="json")
    raw["partition"] = {**raw["partition"], "num_clients": count, "sample_fraction": None}
    try:
        return build_scenario(raw, source=f"partition.num_clients: all = {count}"), line
    except ScenarioError as error:  # e.g. protocol.participation counts more clients than the data has
        raise ScenarioError(f"{error} (partition.num_clients: all = {count} on this data)") from error
