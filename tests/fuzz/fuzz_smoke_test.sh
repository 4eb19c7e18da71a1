#!/usr/bin/env bash
# A short run of the plain-C++ libFuzzer targets (tools/fuzz.sh) over their
# seeds (the MLIR targets replay theirs in the *_fuzz_replay tests): the
# targets build, every seed and a few thousand mutations of it pass without
# a crash, leak, hang or sanitizer report. The long runs are tools/fuzz.sh's
# job (docs/fuzzing.md). Skips, with a message, only where clang-22 is absent.
set -uo pipefail
script="$(readlink -f tools/fuzz.sh)"
out="${TEST_TMPDIR:-$(mktemp -d)}/fuzz"
FUZZ_SKIP_IF_NO_CLANG=1 "$script" --runs "${FUZZ_SMOKE_RUNS:-2000}" --out "$out" \
  model_graph layout artifact safetensors dataset checkpoint checkpoint_tensors mhcrun_flags prep
