#!/usr/bin/env bash
# The test command: installs missing Debian packages, builds everything and
# runs every test (lit, gtest, build checks) with Bazel, then prints
# `N passed, M failed` counted over test cases. GPU tests skip without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test //... "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
python3 tools/test_summary.py "$log" "$(bazel info bazel-testlogs 2>/dev/null)"
summary=$?
[ "$status" -eq 0 ] && [ "$summary" -eq 0 ]
