#!/usr/bin/env bash
# One device call that compares runtime variants of the same bundle: run it
# on the lent machine from .gpu_bundle (tools/gpu_suite.sh bundle and pack
# here, .gpu_bundle.tar.xz carried):
#
#   bash tools/gpu_suite.sh unpack && cd .gpu_bundle && PROBE_AB=1 bash ../tools/gpu_probe.sh
#
# Environment (every part optional, run in this order; results go to
# $OUT/summary.txt line by line and everything to $OUT/all.tgz):
#   PROBE_TESTS=1       cuda_bf16_kernels_test and cuda_mhc_mixing_kernels_test at n = 4, 2, 8 (the kernels' bits)
#   PROBE_AB=1          each variant's 1b step time: median of steps 2 to
#                       PROBE_STEPS (default 6) and the first six losses
#                       (their bits must agree), variants alternating,
#                       PROBE_ROUNDS rounds (default 2);
#                       PROBE_N1=1 adds 1b_n1 under the first variant,
#                       PROBE_N1=all under every one
#   PROBE_VARIANTS      "name=ENV ..." (default "new= kernels=MHCC_MHC_BACKWARD=kernels";
#                       an empty ENV is the default runtime; several variables
#                       separated by commas: "off=MHCC_MHC_FORWARD=entry,MHCC_MHC_BACKWARD=passes")
#   PROBE_NCU=1         ncu's per-kernel time and DRAM bytes over one 1b_m1
#                       step (kernel_table.py against gemm_bench's copy
#                       bandwidth of the same call), for PROBE_NCU_VARIANTS
#                       (names from PROBE_VARIANTS; default all)
#   GPU_SUITE_PARTS     then tools/gpu_suite.sh run with these parts (and its
#                       own variables), bounded by PROBE_SUITE_S seconds (300)
set -uo pipefail
export NCCL_NVLS_ENABLE=0
: "${OUT:?OUT must name the folder results go to}"
S=$OUT/summary.txt
R=$(mktemp -d /tmp/probe.XXXX)
: > "$S"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$S" 2>/dev/null || echo "no nvidia-smi" >> "$S"
declare -A ENVS
ORDER=()
for v in ${PROBE_VARIANTS:-new= kernels=MHCC_MHC_BACKWARD=kernels}; do
  ORDER+=("${v%%=*}")
  ENVS[${v%%=*}]=${v#*=}
done
variantEnv() { [ -n "${ENVS[$1]}" ] && echo "${ENVS[$1]//,/ }"; }

if [ -n "${PROBE_TESTS:-}" ]; then
  timeout 200 ./cuda_bf16_kernels_test tiny_bf16_pp1.mhcc > "$R/bf16_kernels.log" 2>&1
  echo "cuda_bf16_kernels_test rc=$?" >> "$S"
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|differ" "$R/bf16_kernels.log" | head -20 >> "$S"
  for image in tiny_bf16_pp1 tiny_bf16_n2_pp1 tiny_bf16_n8_pp1; do
    [ -f "$image.mhcc" ] || continue
    timeout 200 ./cuda_mhc_mixing_kernels_test "$image.mhcc" > "$R/mixing_kernels_$image.log" 2>&1
    echo "cuda_mhc_mixing_kernels_test $image rc=$?" >> "$S"
    grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|differ|cluster kernel at" "$R/mixing_kernels_$image.log" | head -20 >> "$S"
  done
fi
if [ -n "${PROBE_AB:-}" ]; then
  for round in $(seq 1 "${PROBE_ROUNDS:-2}"); do
    for v in "${ORDER[@]}"; do
      models=(1b_pp1)
      if [ "${PROBE_N1:-}" = all ] || { [ -n "${PROBE_N1:-}" ] && [ "$v" = "${ORDER[0]}" ]; }; then
        models+=(1b_n1_pp1)
      fi
      for m in "${models[@]}"; do
        log=$R/${v}_${m}_$round
        # shellcheck disable=SC2046 # the variant's NAME=VALUE words
        timeout 120 env $(variantEnv "$v") ./mhcrun "$m.mhcc" --data corpus.txt --steps "${PROBE_STEPS:-6}" --no-progress \
          --metrics "$log.jsonl" > "$log.log" 2>&1
        echo "$v $m r$round rc=$? $(python3 -c "
import json, statistics, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
    print('median_ms=%.1f' % statistics.median(r['elapsed_ms'] for r in rows[1:]),
          'loss=', ' '.join('%.7f' % r['lm_loss'] for r in rows[:6]))
except Exception as e:
    print('no metrics:', type(e).__name__, str(e)[:80])
" "$log.jsonl" 2>&1)" >> "$S"
      done
    done
  done
fi
if [ -n "${PROBE_NCU:-}" ]; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  copy=$(timeout 120 ./gemm_bench 2>/dev/null | sed -n 's/^copy: \([0-9.]*\) GB.*/\1/p' | head -1)
  for v in ${PROBE_NCU_VARIANTS:-${ORDER[@]}}; do
    # shellcheck disable=SC2046 # the variant's NAME=VALUE words
    timeout 150 env $(variantEnv "$v") "$ncu" --clock-control none --csv --launch-count 2000 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      ./mhcrun 1b_m1_pp1.mhcc --data corpus.txt --steps 1 --no-progress > "$R/ncu_$v.csv" 2> "$R/ncu_$v.err"
    python3 kernel_table.py "$R/ncu_$v.csv" "${copy:-4300}" > "$R/kernel_table_$v.txt" 2>&1
    echo "kernel table $v (copy ${copy:-?} GB/s):" >> "$S"
    grep -i "mhc\|residual\|row_scale" "$R/kernel_table_$v.txt" | head -30 >> "$S"
  done
fi
if [ -n "${GPU_SUITE_PARTS:-}" ]; then
  OUT=$R/suite timeout "${PROBE_SUITE_S:-300}" bash ../tools/gpu_suite.sh run > "$R/suite.log" 2>&1
  cat "$R/suite/table.txt" >> "$S" 2>/dev/null
fi
tar czf "$OUT/all.tgz" -C "$R" . 2>/dev/null
