"""Input that cannot explode: YAML bombs, self-references, deep nesting, duplicate
keys, huge values echoed in messages, over-long names and paths, bad sweep seeds.
Each exits 2 naming what is wrong, quickly and in little memory."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.safe_yaml import MAX_DEPTH, YAMLLimitError, load_yaml
from tests.conftest import tiny_scenario

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def alias_bomb(levels: int = 9, fan_out: int = 10) -> str:
    """Nine levels of anchors, ten aliases each, under an unused key: 10^9 values once expanded."""
    lines = [yaml.safe_dump(tiny_scenario(), sort_keys=False).rstrip(), "unused:", '  l0: &l0 "lol lol lol"']
    for level in range(1, levels + 1):
        lines.append(f"  l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * fan_out)}]")
    return "\n".join(lines) + "\n"


def test_the_alias_bomb_is_refused_without_expanding_it():
    text = alias_bomb()
    assert len(text.encode()) < 2048
    with pytest.raises(YAMLLimitError, match="aliases"):
        load_yaml(text)


def test_a_few_aliases_still_load():
    assert load_yaml("a: &x {lr: 0.1}\nb: *x\nc:\n  <<: *x\n  lr: 0.2\n") == {"a": {"lr": 0.1}, "b": {"lr": 0.1}, "c": {"lr": 0.2}}


@pytest.mark.parametrize("text", ["a: &x [1, *x]\n", "a: &x {b: *x}\n", "&x [[[*x]]]\n"])
def test_a_self_referencing_alias_is_refused_naming_the_line(text):
    with pytest.raises(YAMLLimitError, match="line 1: the alias \\*x refers to the node that contains it"):
        load_yaml(text)


def test_nesting_through_a_chain_of_aliases_is_measured_too():
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 200)]
    with pytest.raises(YAMLLimitError, match="nested more than"):
        load_yaml("\n".join(lines))


def test_deep_nesting_is_refused_before_the_recursion_limit():
    with pytest.raises(YAMLLimitError, match=f"nested more than {MAX_DEPTH}"):
        load_yaml("[" * 5000 + "]" * 5000)


def test_duplicate_keys_are_refused_naming_the_key_and_both_lines():
    with pytest.raises(YAMLLimitError, match="line 3: duplicate key 'protocol' \\(first at line 2\\)"):
        load_yaml("name: x\nprotocol: {rounds: 2, batch_size: 8}\nprotocol: {rounds: 3}\n")


def test_duplicate_keys_inside_a_section_are_refused_too():
    with pytest.raises(YAMLLimitError, match="duplicate key 'rounds'"):
        load_yaml("protocol:\n  rounds: 2\n  rounds: 3\n")


def _cases(tmp_path: Path) -> dict[str, list[str]]:
    base = yaml.safe_dump(tiny_scenario(), sort_keys=False)
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    (tmp_path / "self.yaml").write_text(base + "unused: &me [1, *me]\n")
    (tmp_path / "dup.yaml").write_text(base + "protocol: {rounds: 3}\n")
    (tmp_path / "ok.yaml").write_text(base)
    deep = "[" * 1000 + "]" * 1000
    return {
        "alias bomb": ["validate", str(tmp_path / "bomb.yaml")],
        "self-referencing alias": ["validate", str(tmp_path / "self.yaml")],
        "duplicate keys": ["validate", str(tmp_path / "dup.yaml")],
        "1000-deep --set": ["validate", str(tmp_path / "ok.yaml"), "--set", f"protocol.rounds={deep}"],
        "1000-part --set key": ["validate", str(tmp_path / "ok.yaml"), "--set", ".".join(["a"] * 1000) + "=1"],
    }


CASE_FRAGMENTS = {
    "alias bomb": "aliases",
    "self-referencing alias": "line ",
    "duplicate keys": "duplicate key 'protocol'",
    "1000-deep --set": "nested more than",
    "1000-part --set key": "not a dotted key path",
}


WATCHDOG_S, WATCHDOG_MB = 60.0, 2000  # far past the limits: a bomb that goes off is stopped there
# per case, the command's CPU seconds: starting Python and torch takes 2-4, a bomb minutes
CPU_SECONDS = 10.0


def _read_within_limits(process: subprocess.Popen, started: float) -> tuple[str, float]:
    """The command's output and its peak resident memory in MB; a command still running
    after WATCHDOG_S or holding more than WATCHDOG_MB (an expanding bomb: unbounded time
    and memory) is killed and the test fails, instead of taking the machine's memory with it.

    The peak is the kernel's high-water mark of the command's own memory (VmHWM), read
    while it runs: wait4's ru_maxrss would also count the pages of the forking test
    process before exec (over a gigabyte in a full suite that has loaded torch and Ray)."""
    chunks: list[bytes] = []
    peak_mb = 0.0
    reader = threading.Thread(target=lambda: chunks.append(process.stdout.read()), daemon=True)
    reader.start()
    while reader.is_alive():  # until the command closes its output (poll() would reap it before wait4)
        try:
            with open(f"/proc/{process.pid}/status") as handle:
                fields = {line.split(":")[0]: line.split()[1] for line in handle if line.startswith(("VmRSS:", "VmHWM:"))}
            rss_mb = int(fields.get("VmRSS", 0)) // 1024
            peak_mb = max(peak_mb, int(fields.get("VmHWM", 0)) / 1024)
        except OSError:
            rss_mb = 0
        over = time.monotonic() - started > WATCHDOG_S or rss_mb > WATCHDOG_MB
        if over:
            process.kill()
            process.wait()
            pytest.fail(f"still running after {time.monotonic() - started:.0f} s holding {rss_mb} MB: killed")
        reader.join(0.05)
    reader.join()
    return b"".join(chunks).decode(), peak_mb


@pytest.mark.parametrize("case", list(CASE_FRAGMENTS))
def test_each_bomb_exits_2_within_10_cpu_seconds_and_500_mb(tmp_path, case):
    """In a process of its own, so time and peak memory are the command's alone."""
    args = _cases(tmp_path)[case]
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; from cli import main; sys.argv[0] = 'hdcfl-ray'; main()", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "4000"},
    )
    output, peak_mb = _read_within_limits(process, started)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    # the command's own CPU time, which a busy machine does not stretch as it stretches
    # wall time (the watchdog above still kills a run that hangs)
    cpu_seconds = usage.ru_utime + usage.ru_stime
    assert process.returncode == 2, output
    assert "Traceback" not in output and CASE_FRAGMENTS[case] in output, output
    assert cpu_seconds < CPU_SECONDS, f"{case}: {cpu_seconds:.1f} CPU s"
    assert peak_mb < 500, f"{case}: {peak_mb:.0f} MB"


