#!/usr/bin/env bash
# Fails if a CUDA backend source uploads with a synchronous cudaMemcpy from
# the host, or fills with cudaMemset: the copy from pageable memory may
# return before its DMA has landed, and both run on the legacy stream, which
# the compute stream does not wait for (CudaRank's upload() says why;
# session 30's odd run). Files whose kernels run on the legacy stream
# themselves (the GPU probe, the wgmma layout check) are ordered with it and
# may.
set -euo pipefail
found=0
for f in "$@"; do
  case "$(basename "$f")" in Gpus.cu | FlashAttentionHopper.cu) continue ;; esac
  if grep -nE 'cudaMemcpy\([^;]*cudaMemcpyHostToDevice' "$f"; then
    echo "FAIL: $f uploads with a synchronous cudaMemcpy; use CudaRank::upload (cudaMemcpyAsync on the compute stream)"
    found=1
  fi
  if grep -nE 'cudaMemset\(' "$f"; then
    echo "FAIL: $f fills on the legacy stream (cudaMemset), unordered with the compute stream; use cudaMemsetAsync on it"
    found=1
  fi
done
[ "$#" -gt 5 ] || { echo "FAIL: only $# sources given"; exit 1; }
[ "$found" = 0 ] && echo "$# CUDA backend sources: no synchronous uploads or legacy-stream fills"
exit "$found"
