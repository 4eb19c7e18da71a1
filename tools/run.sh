#!/usr/bin/env bash
# The main job: installs missing Debian packages, builds mhcc and mhcrun,
# compiles a model (default models/tiny.json) into an artifact and trains it
# for MHCRUN_STEPS iterations (default 20) on the shipped text: on the GPUs
# when each pipeline rank can have one (mhcc compiles the model's CUDA
# kernels when nvcc is installed), else on the CPU reference backend.
# usage: tools/run.sh [MODEL.json] [mhcc flags, e.g. --pp 2 --vpp 2]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
model="${1:-models/tiny.json}"
shift || true
if ! build_log=$(bazel build //compiler:mhcc //tools:mhcrun 2>&1); then
  echo "$build_log" >&2
  echo "run.sh: the build failed (log above)" >&2
  exit 1
fi
mkdir -p out
artifact="out/$(basename "$model" .json).mhcc"
bazel-bin/compiler/mhcc "$model" --microbatches 4 "$@"
bazel-bin/compiler/mhcc "$model" --microbatches 4 "$@" --emit=artifact -o "$artifact"
exec bazel-bin/tools/mhcrun "$artifact" --data data/corpus.txt --steps "${MHCRUN_STEPS:-20}"
