"""Reports that cannot mislead: collapsed and weak rows are marked in every output
format, and averages over settings compare only methods that ran every setting."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from analysis.final_metrics import RunMetrics, average_rank, macro_average
from analysis.report_tables import all_tables, to_csv, to_latex, to_markdown
from analysis.row_flags import row_flags


def run(setting, method, seed, mean, worst=0.3, groups=math.nan, ari=math.nan, entropy=math.nan):
    values = {
        "mean_accuracy": mean, "worst_accuracy": worst, "bottom20_accuracy": worst, "gap": 0.2,
        "mean_accuracy_global": math.nan, "ari_true": ari, "num_groups": groups, "membership_entropy": entropy,
    }  # fmt: skip
    return RunMetrics(setting, method, seed, values)


RUNS = [
    *(run("rot", "local", seed, 0.50 + 0.01 * i) for i, seed in enumerate((1, 2, 3))),
    *(run("rot", "hdcfl", seed, 0.60, groups=4, ari=1.0, entropy=0.1) for seed in (1, 2, 3)),
    # one cluster where four are planted, worst client at 0, far below Local
    *(run("rot", "pacfl", seed, 0.30, worst=0.0, groups=1, ari=0.0) for seed in (1, 2, 3)),
    # soft memberships spread evenly over the clusters
    *(run("rot", "fedce", seed, 0.505, groups=4, ari=0.0, entropy=0.99) for seed in (1, 2, 3)),
    # only one seed
    run("rot", "ifca", 1, 0.55, groups=4, ari=0.5, entropy=math.nan),
    *(run("ls3", "local", seed, 0.40) for seed in (1, 2, 3)),
    *(run("ls3", "hdcfl", seed, 0.45, groups=4, ari=0.3) for seed in (1, 2, 3)),
    *(run("ls3", "pacfl", seed, 0.41, groups=8, ari=0.6) for seed in (1, 2, 3)),
    *(run("ls3", "fedce", seed, 0.42, groups=4, ari=0.2, entropy=0.5) for seed in (1, 2, 3)),
]


def test_each_collapse_and_shortfall_is_flagged_by_its_rule():
    flags = row_flags(RUNS)
    assert flags[("rot", "pacfl")] == ["one group", "worst client 0%", "below Local"]
    assert flags[("rot", "fedce")] == ["uniform memberships"]  # 0.505 vs 0.51 ± 0.01: inside the spread
    assert flags[("rot", "ifca")] == ["fewer seeds (1 of 3)"]
    assert ("rot", "hdcfl") not in flags and ("ls3", "pacfl") not in flags and ("rot", "local") not in flags


def test_one_group_asked_for_is_not_a_collapse():
    """A replay with groups = 1 (table 3's one prototype) forms one group by design."""
    one_prototype = [RunMetrics("rot.groups-1", "hdcfl", seed, {**r.values, "num_groups": 1.0, "ari_true": 0.0, "groups_asked": 1.0})
                     for seed, r in zip((1, 2, 3), RUNS[3:6])]
    collapsed = [RunMetrics("rot.x", "hdcfl", seed, {**r.values, "num_groups": 1.0, "ari_true": 0.0, "groups_asked": 4.0})
                 for seed, r in zip((1, 2, 3), RUNS[3:6])]
    flags = row_flags(one_prototype + collapsed)
    assert ("rot.groups-1", "hdcfl") not in flags
    assert flags[("rot.x", "hdcfl")] == ["one group"]


def test_groups_asked_reads_the_methods_own_count():
    from analysis.final_metrics import groups_asked

    assert groups_asked({"algorithm": {"name": "hdcfl", "hdcfl": {"groups": 1}, "ifca": {"clusters": 4}}}) == 1.0
    assert groups_asked({"algorithm": {"name": "fedsoft", "fedsoft": {"centers": 3}}}) == 3.0
    assert math.isnan(groups_asked({"algorithm": {"name": "fedavg"}}))


@pytest.mark.parametrize("render", [to_markdown, to_csv, to_latex])
def test_flags_appear_in_every_output_format(render):
    text = render(all_tables(RUNS))
    for flag in ("one group", "worst client 0", "below Local", "uniform memberships", "fewer seeds (1 of 3)"):
        assert flag in text, flag


def test_a_method_missing_a_setting_gets_no_macro_value_or_rank_and_is_named():
    assert math.isnan(macro_average(RUNS, "mean_accuracy")["ifca"])
    assert math.isnan(average_rank(RUNS)["ifca"])
    assert not math.isnan(average_rank(RUNS)["hdcfl"])
    # the ranks of the complete methods ignore ifca: hdcfl is first in both settings
    assert average_rank(RUNS)["hdcfl"] == 1.0
    markdown = to_markdown(all_tables(RUNS))
    assert "without them: ifca (no ls3)" in markdown
    mean_table = all_tables(RUNS)[0]
    ifca_row = next(row for row in mean_table.rows if row[0].value == "ifca")
    assert ifca_row[-1].value == "-"  # no average rank


def test_every_table_says_what_produced_its_runs_in_every_format():
    from analysis.provenance import run_provenance

    manifest = {
        "git_revision": "0123456789abcdef", "git_dirty": False,
        "hardware": {"cpu_model": "Intel(R) Xeon(R) Processor"}, "packages": {"torch": "2.14.1", "ray": "2.60.0"},
    }  # fmt: skip
    amd = {**manifest, "hardware": {"cpu_model": "AMD EPYC 9B14"}}
    runs = [RunMetrics(r.setting, r.method, r.seed, r.values, run_provenance(amd if r.seed == 3 else manifest)) for r in RUNS]
    tables = all_tables(runs)
    assert all("Made from 25 runs: commit 0123456789" in table.note for table in tables)
    assert "Intel(R) Xeon(R) Processor (17 runs), AMD EPYC 9B14 (8 runs)" in tables[0].note
    for render in (to_markdown, to_csv, to_latex):
        assert "torch 2.14.1" in render(tables) and "Ray 2.60.0" in render(tables)


def test_runs_trained_on_a_gpu_name_the_gpu_their_hosts_trained_on():
    from analysis.provenance import run_provenance

    manifest = {"git_revision": "0123456789abcdef", "hardware": {"cpu_model": "Intel(R) Xeon(R) Processor", "gpus": ["NVIDIA H200"]},
                "packages": {"torch": "2.11.0", "ray": "2.60.0"}}  # fmt: skip
    on_gpu = {**manifest, "client_host_hardware": [{"device": "cuda:0", "gpu_name": "NVIDIA H200"}] * 4}
    on_cpu = {**manifest, "client_host_hardware": [{"device": "cpu", "gpu_name": None}] * 4}
    assert run_provenance(on_gpu)["device"] == "NVIDIA H200"
    assert run_provenance(on_cpu)["device"] == "Intel(R) Xeon(R) Processor"  # a GPU in the machine, not used
    driver_only = {**manifest, "client_host_hardware": [{"device": "cuda:1"}]}  # an older manifest: no gpu_name
    assert run_provenance(driver_only)["device"] == "NVIDIA H200"


def test_unfinished_runs_are_named_in_every_table_in_every_format():
    import pyarrow as pa

    from analysis.runs import RunRecord, left_out_note, unfinished

    def record(status, evaluated):
        rounds = pa.table({"round": [1], "evaluated": [evaluated]})
        scenario = {"name": "rot", "seed": 7, "algorithm": {"name": "ifca"}}
        return RunRecord(Path("runs/x"), scenario, {"status": status}, rounds, pa.table({}), pa.table({}))

    killed, never_scored, done = record("interrupted", True), record("completed", False), record("completed", True)
    assert unfinished([killed, never_scored, done]) == [killed, never_scored]
    note = left_out_note([killed])
    assert note == "Left out of every table: 1 unfinished run(s): rot/ifca seed 7 (interrupted)."
    assert left_out_note([]) == ""
    tables = all_tables(RUNS, left_out=note)
    assert all(note in table.note for table in tables)
    for render in (to_markdown, to_csv, to_latex):
        assert "rot/ifca seed 7 (interrupted)" in render(tables)


def test_a_flag_marks_the_cells_of_its_own_metric_and_the_runs_flags_mark_every_cell():
    from analysis.row_flags import cell_flags, evidence_flags

    pacfl = row_flags(RUNS)[("rot", "pacfl")]
    assert cell_flags(pacfl, "mean_accuracy") == ["one group", "below Local"]
    assert cell_flags(pacfl, "worst_accuracy") == ["one group", "worst client 0%"]
    assert cell_flags(pacfl, "gap") == cell_flags(pacfl, "ari_true") == ["one group"]
    assert evidence_flags(row_flags(RUNS)[("rot", "ifca")]) == ["fewer seeds (1 of 3)"]
    worst = next(table for table in all_tables(RUNS) if table.title.startswith("Final worst-client"))
    pacfl_row = next(row for row in worst.rows if row[0].value == "pacfl")
    assert "below Local" not in to_markdown([worst]) and pacfl_row[2].flags == ("one group", "worst client 0%")  # columns: ls3, rot


def test_one_cluster_per_client_is_named_with_the_value_that_did_it_in_every_table():
    """PACFL's smallest threshold puts every client in a cluster of its own: the same as
    Local. The row says so, with the value `auto` chose, in md, csv and latex; the choices
    table marks a value at its grid's edge."""
    choice = {"method": "pacfl", "rule": "r", "rounds": 8, "full_rounds": 20, "validation_fraction": 0.2, "from_cache": False,
              "knobs": [{"key": "algorithm.pacfl.threshold", "grid": [0.001, 0.25], "chosen": 0.001, "at_edge": "low", "extended": [],
                         "candidates": [{"value": 0.001, "validation_mean_accuracy": 0.9, "samples_trained": 10},
                                        {"value": 0.25, "validation_mean_accuracy": 0.9, "samples_trained": 0, "same_run_as": 0.001}]}]}  # fmt: skip
    runs = [*(run("ls2", "local", seed, 0.90 + 0.01 * seed) for seed in (1, 2, 3))]
    for seed in (1, 2, 3):
        base = run("ls2", "pacfl", seed, 0.90 + 0.01 * seed, groups=20, ari=0.0)
        runs.append(RunMetrics("ls2", "pacfl", seed, {**base.values, "num_clients": 20.0}, auto_knobs=choice))
    flags = row_flags(runs)
    assert flags[("ls2", "pacfl")] == ["one cluster per client (threshold 0.001 chosen by auto)"]
    tables = all_tables(runs)
    for text in (to_markdown(tables), to_csv(tables), to_latex(tables)):
        assert "one cluster per client (threshold 0.001 chosen by auto)" in text
    markdown = to_markdown(tables)
    assert "[at the grid's edge (smallest value tried)]" in markdown and "0.25: 90.00 (= 0.001)" in markdown


def test_groups_without_planted_ones_are_described_by_silhouette_stability_and_entropy():
    """Natural clients have no planted groups: the report still says how defined and how
    stable each clustered method's groups are."""
    runs = []
    for seed, (silhouette, stability, entropy) in zip((1, 2, 3), ((0.4, 0.9, 0.2), (0.5, 1.0, 0.1), (0.3, 0.8, 0.3))):
        base = run("femnist", "hdcfl", seed, 0.8, groups=4, entropy=entropy)
        runs.append(RunMetrics("femnist", "hdcfl", seed, {**base.values, "refresh_silhouette": silhouette, "refresh_ari_previous": stability}))
        runs.append(run("femnist", "ifca", seed, 0.7, groups=3))
        runs.append(run("femnist", "local", seed, 0.6))
    markdown = to_markdown(all_tables(runs))
    section = markdown.split("how defined and how stable the groups are")[1].split("###")[0]
    assert "| femnist | hdcfl | 4, 4, 4 | 0.40 ± 0.10 | 0.90 ± 0.10 | 0.20 ± 0.10 |" in section
    assert "ifca" not in section and "local" not in section
