#!/usr/bin/env bash
# Deliberately regenerates the CPU goldens: goldens/<recipe>/golden_values_cpu.json,
# 20 iterations of each recipe's artifact (the same Bazel-built artifacts the
# golden test reads). No test ever runs this; commit the result with a note
# saying why the numbers moved.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A RECIPES=([tiny]=tiny_pp1 [tiny_pp2_vpp2]=tiny_pp2_vpp2 [tiny_pp4_vpp2]=tiny_pp4_vpp2
                   [tiny_bf16]=tiny_bf16_pp1 [tiny_bf16_fp32_residual]=tiny_bf16_fp32_residual_pp1
                   [hybrid_tiny_pp2_vpp2]=hybrid_pp2_vpp2_empty
                   [tiny_dp2_pp2_tp2_sp]=tiny_tp2_sp_dp2_pp2)
targets=(//tools:mhcrun)
for artifact in "${RECIPES[@]}"; do targets+=("//tests:$artifact"); done
bazel build "${targets[@]}" >/dev/null 2>&1 || bazel build "${targets[@]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for recipe in "${!RECIPES[@]}"; do
  artifact="bazel-bin/tests/${RECIPES[$recipe]}.mhcc"
  bazel-bin/tools/mhcrun "$artifact" --data data/corpus.txt --steps 20 --no-progress \
      --metrics "$work/$recipe.jsonl" > "$work/$recipe.log"
  mkdir -p "goldens/$recipe"
  python3 tools/metrics_to_golden.py "$work/$recipe.jsonl" > "goldens/$recipe/golden_values_cpu.json"
  echo "goldens/$recipe/golden_values_cpu.json: $(tail -1 "$work/$recipe.log")"
done
