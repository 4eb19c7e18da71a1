#!/usr/bin/env bash
# SIGTERM / SIGINT stop mhcrun at an iteration boundary (CPU backend, tiny PP2):
# the run writes a final checkpoint of the iteration it finished, prints one
# line, exits 128 + the signal, and the checkpoint resumes bit-exactly (the
# metrics JSON lines of stopped + resumed equal an uninterrupted run's).
# Usage: stop_signal_test.sh PP2_ARTIFACT
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
mhcrun="${root}/tools/mhcrun"
corpus="${root}/data/corpus.txt"
pp2="${root}/$1"
work="${TEST_TMPDIR}/stop"
rm -rf "${work}" && mkdir -p "${work}"
python=/usr/bin/python3
run() { "${mhcrun}" "$@" --data "${corpus}" --backend cpu --no-progress; }

source "${root}/tests/runtime/fault_helpers.sh"

# stop_and_resume SIGNAL: stop a long run after >= 2 iterations, resume to
# iteration last+2, compare with an uninterrupted run of that length.
stop_and_resume() {
  local sig=$1 dir="${work}/$1"
  mkdir -p "${dir}"
  # mhcrun itself in the background (not the shell function), so the signal reaches it.
  "${mhcrun}" "${pp2}" --data "${corpus}" --backend cpu --no-progress --steps 100000 --save "${dir}/ck" \
    --metrics "${dir}/a.json" > "${dir}/a.log" 2>&1 &
  local pid=$!
  wait_lines "${dir}/a.json" 2
  kill "-${sig}" "${pid}"
  local rc=0
  wait "${pid}" || rc=$?
  local code=$((128 + $(kill -l "${sig}")))
  [ "${rc}" = "${code}" ] || { echo "SIG${sig}: exit ${rc}, expected ${code}" >&2; cat "${dir}/a.log" >&2; exit 1; }
  local n; n=$(wc -l < "${dir}/a.json")
  local folder; folder=$(printf '%s/ck/iter_%07d' "${dir}" "${n}")
  grep -qx "mhcrun: stopped by ${sig} after iteration ${n}; checkpoint ${folder}" "${dir}/a.log" ||
    { echo "no stop line for iteration ${n}:" >&2; tail -3 "${dir}/a.log" >&2; exit 1; }
  test "$(cat "${dir}/ck/latest_checkpointed_iteration.txt")" = "${n}"
  run "${pp2}" --steps $((n + 2)) --metrics "${dir}/full.json" > /dev/null
  run "${pp2}" --steps $((n + 2)) --load "${dir}/ck" --metrics "${dir}/b.json" > /dev/null
  same_metrics "${dir}/full.json" "${dir}/a.json" "${dir}/b.json"
  echo "ok: ${sig} stopped after iteration ${n} (exit ${rc}), saved, resumed to $((n + 2)) bit-exactly"
}
stop_and_resume SIGTERM
stop_and_resume SIGINT
