#!/usr/bin/env bash
# The simulator's costs end to end on the CPU backend (issue 17):
# 1. mhcrun --device-profile-out writes a profile of the run (tiny, with MTP:
#    every unit kind) that mhcc --device-profile reads and names in its
#    prediction; --profile prints the measured step beside the prediction the
#    artifact records; a hybrid stack's profile has a "gdn" unit too;
# 2. the default profile follows the target (cpu for --cuda-arch none, the
#    H200 profile of the model's dtype otherwise), and --sim-tflops gives
#    nominal rates;
# 3. a profile that is not one (corrupt JSON, a device, a missing file) and
#    --device-profile-out onto an input are refused with one line, exit 1.
# No time is asserted: predictions are measured by tools/bench_cpu.sh.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
mhcc="${root}/compiler/mhcc"
mhcrun="${root}/tools/mhcrun"
tiny="${root}/models/tiny.json"
tiny_bf16="${root}/models/tiny_bf16.json"
hybrid="${root}/models/hybrid_tiny.json"
corpus="${root}/data/corpus.txt"
work="${TEST_TMPDIR}/profile"
rm -rf "${work}" && mkdir -p "${work}"
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Measure, read back, predict.
"${mhcc}" "${tiny}" --pp 1 --microbatches 2 --cuda-arch none --emit=artifact -o "${work}/t.mhcc"
"${mhcrun}" "${work}/t.mhcc" --data "${corpus}" --steps 3 --no-progress --device-profile-out "${work}/p.json" \
  > "${work}/run.log"
grep -q '^mhcrun: profile, ms per iteration' "${work}/run.log" || fail "--device-profile-out did not imply --profile"
grep -Eq '^mhcrun: measured step [0-9.]+ ms \(pipeline and optimizer, wall\), bubble fraction 0\.[0-9]+ .*; predicted [0-9.]+ ms, 0\.[0-9]+ with device profile cpu \(' \
  "${work}/run.log" || fail "no measured step beside the prediction: $(grep measured "${work}/run.log")"
/usr/bin/python3 - "${work}/p.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["format"] == "mhcc-device-profile-v1" and p["name"] == "cpu-f32", p
assert p["measured_on"]["hidden"] == 64 and p["measured_on"]["streams"] == 4, p["measured_on"]
units = p["unit_ms"]
for kind in ("embedding", "expand", "attention", "mlp", "contract", "final_norm", "lm_head", "loss", "mtp", "mhc"):
    assert units[kind]["forward"] > 0 and units[kind]["backward"] > 0, (kind, units.get(kind))
# tiny's MTP module holds a sublayer pair and more: it costs more than one sublayer.
assert units["mtp"]["forward"] > units["attention"]["forward"], units
assert p["optimizer_ns_per_param"] > 0, p
PY
"${mhcc}" "${hybrid}" --pp 1 --microbatches 1 --cuda-arch none --emit=artifact -o "${work}/h.mhcc"
"${mhcrun}" "${work}/h.mhcc" --data "${corpus}" --steps 2 --no-progress --device-profile-out "${work}/h.json" \
  > "${work}/hybrid.log"
/usr/bin/python3 - "${work}/h.json" <<'PY'
import json, sys
units = json.load(open(sys.argv[1]))["unit_ms"]
for kind in ("attention", "gdn", "mlp", "mtp", "mhc"):
    assert units[kind]["forward"] > 0 and units[kind]["backward"] > 0, (kind, units.get(kind))
PY
"${mhcc}" "${hybrid}" --pp 2 --microbatches 2 --device-profile "${work}/h.json" | grep -q 'with device profile cpu-f32' \
  || fail "the hybrid profile is not read back"
"${mhcc}" "${tiny}" --pp 2 --microbatches 4 --device-profile "${work}/p.json" > "${work}/summary.txt"
grep -Eq 'predicted step [0-9.]+ ms with device profile cpu-f32 \(mhcrun --profile, tiny pp 1 vpp 1 m 2, cpu backend, 2 iterations, [0-9-]+; 0\.00 GB/s P2P; ranks share [0-9]+ cores\)' \
  "${work}/summary.txt" || fail "the measured profile is not named (with the host's cores): $(grep predicted "${work}/summary.txt")"

# 2. Defaults and nominal rates.
"${mhcc}" "${tiny}" --pp 2 --cuda-arch none | grep -q 'with device profile cpu (' || fail "default for --cuda-arch none"
"${mhcc}" "${tiny}" --pp 2 --cuda-arch sm_90 --compile-to schedule | grep -q 'with device profile h200-fp32 (' \
  || fail "default for an f32 GPU model"
"${mhcc}" "${tiny_bf16}" --pp 2 --cuda-arch sm_90 | grep -q 'with device profile h200-bf16 (' \
  || fail "default for a bf16 GPU model"
"${mhcc}" "${tiny}" --pp 2 --sim-tflops 100 --sim-link-gbps 10 \
  | grep -q 'with nominal rates: 100.00 TFLOP/s and 10.00 GB/s P2P' || fail "--sim-tflops"

# 3. Refusals: one line, exit 1.
refused() { # EXPECTED_TEXT COMMAND...
  local expected="$1"; shift
  if "$@" > "${work}/out.txt" 2> "${work}/err.txt"; then fail "accepted: $*"; fi
  [ "$(wc -l < "${work}/err.txt")" -eq 1 ] || fail "not one line: $(cat "${work}/err.txt")"
  grep -q -- "${expected}" "${work}/err.txt" || fail "expected '${expected}': $(cat "${work}/err.txt")"
}
echo '{"format": "mhcc-device-profile-v1", "unit_ms": {"mlp": {"forward": 1, "backward": 1}}}' > "${work}/bad.json"
refused "--device-profile: ${work}/bad.json: \"measured_on\" needs" "${mhcc}" "${tiny}" --device-profile "${work}/bad.json"
refused "not a regular file" "${mhcc}" "${tiny}" --device-profile /dev/zero
refused "neither a built-in profile (h200-bf16, h200-fp32, cpu) nor a readable file" \
  "${mhcc}" "${tiny}" --device-profile h100
refused "a flat rate and --device-profile exclude each other" \
  "${mhcc}" "${tiny}" --device-profile cpu --sim-tflops 3
refused "--device-profile-out ${work}/t.mhcc: is the input" \
  "${mhcrun}" "${work}/t.mhcc" --data "${corpus}" --steps 1 --device-profile-out "${work}/t.mhcc"
cmp -s "${work}/t.mhcc" "${work}/t.mhcc" # still there
echo "device profile CLI: measured, read back, defaults and refusals as expected"
