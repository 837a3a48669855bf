"""The scenario schema: one frozen, validated object that describes a run.

Every section forbids unknown keys so a typo stops the run before Ray starts.
Checks that need the dataset (k against the number of classes, data paths) live
in `hdcfl_ray.data.partitions.checks`; this module checks what a file alone can.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, create_model, field_validator, model_validator

from hdcfl_ray.algorithms.registry import method_specs
from hdcfl_ray.contract import NoParams, OptimizerConfig, Section

DATASET_NAMES = ("digits", "cifar10", "cifar100", "parquet_images", "image_folder", "synthetic")


class DatasetConfig(Section):
    name: Literal["digits", "cifar10", "cifar100", "parquet_images", "image_folder", "synthetic"] = "digits"
    # Folder or file the data lives in; required for parquet_images and image_folder,
    # optional for cifar10/cifar100 (defaults to ./data).
    path: str | None = None
    download: bool = False
    # digits has no test split: this fraction of it is held out as the test split.
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    image_column: str = "image"
    label_column: str = "label"
    # Parquet tables: file names inside `path`, relative.
    train_file: str = "train.parquet"
    test_file: str = "test.parquet"
    # Use only the first N training images (after a seeded shuffle); null = all.
    max_train_samples: int | None = Field(None, ge=1)
    max_test_samples: int | None = Field(None, ge=1)
    # synthetic source
    num_classes: int = Field(10, ge=2)
    image_size: int = Field(16, ge=4)
    channels: Literal[1, 3] = 3
    train_samples: int = Field(2000, ge=10)
    test_samples: int = Field(500, ge=10)


class PartitionConfig(Section):
    kind: Literal["iid", "label_subset", "dirichlet", "rotation"] = "iid"
    num_clients: int = Field(20, ge=1)
    # label_subset: classes per client
    k: int | None = Field(None, ge=1)
    # dirichlet: concentration and minimum training samples per client
    alpha: float | None = Field(None, gt=0.0)
    min_samples: int = Field(10, ge=1)
    # rotation: one angle per group, in degrees; clients are spread round-robin over groups
    angles: tuple[float, ...] = (0.0, 90.0, 180.0, 270.0)
    # per-client test set size drawn from the test split with the client's class
    # proportions; null = the client's share of the test split (test size / K).
    test_per_client: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _kind_parameters(self) -> "PartitionConfig":
        if self.kind == "label_subset" and self.k is None:
            raise ValueError("partition.k is required when partition.kind is label_subset (classes per client, e.g. 2)")
        if self.kind == "dirichlet" and self.alpha is None:
            raise ValueError("partition.alpha is required when partition.kind is dirichlet (e.g. 0.3)")
        if self.kind == "rotation" and len(self.angles) == 0:
            raise ValueError("partition.angles must list at least one angle in degrees")
        return self


class ModelConfig(Section):
    encoder: Literal["small_cnn", "resnet18_cifar", "mobilenet_v2"] = "small_cnn"
    # Local file with encoder weights (a state dict saved by torch.save); loaded
    # with weights_only=True. Nothing is fetched from a hub.
    pretrained: str | None = None
    # width multiplier of the small CNN (channels); feature dimension of its output
    width: int = Field(32, ge=4)
    feature_dim: int = Field(128, ge=8)


def _algorithm_config() -> type[Section]:
    """`algorithm`: `name` picks the method; each method with settings has a section
    of its own, `algorithm.<name>`, declared by the method's module, so one scenario
    can carry every method's settings and `--set algorithm.name=...` switches
    between them without a key becoming invalid."""
    specs = method_specs()
    names = tuple(specs)
    fields: dict[str, Any] = {"name": (Literal[names], Field(description="the method: " + " | ".join(names)))}  # type: ignore[valid-type]
    for name, spec in specs.items():
        if spec.params is not NoParams:
            fields[name] = (spec.params, Field(default_factory=spec.params, description=spec.summary))
    return create_model("AlgorithmConfig", __base__=Section, __doc__=_algorithm_config.__doc__, __module__=__name__, **fields)


AlgorithmConfig = _algorithm_config()
ALGORITHM_NAMES = tuple(method_specs())


class Distribution(Section):
    """A per-client value drawn once per run (seeded): constant, uniform(low, high),
    or lognormal exp(N(mean, sigma))."""

    kind: Literal["constant", "uniform", "lognormal"] = "constant"
    value: float = Field(1.0, ge=0.0)
    low: float = Field(0.5, ge=0.0)
    high: float = Field(1.5, ge=0.0)
    mean: float = 0.0
    sigma: float = Field(0.5, ge=0.0)

    @model_validator(mode="after")
    def _ordered_bounds(self) -> "Distribution":
        if self.kind == "uniform" and self.high < self.low:
            raise ValueError(f"uniform needs low <= high (got low={self.low}, high={self.high})")
        return self


class SystemConfig(Section):
    """System heterogeneity on a virtual clock: nothing sleeps in wall time.

    A local update that processes n samples (local epochs x training samples)
    lasts n / speed + delay virtual seconds."""

    speed: Distribution = Distribution(kind="constant", value=100.0)  # samples per virtual second
    delay: Distribution = Distribution(kind="constant", value=0.0)  # virtual seconds of network per update
    # CSV or Parquet with columns client_id, speed, delay[, available_from, available_until]
    # (virtual seconds); it overrides speed and delay for the clients it lists.
    trace: str | None = None

    @model_validator(mode="after")
    def _positive_speed(self) -> "SystemConfig":
        if self.speed.kind == "constant" and self.speed.value <= 0:
            raise ValueError("speed.value must be > 0 samples per virtual second")
        if self.speed.kind == "uniform" and self.speed.low <= 0:
            raise ValueError("speed.low must be > 0 samples per virtual second")
        return self


class AvailabilityConfig(Section):
    # always: every client can be selected; bernoulli: each client is online with
    # `probability` in each round, independently (seeded)
    kind: Literal["always", "bernoulli"] = "always"
    probability: float = Field(1.0, gt=0.0, le=1.0)


class StragglerConfig(Section):
    # virtual seconds a synchronous round waits; null = no deadline
    deadline: float | None = Field(None, gt=0.0)
    # wait_all: the paper's protocol; drop: updates finishing after the deadline are
    # dropped; over_select: select ceil(n * over_selection), keep the first n to finish
    policy: Literal["wait_all", "drop", "over_select"] = "wait_all"
    over_selection: float = Field(1.3, ge=1.0)


class AsyncConfig(Section):
    concurrency: int = Field(10, ge=1)  # clients in flight
    aggregation: Literal["fedasync", "fedbuff"] = "fedasync"
    mixing: float = Field(0.6, gt=0.0, le=1.0)  # FedAsync alpha
    buffer_size: int = Field(5, ge=1)  # FedBuff: apply every B updates
    server_lr: float = Field(1.0, gt=0.0)  # FedBuff: step on the averaged buffered delta
    staleness_exponent: float = Field(0.5, ge=0.0)  # s(tau) = (1 + tau) ** -a


class CheckpointConfig(Section):
    every: int | None = Field(10, ge=1)  # rounds (server versions in async mode) between checkpoints; null = never


class ProtocolConfig(Section):
    mode: Literal["sync", "async"] = "sync"
    # sync: rounds; async: server versions (each applied update or buffer flush is one)
    rounds: int = Field(20, ge=1)
    # fraction of clients per round in (0, 1], or an integer count >= 1
    participation: float | int = 1.0
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    optimizer: OptimizerConfig = OptimizerConfig()
    # evaluate every client every N rounds (and always at the last round)
    eval_every: int = Field(1, ge=1)
    availability: AvailabilityConfig = AvailabilityConfig()
    system: SystemConfig = SystemConfig()
    stragglers: StragglerConfig = StragglerConfig()
    asynchronous: AsyncConfig = AsyncConfig()

    @field_validator("participation")
    @classmethod
    def _participation_range(cls, value: float | int) -> float | int:
        if isinstance(value, bool):
            raise ValueError("must be a fraction in (0, 1] or a client count >= 1")
        if isinstance(value, float) and not 0.0 < value <= 1.0:
            raise ValueError("not a fraction in (0, 1]; use a fraction such as 0.5 or an integer count of clients")
        if isinstance(value, int) and value < 1:
            raise ValueError("use a count of clients >= 1 or a fraction in (0, 1]")
        return value


class RuntimeConfig(Section):
    # ray = client host actors and a server actor; local = everything in this process
    # (no Ray start-up, one process); auto = local on a machine of <= 4 CPUs with no
    # cluster, GPU shares or clients_per_actor asked for, else ray (runtime/backends.py)
    backend: Literal["auto", "ray", "local"] = "auto"
    # null = start a local Ray instance; "auto" or "ray://host:port" = join a cluster
    address: str | None = None
    # "auto" packs clients onto as many host actors as the CPUs allow
    clients_per_actor: int | Literal["auto"] = "auto"
    # upper bound on client host actors (null = as many as resources allow)
    max_actors: int | None = Field(None, ge=1)
    num_cpus_per_actor: float = Field(1.0, gt=0.0)
    num_gpus_per_actor: float = Field(0.0, ge=0.0)
    # CPUs given to a local Ray instance (null = all cores)
    num_cpus: int | None = Field(None, ge=1)
    # a client host actor that dies is replaced, at most this many times per run (its
    # clients' states come from the server, so results do not change)
    max_restarts: int = Field(3, ge=0)
    include_dashboard: bool = False
    dashboard_host: str = "127.0.0.1"

    @field_validator("clients_per_actor")
    @classmethod
    def _positive_packing(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("use an integer >= 1 or 'auto'")
        return value


class OutputConfig(Section):
    dir: str = "runs"
    # HDC-FL: save the server cache (heads, encoders, sample counts, global encoder) at
    # every refresh round to RUN_DIR/refresh_cache/, so `hdcfl-ray ablate` can replay
    # other server-side settings without retraining. Costs K encoders per refresh on disk.
    save_refresh_cache: bool = False


class Scenario(Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    seed: int = 42
    dataset: DatasetConfig = DatasetConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig
    protocol: ProtocolConfig = ProtocolConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    output: OutputConfig = OutputConfig()

    @model_validator(mode="after")
    def _cross_section_checks(self) -> "Scenario":
        participation = self.protocol.participation
        if isinstance(participation, int) and participation > self.partition.num_clients:
            raise ValueError(
                f"protocol.participation: {participation} clients per round is more than "
                f"partition.num_clients = {self.partition.num_clients}"
            )
        stragglers = self.protocol.stragglers
        if stragglers.policy == "drop" and stragglers.deadline is None:
            raise ValueError(
                "protocol.stragglers.policy: 'drop' needs protocol.stragglers.deadline (virtual seconds per round)"
            )
        if self.algorithm.name == "hdcfl":
            activation = self.algorithm.hdcfl.activation_round
            if activation is not None and activation > self.protocol.rounds:
                raise ValueError(
                    f"algorithm.hdcfl.activation_round: {activation} is after the last round "
                    f"(protocol.rounds = {self.protocol.rounds}); choose 1..{self.protocol.rounds}"
                )
        return self

    def clients_per_round(self) -> int:
        """Clients a synchronous round wants to train (before availability and stragglers)."""
        participation = self.protocol.participation
        if isinstance(participation, int):
            return participation
        return max(1, round(participation * self.partition.num_clients))
