#!/usr/bin/env bash
# Compile-time benchmark (prints numbers; not a test): mhcc's wall time and
# peak memory for deep pipelines, without nvcc (--cuda-arch none), from the
# model graph to the verified schedule and its summary. Models are tiny's
# sizes (C = 64, n = 4) with L layers, so the time is the compiler's, not
# the cost of large tensors. The simulator prices them with a GPU profile
# (h200-fp32, a device per rank): deep pipelines are GPU runs, and the CPU
# profile's 2 shared cores would add its processor-sharing iterations
# (about 0.5 s at PP64/VPP2, m = 512) to a case no CPU host runs. Rows:
#   - PP8 ... PP256, two chunks per rank where the bound allows, one layer
#     per virtual stage, 128 microbatches: time should grow linearly with the
#     stage x microbatch pairs the schedule holds;
#   - the issue-17 case: 128 layers at PP64/VPP2 with 512 microbatches.
# Results are recorded in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //compiler:mhcc >/dev/null 2>&1 || bazel build //compiler:mhcc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

make_model() { # LAYERS OUT: tiny's sizes, LAYERS layers, no MTP (tools/gen_models.py's graph)
  python3 - "$1" "$2" <<'PY'
import json, sys
sys.path.insert(0, "tools")
from gen_models import MODELS, graph
layers, out = int(sys.argv[1]), sys.argv[2]
config = MODELS["tiny"][1]
json.dump(graph(f"deep{layers}", "compile benchmark", config, layers, []), open(out, "w"))
PY
}

printf '%-22s %8s %8s %10s %9s %9s\n' case layers stages "pairs" seconds "peak MiB"
run() { # NAME LAYERS PP VPP M
  local name=$1 layers=$2 pp=$3 vpp=$4 m=$5 model="$work/deep$2.json"
  [ -f "$model" ] || make_model "$layers" "$model"
  local secs=999 kib=0 s k
  for _ in 1 2 3; do # the fastest of three: the machine is shared
    /usr/bin/time -f '%e %M' -o "$work/time" bazel-bin/compiler/mhcc "$model" --cuda-arch none --device-profile h200-fp32 \
      --pp "$pp" --vpp "$vpp" --microbatches "$m" > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
    read -r s k < "$work/time"
    if (( $(echo "$s < $secs" | bc) )); then secs=$s; fi
    (( k > kib )) && kib=$k
  done
  printf '%-22s %8d %8d %10d %9.2f %9.1f\n' "$name" "$layers" $((pp * vpp)) $((pp * vpp * m)) "$secs" \
    "$(echo "$kib / 1024" | bc -l)"
}
for pp in 8 16 32 64 128; do
  run "PP$pp/VPP2, m=128" $((2 * pp)) "$pp" 2 128
done
run "PP256/VPP1, m=128" 256 256 1 128
run "PP64/VPP2, m=512" 128 64 2 512
