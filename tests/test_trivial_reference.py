"""Every results table carries trivial reference rows: what predicting a majority class or
a character n-gram scores on exactly the samples the clients are scored on, recorded in
the manifest at the start of a run and shown (italic, never ranked) beside the methods;
a method that does not beat them is flagged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from analysis.final_metrics import RunMetrics, average_rank
from analysis.report_tables import all_tables, to_csv, to_latex, to_markdown, to_rich
from analysis.row_flags import row_flags
from hdcfl_ray.data.dataset import ImageDataset
from hdcfl_ray.data.partitions.client_data import ClientData, Partition
from hdcfl_ray.data.shifts import NO_SHIFT, Shift
from hdcfl_ray.diagnostics.char_ngram import fit_char_ngram, predict_next
from hdcfl_ray.diagnostics.trivial_reference import (
    MAJORITY_OWN,
    MAJORITY_POOLED,
    NGRAM_OWN,
    NGRAM_POOLED,
    ClientSamples,
    Splits,
    majority_class,
    reference_accuracies,
)
from hdcfl_ray.runtime.trivial_references import reference_record
from tests import report_runs

# ---- majority class on a hand-built partition ----

TRAIN_LABELS = np.array([0, 0, 0, 1, 2, 2, 1, 1, 2, 2, 2, 0])
TEST_LABELS = np.array([0, 1, 2, 2, 0, 2, 1, 1])


def client(client_id: int, train: list[int], test: list[int], from_train: bool = False, shift: Shift = NO_SHIFT) -> ClientData:
    return ClientData(client_id, np.array(train, dtype=np.int64), np.array(test, dtype=np.int64), shift, None, test_from_train=from_train)


def images(labels: np.ndarray) -> np.ndarray:
    return np.zeros((labels.shape[0], 2, 2, 1), dtype=np.uint8)


def dataset(text: bool = False, train: np.ndarray | None = None, test: np.ndarray | None = None) -> ImageDataset:
    return ImageDataset(
        name="hand", train_images=images(TRAIN_LABELS) if train is None else train, train_labels=TRAIN_LABELS,
        test_images=images(TEST_LABELS) if test is None else test, test_labels=TEST_LABELS, classes=("a", "b", "c"), text=text,
    )  # fmt: skip


def test_majority_class_breaks_ties_toward_the_smallest_class():
    assert majority_class(np.array([2, 1, 2, 1]), 3) == 1
    assert majority_class(np.array([], dtype=np.int64), 3) == 0


def test_majority_class_references_are_exact_on_a_hand_built_partition():
    # pooled training labels of the clients: 0 x3, 1 x3, 2 x5 (index 11, a 0, is no client's) -> class 2
    # client 0 trains on 0, 0, 0, 1 (own class 0), is scored on test 0, 1, 2, 3 (labels 0, 1, 2, 2)
    # client 1 trains on 2, 2, 1, 1 (tie 1 / 2 -> own class 1), is scored on test 4, 5, 6 (labels 0, 2, 1)
    # client 2 trains on 2, 2, 2 (own class 2), is scored on test 7 (label 1)
    partition = Partition((client(0, [0, 1, 2, 3], [0, 1, 2, 3]), client(1, [4, 5, 6, 7], [4, 5, 6]), client(2, [8, 9, 10], [7])))
    record = reference_record(dataset(), partition, (0, 1, 2))
    pooled, own = record["references"][MAJORITY_POOLED], record["references"][MAJORITY_OWN]
    assert pooled["client_accuracies"] == [0.5, round(1 / 3, 6), 0.0]
    assert pooled["predicted_class"] == 2 and pooled["predicted_class_name"] == "c"
    assert pooled["mean_accuracy"] == pytest.approx((0.5 + 1 / 3 + 0.0) / 3)
    assert pooled["worst_accuracy"] == 0.0 and pooled["bottom20_accuracy"] == 0.0  # ceil(3 / 5) = 1 client
    assert pooled["gap"] == pytest.approx(0.5)
    assert own["client_accuracies"] == [0.25, round(1 / 3, 6), 0.0]
    assert own["mean_accuracy"] == pytest.approx((0.25 + 1 / 3) / 3)
    assert record["scored_on"] == "test" and record["clients"] == 3 and "ngram_order" not in record
    assert set(record["references"]) == {MAJORITY_POOLED, MAJORITY_OWN}  # images: no n-gram


def test_a_validation_split_is_scored_on_the_training_labels_it_holds_out():
    # client 0 trains on 0, 1, 2 (labels 0, 0, 0) and is scored on training samples 3, 4 (labels 1, 2)
    partition = Partition((client(0, [0, 1, 2], [3, 4], from_train=True), client(1, [5, 6, 7, 8], [9, 10], from_train=True)))
    record = reference_record(dataset(), partition, (0, 1))
    # pooled labels 0, 0, 0, 2, 1, 1, 2 -> class 0: client 0 scores 0 of 2, client 1 (labels 2, 2) 0 of 2
    assert record["references"][MAJORITY_POOLED]["client_accuracies"] == [0.0, 0.0]
    # own classes: 0 for client 0; 1 for client 1 (2, 1, 1, 2: a tie) -> 0 of 2
    assert record["references"][MAJORITY_OWN]["client_accuracies"] == [0.0, 0.0]
    assert record["scored_on"] == "validation"


def test_whole_split_scoring_and_a_sampled_evaluation_score_what_the_clients_are_scored_on():
    whole = list(range(TEST_LABELS.shape[0]))  # test labels 0, 1, 2, 2, 0, 2, 1, 1: three of eight are 2
    partition = Partition((client(0, [8, 9, 10], whole), client(1, [0, 1, 2], whole), client(2, [3, 6, 7], whole)))
    record = reference_record(dataset(), partition, (1, 2))  # client 0 left out of the evaluation sample
    assert record["client_ids"] == [1, 2] and record["clients"] == 2
    # pooled over all three clients (2, 2, 2, 0, 0, 0, 1, 1, 1: a tie) -> class 0: 2 of 8 for each
    assert record["references"][MAJORITY_POOLED]["client_accuracies"] == [0.25, 0.25]
    assert record["references"][MAJORITY_OWN]["client_accuracies"] == [0.25, 0.375]  # own 0 and 1


def test_the_pooled_class_is_of_the_clients_that_train_alone():
    # client 2 (training labels 2, 2, 2) never trains (a newcomer): pooled 0, 0, 0, 1, 2, 2, 1, 1 -> a tie of 0 and 1 -> 0
    partition = Partition((client(0, [0, 1, 2, 3], [0, 1, 2, 3]), client(1, [4, 5, 6, 7], [4, 5, 6]), client(2, [8, 9, 10], [7])))
    record = reference_record(dataset(), partition, (0, 1), trained_clients=(0, 1))
    assert record["references"][MAJORITY_POOLED]["predicted_class"] == 0
    assert record["references"][MAJORITY_POOLED]["client_accuracies"] == [0.25, round(1 / 3, 6)]
    assert record["client_ids"] == [0, 1]


def test_a_feature_shift_leaves_the_labels_and_so_the_references_alone():
    rotated = Shift("rotation", 180.0)
    plain = Partition((client(0, [0, 1, 2, 3], [0, 1, 2, 3]), client(1, [4, 5, 6, 7], [4, 5, 6])))
    shifted = Partition((client(0, [0, 1, 2, 3], [0, 1, 2, 3], shift=rotated), client(1, [4, 5, 6, 7], [4, 5, 6], shift=rotated)))
    assert reference_record(dataset(), plain, (0, 1))["references"] == reference_record(dataset(), shifted, (0, 1))["references"]


# ---- the character n-gram ----


def windows(*texts: str) -> np.ndarray:
    return np.array([[ord(char) - ord("a") for char in text] for text in texts], dtype=np.uint8)


def chars(text: str) -> np.ndarray:
    return np.array([ord(char) - ord("a") for char in text], dtype=np.int64)


def test_the_ngram_predicts_the_most_frequent_next_character_of_the_longest_seen_context():
    # training pairs (window -> next), alphabet a..e, order 3 (two characters of context):
    #   "ab" -> c, c, d, d (a tie: c); "bc" -> a, a; "b" -> c, c, d, d (c); "c" -> a, a; overall a, c, d twice each (a)
    model = fit_char_ngram(windows("aab", "cab", "bab", "aab", "abc", "bbc"), chars("ccddaa"), vocabulary=5, order=3)
    predicted = predict_next(model, windows("eab", "ebc", "eeb", "eee"))
    # "eab" and "ebc": their two last characters were seen; "eeb": "eb" never, "b" was;
    # "eee": neither "ee" nor "e" was seen, so the most frequent next character overall
    assert predicted.tolist() == [2, 0, 2, 0]


def test_the_ngram_backs_off_one_context_length_at_a_time():
    # order 4: "abc" -> d; "bc" -> d, e, e -> e; "c" -> d, e, e, b, b, b -> b (3)
    model = fit_char_ngram(windows("abc", "xbc", "ybc", "aac", "bac", "eac"), chars("deebbb"), vocabulary=26, order=4)
    assert predict_next(model, windows("abc")).tolist() == [3]  # three characters seen: d
    assert predict_next(model, windows("zbc")).tolist() == [4]  # "zbc" unseen, "bc" seen: e
    assert predict_next(model, windows("zzc")).tolist() == [1]  # only "c" seen: b
    assert predict_next(model, windows("zzz")).tolist() == [1]  # nothing seen: the most frequent next character, b


def test_the_ngram_counts_only_the_character_after_each_window():
    # "abab" -> a: the b's inside the windows are no next characters, so the unigram predicts a
    model = fit_char_ngram(windows("abab", "abab"), chars("aa"), vocabulary=3, order=1)
    assert predict_next(model, windows("bbbb")).tolist() == [0]


def test_windows_shorter_than_the_context_are_read_as_far_as_they_go():
    model = fit_char_ngram(windows("a", "a", "b"), chars("bbc"), vocabulary=3, order=4)
    assert predict_next(model, windows("a", "b", "c")).tolist() == [1, 2, 1]


def test_the_ngram_is_deterministic_and_independent_of_the_order_of_the_windows():
    rng = np.random.default_rng(0)
    train, following = rng.integers(0, 6, size=(500, 8)).astype(np.uint8), rng.integers(0, 6, size=500)
    test = rng.integers(0, 6, size=(200, 8)).astype(np.uint8)
    first = predict_next(fit_char_ngram(train, following, 6), test)
    order = rng.permutation(500)
    assert np.array_equal(first, predict_next(fit_char_ngram(train, following, 6), test))
    assert np.array_equal(first, predict_next(fit_char_ngram(train[order], following[order], 6), test))


def test_the_text_references_score_each_clients_test_windows():
    # vocabulary a, b, c; windows of two characters, whose next characters are the labels:
    # training (TRAIN_LABELS):  ab>a ab>a ab>a ba>b ba>c ba>c ab>b ab>b ab>c ab>c ab>c aa>a (no client's)
    # test (TEST_LABELS):       ab>a ba>b ab>c cc>c ba>a ab>c aa>b ab>b
    train_windows = windows("ab", "ab", "ab", "ba", "ba", "ba", "ab", "ab", "ab", "ab", "ab", "aa")[:, :, None, None]
    test_windows = windows("ab", "ba", "ab", "cc", "ba", "ab", "aa", "ab")[:, :, None, None]
    text = dataset(text=True, train=train_windows, test=test_windows)
    partition = Partition((client(0, [0, 1, 2, 3], [0, 1, 2, 3]), client(1, [4, 5, 6, 7, 8, 9, 10], [4, 5, 6, 7])))
    record = reference_record(text, partition, (0, 1), order=2)
    references = record["references"]
    assert record["ngram_order"] == 2
    # pooled (training samples 0-10), one character of context: after "b" a, a, a, b, b, c, c, c (a tie: a);
    # after "a" b, c, c (c); "c" never seen: overall c (5 of 11)
    # client 0 predicted a, c, a, c for a, b, c, c: 2 of 4; client 1 predicted c, a, c, a for a, c, b, b: 0 of 4
    assert references[NGRAM_POOLED]["client_accuracies"] == [0.5, 0.0]
    # own, client 0 (samples 0-3): after "b" a; after "a" b; overall a: predicted a, b, a, a: 2 of 4
    # own, client 1 (samples 4-10): after "a" c; after "b" c (3 of 5); predicted c everywhere: 1 of 4
    assert references[NGRAM_OWN]["client_accuracies"] == [0.5, 0.25]


def test_reference_accuracies_of_a_client_scored_on_nothing_are_left_out():
    splits = Splits(TRAIN_LABELS, TEST_LABELS, 3)
    accuracies = reference_accuracies([ClientSamples(np.array([0]), np.array([], dtype=np.int64)), ClientSamples(np.array([3]), np.array([1]))], splits)
    assert math.isnan(accuracies[MAJORITY_POOLED][0]) and accuracies[MAJORITY_OWN][1] == 1.0


# ---- the report ----

REFERENCES = {
    MAJORITY_POOLED: {"mean_accuracy": 0.20, "worst_accuracy": 0.10, "bottom20_accuracy": 0.12, "gap": 0.20},
    NGRAM_POOLED: {"mean_accuracy": 0.59, "worst_accuracy": 0.45, "bottom20_accuracy": 0.50, "gap": 0.24},
}


def run(setting: str, method: str, seed: int, mean: float, references: dict | None = REFERENCES) -> RunMetrics:
    values = {"mean_accuracy": mean, "worst_accuracy": mean - 0.1, "bottom20_accuracy": mean - 0.05, "gap": 0.2,
              "mean_accuracy_global": math.nan, "ari_true": math.nan, "num_groups": math.nan}  # fmt: skip
    return RunMetrics(setting, method, seed, values, trivial_references=references)


RUNS = [
    *(run("text", "hdcfl", seed, 0.45 + 0.01 * seed) for seed in (1, 2, 3)),  # below the n-gram
    *(run("text", "fedavg", seed, 0.60 + 0.001 * seed) for seed in (1, 2, 3)),  # above it by more than its spread
    *(run("text", "local", seed, 0.70) for seed in (1, 2, 3)),
    *(run("old", "hdcfl", seed, 0.50, references=None) for seed in (1, 2, 3)),
    *(run("old", "fedavg", seed, 0.40, references=None) for seed in (1, 2, 3)),
]


def test_a_method_not_above_the_best_reference_by_the_seed_spread_is_flagged():
    flags = row_flags(RUNS)
    assert "trivial (pooled n-gram 59.00)" in flags[("text", "hdcfl")]
    # fedavg 60.2 ± 0.1 over the n-gram's 59.00 ± 0 (one value per seed, all alike): above by more than the spread
    assert not any(flag.startswith("trivial") for flag in flags.get(("text", "fedavg"), []))
    assert not any(flag.startswith("trivial") for flag in flags.get(("old", "fedavg"), []))  # no record: no flag
    edge = [run("s", "fedavg", seed, value) for seed, value in ((1, 0.58), (2, 0.60), (3, 0.62))]  # 60 ± 2 vs 59
    assert "trivial (pooled n-gram 59.00)" in row_flags(edge)[("s", "fedavg")]


def test_reference_rows_are_shown_but_never_ranked_or_marked_best():
    tables = all_tables(RUNS)
    mean_table = tables[0]
    labels = [row[0].value for row in mean_table.rows]
    assert labels[-2:] == ["reference: majority class (pooled)", "reference: pooled n-gram"]
    reference = mean_table.rows[-1]
    assert [cell.value for cell in reference] == ["reference: pooled n-gram", "-", "59.00 ± 0.00", "-"]
    assert all(cell.mark == "reference" for cell in reference)
    assert reference[-1].value == "-"  # no rank
    # the best in "text" is local, the second fedavg, never the n-gram; the ranks are the methods' alone
    text_column = mean_table.header.index("text")
    assert {row[0].value: row[text_column].mark for row in mean_table.rows if row[text_column].mark in ("best", "second")} == {
        "local": "best", "fedavg": "second"}  # fmt: skip
    ranks = average_rank(RUNS)
    assert set(ranks) == {"hdcfl", "fedavg", "local"} and ranks["hdcfl"] == ranks["fedavg"] == 1.5
    assert "reference" not in {row[1].value for table in tables if table.title.startswith("Paired") for row in table.rows}
    for metric_table in tables[1:4]:  # worst, bottom 20%, gap
        assert metric_table.rows[-1][0].value == "reference: pooled n-gram"


@pytest.mark.parametrize("render", [to_markdown, to_csv, to_latex])
def test_reference_rows_and_the_flag_reach_every_format(render):
    text = render(all_tables(RUNS))
    assert "reference: pooled n-gram" in text and "reference: majority class (pooled)" in text
    assert "trivial (pooled n-gram 59.00)" in text
    assert "[trivial] not above the trivial reference" in text.replace("\\_", "_")
    assert "no trivial reference recorded (runs older than" in text.replace("\\_", "_").lower()


def test_reference_rows_are_set_in_italics():
    assert "| *reference: pooled n-gram* |" in to_markdown(all_tables(RUNS))
    assert "\\textit{reference: pooled n-gram}" in to_latex(all_tables(RUNS))
    rich_rows = to_rich(all_tables(RUNS))[0].columns[0]._cells
    assert "[italic]reference: pooled n-gram[/]" in rich_rows


def test_runs_without_the_record_report_with_one_note_per_table():
    old = [record for record in RUNS if record.setting == "old"]
    tables = all_tables(old)
    assert not any(row[0].value.startswith("reference:") for table in tables for row in table.rows)
    assert tables[0].note.count("No trivial reference recorded (runs older than") == 1


# ---- real runs ----


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trivial-reference")
    for seed in (1, 2):
        report_runs.simulate(root, "tiny", "fedavg", seed)
        report_runs.simulate(root, "tiny", "local", seed)
    return root


def test_a_run_records_its_references_in_the_manifest_before_round_one(finished_runs: Path):
    manifest = json.loads((finished_runs / "tiny" / "fedavg" / "seed1" / "manifest.json").read_text())
    record = manifest["trivial_references"]
    assert record["clients"] == 8 and record["scored_on"] == "test"
    pooled = record["references"][MAJORITY_POOLED]
    assert len(pooled["client_accuracies"]) == 8 and 0.0 <= pooled["worst_accuracy"] <= pooled["mean_accuracy"] <= 1.0
    # every method's run of a seed scores the same clients on the same samples
    local = json.loads((finished_runs / "tiny" / "local" / "seed1" / "manifest.json").read_text())
    assert local["trivial_references"]["references"] == record["references"]


def test_the_report_command_shows_the_reference_rows_of_real_runs(finished_runs: Path):
    from typer.testing import CliRunner

    from cli import app

    result = CliRunner().invoke(app, ["report", str(finished_runs), "--format", "md"])
    assert result.exit_code == 0, result.output
    assert "| *reference: majority class (pooled)* |" in result.stdout
    assert "| *reference: majority class (own)* |" in result.stdout
    assert "no trivial reference recorded" not in result.stdout.lower()


def test_a_run_logged_before_the_record_still_reports(finished_runs: Path, tmp_path: Path):
    import shutil

    from typer.testing import CliRunner

    from cli import app

    copy = tmp_path / "old"
    shutil.copytree(finished_runs, copy)
    for manifest_path in copy.rglob("manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        manifest.pop("trivial_references")
        manifest_path.write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["report", str(copy), "--format", "md"])
    assert result.exit_code == 0, result.output
    assert "reference: majority class" not in result.stdout
    assert "No trivial reference recorded (runs older than the manifest's trivial_references record)." in result.stdout
