#!/usr/bin/env bash
# The paper-size comparison (table 1's form): HDC-FL and the paper's seven compared methods
# (FedAvg-SE, FedBABU, FedALA, FedCE, FedSoft, IFCA, PACFL) on both pretrained paper-size forms
# (C10 LS3 on the NIID-Bench #C=3 partition, C10 Rot run 40 rounds), seeds 42, 123, 2026, every
# method with a data-dependent knob calibrated at this size on held-out training images.
#
#   export HDCFL_CIFAR10_PARQUET=data/cifar10-parquet     # from the repository root
#   scenarios/cpu/paper-size/compare.sh [ls3|rot|all]     # default: all (ls3 first, the cheaper form)
#
# Per form, in this order (each step skips what is finished, so a rerun resumes where a killed
# one stopped; every run is niced by the caller if wanted):
#   1. the pretrained weights (once, shared by both forms): hdcfl-ray pretrain, 10 epochs;
#   2. the knob each of four methods' results hinges on, chosen by `hdcfl-ray calibrate` at seed
#      42 on a fifth of each client's training images held out (never the test set), with 20 rounds
#      on both forms for time: IFCA's model count, FedSoft's centre count and then its proximal
#      lambda at that count, FedCE's temperature and PACFL's threshold (its grid brackets the
#      pairwise subspace angles measured at this size: Rot smallest 0.53, median 1.97 degrees; LS3
#      smallest 1.20, median 3.38). FedSoft's lambda is calibrated here because it sets how far 63
#      local steps a round carry a personal model from the centres: at the 250-image value (0.001)
#      the pull moves a model by about 1e-5 of its distance per step, and FedSoft scored Local's
#      accuracy client for client. Other knobs keep the 250-image held-out values the scenarios
#      carry (docs/calibration.md). A committed
#      table docs/calibration/paper-size-<form>-<method>-<knob>.md is a finished calibration and
#      its chosen value is reused; delete the table to calibrate again;
#   3. one sweep of all nine methods x 3 seeds (27 runs): HDC-FL, FedAvg-SE, FedBABU and FedALA,
#      which have no data-dependent knob, the four above at their chosen values, and Local as the
#      reference the report flags a method below (a shortfall, a collapse). One sweep keeps both
#      cores busy to its last run; each --set reaches only its own method's runs;
#   4. the form's report, docs/reproduction-paper-size-<form>.md (learning curves, which show
#      whether the form reached its plateau, in docs/figures/paper-size-<form>/), and the replays of its HDC-FL
#      runs (scenarios/cpu/replays.sh <form> paper-size: tables 3, 10, 12, 13 and 14).
# Then, once both forms are kept in results/paper-size/, docs/reproduction-paper-size-tables.md over
# all 54 runs (48 and Local's 6): the table-2 form's macro values over the two forms.
#
# A form's runs take longer than some machines live, so finished runs are kept in the repository:
# `python scenarios/cpu/paper-size/keep_runs.py save <form>` copies the completed ones (logs and
# manifest, no checkpoints) and the weights file into results/paper-size/ (commit them), and this
# script first restores kept runs the runs folder lacks, so the sweep skips them as complete.
#
# Runs go to $PAPER_SIZE_OUT/<form>/<setting>/<method>/seed<N> (default runs/paper-size-compare),
# calibration runs to $PAPER_SIZE_OUT/calibrate, their tables to
# docs/calibration/paper-size-<form>-<method>-<knob>.md. Two runs at a time, one core each.
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${HDCFL_CIFAR10_PARQUET:?export HDCFL_CIFAR10_PARQUET=<folder with train.parquet and test.parquet>, e.g. data/cifar10-parquet from scripts/cifar10_to_parquet.py}"
out="${PAPER_SIZE_OUT:-runs/paper-size-compare}"
which="${1:-all}"
seeds=42,123,2026
one_host=(--set runtime.clients_per_actor=20 --parallel 2)

