"""The hooks a method implements and the declaration that makes it one.

A method is one object with server hooks (numpy only, run in the server actor)
and client hooks (torch, run in client host actors). The runtime owns all Ray
plumbing and calls the hooks in this order each round:

    server: select -> probe_task? -> broadcast -> training_task per client
    client: probe (all clients with a probe task) ; local_update (selected)
    server: absorb_probes ; aggregate (returns RoundNotes)
    at evaluation rounds: evaluation_task per client -> client: evaluate

Server state and per-client state are plain objects owned by the method; the
runtime stores them and passes them back, never looks inside.

Under client-level differential privacy (`RunInfo.privacy`, a method whose MethodSpec
declares a `privacy` rule; docs/privacy.md) `aggregate` clips each upload, adds the
noise to the sum itself and reports what it released in `RoundNotes.releases`. A round
may then train no client at all (Poisson sampling draws each client independently):
`aggregate` is called with an empty list of uploads all the same, and releases its
noise (the accountant counts that release as any other).

A module under hdcfl_ray/algorithms/ becomes a method by declaring, at module
level, `METHOD = MethodSpec(...)`: its name, its parameters (a Section whose
fields carry descriptions; they become the scenario's `algorithm.<name>` keys),
how to build it, and whether it runs in `protocol.mode: async`. Nothing else
needs an edit (docs/adding-a-method.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar

import numpy as np

from hdcfl_ray.contract.context import ClientContext
from hdcfl_ray.contract.optimizer import OptimizerConfig
from hdcfl_ray.contract.privacy import PrivacyRule, ResolvedPrivacy
from hdcfl_ray.contract.section import Section
from hdcfl_ray.contract.server_optimizer import ServerOptimizerConfig
from hdcfl_ray.contract.values import ClientTask, EvalResult, ModelParams, RoundNotes, Upload


class Method(Protocol):
    name: str

    # ---- server side (numpy only) ----
    # independent seeded initialisations a method asks for (cluster models, FedSoft centres)
    independent_inits: int

    def init_server(self, initial: ModelParams, independent: list[ModelParams], num_clients: int) -> Any: ...

    # `sampled`: the runtime's seeded draw among `online` (the clients available this round)
    def select(self, state: Any, round_index: int, sampled: list[int], online: list[int]) -> list[int]: ...

    def probe_task(self, state: Any, round_index: int, client_id: int) -> ClientTask | None: ...

    def absorb_probes(self, state: Any, round_index: int, results: Mapping[int, Mapping[str, Any]]) -> RoundNotes: ...

    def broadcast(self, state: Any, round_index: int) -> dict[str, Any]: ...

    def training_task(self, state: Any, round_index: int, client_id: int) -> ClientTask: ...

    def aggregate(self, state: Any, round_index: int, uploads: list[Upload]) -> RoundNotes: ...

    def evaluation_task(self, state: Any, round_index: int, client_id: int, final: bool) -> ClientTask: ...

    # ---- client side (torch, inside a client host) ----
    def init_client(self, client_id: int, initial: ModelParams) -> Any: ...

    def probe(self, ctx: ClientContext, state: Any, task: ClientTask, objects: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def local_update(self, ctx: ClientContext, state: Any, task: ClientTask, objects: Mapping[str, Any]) -> tuple[Upload, Any]: ...

    def evaluate(self, ctx: ClientContext, state: Any, task: ClientTask, objects: Mapping[str, Any], final: bool) -> EvalResult: ...


HookT = TypeVar("HookT", bound=Callable[..., Any])


def never_probes(hook: HookT) -> HookT:
    """Marks a `probe_task` that returns None for every client: the server then does
    not ask it about each of the K clients every round."""
    hook.never_probes = True  # type: ignore[attr-defined]
    return hook


def asks_for_probes(method: Method) -> bool:
    """Whether a method's `probe_task` may return a task (it is not marked `never_probes`)."""
    return not getattr(method.probe_task, "never_probes", False)


