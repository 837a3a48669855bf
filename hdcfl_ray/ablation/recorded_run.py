"""A finished run's scenario as the commands that rebuild its method from the run
folder (`ablate`, `diagnose donor-swap`) need it.

The folder's scenario.yaml is the scenario as written, `auto` kept (reports and
reruns compare it); a method cannot be built with a knob at `auto`. So each knob
still `auto` takes the value the run recorded choosing (manifest.json's
`auto_knobs`, hdcfl_ray/auto_knobs/record.py), and a value given on the command
line wins over the recorded one. A resume reads the same record (runtime/driver.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hdcfl_ray.algorithms.registry import method_spec
from hdcfl_ray.auto_knobs.plan import with_values
from hdcfl_ray.auto_knobs.record import find_recorded_choice
from hdcfl_ray.config.loading import load_scenario
from hdcfl_ray.config.schema import Scenario, method_params
from hdcfl_ray.contract import AUTO
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.logs.manifest import read_manifest


def written_scenario(run_dir: Path, command: str, overrides: Sequence[str] = ()) -> Scenario:
    """The run folder's scenario.yaml with `overrides` applied, `auto` kept."""
    return load_scenario(scenario_file(run_dir, command), list(overrides))


def scenario_file(run_dir: Path, command: str) -> Path:
    """RUN_DIR/scenario.yaml; a folder that is not a run's is bad input (ScenarioError) naming it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ScenarioError(f"{command} {run_dir}: no such folder; pass the folder of a finished run (the --out of hdcfl-ray simulate)")
    path = run_dir / "scenario.yaml"
    if not path.is_file():
        raise ScenarioError(f"{command} {run_dir}: not a run directory (no scenario.yaml); pass the folder of a finished run")
    return path


def with_recorded_choices(scenario: Scenario, run_dir: Path, command: str, fix: str) -> Scenario:
    """`scenario` (the run's, with any overrides) with each knob of its method still `auto`
    at the value the run recorded choosing: a knob it gives a value (the run's own, or an
    override) keeps it. `command` names the command in errors; `fix` says what to do when
    the run recorded no value (`{set_options}` in it becomes `--set KEY=VALUE` for each
    such knob)."""
    unchosen = unchosen_knobs(scenario)
    if not unchosen:
        return scenario  # the manifest is not read: a run without auto knobs needs none
    method = scenario.algorithm.name
    keys = [f"algorithm.{method}.{field}" for field in unchosen]
    named = ", ".join(keys)
    what_to_do = fix.format(set_options=" ".join(f"--set {key}=VALUE" for key in keys))
    # the manifest is read only here, so its fix speaks of what it is read for
    manifest = read_manifest(run_dir, fix=f"{command} reads the values the run chose for {named} from it; {what_to_do}")
    record = find_recorded_choice(method, set(unchosen), [manifest])
    if record is None:
        where = "the run has no manifest.json" if manifest is None else "its manifest.json records no value the run chose"
        verb = "is" if len(keys) == 1 else "are"
        raise ScenarioError(f"{command} {run_dir}: {named} {verb} auto in the run's scenario.yaml, and {where}; {what_to_do}")
    chosen = record.choices()
    return with_values(scenario, {field: chosen[field] for field in unchosen})


def unchosen_knobs(scenario: Scenario) -> list[str]:
    """The fields of the running method's section that are `auto` in `scenario`."""
    params = method_params(scenario.algorithm)
    return [knob.key for knob in method_spec(scenario.algorithm.name).auto_knobs if getattr(params, knob.key) == AUTO]
