#!/usr/bin/env bash
# A stuck rank among the CPU backend's thread ranks (one process), caught in
# each collective the threads share: rank 1 hangs at its second iteration's
# first forward (MHCC_TEST_HANG_RANK_AT=1:2, runtime/exec/TestFaults.h) while
# rank 0 waits for it in a tensor-parallel collective (tp 2), the gradient
# ALLREDUCE (dp 2), a context-parallel row gather (cp 2), and, at pp 2 x
# tp 2, behind a receive from a rank that itself waits in a collective (a
# chain of waits). Each run exits non-zero with one line naming rank 1 and
# iteration 2, within --recv-timeout (2 s) plus a few; before, a rank
# waiting in a collective waited forever. Prints the measured times.
# Usage: thread_rank_stuck_test.sh TP2 DP2 CP2 TP2_PP2
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
mhcrun="${root}/tools/mhcrun"
corpus="${root}/data/corpus.txt"
work="${TEST_TMPDIR}/stuck"
mkdir -p "${work}"
now() { date +%s.%N; }

# stuck NAME ARTIFACT WHERE: the line names rank 1 as stuck, iteration 2 and WHERE.
stuck() {
  local name=$1 artifact="${root}/$2" where=$3 start rc=0
  start=$(now)
  MHCC_TEST_HANG_RANK_AT=1:2 timeout 60 "${mhcrun}" "${artifact}" --data "${corpus}" --backend cpu \
    --no-progress --steps 4 --recv-timeout 2 > "${work}/${name}.out" 2> "${work}/${name}.err" || rc=$?
  local seconds; seconds=$(/usr/bin/python3 -c "print(f'{$(now) - ${start}:.1f}')")
  [ "${rc}" != 124 ] || { echo "${name}: still running after 60 s (a wait without a deadline)" >&2; exit 1; }
  [ "${rc}" != 0 ] || { echo "${name}: exited 0 with rank 1 stuck" >&2; exit 1; }
  [ "$(wc -l < "${work}/${name}.err")" = 1 ] ||
    { echo "${name}: expected one line:" >&2; cat "${work}/${name}.err" >&2; exit 1; }
  grep -q "^mhcrun: iteration 2: rank [0-9]* .*${where}.*rank 1 is stuck: it made no progress for 2 s" \
    "${work}/${name}.err" || { echo "${name}: the line does not name ${where}, rank 1 and iteration 2:" >&2
                               cat "${work}/${name}.err" >&2; exit 1; }
  # Iteration 1 ran in full: the hang, not start-up, ended the run.
  grep -q "iteration        1/" "${work}/${name}.out" ||
    { echo "${name}: iteration 1 did not complete" >&2; cat "${work}/${name}.out" >&2; exit 1; }
  /usr/bin/python3 -c "import sys; sys.exit(0 if ${seconds} < 30 else 1)" ||
    { echo "${name}: the run took ${seconds} s to end (limit 2 s plus start-up)" >&2; exit 1; }
  echo "ok: ${name}: exit ${rc} after ${seconds} s (start-up and iteration 1 included): $(cat "${work}/${name}.err")"
}

stuck tp2 "$1" "a collective of its tensor-parallel group"
stuck dp2 "$2" "the gradient ALLREDUCE"
stuck cp2 "$3" "a row gather of its context-parallel group"
stuck tp2_pp2 "$4" ""