def test_a_huge_value_is_not_echoed_whole(write_scenario):
    path = write_scenario(tiny_scenario())
    huge = "x" * 2_000_000
    result = runner.invoke(app, ["validate", str(path), "--set", f"protocol.rounds={huge}"])
    assert result.exit_code == 2 and "protocol.rounds" in result.output
    assert len(result.output) < 5000 and "2000000 characters" in result.output


def test_a_huge_value_in_an_unknown_key_is_not_echoed_whole(write_scenario):
    path = write_scenario({**tiny_scenario(), "x" * 100_000: 1})
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "unknown key" in result.output and len(result.output) < 5000


def test_a_300_character_name_exits_2_in_validate(write_scenario):
    path = write_scenario(tiny_scenario(name="n" * 300))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "name: 300 characters" in result.output and "at most 100" in result.output


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("output.dir", "runs/" + "d" * 300, "a name is at most 255"),
        ("dataset.path", "/data/" + "p" * 5000, "a path is at most 4096"),
        ("model.pretrained", "w\x00.pt", "NUL byte"),
    ],
)
def test_path_forming_values_are_length_checked(write_scenario, key, value, said):
    section, name = key.split(".")
    path = write_scenario(tiny_scenario(**{section: {name: value}}))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert key in result.output and said in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "seeds, said",
    [("[a]", "'a' is not an integer seed"), ("[1.7]", "1.7 is not an integer seed"), ("[1, 1]", "seed 1 is listed twice"), ("[-3]", "outside")],
)
def test_sweep_file_seeds_are_checked(write_scenario, tmp_path, seeds, said):
    scenario = write_scenario(tiny_scenario())
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"scenarios: [{scenario.name}]\nseeds: {seeds}\nout: sw\n")
    result = runner.invoke(app, ["sweep", str(sweep_file)])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("seeds, said", [("1,1", "seed 1 is listed twice"), ("1,x", "'x' is not an integer seed"), ("2.5", "'2.5' is not")])
