# Shared by the stop and fault tests (sourced).

# same_metrics EXPECTED TAIL...: the tail files' metrics lines, together,
# equal the end of the expected file's (iteration, losses, grad norm, zeros,
# learning rate, peak bytes).
same_metrics() {
  /usr/bin/python3 - "$@" <<'PY'
import json, os, sys
keys = ["iteration", "lm_loss", "mtp_loss", "grad_norm", "num_zeros", "learning_rate"]
if not os.environ.get("SAME_METRICS_BUT_MEMORY"):  # set: a run whose memory differs by design
    keys.append("peak_bytes_per_rank")
rows = lambda paths: [[json.loads(l).get(k) for k in keys] for p in paths for l in open(p)]
expected, got = rows([sys.argv[1]]), rows(sys.argv[2:])
if expected[-len(got):] != got or len(got) == 0:
    sys.exit(f"metrics differ:\n expected {expected}\n got      {got}")
PY
}

# wait_lines FILE N: until FILE has at least N lines (60 s at most).
wait_lines() {
  for _ in $(seq 1200); do
    [ -f "$1" ] && [ "$(wc -l < "$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  echo "timed out waiting for $2 lines in $1" >&2
  exit 1
}
