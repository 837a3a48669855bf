"""What a run says about batched training (`runtime.batched_training`): the manifest's
`batching` and the notice printed at start.

Whether a round's clients on a host can train as one batched model is decided partly by
the scenario, which preflight reads (the optimiser, the precision, the protocol's mode),
and partly by how the method calls `ctx.train` (its own training loop, a regulariser
other than a proximal pull, an optimiser of its own), which shows only while it runs. So
the record is written twice: at start, `batched` and, when it is false, the `reason`;
after the run, `observed_max_trained_together` (the largest `trained_together` in
updates.parquet), with `batched` false and a reason when no update trained with
another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hdcfl_ray.config.runtime_resolved import trains_batched
from hdcfl_ray.config.schema import Scenario


def scenario_obstacle(scenario: Scenario) -> str | None:
    """Why a run with batched training on still trains one client at a time, as far as
    the scenario says (None: nothing in it stops batching)."""
    protocol, runtime = scenario.protocol, scenario.runtime
    if protocol.mode == "async":
        return "protocol.mode: async trains each update on its own (batched training runs synchronous rounds only)"
    if protocol.optimizer.name != "sgd":
        return f"protocol.optimizer.name: {protocol.optimizer.name} trains one client at a time (batched training runs SGD only)"
    if runtime.precision == "fp16":
        return "runtime.precision: fp16 trains one client at a time (batched training runs float32 and bfloat16 only)"
    return None


def batching_at_start(scenario: Scenario) -> dict[str, Any]:
    """The manifest's `batching` when the run starts."""
    if not trains_batched(scenario.runtime):
        setting = scenario.runtime.batched_training
        why = "it is on for CUDA hosts only, and this run gives its hosts no GPU" if setting == "auto" else "it is off"
        return {"batched": False, "reason": f"runtime.batched_training: {str(setting).lower()}: {why}"}
    obstacle = scenario_obstacle(scenario)
    return {"batched": obstacle is None, "reason": obstacle}


def batching_notices(scenario: Scenario) -> list[str]:
    """The notice a run prints at start when batched training is on but cannot batch."""
    obstacle = scenario_obstacle(scenario) if trains_batched(scenario.runtime) else None
    return [] if obstacle is None else [f"runtime.batched_training is on, but {obstacle}"]


def batching_after_run(at_start: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """`at_start` with what the updates table shows: the largest group any update trained
    in and, when batching was expected but no update trained with another, why."""
    import pyarrow.parquet as pq

    from hdcfl_ray.logs.schemas import TABLE_SCHEMAS

    directory = run_dir / "updates.parquet"
    if not directory.exists():
        return at_start
    columns = pq.read_table(directory, schema=TABLE_SCHEMAS["updates"], columns=["round", "host", "trained_together"]).to_pydict()
    # (round, host, group size) of every update that ran
    updates = [row for row in zip(columns["round"], columns["host"], columns["trained_together"]) if row[2] is not None]
    if not updates:
        return at_start
    largest = max(size for _, _, size in updates)
    record = {**at_start, "observed_max_trained_together": largest}
    if at_start["batched"] and largest == 1:
        shared = len({(round_index, host) for round_index, host, _ in updates}) < len(updates)
        record["batched"] = False
        record["reason"] = (
            "no update trained with another: the method trains with its own loop or settings batched training "
            "does not run (another optimiser, a regulariser other than a proximal pull)"
            if shared
            else "no update trained with another: no host ran two clients' updates in one round"
        )
    return record
