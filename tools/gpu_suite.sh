#!/usr/bin/env bash
# The GPU suite, in two halves.
#
#   tools/gpu_suite.sh bundle   (here, no GPU needed) builds every GPU test and
#                               benchmark and copies them into .gpu_bundle/
#   tools/gpu_suite.sh run      (on the lent GPU machine, with .gpu_bundle
#                               carried) runs them all and prints a table;
#                               logs go to $OUT when it is set
#
# Results we rely on are recorded in docs/gpu_results.md.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=.gpu_bundle
# Bazel labels of the GPU tests; each binary lands in .gpu_bundle/ by name.
GPU_TESTS=(//tests:gpu_test //tests:cuda_kernels_test)

case "${1:-}" in
bundle)
  # Our own libraries linked in statically, so the binaries travel alone
  # (system libraries: CUDA, NCCL, MPI come from the GPU machine).
  build=(bazel build --dynamic_mode=off "${GPU_TESTS[@]}")
  "${build[@]}" >/dev/null 2>&1 || { "${build[@]}"; exit 1; }
  rm -rf "$bundle" && mkdir -p "$bundle"
  for t in "${GPU_TESTS[@]}"; do
    path=${t#//}
    cp "bazel-bin/${path/://}" "$bundle/${t##*:}"
  done
  git rev-parse HEAD > "$bundle/COMMIT"
  echo "bundled ${#GPU_TESTS[@]} binaries into $bundle (commit $(cat $bundle/COMMIT))"
  ;;
run)
  [ -d "$bundle" ] || { echo "gpu_suite: no $bundle; run 'tools/gpu_suite.sh bundle' first and carry it"; exit 2; }
  export NCCL_NVLS_ENABLE=0
  logs="${OUT:-/tmp/gpu_suite}"
  mkdir -p "$logs"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpus.txt"
  failed=0
  printf '%-28s %-8s %s\n' test result detail > "$logs/table.txt"
  for t in "${GPU_TESTS[@]}"; do
    name=${t##*:}
    if timeout 300 "$bundle/$name" --gtest_output="xml:$logs/$name.xml" > "$logs/$name.log" 2>&1; then
      result=PASS
    else
      result=FAIL
      failed=$((failed + 1))
    fi
    detail=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')
    printf '%-28s %-8s %s\n' "$name" "$result" "$detail" >> "$logs/table.txt"
  done
  echo "commit $(cat $bundle/COMMIT), $(date -u +%Y-%m-%dT%H:%MZ)"
  cat "$logs/table.txt"
  exit $((failed > 0))
  ;;
*)
  echo "usage: tools/gpu_suite.sh bundle|run"
  exit 2
  ;;
esac
