#!/usr/bin/env bash
# Validation passes (mhcrun --eval-interval, --split; Megatron's evaluation):
# 1. a run with validation trains exactly as one without it (the same
#    --split): the passes read the validation part under their own key and
#    leave weights, moments and step count alone;
# 2. the validation losses are the same bits across pipeline layouts (PP1,
#    PP2/VPP2), on a rerun, and with dp 2 x pp 2 in threads and in four
#    processes; the lines appear after iterations 2 and 4;
# 3. 2 + 2 iterations through a checkpoint give the uninterrupted run's
#    training and validation numbers.
# Usage: validation_cli_test.sh PP1 PP2_VPP2 DP2_PP2
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
mhcrun="${root}/tools/mhcrun"
corpus="${root}/data/corpus.txt"
pp1="${root}/$1"
vpp="${root}/$2"
dp2="${root}/$3"
work="${TEST_TMPDIR}/validation"
rm -rf "${work}" && mkdir -p "${work}"
python=/usr/bin/python3
run() { "${mhcrun}" "$@" --data "${corpus}" --backend cpu --no-progress; }

# keys FILE...: every file's rows of the keys equal the first file's.
same() {
  local keys="$1"; shift
  "${python}" - "${keys}" "$@" <<'PY'
import json, sys
keys = sys.argv[1].split(",")
rows = [[[json.loads(l).get(k) for k in keys] for l in open(p)] for p in sys.argv[2:]]
for p, r in zip(sys.argv[3:], rows[1:]):
    if r != rows[0]:
        sys.exit(f"{p} differs:\n {rows[0]}\n {r}")
PY
}
train="iteration,lm_loss,mtp_loss,grad_norm,learning_rate"
valid="iteration,validation_lm_loss,validation_mtp_loss"

run "${pp1}" --steps 4 --eval-interval 2 --metrics "${work}/pp1.json" > "${work}/pp1.log"
run "${pp1}" --steps 4 --split 98,2 --metrics "${work}/plain.json" > /dev/null
same "${train}" "${work}/plain.json" "${work}/pp1.json"
echo "ok: validation passes leave training unchanged"
[ "$(grep -c '^ validation loss at iteration [24] | lm loss value: ' "${work}/pp1.log")" -eq 2 ]
"${python}" -c "
import json, sys
v = [json.loads(l).get('validation_lm_loss') for l in open('${work}/pp1.json')]
sys.exit(0 if v[0] is None and v[2] is None and v[1] > 0 and v[3] > 0 else f'validation keys: {v}')"
run "${pp1}" --steps 4 --eval-interval 2 --metrics "${work}/again.json" > /dev/null
run "${vpp}" --steps 4 --eval-interval 2 --metrics "${work}/vpp.json" > /dev/null
same "${train},validation_lm_loss,validation_mtp_loss" "${work}/pp1.json" "${work}/again.json" "${work}/vpp.json"
echo "ok: validation losses bit-identical on a rerun and under PP2/VPP2"
run "${dp2}" --steps 4 --eval-interval 2 --metrics "${work}/dp2.json" > /dev/null
run "${dp2}" --steps 4 --eval-interval 2 --processes 4 --metrics "${work}/dp2_procs.json" > /dev/null
same "${train},validation_lm_loss,validation_mtp_loss" "${work}/dp2.json" "${work}/dp2_procs.json"
echo "ok: dp 2 x pp 2: four processes == threads, validation included"

run "${pp1}" --steps 2 --eval-interval 2 --save "${work}/ck" --metrics "${work}/a.json" > /dev/null
run "${pp1}" --steps 4 --eval-interval 2 --load "${work}/ck" --metrics "${work}/b.json" > /dev/null
cat "${work}/a.json" "${work}/b.json" > "${work}/ab.json"
same "${train},validation_lm_loss,validation_mtp_loss" "${work}/pp1.json" "${work}/ab.json"
echo "ok: 2 + 2 through a checkpoint == 4, validation included"
