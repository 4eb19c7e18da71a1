#!/usr/bin/env bash
# The chunked WY form of Gated DeltaNet that runtime/cuda/GdnWy.cu runs, in
# float64 NumPy (tools/reference/gdn_wy.py), against the token-by-token
# recurrence and its finite differences; and four deliberately wrong variants
# (no decay to the chunk's end, no state decay across the chunk, document
# starts ignored, a first-order inverse) that the check must reject.
set -euo pipefail
script="${TEST_SRCDIR}/${TEST_WORKSPACE}/tools/reference/gdn_wy.py"
python3 "${script}" || { echo "FAIL: the WY form does not match the recurrence"; exit 1; }
for broken in rho gam_end reset inverse; do
  if python3 "${script}" --break "${broken}" > /dev/null; then
    echo "FAIL: the check accepted the broken variant '${broken}'"
    exit 1
  fi
done
echo "PASS: the WY form matches; the four broken variants are caught"
