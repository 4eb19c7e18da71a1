#!/usr/bin/env bash
# mhcc against the independent NumPy float64 reference (tools/reference):
# compiles tiny, small_ci and tiny_sinkhorn (gating factor 1, so H_res is far
# from uniform and every Sinkhorn iteration matters), trains each 3 steps on
# the CPU backend with --dump-tensors, and replays the run in the reference
# (losses, every gradient, AdamW, the paper's H properties). Then shows that
# the comparison can fail: two deliberately broken references must be caught.
# tiny also trains as two data-parallel replicas of a two-rank pipeline (one
# microbatch each: the same global batch of two), which the reference
# replays as one model on the global batch. tiny trains on packed documents
# too (mhc-prep's corpus, --reset-position-ids --reset-attention-mask), whose
# positions and masks the reference reads from the dump (a third broken
# reference ignores them), also with two context-parallel ranks per sequence
# (replayed as one rank per sequence). hybrid_tiny (Gated DeltaNet and
# attention layers) trains on the packed documents under a layout with an
# empty chunk: the reference's recurrence is its own, token by token.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
mhcc="${root}/compiler/mhcc"
mhcrun="${root}/tools/mhcrun"
prep="${root}/tools/mhc-prep"
check="${root}/tools/reference/check_against_mhcc.py"
corpus="${root}/data/corpus.txt"
work="${TEST_TMPDIR}"
# Debian's NumPy (tools/setup.sh installs python3-numpy) is seen by the
# system interpreter, not necessarily by a pyenv python3 earlier on PATH.
python=/usr/bin/python3
if ! "${python}" -c 'import numpy' 2>/dev/null; then
  echo "reference_test: ${python} cannot import numpy; run tools/setup.sh (python3-numpy)" >&2
  exit 1
fi

train() { # MODEL NAME [MHCC FLAGS]: artifact, 3 CPU steps, tensors under $work/NAME
  "${mhcc}" "$1" --microbatches 2 "${@:3}" --emit=artifact -o "${work}/$2.mhcc" --cuda-arch=none
  "${mhcrun}" "${work}/$2.mhcc" --backend cpu --steps 3 --data "${data:-${corpus}}" --dump-tensors "${work}/$2" \
    --no-progress ${run_flags:-} > "${work}/$2.log"
}

train "${root}/models/tiny.json" tiny
train "${root}/models/small_ci.json" small_ci
train "${root}/tests/reference/tiny_sinkhorn.json" tiny_sinkhorn
train "${root}/models/tiny.json" tiny_dp2 --microbatches 1 --dp 2 --pp 2 --layout 'Ett|ttmL'
"${prep}" --input "${corpus}" --output-prefix "${work}/corpus_docs" > /dev/null
data="${work}/corpus_docs" run_flags="--reset-position-ids --reset-attention-mask" \
  train "${root}/models/tiny.json" tiny_packed --pp 2 --vpp 2 --layout 'Et|t|t|tmL'
data="${work}/corpus_docs" run_flags="--reset-position-ids --reset-attention-mask" \
  train "${root}/models/tiny.json" tiny_packed_cp2 --cp 2 --pp 2 --layout 'Ett|ttmL'
data="${work}/corpus_docs" run_flags="--reset-position-ids --reset-attention-mask" \
  train "${root}/models/hybrid_tiny.json" hybrid_packed --pp 2 --vpp 2 --layout 'Ettt|ttt||ttmL'

echo "=== tiny"
"${python}" "${check}" "${root}/models/tiny.json" "${work}/tiny"
echo "=== tiny, dp 2 x pp 2"
"${python}" "${check}" "${root}/models/tiny.json" "${work}/tiny_dp2"
echo "=== tiny, packed documents, pp 2 x vpp 2"
"${python}" "${check}" "${root}/models/tiny.json" "${work}/tiny_packed"
echo "=== tiny, packed documents, cp 2 x pp 2"
"${python}" "${check}" "${root}/models/tiny.json" "${work}/tiny_packed_cp2"
echo "=== hybrid_tiny, packed documents, pp 2 x vpp 2 with an empty chunk"
"${python}" "${check}" "${root}/models/hybrid_tiny.json" "${work}/hybrid_packed"
echo "=== small_ci"
"${python}" "${check}" "${root}/models/small_ci.json" "${work}/small_ci"
# After 20 iterations on order-1 logits the rows are still ~3e-3 from 1
# (columns are exact: the last half-step normalizes them).
echo "=== tiny_sinkhorn"
"${python}" "${check}" "${root}/tests/reference/tiny_sinkhorn.json" "${work}/tiny_sinkhorn" --sinkhorn-tol 1e-2

expect_failure() { # BREAK MODEL NAME [ARGS]: the broken reference must disagree with mhcc
  local broken=$1 model=$2 name=$3
  shift 3
  echo "=== ${name} against the broken reference MHC_REFERENCE_BREAK=${broken} (must fail)"
  if MHC_REFERENCE_BREAK="${broken}" "${python}" "${check}" "${model}" "${work}/${name}" "$@" \
      > "${work}/broken_${broken}.log"; then
    cat "${work}/broken_${broken}.log"
    echo "reference_test: the ${broken} reference agreed with mhcc: the comparison cannot fail" >&2
    exit 1
  fi
  grep -E "^  step 1:|^reference: FAILED" "${work}/broken_${broken}.log"
}
expect_failure rms_per_stream "${root}/models/tiny.json" tiny
expect_failure sinkhorn_short "${root}/tests/reference/tiny_sinkhorn.json" tiny_sinkhorn --sinkhorn-tol 1e-2
expect_failure no_documents "${root}/models/tiny.json" tiny_packed
expect_failure no_documents "${root}/models/hybrid_tiny.json" hybrid_packed
expect_failure gdn_conv_flipped "${root}/models/hybrid_tiny.json" hybrid_packed
echo "reference_test: mhcc agrees with the reference; the broken references were caught"
