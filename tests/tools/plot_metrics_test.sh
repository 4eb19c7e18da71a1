#!/usr/bin/env bash
# tools/plot_metrics.py (issue 17) end to end:
# 1. metrics JSON lines with mhcrun's spaced keys ("lm loss", "num-zeros")
#    and with the snake_case ones plot to the same bytes; several runs on one
#    figure, one subplot per metric (the image height counts them), a rerun
#    writes the same bytes, a golden-values file plots too;
# 2. a predicted trace (mhcc --trace, tiny PP2/VPP2) and a measured one
#    (tiny_pp2_vpp2_measured_trace.json: mhcrun --trace, one CPU step) as
#    timelines;
# 3. bad input (missing, empty or non-JSON file, a line without "iteration",
#    an unknown --metrics name, a trace without events, ...): exit 2, one line
#    on stderr naming what is wrong, and no PNG written or replaced.
# Skips (exit 0, SKIPPED) only where Debian's python3-matplotlib is missing.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
tool="${root}/tools/plot_metrics.py"
mhcc="${root}/compiler/mhcc"
tiny="${root}/models/tiny.json"
golden="${root}/goldens/tiny/golden_values_cpu.json"
measured="${root}/tests/tools/tiny_pp2_vpp2_measured_trace.json"
work="${TEST_TMPDIR}/plot"
rm -rf "${work}" && mkdir -p "${work}"
cd "${work}"
export MPLCONFIGDIR="${work}/mplconfig"
# Debian's matplotlib is seen by the system interpreter, not necessarily by a
# pyenv python3 earlier on PATH.
python=/usr/bin/python3
if ! "${python}" -c 'import matplotlib' 2>/dev/null; then
  echo "plot_metrics_test: SKIPPED: ${python} cannot import matplotlib (install python3-matplotlib: tools/setup.sh)"
  exit 0
fi

fail() { echo "plot_metrics_test: FAIL: $*" >&2; exit 1; }
plot() { "${python}" "${tool}" "$@"; }

