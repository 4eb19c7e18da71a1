#!/usr/bin/env bash
# A short run of every libFuzzer target (tools/fuzz.sh) over its seeds: the
# targets build, every seed and a few thousand mutations of it pass without
# a crash, leak, hang or sanitizer report. The long runs are tools/fuzz.sh's
# job (docs/fuzzing.md). Skips, with a message, only where clang-22 is absent.
set -uo pipefail
script="$(readlink -f tools/fuzz.sh)"
out="${TEST_TMPDIR:-$(mktemp -d)}/fuzz"
FUZZ_SKIP_IF_NO_CLANG=1 "$script" --runs "${FUZZ_SMOKE_RUNS:-2000}" --out "$out"