class AsyncHooks(Protocol):
    """What a method declared `asynchronous=True` adds: the runtime mixes one update
    (FedAsync) or a buffer of updates (FedBuff) into one shared vector."""

    def async_shared(self, state: Any) -> np.ndarray: ...

    def async_set_shared(self, state: Any, vector: np.ndarray) -> None: ...

    def async_upload_vector(self, upload: Upload) -> np.ndarray: ...

    def async_record(self, state: Any, version: int, upload: Upload) -> None: ...

    def async_after_apply(self, state: Any, version: int) -> RoundNotes: ...


ASYNC_HOOKS = ("async_shared", "async_set_shared", "async_upload_vector", "async_record", "async_after_apply")


class ExportHooks(Protocol):
    """Optional hooks a method may add; the runtime calls them only when present.

    `export_cache(state)`: plain arrays (numpy, no objects) of the server state after
    a round's aggregation, written to RUN_DIR/refresh_cache/ at each round whose
    RoundNotes carry a grouping summary when output.save_refresh_cache is on.
    A method's per-refresh summary row is the `RoundNotes.refresh` it returns, and
    its scores per reference model are `EvalResult.references`."""

    def export_cache(self, state: Any) -> Mapping[str, np.ndarray] | None: ...


@dataclass(frozen=True)
class RunInfo:
    """What a method may know about the run when it is built."""

    seed: int
    rounds: int
    # the step a synchronous round's aggregate takes on each shared model (the default:
    # the clients' mean itself); a method applies it with maths.server_optimizer.server_step
    server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig()
    # the clients' optimiser (protocol.optimizer): a method whose rule depends on it (a
    # local step count, SGD only) refuses another one when it is built
    client_optimizer: OptimizerConfig = OptimizerConfig()
    # the clients that never train (partition.newcomers), in id order: a method that keeps or
    # averages something over every client leaves them out (FedSoft's centres, SCAFFOLD's N)
    newcomers: tuple[int, ...] = ()
    # client-level differential privacy as the run resolved it (the scenario's privacy section:
    # z, C, q, ...); None = no privacy. Only a method whose MethodSpec declares `privacy` gets one
    privacy: ResolvedPrivacy | None = None


class NoParams(Section):
    """A method without settings of its own."""


ParamsT = TypeVar("ParamsT", bound=Section)

# The value of a knob that a run chooses for itself before it starts (AutoKnob).
AUTO = "auto"
AutoValue = float | int


@dataclass(frozen=True)
class AutoKnob(Generic[ParamsT]):
    """A data-dependent knob of a method that a run may choose for itself: when the
    method's section says `<key>: auto`, the run first trains a shortened run per
    value of `grid` on images each client holds out of its training data, keeps the
    value with the highest mean accuracy on them and runs with it
    (docs/calibration.md, "auto"). The section's field accepts the value `auto`."""

    key: str  # the field of the method's params section, e.g. "threshold"
    # the candidates, smallest first (a tie goes to the first); a function of the
    # section when its other keys change them (a unit)
    grid: tuple[AutoValue, ...] | Callable[[ParamsT], tuple[AutoValue, ...]]
    # the value the knob takes while another of the method's auto knobs is chosen before
    # it (needed by every knob but the first)
    placeholder: AutoValue | None = None
    # the value counts full models (clusters, centres): values above partition.num_clients
    # are skipped, more models than clients
    counts_models: bool = False
    # One step beyond the grid's edge, where a choice at that edge extends the grid:
    # (section, the edge value, "high" or "low", the clients) -> the value beyond it, or
    # None where going further means nothing (the choice is then marked at the edge).
    beyond: Callable[[ParamsT, AutoValue, str, int], AutoValue | None] | None = None
    # The values change nothing a client trains, only what the server makes of one run's
    # saved state (HDC-FL's groups at its refreshes): one candidate trains, the others
    # are scored on replays of its saved refreshes (hdcfl-ray ablate's replay).
    server_side: bool = False
    # Which values give the same run: (section, the method's server state after round 1's
    # probes, value) -> a key; values with one key run once (PACFL's thresholds that cut
    # the clients' subspaces into the same clusters).
    same_run_key: Callable[[ParamsT, Any, AutoValue], Any] | None = None

    def candidates(self, params: ParamsT) -> tuple[AutoValue, ...]:
        return tuple(self.grid(params) if callable(self.grid) else self.grid)