# PNG FILE WIDTH MIN_HEIGHT [HEIGHT]: the PNG signature, IHDR's size, and
# more than a blank image's bytes.
png() {
  "${python}" - "$@" <<'EOF' || fail "$1 is not the expected PNG"
import struct, sys
path, width, min_height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = open(path, "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
    sys.exit(f"{path}: no PNG signature")
w, h = struct.unpack(">II", data[16:24])
if w != width or h < min_height or (len(sys.argv) > 4 and h != int(sys.argv[4])):
    sys.exit(f"{path}: {w}x{h}, expected width {width}, height {sys.argv[3:]}")
if not 5000 < len(data) < 400000:
    sys.exit(f"{path}: {len(data)} bytes")
EOF
}

# Two runs of 6 iterations, the first with today's spaced keys, the second
# the same numbers with snake_case keys; a third with other numbers.
"${python}" - <<'EOF'
import json
old = {"lm loss": "lm_loss", "mtp loss": "mtp_loss", "grad norm": "grad_norm", "num-zeros": "num_zeros",
       "tokens per second": "tokens_per_second", "tflops": "tflops", "elapsed ms": "elapsed_ms",
       "learning rate": "learning_rate", "peak bytes per rank": "peak_bytes_per_rank"}
def row(i, shift):
    return {"iteration": i, "lm loss": 5.5 - 0.4 * i + shift, "mtp loss": 5.6 - 0.38 * i + shift,
            "grad norm": 2.0 / i + shift, "num-zeros": 13000 + 10 * i, "tokens per second": 1200.0 + 17 * (i % 3),
            "tflops": 0.003, "elapsed ms": 850.0 - 9 * (i % 3), "learning rate": 0.003,
            "peak bytes per rank": [8690760, 5200000]}
with open("old.jsonl", "w") as f:
    for i in range(1, 7):
        f.write(json.dumps(row(i, 0.0)) + "\n")
with open("new.jsonl", "w") as f:
    for i in range(1, 7):
        f.write(json.dumps({old.get(k, k): v for k, v in row(i, 0.0).items()}) + "\n")
with open("other.jsonl", "w") as f:
    for i in range(1, 7):
        f.write(json.dumps({old.get(k, k): v for k, v in row(i, 0.05).items()}) + "\n\n"[: 1 + (i == 3)])
EOF

# 1. Curves. Default metrics here: lm, mtp loss, grad norm, tokens/s (2.4 in
# at 100 dpi each).
plot old.jsonl new.jsonl other.jsonl --labels spaced,snake,other -o three.png
png three.png 800 960 960
plot old.jsonl --labels run -o old.png
plot new.jsonl --labels run -o new.png
cmp -s old.png new.png || fail "the spaced and snake_case keys of the same run plot differently"
plot other.jsonl --labels run -o other.png
cmp -s old.png other.png && fail "two different runs plot to the same bytes"
plot new.jsonl other.jsonl --metrics lm_loss,grad_norm,tokens_per_second,peak_bytes_per_rank -o four.png
png four.png 800 960 960
plot old.jsonl --metrics num_zeros -o one.png
png one.png 800 240 240
plot old.jsonl new.jsonl other.jsonl --labels spaced,snake,other -o again.png
cmp -s three.png again.png || fail "a rerun wrote other bytes"
plot "${golden}" --labels golden -o golden.png # lm and mtp loss (no grad norm in goldens)
png golden.png 800 480 480

# 2. Timelines: predicted by mhcc, measured by mhcrun.
"${mhcc}" "${tiny}" --pp 2 --vpp 2 --microbatches 4 --print-schedule --trace predicted.json --cuda-arch none \
  > /dev/null
grep -q '"ph": "X"' predicted.json || fail "mhcc wrote no trace events"
plot --timeline predicted.json -o predicted.png
png predicted.png 1000 250
plot --timeline "${measured}" -o measured.png
png measured.png 1000 250
cmp -s predicted.png measured.png && fail "two traces drew the same timeline"

# 3. Refusals: exit 2, one line on stderr containing the words given, and
# neither a new PNG nor a replaced one nor a temporary file left behind.
printf 'not json\n' > notjson.jsonl
printf '{"iteration": 1, "lm_loss": 5}\n{"lm_loss": 4}\n' > noiter.jsonl
: > empty.jsonl
printf '[1, 2]\n' > array.jsonl
printf '{"iteration": 1, "lm loss": "high"}\n' > string.jsonl
printf '{"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}}]}\n' \
  > noevents.json
printf '{"traceEvents": [\n{"ph": "X", "ts": 1,\n' > broken.json
cp three.png keep.png
refused() { # WORDS... -- ARGS...
  local words=() out=refused.png
  while [ "$1" != "--" ]; do words+=("$1"); shift; done
  shift
  rm -f "${out}"
  local rc=0
  plot "$@" > stdout.txt 2> stderr.txt || rc=$?
  [ "${rc}" -eq 2 ] || fail "plot_metrics.py $* exited ${rc}, not 2 ($(cat stderr.txt))"
  [ "$(wc -l < stderr.txt)" -eq 1 ] || fail "plot_metrics.py $* wrote not one line on stderr: $(cat stderr.txt)"
  [ ! -s stdout.txt ] || fail "plot_metrics.py $* wrote on stdout: $(cat stdout.txt)"
  grep -q Traceback stderr.txt && fail "plot_metrics.py $* printed a traceback"
  for w in "${words[@]}"; do
    grep -qF -- "${w}" stderr.txt || fail "plot_metrics.py $*: '${w}' not in: $(cat stderr.txt)"
  done
  [ ! -e "${out}" ] || fail "plot_metrics.py $* wrote ${out}"
  ! ls .plot_metrics.* > /dev/null 2>&1 || fail "plot_metrics.py $* left a temporary file"
  echo "refused as expected: $(cat stderr.txt)"
}
refused missing.jsonl "no such file" -- missing.jsonl -o refused.png
refused notjson.jsonl:1 "not a JSON line" -- new.jsonl notjson.jsonl -o refused.png
refused noiter.jsonl:2 '"iteration"' -- noiter.jsonl -o refused.png
refused empty.jsonl "no metrics lines" -- empty.jsonl -o refused.png
refused array.jsonl:1 "not a JSON object" -- array.jsonl -o refused.png
refused string.jsonl:1 "lm loss" "not a number" -- string.jsonl -o refused.png
refused --metrics bogus lm_loss -- new.jsonl --metrics lm_loss,bogus -o refused.png
refused --labels "2 labels for 1 file" -- new.jsonl --labels a,b -o refused.png
refused noevents.json "no trace events" -- --timeline noevents.json -o refused.png
refused broken.json:3 "not JSON" -- --timeline broken.json -o refused.png
refused missing.json "no such file" -- --timeline missing.json -o refused.png
refused --timeline "no metrics files" -- new.jsonl --timeline predicted.json -o refused.png
refused "no metrics file given" -- -o refused.png
refused "-o" -- new.jsonl
refused noiter.jsonl:2 -- noiter.jsonl -o keep.png
cmp -s keep.png three.png || fail "a refused run replaced the PNG it was to write"
echo "plot_metrics_test: PASSED"
