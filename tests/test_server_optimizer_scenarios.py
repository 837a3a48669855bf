"""protocol.server_optimizer in a scenario: bad input stops `validate` and `simulate` with
exit 2 naming the key and the fix; a run with adam resumes from its checkpoint to the
bits of the uninterrupted run (the moments are saved with the server state); and a
report keeps runs with and without adam apart, as two settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.checkpoint.store import read_checkpoint
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.maths.server_optimizer import Moments
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.cli_exit import assert_refused
from tests.conftest import slow_beyond, tiny_scenario
from tests.stop_observer import resume_after_a_stop

runner = CliRunner()
ADAM = {"name": "adam", "lr": 0.01}
FEDBUFF = {"mode": "async", "asynchronous": {"concurrency": 3, "aggregation": "fedbuff", "buffer_size": 2}}


@pytest.mark.parametrize(
    ("optimizer", "sections", "expected"),
    [
        ({"name": "adma"}, {}, ["protocol.server_optimizer.name", "'adma'", "did you mean 'adam'?", "'yogi'", "'adagrad'"]),
        ({"name": "adam", "lr": 0}, {}, ["protocol.server_optimizer.lr", "greater than 0"]),
        ({"name": "adam", "lr": -0.1}, {}, ["protocol.server_optimizer.lr", "greater than 0"]),
        ({"name": "yogi", "tau": 0}, {}, ["protocol.server_optimizer.tau", "greater than 0"]),
        ({"name": "adam", "beta1": 1.0}, {}, ["protocol.server_optimizer.beta1", "less than 1"]),
        ({"name": "adam", "beta2": -0.5}, {}, ["protocol.server_optimizer.beta2", "greater than or equal to 0"]),
        ({"name": "yogi", "beta2": 1.5}, {}, ["protocol.server_optimizer.beta2", "less than 1"]),
        ({"name": "avgm", "momentum": 1.0}, {}, ["protocol.server_optimizer.momentum", "less than 1"]),
        ({"name": "avgm", "momentum": -0.1}, {}, ["protocol.server_optimizer.momentum", "greater than or equal to 0"]),
        ({"nmae": "adam"}, {}, ["protocol.server_optimizer.nmae", "unknown key", "did you mean 'name'?"]),
        (ADAM, {"algorithm": {"name": "local"}}, ["protocol.server_optimizer.name: adam", "algorithm.name: local", "shares no model", "remove protocol.server_optimizer"]),
        ({"name": "avgm", "momentum": 0.9}, {"algorithm": {"name": "local"}}, ["algorithm.name: local", "remove protocol.server_optimizer"]),
        (ADAM, {"protocol": {"mode": "async"}, "algorithm": {"name": "fedavg"}}, ["protocol.asynchronous.aggregation: fedasync", "set protocol.asynchronous.aggregation: fedbuff"]),
        (ADAM, {"protocol": {**FEDBUFF, "asynchronous": {"aggregation": "fedbuff", "server_lr": 0.5}}, "algorithm": {"name": "fedavg"}},
         ["protocol.asynchronous.server_lr: 0.5", "set protocol.server_optimizer.lr instead"]),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["validate", "simulate"])
def test_bad_server_optimizer_exits_2_naming_the_key_and_the_fix(write_scenario, tmp_path, command, optimizer, sections, expected) -> None:
    others = {key: value for key, value in sections.items() if key != "protocol"}
    path = write_scenario(tiny_scenario(protocol={**sections.get("protocol", {}), "server_optimizer": optimizer}, **others))
    assert_refused(command, path, tmp_path, expected)


def test_the_default_under_another_name_is_fine_for_a_method_that_shares_nothing(write_scenario) -> None:
    path = write_scenario(tiny_scenario(algorithm={"name": "local"}, protocol={"server_optimizer": {"name": "avgm", "momentum": 0.0}}))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def scenario_with(protocol: dict[str, Any], method: str = "fedavg", seed: int = 7, backend: str = "local"):
    return build_scenario(
        tiny_scenario(
            seed=seed,
            algorithm={"name": method},
            protocol={"rounds": 4, "participation": 0.5, **protocol},
            runtime={"backend": "local", "num_cpus": 1} if backend == "local" else {"backend": backend},
            checkpoint={"every": 2},
        )
    )


ADAM_RESUME_CASES = [
    ({"server_optimizer": ADAM}, "local"),
    ({**FEDBUFF, "server_optimizer": ADAM}, "local"),
    ({"server_optimizer": ADAM}, "ray"),
]


@pytest.mark.parametrize(
    ("protocol", "backend"),
    slow_beyond(ADAM_RESUME_CASES, fast=ADAM_RESUME_CASES[:2]),
    ids=["sync", "fedbuff", "sync-on-ray"],
)
def test_a_run_with_adam_resumes_to_the_bits_of_the_uninterrupted_run(
    tmp_path: Path, protocol: dict[str, Any], backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    scenario = scenario_with(protocol, backend=backend)
    def moments_checkpointed(stopped: Path) -> None:  # checkpoint at round 2
        server = read_checkpoint(stopped)["server"]
        moments = server["server_moments"] if "version" in server else server["state"].server_moments["global/encoder"]
        assert isinstance(moments, Moments) and moments.steps == 2 and moments.second is not None

    resume_after_a_stop(scenario, tmp_path, on_stopped=moments_checkpointed)


def test_a_resume_may_not_change_the_server_optimizer(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scenario.yaml").write_text(__import__("yaml").safe_dump(tiny_scenario()))
    result = runner.invoke(app, ["simulate", "--resume", str(run_dir), "--set", "protocol.server_optimizer.name=adam"])
    assert result.exit_code == 2, result.output
    assert "protocol.server_optimizer.name" in result.output


def test_a_report_keeps_runs_with_and_without_adam_apart(tmp_path: Path) -> None:
    folders = []
    for name, protocol in (("default", {}), ("adam", {"server_optimizer": ADAM})):
        scenario = build_scenario(
            tiny_scenario(algorithm={"name": "fedavg"}, protocol={"rounds": 1, **protocol}, runtime={"backend": "local"}, checkpoint={"every": None})
        )
        folders.append(tmp_path / name)
        run_simulation(prepare_run(scenario), folders[-1], QuietObserver())
    result = runner.invoke(app, ["report", *map(str, folders), "--format", "md"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("| Method |"))
    assert "protocol.server_optimizer.name=adam" in header and "protocol.server_optimizer.name=sgd" in header, header


def test_a_server_state_checkpointed_before_server_optimisers_resumes_with_no_moments() -> None:
    from hdcfl_ray.algorithms.fedavg import GlobalModelState
    from hdcfl_ray.checkpoint.codec import Decoder, Encoder
    from hdcfl_ray.contract import ModelParams

    encoder = Encoder()
    encoded = encoder.encode(GlobalModelState(ModelParams(np.arange(3, dtype=np.float32), np.ones(2, dtype=np.float32))))
    del encoded["fields"]["server_moments"]  # as a checkpoint written before the field existed
    decoded = Decoder(encoder.arrays).decode(encoded)
    assert decoded.server_moments == {} and np.array_equal(decoded.model.encoder, np.arange(3))
