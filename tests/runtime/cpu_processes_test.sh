#!/usr/bin/env bash
# The CPU backend with one process per rank (runtime/cpu/CpuProcessDevice):
# 1. parity: `--processes N` (and mpirun -np N --backend cpu, where Open MPI
#    is installed) gives the in-process run's numbers bit for bit (metrics
#    JSON lines: losses, grad norm, zeros, learning rate, peak bytes) for
#    tiny PP2, PP2/VPP2 and PP4, tiny_bf16 PP2 (bf16 storage in each rank),
#    tiny at dp 2 x pp 2 (four processes, the ALLREDUCE over sockets), at
#    tp 2 + SP x dp 2 x pp 2, at tp 2 x cp 2 x pp 2 and at tp 2 + SP x cp 2
#    x pp 2 (eight processes: the tensor-parallel reductions, gathers and
#    reduce-scatters and the context gathers over sockets), bf16 at
#    tp 2 + SP x pp 2, and dp 2 x pp 2 with the distributed optimizer (each
#    replica's first rank updating its shard with the moments it alone holds);
# 1b. with --recompute-sublayers under tp 2 across processes (the
#    recomputed forwards' collectives over the sockets): the same numbers;
# 2. SIGTERM to the --processes parent: every rank stops after the same
#    iteration, the ranks save it, the parent exits 143, no rank is left and
#    the bootstrap folder is gone; the checkpoint resumes (in one process)
#    exactly as an uninterrupted run;
# 2b. under mpirun, a rank started with another flag names it and ends the
#    job (MPI_Abort) instead of leaving rank 0 waiting;
# 3. the distributed optimizer across processes saves (each part's rank
#    writing its part of the moments as pieces of its own shard) a
#    checkpoint that resumes in one process exactly as an uninterrupted run,
#    and exports the same weights file as one process.
# Usage: cpu_processes_test.sh PP2 PP2_VPP2 PP4 BF16_PP2 DP2_PP2 [MESH ...]
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
mhcrun="${root}/tools/mhcrun"
corpus="${root}/data/corpus.txt"
work="${TEST_TMPDIR}/procs"
rm -rf "${work}" && mkdir -p "${work}"
python=/usr/bin/python3
source "${root}/tests/runtime/fault_helpers.sh"

# 1. Parity.
declare -A world # by artifact name: its ranks, one process each
for artifact in "$@"; do
  name=$(basename "${artifact}" .mhcc)
  # One process per rank of the mesh: pp x dp x cp x tp.
  pp=$("${python}" -c "import re,sys, math; t = sys.stdin.read()
print(math.prod(int(m.group(1)) if m else 1 for m in (re.search(k + r' = (\d+)', t) for k in ('pp', 'dp', 'cp', 'tp'))))" \
       < <("${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 1 2>&1))
  world[${name}]=${pp}
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 3 \
    --metrics "${work}/${name}.in.json" > /dev/null
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 3 \
    --processes "${pp}" --metrics "${work}/${name}.procs.json" > "${work}/${name}.procs.log"
  same_metrics "${work}/${name}.in.json" "${work}/${name}.procs.json"
  echo "ok: ${name}: --processes ${pp} == one process, bit for bit"
  if command -v mpirun > /dev/null && [ -z "${MHCC_TEST_NO_MPI:-}" ]; then
    if timeout 120 mpirun --allow-run-as-root --oversubscribe -np "${pp}" "${mhcrun}" "${root}/${artifact}" \
         --data "${corpus}" --backend cpu --no-progress --steps 3 --metrics "${work}/${name}.mpi.json" \
         > "${work}/${name}.mpi.log" 2>&1; then
      same_metrics "${work}/${name}.in.json" "${work}/${name}.mpi.json"
      echo "ok: ${name}: mpirun -np ${pp} --backend cpu == one process, bit for bit"
    else
      echo "note: mpirun did not run here (sandbox?); skipped: $(tail -1 "${work}/${name}.mpi.log")"
    fi
  fi
done

# 1b. Recomputation across processes under tensor parallelism: the
# recomputed forwards' collectives, issued inside the backward, meet over
# the sockets in the same order on every rank: the plain run's numbers.
for artifact in "$@"; do
  name=$(basename "${artifact}" .mhcc)
  [[ "${name}" == *_tp2_* ]] || continue
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 3 \
    --processes "${world[${name}]}" --recompute-sublayers --metrics "${work}/${name}.recompute.json" \
    > "${work}/${name}.recompute.log"
  grep -q "activation recomputation" "${work}/${name}.recompute.log"
  SAME_METRICS_BUT_MEMORY=1 same_metrics "${work}/${name}.in.json" "${work}/${name}.recompute.json"
  "${python}" - "${work}/${name}.in.json" "${work}/${name}.recompute.json" <<'PY'
import json, sys
plain, recomputed = ([json.loads(l)["peak_bytes_max"] for l in open(p)] for p in sys.argv[1:])
assert recomputed[-1] < plain[-1], f"peak {recomputed[-1]} recomputing, {plain[-1]} without"
PY
  echo "ok: ${name}: --processes ${world[${name}]} --recompute-sublayers == one process without, bit for bit"
  break
done

# 2. SIGTERM to the parent.
pp2="${root}/$1"
dir="${work}/term"
mkdir -p "${dir}"
"${mhcrun}" "${pp2}" --data "${corpus}" --backend cpu --no-progress --steps 100000 --processes 2 \
  --save "${dir}/ck" --metrics "${dir}/a.json" > "${dir}/a.log" 2> "${dir}/a.err" &
