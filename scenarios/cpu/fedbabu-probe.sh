#!/usr/bin/env bash
# Why FedBABU, the paper's strongest mean, trails FedAvg-SE here: its fixed head, its fine-tuning
# or the regime? The reproduction sweep's FedBABU runs log, from one final evaluation, the
# fine-tuned model and the body under the fixed random head before fine-tuning (the report's
# personalisation-step table pairs them by seed). This adds FedBABU with four times the
# fine-tuning (20 epochs instead of 5) on both CPU settings, seeds 42, 123, 2026: if fine-tuning
# budget were the reason, the gap to FedAvg-SE would close.
#
#   export HDCFL_CIFAR10_PARQUET=data/cifar10-parquet   # from the repository root
#   scenarios/cpu/fedbabu-probe.sh [cpu|paper-size]     # 6 runs into runs/cpu-fedbabu-ft20 (or runs/paper-size-fedbabu-ft20)
#
# The longer fine-tuning runs in the same settings under the label fedbabu-ft20 (output.label),
# so the report pairs them by seed with the sweep's runs. cpu (the default) writes
# docs/reproduction-fedbabu-probe.md: FedBABU (5 and 20 fine-tuning epochs), FedAvg-SE and Local from
# the reproduction sweep, with the personalisation-step table and FedAvg-SE minus each of them, seed
# by seed (report --against). paper-size does the same beside the paper-size comparison's kept runs
# (results/paper-size/<form>, scenarios/cpu/paper-size/compare.sh) with 2000 images per client and the
# pretrained encoder, and writes docs/reproduction-paper-size-fedbabu-probe.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HDCFL_CIFAR10_PARQUET:?export HDCFL_CIFAR10_PARQUET=<folder with train.parquet and test.parquet>, e.g. data/cifar10-parquet from scripts/cifar10_to_parquet.py}"
scale="${1:-cpu}"
case "$scale" in
  cpu)
    runs="${REPRODUCTION_OUT:-runs/cpu-reproduction}" out="${FEDBABU_PROBE_OUT:-runs/cpu-fedbabu-ft20}"
    scenario() { echo "scenarios/cpu/cpu-c10-$1.yaml"; }
    compared() { echo "$runs"/cpu-c10-{rot,ls3}/{fedbabu,fedavg_se,local}; }
    report=docs/reproduction-fedbabu-probe.md extra=() ;;
  paper-size)
    runs="${PAPER_SIZE_KEPT:-results/paper-size}" out="${FEDBABU_PROBE_OUT:-runs/paper-size-fedbabu-ft20}"
    scenario() { echo "scenarios/cpu/paper-size/paper-size-c10-$1-pretrained.yaml"; }
    compared() { for form in rot ls3; do echo "$runs/$form/paper-size-c10-$form-pretrained/"{fedbabu,fedavg_se,local}; done; }
    report=docs/reproduction-paper-size-fedbabu-probe.md extra=(--set runtime.clients_per_actor=20 --parallel 2) ;;
  *) echo "fedbabu-probe.sh: the scale is cpu or paper-size, not $scale" >&2; exit 2 ;;
esac

for setting in rot ls3; do
  hdcfl-ray sweep "$(scenario "$setting")" --algorithms fedbabu --seeds 42,123,2026 \
    --set algorithm.fedbabu.finetune_epochs=20 --set output.label=fedbabu-ft20 "${extra[@]}" --out "$out/$setting"
done
# shellcheck disable=SC2046  # one folder per word
hdcfl-ray report $(compared) "$out" --against fedavg_se --format md --out "$report"
