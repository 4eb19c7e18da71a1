#!/usr/bin/env bash
# The main job: installs missing Debian packages, builds mhcc and compiles a
# model (default models/small.json), printing its summary: parameters, FLOPs
# per token and the n*C width every pipeline boundary carries.
# usage: tools/run.sh [MODEL.json] [mhcc flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
model="${1:-models/small.json}"
shift || true
if ! build_log=$(bazel build //compiler:mhcc //tools:mhc-opt 2>&1); then
  echo "$build_log" >&2
  echo "run.sh: the build failed (log above)" >&2
  exit 1
fi
exec bazel-bin/compiler/mhcc "$model" "$@"
