#!/usr/bin/env bash
# The GPU suite, in two halves.
#
#   tools/gpu_suite.sh bundle   (here, no GPU needed) builds every GPU test,
#                               mhcrun and the artifacts they use, and copies
#                               them into .gpu_bundle/
#   tools/gpu_suite.sh run      (on the lent machine, .gpu_bundle carried)
#                               runs every GPU check, then the H200 goldens
#                               and the benchmarks, and prints a table; logs,
#                               goldens and metrics go to $OUT when it is set
#
# Results we rely on are recorded in docs/gpu_results.md.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=.gpu_bundle
# Bazel labels of the GPU test binaries; each lands in .gpu_bundle/ by name.
GPU_TESTS=(//tests:gpu_test //tests:cuda_kernels_test //tests:gpu_training_test)
ARTIFACTS=(tiny_pp1 tiny_pp2 tiny_pp2_vpp2 tiny_edge_chunks)
# name -> "model mhcc-flags": benchmark artifacts (8 microbatches).
declare -A BENCH=(
  [small_pp1]="models/small.json --pp 1"
  [small_n1_pp1]="models/small_n1.json --pp 1"
  [small_pp2]="models/small.json --pp 2"
  [small_pp2_vpp2]="models/small.json --pp 2 --vpp 2"
)

case "${1:-}" in
bundle)
  # Our own libraries linked in statically, so the binaries travel alone
  # (system libraries: CUDA, cuBLAS, NCCL come from the GPU machine).
  targets=("${GPU_TESTS[@]}" //tools:mhcrun //compiler:mhcc)
  for a in "${ARTIFACTS[@]}"; do targets+=("//tests:$a"); done
  build=(bazel build --dynamic_mode=off "${targets[@]}")
  "${build[@]}" >/dev/null 2>&1 || { "${build[@]}"; exit 1; }
  rm -rf "$bundle" && mkdir -p "$bundle"
  for t in "${GPU_TESTS[@]}"; do
    path=${t#//}
    cp "bazel-bin/${path/://}" "$bundle/${t##*:}"
  done
  cp bazel-bin/tools/mhcrun "$bundle/"
  for a in "${ARTIFACTS[@]}"; do cp "bazel-bin/tests/$a.mhcc" "$bundle/"; done
  for name in "${!BENCH[@]}"; do
    # shellcheck disable=SC2086
    bazel-bin/compiler/mhcc ${BENCH[$name]} --microbatches 8 --emit=artifact -o "$bundle/$name.mhcc"
  done
  cp data/corpus.txt tools/metrics_to_golden.py "$bundle/"
  for recipe in tiny tiny_pp2_vpp2; do
    [ -f "goldens/$recipe/golden_values_h200.json" ] && cp "goldens/$recipe/golden_values_h200.json" "$bundle/golden_h200_$recipe.json"
  done
  git rev-parse HEAD > "$bundle/COMMIT"
  echo "bundled into $bundle (commit $(cat $bundle/COMMIT)): $(ls $bundle | tr '\n' ' ')"
  ;;
run)
  [ -d "$bundle" ] || { echo "gpu_suite: no $bundle; run 'tools/gpu_suite.sh bundle' first and carry it"; exit 2; }
  export NCCL_NVLS_ENABLE=0
  logs="${OUT:-/tmp/gpu_suite}"
  mkdir -p "$logs"
  cd "$bundle"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpus.txt"
  failed=0
  printf '%-28s %-8s %s\n' check result detail > "$logs/table.txt"
  declare -A ARGS=([gpu_training_test]="corpus.txt tiny_pp1.mhcc tiny_pp1.mhcc tiny_pp2.mhcc tiny_pp2_vpp2.mhcc tiny_edge_chunks.mhcc")
  for t in "${GPU_TESTS[@]}"; do
    name=${t##*:}
    # shellcheck disable=SC2086
    if timeout 300 "./$name" ${ARGS[$name]:-} > "$logs/$name.log" 2>&1; then result=PASS; else result=FAIL; failed=$((failed + 1)); fi
    detail=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')
    printf '%-28s %-8s %s\n' "$name" "$result" "$detail" >> "$logs/table.txt"
  done
  # Goldens on this card: 20 iterations per recipe, Megatron's layout.
  for recipe in tiny:tiny_pp1 tiny_pp2_vpp2:tiny_pp2_vpp2; do
    name=${recipe%%:*}; artifact=${recipe##*:}
    if timeout 300 ./mhcrun "$artifact.mhcc" --backend cuda --data corpus.txt --steps 20 --no-progress \
        --metrics "$logs/$name.jsonl" > "$logs/golden_$name.log" 2>&1; then
      python3 metrics_to_golden.py "$logs/$name.jsonl" > "$logs/golden_values_h200_$name.json"
      result=PASS
      # An existing H200 golden must be reproduced exactly.
      if [ -f "golden_h200_$name.json" ] && ! python3 -c "
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sys.exit(0 if a == b else 1)" "golden_h200_$name.json" "$logs/golden_values_h200_$name.json"; then
        result=FAIL; failed=$((failed + 1))
      fi
    else
      result=FAIL; failed=$((failed + 1))
    fi
    printf '%-28s %-8s %s\n' "golden $name" "$result" "$(tail -1 "$logs/golden_$name.log")" >> "$logs/table.txt"
  done
  # Benchmarks: 5 iterations each, the median of the last 4.
  gpus=$(nvidia-smi --list-gpus | wc -l)
  for name in ${GPU_SUITE_BENCH:-small_pp1 small_n1_pp1 small_pp2 small_pp2_vpp2}; do
    case "$name" in *pp2*) [ "$gpus" -ge 2 ] || continue ;; esac
    if timeout 400 ./mhcrun "$name.mhcc" --backend cuda --data corpus.txt --steps 5 --no-progress \
        --metrics "$logs/bench_$name.jsonl" > "$logs/bench_$name.log" 2>&1; then
      numbers=$(python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open('$logs/bench_$name.jsonl')][1:]
print('%.1f ms/iter, %.0f tokens/s, %.2f TFLOP/s, peak MiB %s' % (statistics.median(r['elapsed ms'] for r in rows),
      statistics.median(r['tokens per second'] for r in rows), statistics.median(r['tflops'] for r in rows),
      ' '.join('%.0f' % (b / 2**20) for b in rows[-1]['peak bytes per rank'])))")
      result=PASS
    else
      numbers=$(tail -1 "$logs/bench_$name.log"); result=FAIL; failed=$((failed + 1))
    fi
    printf '%-28s %-8s %s\n' "bench $name" "$result" "$numbers" >> "$logs/table.txt"
  done
  echo "commit $(cat COMMIT), $(date -u +%Y-%m-%dT%H:%MZ)"
  cat "$logs/table.txt"
  exit $((failed > 0))
  ;;
*)
  echo "usage: tools/gpu_suite.sh bundle|run"
  exit 2
  ;;
esac
