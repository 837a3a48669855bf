#!/usr/bin/env bash
# Every data-dependent knob of the CPU settings, chosen the way a user of the method could:
# `hdcfl-ray calibrate` holds out a fifth of each client's training images and picks the value
# with the best final mean accuracy on them (never the test set; ARI is shown, never used).
# The CIFAR settings use one seed (42) per knob for time, the digits quickstart the paper's
# three seeds; the chosen value is then run at the paper's three seeds.
#
#   export HDCFL_CIFAR10_PARQUET=data/cifar10-parquet   # from the repository root
#   scenarios/cpu/calibrate.sh [rot|ls3|quickstart|all] [KNOB...]
#   # KNOB: pacfl ifca fedprox fedsoft fedsoft_centers fedce fedce_temperature (default: all)
#
# Each table lands in docs/calibration/<setting>-<knob>.md; docs/calibration.md quotes the choices.
# Like every sweep, a rerun skips finished runs and resumes killed ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${CALIBRATE_OUT:-runs/calibrate}"
which="${1:-all}"
shift || true
knobs=("$@")
[ ${#knobs[@]} -eq 0 ] && knobs=(pacfl ifca fedprox fedsoft fedsoft_centers fedce fedce_temperature)

knob() {  # knob SETTING NAME METHOD KEY VALUES [--set KEY=VALUE]...
  local setting=$1 name=$2 method=$3 key=$4 values=$5 scenario seeds report
  shift 5
  if [ "$setting" = quickstart ]; then
    scenario=scenarios/quickstart.yaml seeds=42,123,2026 report="docs/calibration/quickstart-$name.md"
  else
    : "${HDCFL_CIFAR10_PARQUET:?export HDCFL_CIFAR10_PARQUET=<folder with train.parquet and test.parquet>, e.g. data/cifar10-parquet from scripts/cifar10_to_parquet.py}"
    scenario="scenarios/cpu/cpu-c10-$setting.yaml" seeds=42 report="docs/calibration/cpu-c10-$setting-$name.md"
  fi
  # a failed run (exit 1) leaves the others and the table; go on with the next knob, rerun to retry it
  hdcfl-ray calibrate "$scenario" --algorithm "$method" --key "$key" --values "$values" \
    --seeds "$seeds" "$@" --out "$out/$setting-$name" --report "$report" || echo "calibrate.sh: $setting $name: exit $?" >&2
}

pacfl_thresholds() {  # the quickstart's 8x8 digits need wider angles than CIFAR-10
  if [ "$1" = quickstart ]; then echo 4,8,12; else echo 1.5,2.5,4; fi
}

settings=(rot ls3 quickstart)
[ "$which" != all ] && settings=("$which")
for setting in "${settings[@]}"; do
  for name in "${knobs[@]}"; do
    case "$name" in
      pacfl) knob "$setting" pacfl-threshold pacfl algorithm.pacfl.threshold "$(pacfl_thresholds "$setting")" ;;
      ifca) knob "$setting" ifca-clusters ifca algorithm.ifca.clusters 2,4,10 ;;
      fedprox) knob "$setting" fedprox-mu fedprox algorithm.fedprox.mu 0.001,0.01,0.1,1 ;;
      fedsoft) knob "$setting" fedsoft-proximal fedsoft algorithm.fedsoft.proximal 0.001,0.01,0.1 ;;
      fedsoft_centers) knob "$setting" fedsoft-centers fedsoft algorithm.fedsoft.centers 2,4,10 ;;
      fedce) knob "$setting" fedce-clusters fedce algorithm.fedce.clusters 2,4 ;;
      fedce_temperature) knob "$setting" fedce-temperature fedce algorithm.fedce.temperature 1,2,4 ;;
      *) echo "unknown knob $name" >&2; exit 2 ;;
    esac
  done
done
