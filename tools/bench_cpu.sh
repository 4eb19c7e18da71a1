#!/usr/bin/env bash
# CPU benchmark (prints numbers; not a test): tiny and small_ci for 20
# iterations at PP1, PP2/VPP2 and PP4/VPP2 (4 microbatches), reporting the
# median time per iteration, tokens/s, the final loss and peak bytes per
# rank, and (from --profile, over the iterations after the first) the
# measured step and bubble beside the prediction mhcc recorded. The
# prediction uses a cpu profile measured first, in the same run, on tiny
# and small_ci at PP1 (mhcrun --device-profile-out; the VM's speed drifts
# by 20% from hour to hour, so the built-in profile's rates are not this
# hour's); BENCH_CPU_PROFILE=cpu uses the built-in one instead. Results are
# recorded in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //compiler:mhcc //tools:mhcrun >/dev/null 2>&1 || bazel build //compiler:mhcc //tools:mhcrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -a NAMES=(tiny_pp1 tiny_pp2_vpp2 tiny_pp4_vpp2 small_ci_pp1 small_ci_pp2_vpp2 small_ci_pp4_vpp2)
declare -A FLAGS=([tiny_pp1]="models/tiny.json --pp 1"
                  [tiny_pp2_vpp2]="models/tiny.json --pp 2 --vpp 2 --layout Et|t|t|tmL"
                  [tiny_pp4_vpp2]="models/tiny.json --pp 4 --vpp 2 --layout Et|t|t||||t|mL"
                  [small_ci_pp1]="models/small_ci.json --pp 1"
                  [small_ci_pp2_vpp2]="models/small_ci.json --pp 2 --vpp 2"
                  [small_ci_pp4_vpp2]="models/small_ci.json --pp 4 --vpp 2 --layout Ettt|ttt||ttt|ttt|||mL")
profile=${BENCH_CPU_PROFILE:-}
if [ -z "$profile" ]; then
  for model in tiny small_ci; do
    bazel-bin/compiler/mhcc "models/$model.json" --pp 1 --microbatches 4 --cuda-arch none --emit=artifact \
      -o "$work/$model.profile.mhcc"
    bazel-bin/tools/mhcrun "$work/$model.profile.mhcc" --data data/corpus.txt --steps 20 --no-progress \
      --device-profile-out "$work/$model.profile.json" > /dev/null
  done
  profile="$work/cpu-now.json"
  python3 - "$work/tiny.profile.json" "$work/small_ci.profile.json" "$profile" <<'PY'
import json, sys
parts = [json.load(open(p)) for p in sys.argv[1:3]]
merged = {"format": "mhcc-device-profile-v1", "name": "cpu-now", "dtype": "f32",
          "source": "tiny and small_ci at PP1, measured by tools/bench_cpu.sh in this run",
          "measurements": [{"measured_on": p["measured_on"], "unit_ms": p["unit_ms"]} for p in parts],
          "optimizer_ns_per_param": sum(p["optimizer_ns_per_param"] for p in parts) / 2,
          "shared_cores": parts[0]["shared_cores"]}
json.dump(merged, open(sys.argv[3], "w"))
PY
fi
echo "device profile: $profile"
printf '%-18s %9s %9s %8s %11s %9s %9s %7s %9s %9s  %s\n' layout "ms/iter" "tokens/s" "GFLOP/s" "final loss" \
  "step ms" "pred ms" "ratio" "bubble" "pred bub" "peak MiB per rank"
for name in "${NAMES[@]}"; do
  # shellcheck disable=SC2086
  bazel-bin/compiler/mhcc ${FLAGS[$name]} --microbatches 4 --cuda-arch none --device-profile "$profile" \
    --emit=artifact -o "$work/$name.mhcc"
  bazel-bin/tools/mhcrun "$work/$name.mhcc" --data data/corpus.txt --steps 20 --no-progress --profile \
      --metrics "$work/$name.jsonl" > "$work/$name.log"
  python3 - "$work/$name.jsonl" "$name" "$work/$name.log" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = statistics.median(r["elapsed_ms"] for r in rows)
tps = statistics.median(r["tokens_per_second"] for r in rows)
gflops = statistics.median(r["tflops"] for r in rows) * 1e3
peak = " ".join(f'{b / 2**20:.1f}' for b in rows[-1]["peak_bytes_per_rank"])
line = next(l for l in open(sys.argv[3]) if l.startswith("mhcrun: measured step"))
m = re.search(r"measured step ([0-9.]+) ms .*bubble fraction ([0-9.]+) .*predicted ([0-9.]+) ms, ([0-9.]+)", line)
step, bubble, pred, pbubble = (float(x) for x in m.groups())
print(f'{sys.argv[2]:<18} {ms:9.1f} {tps:9.1f} {gflops:8.2f} {rows[-1]["lm_loss"]:11.6f} {step:9.1f} {pred:9.1f} '
      f'{step / pred:7.2f} {bubble:9.3f} {pbubble:9.3f}  {peak}')
PY
done
