#!/usr/bin/env bash
# A rank lost mid-step in a multi-process CPU run (mhcrun --processes 4, tiny
# PP4): killed with SIGKILL (MHCC_TEST_KILL_RANK_AT), stopped with SIGSTOP
# (MHCC_TEST_STOP_RANK_AT, --recv-timeout 3), or stuck forever
# (MHCC_TEST_HANG_RANK_AT) under the default --recv-timeout. Every
# surviving rank exits non-zero with one line
# naming the lost rank and the iteration, within 60 s; the parent exits
# non-zero, leaves no rank process and removes its bootstrap folder. Prints
# the measured time from the start of the faulty iteration until the
# survivors, then every process, exited. Then a slow rank that progresses
# (MHCC_TEST_SLOW_RANK, 100 ms before each instruction) under --recv-timeout
# 1: waits on it last seconds, but it is never declared stuck.
# Also tp 2 x pp 2 (four processes), where the lost rank's tensor-parallel
# peer waits on it in a collective over the sockets.
# Usage: rank_loss_test.sh PP4 DP2_PP2 TP2_PP2
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
mhcrun="${root}/tools/mhcrun"
corpus="${root}/data/corpus.txt"
pp4="${root}/$1"
dp2="${root}/$2"
tp2="${root}/$3"
work="${TEST_TMPDIR}/loss"
rm -rf "${work}" && mkdir -p "${work}"
source "${root}/tests/runtime/fault_helpers.sh"
now() { date +%s.%N; }
since() { /usr/bin/python3 -c "print(f'{$(now) - $1:.1f}')"; }

# lose NAME LOST_RANK WHAT FAULT [FLAGS...]: rank LOST_RANK fails in
# iteration 3 (FAULT: VAR=VALUE for the environment; the hooks fire once the
# rank's first exchange of iteration 3 completed, runtime/exec/TestFaults.h,
# so its peers are in iteration 3 too). ARTIFACT (default PP4): a four-rank
# artifact.
lose() {
  local name=$1 lost=$2 what=$3 fault=$4 dir="${work}/$1"
  shift 4
  mkdir -p "${dir}"
  env "${fault}" "${mhcrun}" "${ARTIFACT:-${pp4}}" --data "${corpus}" --backend cpu --no-progress --steps 1000 \
    --processes 4 --metrics "${dir}/m.json" "$@" > "${dir}/out.log" 2> "${dir}/err.log" &
  local parent=$!
  wait_lines "${dir}/m.json" 1
  local children; children=$(pgrep -P "${parent}" | tr '\n' ' ')
  local bootstrap; bootstrap=$(tr '\0' '\n' < "/proc/${children%% *}/environ" | sed -n 's/^MHCC_BOOTSTRAP_DIR=//p')
  wait_lines "${dir}/m.json" 2
  local start; start=$(now) # iteration 3 begins as iteration 2's line is written
  # The survivors' lines come as they exit; the parent then stops (SIGKILLs) a stuck rank.
  for _ in $(seq 1800); do
    [ "$(grep -c '^mhcrun: rank [0-9]*: iteration' "${dir}/err.log" || true)" -ge 3 ] && break
    sleep 0.05
  done
  local survivors; survivors=$(since "${start}")
  local rc=0
  wait "${parent}" || rc=$?
  local seconds; seconds=$(since "${start}")
  [ "${rc}" != 0 ] || { echo "${what}: the run exited 0" >&2; exit 1; }
  for pid in ${children}; do
    if kill -0 "${pid}" 2> /dev/null; then echo "${what}: rank process ${pid} outlived the parent" >&2; exit 1; fi
  done
  test ! -e "${bootstrap}" || { echo "${what}: ${bootstrap} was left behind" >&2; exit 1; }
  # One line per survivor, naming the lost rank and the iteration; the parent's line.
  for rank in 0 1 2 3; do
    [ "${rank}" = "${lost}" ] && continue
    local lines; lines=$(grep -c "^mhcrun: rank ${rank}: iteration 3: .*rank ${lost} \(lost\|is stuck\)" \
                         "${dir}/err.log" || true)
    [ "${lines}" = 1 ] || { echo "${what}: rank ${rank} printed ${lines} lines naming rank ${lost}:" >&2
                            cat "${dir}/err.log" >&2; exit 1; }
  done
  [ "$(wc -l < "${dir}/err.log")" = 4 ] || { echo "${what}: expected 4 lines:" >&2; cat "${dir}/err.log" >&2; exit 1; }
  /usr/bin/python3 -c "import sys; sys.exit(0 if $survivors < 60 and $seconds < 60 else 1)" ||
    { echo "${what}: survivors gone after ${survivors} s, every process after ${seconds} s (limit 60)" >&2; exit 1; }
  echo "ok: ${what}: every survivor exited non-zero naming rank ${lost} and iteration 3 within ${survivors} s" \
    "of the iteration's start, every process (parent exit ${rc}) within ${seconds} s; nothing left. Rank 0's line:"
  grep "^mhcrun: rank 0:" "${dir}/err.log" || grep "^mhcrun: rank 1:" "${dir}/err.log"
}