parent=$!
wait_lines "${dir}/a.json" 2
children=$(pgrep -P "${parent}" | tr '\n' ' ')
bootstrap=$(tr '\0' '\n' < "/proc/${children%% *}/environ" | sed -n 's/^MHCC_BOOTSTRAP_DIR=//p')
test -d "${bootstrap}"
kill -TERM "${parent}"
rc=0
wait "${parent}" || rc=$?
[ "${rc}" = 143 ] || { echo "the parent exited ${rc}, expected 143" >&2; cat "${dir}/a.err" >&2; exit 1; }
n=$(wc -l < "${dir}/a.json")
grep -qx "mhcrun: stopped by SIGTERM after iteration ${n}; checkpoint ${dir}/ck/$(printf 'iter_%07d' "${n}")" \
  "${dir}/a.log" || { echo "no stop line for iteration ${n}" >&2; tail -3 "${dir}/a.log" >&2; exit 1; }
for pid in ${children}; do
  if kill -0 "${pid}" 2> /dev/null; then echo "rank process ${pid} outlived the parent" >&2; exit 1; fi
done
test ! -e "${bootstrap}" || { echo "the bootstrap folder ${bootstrap} was left behind" >&2; exit 1; }
"${mhcrun}" "${pp2}" --data "${corpus}" --backend cpu --no-progress --steps $((n + 2)) \
  --metrics "${dir}/full.json" > /dev/null
"${mhcrun}" "${pp2}" --data "${corpus}" --backend cpu --no-progress --steps $((n + 2)) --load "${dir}/ck" \
  --metrics "${dir}/b.json" > /dev/null
same_metrics "${dir}/full.json" "${dir}/a.json" "${dir}/b.json"
echo "ok: SIGTERM to the --processes parent: both ranks stopped after iteration ${n}, exit 143, saved," \
  "no process or folder left, resumed bit-exactly"

# 2b. Under mpirun, ranks given other flags (two command lines, MPMD): the
# rank that differs names the flag and ends the job (MPI_Abort), where rank
# 0 would otherwise wait for its socket for 120 s.
if command -v mpirun > /dev/null && [ -z "${MHCC_TEST_NO_MPI:-}" ]; then
  dir="${work}/mpmd"
  mkdir -p "${dir}"
  rc=0
  start=${SECONDS}
  timeout 100 mpirun --allow-run-as-root --oversubscribe \
    -np 1 "${mhcrun}" "${pp2}" --data "${corpus}" --backend cpu --no-progress --steps 2 : \
    -np 1 "${mhcrun}" "${pp2}" --data "${corpus}" --backend cpu --no-progress --steps 2 --lr 0.001 \
    > "${dir}/mpmd.log" 2>&1 || rc=$?
  if grep -q "rank 1: --lr is '0.001' here but '0.003' on rank 0" "${dir}/mpmd.log"; then
    [ "${rc}" != 0 ] && [ "${rc}" != 124 ] && [ $((SECONDS - start)) -lt 60 ] ||
      { echo "mpirun with other flags on rank 1 exited ${rc} after $((SECONDS - start)) s" >&2; exit 1; }
    echo "ok: mpirun, rank 1 given another --lr: named, the job ended (exit ${rc}, $((SECONDS - start)) s)"
  else
    echo "note: mpirun did not run here (sandbox?); skipped: $(tail -1 "${dir}/mpmd.log")"
  fi
fi

# 3. The distributed optimizer's save across processes.
for artifact in "$@"; do
  [[ "$(basename "${artifact}")" == *zero1* ]] || continue
  dir="${work}/zero1"
  # What killed saves of iteration 2 left: markers and a torn shard, in the
  # folder of another run and in the unnamed one. This run meets in its own.
  for stale in iter_0000002.tmp iter_0000002.tmp-0123456789abcdef; do
    mkdir -p "${dir}/ck/${stale}"
    for r in 1 2 3; do touch "${dir}/ck/${stale}/shard-rank${r}.done"; done
    head -c 100 /dev/urandom > "${dir}/ck/${stale}/optim-rank1.safetensors"
  done
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 2 --processes 4 \
    --save "${dir}/ck" --metrics "${dir}/a.json" > "${dir}/a.log"
  if compgen -G "${dir}/ck/iter_0000002.tmp*" > /dev/null; then
    echo "the stale save folders outlived the save: $(ls "${dir}/ck")" >&2
    exit 1
  fi
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 4 \
    --metrics "${dir}/full.json" > /dev/null
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 4 --load "${dir}/ck" \
    --metrics "${dir}/b.json" > /dev/null
  same_metrics "${dir}/full.json" "${dir}/a.json" "${dir}/b.json"
  # Each part's rank wrote its part of the moments as pieces of its own shard.
  python3 - "${dir}/ck/iter_0000002" <<'PY'
import glob, json, struct, sys
holders = []
for path in sorted(glob.glob(sys.argv[1] + "/optim-rank*.safetensors")):
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    if json.loads(header.get("__metadata__", {}).get("mhcc_pieces", "{}")):
        holders.append(path.rsplit("/", 1)[1])
assert len(holders) == 2, f"moment pieces in {holders}, expected the two parts' ranks"
PY
  echo "ok: $(basename "${artifact}" .mhcc): saved across 4 processes (each part's rank its pieces), resumed bit-exactly"
  # --export-safetensors across processes: rank 0 holds every weight and writes the file alone.
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 2 --processes 4 \
    --export-safetensors "${dir}/procs.safetensors" > /dev/null
  "${mhcrun}" "${root}/${artifact}" --data "${corpus}" --backend cpu --no-progress --steps 2 \
    --export-safetensors "${dir}/one.safetensors" > /dev/null
  cmp "${dir}/procs.safetensors" "${dir}/one.safetensors"
  echo "ok: $(basename "${artifact}" .mhcc): --export-safetensors across 4 processes == in one, byte for byte"
done
