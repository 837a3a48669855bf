#!/usr/bin/env bash
# The paper's server-side tables, replayed from the saved refreshes of the reproduction sweep's
# HDC-FL runs (scenarios/cpu/sweep-reproduction.yaml, runs/cpu-reproduction): nothing is retrained,
# so every variant is paired by seed with the run itself.
#   table 3:  mix=0 (no prototype: the global encoder), groups=1 (one prototype), the run (G = 4)
#   table 10: descriptor=raw against the run's low-rank descriptors (accuracy, silhouette, refresh ARI)
#   table 12: membership=hard against the run's soft memberships
#   table 13: mix=0, mix=0.5 and the run's mix=1 (lambda)
#   tables 4, 14, 15: the donor-swap diagnostic over the three seeds of each setting
#
#   export HDCFL_CIFAR10_PARQUET=data/cifar10-parquet   # from the repository root
#   scenarios/cpu/replays.sh [rot|ls3|all] [cpu|paper-size]
#
# cpu (the default) replays the 250-image runs and writes docs/reproduction-replays-<setting>.md
# (`hdcfl-ray report` of the runs and their replays) and docs/reproduction-donor-swap-<setting>.md;
# paper-size replays the HDC-FL runs of scenarios/cpu/paper-size/compare.sh and writes
# docs/reproduction-paper-size-replays-<setting>.md and docs/reproduction-paper-size-donor-swap-<setting>.md.
# A rerun skips the replays already on disk.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HDCFL_CIFAR10_PARQUET:?export HDCFL_CIFAR10_PARQUET=<folder with train.parquet and test.parquet>, e.g. data/cifar10-parquet from scripts/cifar10_to_parquet.py}"
which="${1:-all}"
scale="${2:-cpu}"
case "$scale" in
  cpu) runs="${REPRODUCTION_OUT:-runs/cpu-reproduction}" out="${REPLAYS_OUT:-runs/cpu-replays}" docs=docs/reproduction ;;
  paper-size) runs="${PAPER_SIZE_OUT:-runs/paper-size-compare}" out="${REPLAYS_OUT:-runs/paper-size-replays}" docs=docs/reproduction-paper-size ;;
  *) echo "replays.sh: the scale is cpu or paper-size, not $scale" >&2; exit 2 ;;
esac
hdcfl_runs() {  # the folder holding a setting's HDC-FL runs (seed42, seed123, seed2026)
  if [ "$scale" = cpu ]; then echo "$runs/cpu-c10-$1/hdcfl"; else echo "$runs/$1/paper-size-c10-$1-pretrained/hdcfl"; fi
}
settings=(rot ls3)
[ "$which" != all ] && settings=("$which")
seeds=(42 123 2026)

for setting in "${settings[@]}"; do
  for seed in "${seeds[@]}"; do
    run="$(hdcfl_runs "$setting")/seed$seed"
    [ -f "$run/manifest.json" ] || { echo "replays.sh: $run is missing; run its sweep first" >&2; exit 2; }
    for variant in mix=0 mix=0.5 groups=1 descriptor=raw membership=hard; do
      target="$out/$setting/$(echo "$variant" | tr = -)/seed$seed"
      [ -f "$target/manifest.json" ] || hdcfl-ray ablate "$run" --set "algorithm.hdcfl.$variant" --out "$target"
    done
  done
  hdcfl-ray report "$(hdcfl_runs "$setting")" "$out/$setting" --format md --out "$docs-replays-$setting.md"
  hdcfl-ray diagnose donor-swap "${seeds[@]/#/$(hdcfl_runs "$setting")/seed}" --report "$docs-donor-swap-$setting.md"
done