def tenfold(params: Any, edge: AutoValue, side: str, num_clients: int) -> AutoValue | None:
    """`beyond` for a strength on a log grid (a proximal weight): ten times the largest,
    a tenth of the smallest."""
    return float(edge) * 10.0 if side == "high" else float(edge) / 10.0


def doubled_count(params: Any, edge: AutoValue, side: str, num_clients: int) -> AutoValue | None:
    """`beyond` for a count of models (clusters, centres, groups): twice the grid's
    largest, up to one per client; nothing below the smallest."""
    if side != "high" or edge >= num_clients:
        return None
    return int(min(num_clients, 2 * edge))


@dataclass(frozen=True)
class MethodSpec(Generic[ParamsT]):
    """A method's declaration (module level `METHOD = MethodSpec(...)`)."""

    name: str  # the scenario's `algorithm.name`, and the name of its `algorithm.<name>` section
    summary: str  # one line for listings and the generated scenario reference
    build: Callable[[ParamsT, RunInfo], Method]
    params: type[ParamsT] = NoParams  # type: ignore[assignment]
    asynchronous: bool = False  # runs in protocol.mode: async (the method implements AsyncHooks)
    # what is wrong with the parameters for this run ("key: why", the key inside the method's
    # section, or a whole `protocol.` key), or None; checked when the scenario loads
    check: Callable[[ParamsT, RunInfo], str | None] | None = None
    # the parameter that counts the full models the method keeps besides the shared one
    # (cluster models, centres): the memory check counts them before the method is built
    extra_models: str | None = None
    # the knobs whose value `auto` the run chooses itself, in the order they are chosen
    # (each with the ones before it at their chosen values, the ones after at their placeholder)
    auto_knobs: tuple[AutoKnob[ParamsT], ...] = ()
    # the section of a shortened run of `rounds` rounds (an auto knob's candidate): a method
    # whose schedule counts rounds (a first refresh round) keeps it inside them
    shortened: Callable[[ParamsT, int], ParamsT] | None = None
    # the method steps its shared models with RunInfo.server_optimizer (maths.server_optimizer):
    # a scenario that sets any optimiser but the default for a method that does not (one that
    # shares nothing, or a plugin written without it) is refused, never silently ignored
    applies_server_optimizer: bool = False
    # what a newcomer (a client that never trained: partition.newcomers) is placed and scored
    # with, one line; a method that declares it implements contract.newcomers.NewcomerHooks.
    # None: the method has no newcomer rule, and its newcomers' rows say so
    newcomer_rule: str | None = None
    # why the method has no privacy rule (MethodSpec.privacy is None), one line: what the
    # refusal of a `privacy:` section says besides naming the methods that accept one
    no_privacy_reason: str = ""
    # what the method sends under client-level differential privacy (the scenario's privacy
    # section; RunInfo.privacy) and the releases it plans; None: it refuses a privacy section
    privacy: PrivacyRule | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name) or self.name == "name":
            raise ValueError(f"method name {self.name!r}: use lower-case letters, digits and _ (it is a YAML key)")
        if not (isinstance(self.params, type) and issubclass(self.params, Section)):
            raise TypeError(f"method {self.name!r}: params must be a Section subclass, got {self.params!r}")
        keys = [knob.key for knob in self.auto_knobs]
        unknown = [key for key in keys if key not in self.params.model_fields]
        if unknown or len(set(keys)) != len(keys):
            raise ValueError(f"method {self.name!r}: auto_knobs {keys} must name distinct fields of {self.params.__name__}")
        if any(knob.placeholder is None for knob in self.auto_knobs[1:]):
            raise ValueError(f"method {self.name!r}: every auto knob after the first needs a placeholder")
