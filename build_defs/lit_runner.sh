#!/usr/bin/env bash
# Runs one lit test file from Bazel's runfiles with LLVM 22's lit.
# Tools (mhcc, mhc-opt) come from the runfiles; FileCheck and not from LLVM 22.
set -euo pipefail
test_file="$1"
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export MHCC_TOOLS_PATH="${root}/compiler:${root}/tools:/usr/lib/llvm-22/bin"
export MHCC_LIT_EXEC_ROOT="${TEST_TMPDIR}/lit"
export MHCC_SOURCE_ROOT="${root}"
exec /usr/lib/llvm-22/bin/lit -v --no-progress-bar "${root}/${test_file}"