forms=(ls3 rot)
[ "$which" != all ] && forms=("$which")
for form in "${forms[@]}"; do  # runs kept in the repository by an earlier machine, and their weights file
  python scenarios/cpu/paper-size/keep_runs.py restore "$form" --runs "$out"
done
if [ ! -f weights/c10-pool.pt ]; then
  hdcfl-ray pretrain scenarios/cpu/paper-size/paper-size-c10-rot-pretrained.yaml --epochs 10 --out weights/c10-pool.pt
fi

chosen() {  # chosen REPORT: the value a calibration table's last line names
  sed -n 's/.*Chosen: [^ ]* = \([^ ]*\) by the rule.*/\1/p' "$1"
}

calibrate() {  # calibrate FORM METHOD KNOB VALUES [--set K=V]...: print --set algorithm.METHOD.KNOB=<chosen value>
  local form=$1 method=$2 knob=$3 values=$4 scenario report value
  shift 4  # the rest: knobs already chosen, held fixed while this one is calibrated
  scenario="scenarios/cpu/paper-size/paper-size-c10-$form-pretrained.yaml"
  report="docs/calibration/paper-size-$form-$method-$knob.md"
  value=$([ -f "$report" ] && chosen "$report" || true)
  if [ -n "$value" ]; then  # a committed table is a finished calibration: delete it to recalibrate
    echo "compare.sh: $form $method $knob = $value, as chosen in $report" >&2
    echo "--set algorithm.$method.$knob=$value"
    return
  fi
  hdcfl-ray calibrate "$scenario" --algorithm "$method" --key "algorithm.$method.$knob" --values "$values" --seeds 42 \
    --set protocol.rounds=20 "$@" "${one_host[@]}" --out "$out/calibrate/$form-$method-$knob" --report "$report" >&2
  value=$(chosen "$report")
  [ -n "$value" ] || { echo "compare.sh: $form $method $knob: no value chosen" >&2; exit 1; }
  echo "--set algorithm.$method.$knob=$value"
}

for form in "${forms[@]}"; do
  scenario="scenarios/cpu/paper-size/paper-size-c10-$form-pretrained.yaml"
  if [ "$form" = rot ]; then thresholds=0.75,1.25,2; else thresholds=1.5,2.5,3.5; fi
  pacfl=$(calibrate "$form" pacfl threshold "$thresholds")   # one at a time, so that a failed one stops the script
  ifca=$(calibrate "$form" ifca clusters 2,4,10)
  fedsoft=$(calibrate "$form" fedsoft centers 2,4,10)
  # shellcheck disable=SC2086
  fedsoft_proximal=$(calibrate "$form" fedsoft proximal 0.001,0.01,0.1,1 $fedsoft)
  fedce=$(calibrate "$form" fedce temperature 1,2,4)
  # shellcheck disable=SC2086  # each holds two words: --set algorithm.METHOD.KNOB=VALUE
  hdcfl-ray sweep "$scenario" --algorithms hdcfl,fedavg_se,fedbabu,fedala,pacfl,ifca,fedsoft,fedce,local --seeds "$seeds" \
    $pacfl $ifca $fedsoft $fedsoft_proximal $fedce "${one_host[@]}" --out "$out/$form"
  python scenarios/cpu/paper-size/keep_runs.py save "$form" --runs "$out"   # into results/paper-size/<form>: commit it
  hdcfl-ray report "$out/$form" --format md --out "docs/reproduction-paper-size-$form.md" --figures "docs/figures/paper-size-$form"
  PAPER_SIZE_OUT="$out" scenarios/cpu/replays.sh "$form" paper-size   # tables 3, 10, 12, 13, 14 from the HDC-FL runs
done
kept=results/paper-size
if [ -d "$kept/ls3" ] && [ -d "$kept/rot" ]; then  # both forms kept: the tables over all of their runs
  hdcfl-ray report "$kept/ls3" "$kept/rot" --format md --out docs/reproduction-paper-size-tables.md
fi
