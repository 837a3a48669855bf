#!/usr/bin/env bash
# The GPU check of hdcfl-ray (benchmarks/gpu_check.py) with a Python that can run it.
#
#   bash benchmarks/gpu_check.sh [--no-install] [--wheels DIR] [--out PATH] [gpu_check.py options...]
#   bash benchmarks/gpu_check.sh --dry-run --no-install          # a machine without a GPU
#   bash benchmarks/gpu_check.sh --prepare-wheels .whl           # online, before: wheels for an offline GPU machine
#
# The JSON goes to --out PATH, else $OUT/gpu_check.json when $OUT is set, else
# runs/gpu_check/gpu_check.json; the printed log goes beside it (gpu_check.log).
#
# Python: $PYTHON (default python3) when it already imports torch, Ray and hdcfl_ray,
# or with --no-install. Else, with a wheel folder (--wheels DIR, $HDCFL_WHEELS, or
# .whl/ in the repository): its wheels are installed offline with --target into
# /tmp/hdcfl-gpu-site, beside the machine's own torch. Else a venv .venv-gpu gets
# torch==2.14.1, torchvision==0.29.1 and the project (wheels only, from the index).
#
# --prepare-wheels DIR downloads, here and online, the CPython 3.12 x86-64 wheels a GPU
# image with torch but without Ray lacks (the versions this Python has), and drops the
# Java jars from Ray's wheel (30 MB no Python run needs): about 49 MB in all.
#
# A GPU machine that receives a copy of the working tree of at most 64 MiB cannot take
# the wheels and the CIFAR-10 copy (55 MB) at once, nor results/ (the kept paper-size runs,
# over 64 MB: move it aside for the copy and back after). Two commands on the same machine,
# the second sent at once (a machine kept warm for only seconds between calls):
#   1. with .whl/ in the tree:
#        bash benchmarks/gpu_check.sh --steps machine,cuda_tests,throughput,paper_round,bit_identity
#   2. right after, with the data in a git-ignored folder of the tree prepared before the
#      first command (e.g. .gpudata/cifar10-jpeg) and sent with the second alone; the wheels
#      installed by the first stay in /tmp/hdcfl-gpu-site while the machine is kept:
#        bash benchmarks/gpu_check.sh --steps paper_rot_two_rounds --cifar .gpudata/cifar10-jpeg --out "$OUT/gpu_check_paper.json"
# That is how the H200 record in docs/benchmarks.md ("GPU check") was made, in about 8 minutes
# of GPU machine time for both commands, start-up included.
# HDCFL_GIT_COMMIT=<sha> names the commit where the copy has no .git.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
python="${PYTHON:-python3}"
site=/tmp/hdcfl-gpu-site
install=1 wheels="${HDCFL_WHEELS:-}" out="" prepare="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) install=0 ;;
    --wheels) wheels="$2"; shift ;;
    --out) out="$2"; shift ;;
    --out=*) out="${1#--out=}" ;;
    --prepare-wheels) prepare="$2"; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done

if [ -n "$prepare" ]; then
  mkdir -p "$prepare"
  pins=$("$python" -c 'import importlib.metadata as m
names = "ray pydantic pydantic-core annotated-types typing-inspection jsonschema jsonschema-specifications referencing rpds-py".split()
def pin(name):
    try: return name + "==" + m.version(name)
    except m.PackageNotFoundError: return name
print(" ".join(pin(name) for name in names))')
  # shellcheck disable=SC2086  # one word per requirement
  "$python" -m pip download --no-deps --only-binary=:all: --python-version "${HDCFL_WHEELS_PYTHON:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$prepare" $pins
  "$python" - "$prepare" <<'EOF'
import pathlib, sys, zipfile
for wheel in pathlib.Path(sys.argv[1]).glob("ray-*.whl"):
    with zipfile.ZipFile(wheel) as source:
        if not any(name.startswith("ray/jars/") for name in source.namelist()):
            continue
        slim = wheel.with_suffix(".slim")
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
            for info in source.infolist():
                if info.filename.startswith("ray/jars/"):
                    continue
                data = source.read(info.filename)
                if info.filename.endswith(".dist-info/RECORD"):
                    data = b"".join(line + b"\n" for line in data.splitlines() if not line.startswith(b"ray/jars/"))
                target.writestr(info, data)
    slim.replace(wheel)
EOF
  du -sh "$prepare"
  echo "wheels in $prepare: keep them out of git (for .whl: echo /.whl/ >> .git/info/exclude) and carry them to the GPU machine"
  exit 0
fi

if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out="$OUT/gpu_check.json"; else out="runs/gpu_check/gpu_check.json"; fi
fi
if [ -z "$wheels" ] && [ -d .whl ]; then wheels=.whl; fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -d "$site" ]; then export PYTHONPATH="$site:$PYTHONPATH"; fi
usable() { "$1" -c 'import torch, ray, pydantic, hdcfl_ray.runtime.driver' >/dev/null 2>&1; }

if [ "$install" = 1 ] && ! usable "$python"; then
  if [ -n "$wheels" ]; then
    echo "[gpu_check.sh] installing the wheels in $wheels into $site (offline)"
    "$python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --upgrade --target "$site" "$wheels"/*.whl
    export PYTHONPATH="$site:$PYTHONPATH"
  else
    if [ ! -x .venv-gpu/bin/python ]; then
      echo "[gpu_check.sh] creating .venv-gpu (torch==2.14.1, torchvision==0.29.1, the project; wheels only)"
      "$python" -m venv .venv-gpu
      .venv-gpu/bin/python -m pip install -q --only-binary=:all: torch==2.14.1 torchvision==0.29.1
      .venv-gpu/bin/python -m pip install -q --only-binary=:all: -e ".[test]"
    fi
    python=.venv-gpu/bin/python
  fi
  if ! usable "$python"; then
    echo "[gpu_check.sh] error: $python cannot import torch, ray, pydantic and hdcfl_ray after the install" >&2
    "$python" -c 'import torch, ray, pydantic, hdcfl_ray.runtime.driver' || true
    exit 2
  fi
fi

mkdir -p "$(dirname "$out")"
log="$(dirname "$out")/gpu_check.log"
"$python" -m benchmarks.gpu_check --out "$out" ${args[@]+"${args[@]}"} 2>&1 | tee "$log"