def test_seeds_options_are_checked(write_scenario, tmp_path, seeds, said):
    scenario = write_scenario(tiny_scenario())
    result = runner.invoke(app, ["sweep", str(scenario), "--seeds", seeds, "--out", str(tmp_path / "sw")])
    assert result.exit_code == 2 and said in result.output, result.output
    result = runner.invoke(
        app, ["calibrate", str(scenario), "--key", "protocol.optimizer.lr", "--values", "0.1", "--seeds", seeds, "--out", str(tmp_path / "c")]
    )
    assert result.exit_code == 2 and said in result.output, result.output


# --- every command's bad input exits 2 without a traceback ---------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.runtime.driver import prepare_run, run_simulation
    from hdcfl_ray.terminal.live_view import QuietObserver

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_simulation(prepare_run(build_scenario(tiny_scenario(protocol={"rounds": 2}, runtime={"backend": "local"}))), run_dir, QuietObserver())
    return run_dir


def _copy_run(finished_run, tmp_path):
    import shutil

    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run"


def test_report_on_a_truncated_part_exits_2_naming_it(finished_run, tmp_path):
    run_dir = _copy_run(finished_run, tmp_path)
    part = run_dir / "clients.parquet" / "part-000002.parquet"
    part.write_bytes(part.read_bytes()[:100])
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 2, result.output
    assert str(part) in result.output and "--resume" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("option, target", [("--out", "/proc/hdcfl-report.md"), ("--figures", "FILE")])
def test_report_to_a_place_it_cannot_write_exits_2_before_computing(finished_run, tmp_path, option, target):
    if target == "FILE":
        target = str(tmp_path / "a-file")
        Path(target).write_text("x")
    result = runner.invoke(app, ["report", str(finished_run), "--format", "md", option, target])
    assert result.exit_code == 2, result.output
    assert option in result.output and "Traceback" not in result.output


def test_pretrain_to_a_place_it_cannot_write_exits_2_before_training(write_scenario, monkeypatch):
    import hdcfl_ray.pretraining as pretraining

    def must_not_train(*args, **kwargs):
        raise AssertionError("trained before checking --out")

    monkeypatch.setattr(pretraining, "pretrain", must_not_train)
    path = write_scenario(tiny_scenario(dataset={"name": "digits", "pretrain_pool": 0.2}))
    result = runner.invoke(app, ["pretrain", str(path), "--out", "/proc/hdcfl-weights.pt", "--epochs", "1"])
    assert result.exit_code == 2, result.output
    assert "--out /proc/hdcfl-weights.pt: cannot write" in result.output


def test_sweep_report_to_a_place_it_cannot_write_exits_2_before_running(write_scenario, tmp_path):
    path = write_scenario(tiny_scenario())
    result = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "sw"), "--report", "/proc/hdcfl-sweep.md"])
    assert result.exit_code == 2 and "--report" in result.output, result.output
    assert not (tmp_path / "sw").exists()
