#!/usr/bin/env bash
# CPU benchmark (prints numbers; not a test): the tiny recipe for 20
# iterations at PP1, PP2/VPP2 and PP4/VPP2 (4 microbatches of 128 tokens),
# reporting the median time per iteration, tokens/s and peak bytes per rank.
# Results are recorded in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //compiler:mhcc //tools:mhcrun >/dev/null 2>&1 || bazel build //compiler:mhcc //tools:mhcrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -a NAMES=(pp1 pp2_vpp2 pp4_vpp2)
declare -A FLAGS=([pp1]="--pp 1" [pp2_vpp2]="--pp 2 --vpp 2 --layout Et|t|t|tmL"
                  [pp4_vpp2]="--pp 4 --vpp 2 --layout Et|t|t||||t|mL")
printf '%-10s %14s %12s %10s %14s %s\n' layout "ms/iteration" "tokens/s" "GFLOP/s" "final lm loss" "peak MiB per rank"
for name in "${NAMES[@]}"; do
  # shellcheck disable=SC2086
  bazel-bin/compiler/mhcc models/tiny.json --microbatches 4 ${FLAGS[$name]} --emit=artifact -o "$work/$name.mhcc"
  bazel-bin/tools/mhcrun "$work/$name.mhcc" --data data/corpus.txt --steps 20 --no-progress \
      --metrics "$work/$name.jsonl" > /dev/null
  python3 - "$work/$name.jsonl" "$name" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = statistics.median(r["elapsed ms"] for r in rows)
tps = statistics.median(r["tokens per second"] for r in rows)
gflops = statistics.median(r["tflops"] for r in rows) * 1e3
peak = " ".join(f'{b / 2**20:.1f}' for b in rows[-1]["peak bytes per rank"])
print(f'{sys.argv[2]:<10} {ms:14.1f} {tps:12.1f} {gflops:10.2f} {rows[-1]["lm loss"]:14.6f} {peak}')
PY
done