lose kill 1 "rank 1 SIGKILLed mid-step" MHCC_TEST_KILL_RANK_AT=1:3
# Data parallelism (dp 2 x pp 2): rank 3, replica 1 of pipeline rank 1, dies;
# rank 2 waits on it in the gradient ALLREDUCE, rank 1 as its pipeline peer.
ARTIFACT="${dp2}" lose dp_kill 3 "dp 2 x pp 2: rank 3 SIGKILLed mid-step" MHCC_TEST_KILL_RANK_AT=3:3
# Tensor parallelism (tp 2 x pp 2): rank 1, rank 0's tensor-parallel peer,
# dies; rank 0 waits on it inside a tensor collective of its forward.
ARTIFACT="${tp2}" lose tp_kill 1 "tp 2 x pp 2: rank 1 SIGKILLed mid-step" MHCC_TEST_KILL_RANK_AT=1:3
# Stopped, a rank neither progresses nor heartbeats (nor reads its socket).
lose stop 2 "rank 2 SIGSTOPped (--recv-timeout 3)" MHCC_TEST_STOP_RANK_AT=2:3 --recv-timeout 3

# A slow rank that progresses: rank 2 takes 100 ms more per instruction, so
# the others wait on it (directly, or through a chain of waits) for 1 to 5
# s at a time, longer than --recv-timeout 1; it progresses every 100 ms, so
# nobody declares it stuck and the run finishes.
dir="${work}/slow"
mkdir -p "${dir}"
start=$(now)
MHCC_TEST_SLOW_RANK=2:100 "${mhcrun}" "${pp4}" --data "${corpus}" --backend cpu --no-progress --steps 2 \
  --processes 4 --recv-timeout 1 --metrics "${dir}/m.json" > "${dir}/out.log" 2> "${dir}/err.log" ||
  { echo "slow rank: the run failed:" >&2; cat "${dir}/err.log" >&2; exit 1; }
[ "$(wc -l < "${dir}/m.json")" = 2 ] && [ ! -s "${dir}/err.log" ] ||
  { echo "slow rank: expected 2 iterations and no error:" >&2; cat "${dir}/err.log" >&2; exit 1; }
iteration=$(/usr/bin/python3 -c "import json,sys; print(min(json.loads(l)['elapsed_ms'] for l in open(sys.argv[1])) / 1e3)" \
            "${dir}/m.json")
/usr/bin/python3 -c "import sys; sys.exit(0 if ${iteration} > 4 else 1)" ||
  { echo "slow rank: an iteration took ${iteration} s; too fast to make the waits outlast the limit" >&2; exit 1; }
echo "ok: rank 2 slow but progressing (${iteration} s per iteration, waits on it beyond --recv-timeout 1)" \
  "was not declared stuck; 2 iterations in $(since "${start}") s"

# Stuck forever under the default --recv-timeout (30 s): found within 60 s.
lose hang 2 "rank 2 stuck mid-step (default --recv-timeout)" MHCC_TEST_HANG_RANK_AT=2:3

# The same SIGKILL under mpirun (Open MPI aborts the job once a rank dies;
# the survivors must still have said which rank and iteration).
if command -v mpirun > /dev/null && [ -z "${MHCC_TEST_NO_MPI:-}" ]; then
  dir="${work}/mpirun"
  mkdir -p "${dir}"
  start=$(now)
  rc=0
  MHCC_TEST_KILL_RANK_AT=1:3 timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 "${mhcrun}" "${pp4}" \
    --data "${corpus}" --backend cpu --no-progress --steps 1000 > "${dir}/out.log" 2> "${dir}/err.log" || rc=$?
  seconds=$(since "${start}")
  if [ "${rc}" = 124 ] || ! grep -q "iteration        2/" "${dir}/out.log"; then
    echo "note: mpirun did not run here (sandbox?); skipped: $(tail -1 "${dir}/err.log")"
  else
    [ "${rc}" != 0 ] || { echo "mpirun: the job exited 0 after a rank was killed" >&2; exit 1; }
    for rank in 0 2 3; do
      [ "$(grep -c "^mhcrun: rank ${rank}: iteration 3: .*rank 1 lost" "${dir}/err.log" || true)" = 1 ] ||
        { echo "mpirun: rank ${rank} did not name rank 1:" >&2; cat "${dir}/err.log" >&2; exit 1; }
    done
    echo "ok: mpirun -np 4, rank 1 SIGKILLed mid-step: ranks 0, 2, 3 named it and iteration 3; job exit ${rc}" \
      "after ${seconds} s in all (start-up and two iterations included)"
  fi
fi
