#!/usr/bin/env bash
# The GPU suite, in two halves.
#
#   tools/gpu_suite.sh bundle   (here, no GPU needed) builds every GPU test,
#                               mhcrun, the MPI plugin and the artifacts they
#                               use, and copies them into .gpu_bundle/
#   tools/gpu_suite.sh run      (on the lent machine, in .gpu_bundle, unpacked)
#                               runs every GPU check, the H200 goldens and
#                               the benchmarks, and prints a table; logs,
#                               goldens and metrics go to $OUT as one
#                               archive (suite_logs.tgz) plus table.txt
#   tools/gpu_suite.sh pack     (here, after bundle) .gpu_bundle as one xz
#                               archive, .gpu_bundle.tar.xz (the whole bundle,
#                               173 MiB, packs into 10 MiB): carry that, and
#                               start the call with
#   tools/gpu_suite.sh unpack   (on the lent machine) which restores .gpu_bundle
#   tools/gpu_suite.sh prune GPUS [transport|mesh|context|bench|memory]
#                               (here, after bundle) fits .gpu_bundle unpacked
#                               into the device tool's 64 MiB carry for a
#                               machine of GPUS (1 or 2) H200s, or selects
#                               what a packed call runs: drops the artifacts it
#                               cannot run or the call will not use (one GPU:
#                               `transport` keeps the C=4096/7168 bf16
#                               layouts instead of the benchmarks, `mesh`
#                               the dp / tp / SP groups, `context` the cp
#                               groups and tiny's references; two GPUs:
#                               `bench` keeps the benchmarks and traces alone)
#   tools/gpu_suite.sh adopt-goldens DIR
#                               (here) copies golden_values_h200_*.json from
#                               an unpacked suite_logs.tgz into goldens/: the
#                               one deliberate way to change an H200 golden
#
# Environment for `run`: GPU_SUITE_PARTS (default "checks goldens checkpoint
# bench"; checkpoint: tiny 10 + 10 iterations == 20 at PP1 and at PP2 with
# --gpus 2, the PP2 checkpoint resumed under PP1, dp 2 zero1, tp 2 and cp 2
# checkpoints resumed at other layouts (zero1 and tp 2 also with --gpus 2:
# each rank's pieces in its own shard), and SIGTERM to a --gpus 2
# run: exit 143, its final save resumes exactly; opt-in "ceilings":
# tools/gemm_bench.cu's copy bandwidth and bf16 / fp32 GEMM table; opt-in
# "sanitizers": compute-sanitizer memcheck, racecheck and synccheck; opt-in
# "profiles": device profiles of 1b, small and hybrid_1b for mhcc --device-profile;
# opt-in "faults": a rank SIGKILLed or stuck mid-step under --gpus 2;
# opt-in "repeat": GPU_SUITE_REPEAT's artifacts run GPU_SUITE_REPEAT_N
# times each, the same bits every time (tools/gpu_suite_optin.sh);
# opt-in "memory": GPU_SUITE_MEMORY's artifacts (default 1b PP1, PP2 and
# PP2/VPP2 and dp 2 with and without the distributed optimizer, their ranks
# sharing the GPU, and fp32 PP1) plain and with --recompute-sublayers: peak
# a rank against the fp32 1b's at the layout, ms/iter, the same bits
# (`prune 1 memory` keeps what it and the repeat part need);
# opt-in "trace": mhcrun --trace of GPU_SUITE_TRACE's artifacts, default
# 1b_pp1 small_pp1 small_pp2 small_pp2_vpp2 1b_pp2_vpp2, checked against
# mhcc's predicted trace, both into suite_logs.tgz, spans and bubbles side
# by side in the table; opt-in "convergence": GPU_SUITE_CONVERGENCE's 1b
# runs against fp32 over 100 iterations),
# GPU_SUITE_PARITY (parity groups, default "tiny tiny_pool small c4096 c7168",
# the bf16 and packed-document groups and the PP4 groups),
# GPU_SUITE_BENCH (benchmark names, default all), GPU_SUITE_BENCH_DATA (the
# benchmarks' --data, default corpus.txt; corpus_docs: the corpus as
# documents, for --reset-attention-mask), GPU_SUITE_PROFILE
# (artifacts to run with --profile after the benchmarks), GPU_SUITE_MHCRUN_FLAGS
# (extra mhcrun flags for the goldens and benchmarks, e.g. "--memory-plan
# pool": the goldens must still match exactly), GPU_SUITE_GOLDENS=regen
# (record new goldens without comparing to the committed ones; the run is
# still compared with its own rerun), GPU_SUITE_BASELINE=PATH (bundle: an
# mhcrun built from an earlier commit, run beside every benchmark so the
# ratio of the two comes from one run), GPU_SUITE_BASELINE_MHCC=PATH
# (bundle: that commit's mhcc, which compiles the benchmarks' artifacts for
# the baseline too: the model kernels travel in the artifact, so a kernel
# change needs both for its baseline).
#
# tools/gpu_probe.sh compares runtime variants of one bundle (step times,
# losses, ncu kernel tables) in one call, before or beside `run`.
#
# Results we rely on are recorded in docs/gpu_results.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
tools=$PWD/tools # parts of run live in tools/gpu_suite_parts.sh and gpu_suite_optin.sh
bundle=.gpu_bundle
archive=.gpu_bundle.tar.xz
# The carry travels with the working tree, 64 MiB in all: fails (after
# saying so) when SIZE bytes of carry do not fit beside the tree.
check_carry() {
  local size=$1 what=$2 tree
  # The device tool sends the tracked files and the untracked ones git does not ignore.
  tree=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null | du -cb --files0-from=- 2>/dev/null |
    tail -1 | cut -f1)
  echo "$what: $((size / 1048576)) MiB, the working tree $((tree / 1048576)) MiB (64 in all)"
  [ $((size + tree)) -le $((64 * 1048576)) ]
}
GPU_TESTS=(//tests:gpu_test //tests:cuda_kernels_test //tests:cuda_bf16_kernels_test
           //tests:cuda_mhc_mixing_kernels_test //tests:cuda_fp32_residual_kernels_test //tests:gpu_training_test)
TINY=(tiny_pp1 tiny_pp2 tiny_pp2_vpp2 tiny_edge_chunks tiny_pp2_zb tiny_pp4 tiny_pp4_vpp2
      tiny_bf16_pp1 tiny_bf16_pp2 tiny_bf16_pp2_vpp2 tiny_bf16_edge_chunks tiny_bf16_pp2_zb tiny_bf16_pp1_vpp2
      tiny_bf16_n2_pp1 tiny_bf16_n8_pp1
      hybrid_pp1 hybrid_pp2 hybrid_pp2_vpp2_empty hybrid_pp2_zb
      tiny_bf16_fp32_residual_pp1 tiny_bf16_fp32_residual_pp2 tiny_bf16_fp32_residual_pp2_vpp2
      tiny_bf16_fp32_residual_edge_chunks tiny_bf16_fp32_residual_pp2_zb
      tiny_n1_bf16_fp32_residual_pp1 tiny_n1_bf16_fp32_residual_pp2_vpp2 tiny_n1_bf16_fp32_residual_pp2_zb)
# name -> "model mhcc-flags"
declare -A ARTIFACT=(
  # Refusal: an artifact without kernels. (Kernels for another architecture
  # cannot be made any more: mhcc accepts --cuda-arch sm_90 only, see
  # tests/compiler/codegen.test.)
  [tiny_no_kernels]="models/tiny.json --microbatches 2 --cuda-arch none"
  # Layout parity (2 microbatches keep the large cases inside the call).
  [small_m2_pp1]="models/small.json --microbatches 2 --pp 1"
  [small_m2_pp2]="models/small.json --microbatches 2 --pp 2"
  [small_m2_pp2_vpp2]="models/small.json --microbatches 2 --pp 2 --vpp 2"
  [c4096_pp1]="models/transport_c4096.json --microbatches 2 --pp 1"
  [c4096_pp2]="models/transport_c4096.json --microbatches 2 --pp 2"
  [c4096_pp2_vpp2]="models/transport_c4096.json --microbatches 2 --pp 2 --vpp 2"
  [c7168_pp1]="models/transport_c7168.json --microbatches 2 --pp 1"
  [c7168_pp2]="models/transport_c7168.json --microbatches 2 --pp 2"
  [c7168_pp2_vpp2]="models/transport_c7168.json --microbatches 2 --pp 2 --vpp 2"
  # bf16 (docs/precision.md): flash attention (head dim 64 / 128) and cuBLASLt.
  [small_bf16_m2_pp1]="models/small_bf16.json --microbatches 2 --pp 1"
  [small_bf16_m2_pp2]="models/small_bf16.json --microbatches 2 --pp 2"
  [small_bf16_m2_pp2_vpp2]="models/small_bf16.json --microbatches 2 --pp 2 --vpp 2"
  [small_bf16_m2_pp2_zb]="models/small_bf16.json --microbatches 2 --pp 2 --schedule zb-h1"
  [c4096_bf16_pp1]="models/transport_c4096_bf16.json --microbatches 2 --pp 1"
  [c4096_bf16_pp2]="models/transport_c4096_bf16.json --microbatches 2 --pp 2"
  [c4096_bf16_pp2_vpp2]="models/transport_c4096_bf16.json --microbatches 2 --pp 2 --vpp 2"
  [c7168_bf16_pp1]="models/transport_c7168_bf16.json --microbatches 2 --pp 1"
  [c7168_bf16_pp2]="models/transport_c7168_bf16.json --microbatches 2 --pp 2"
  [c7168_bf16_pp2_vpp2]="models/transport_c7168_bf16.json --microbatches 2 --pp 2 --vpp 2"
  # Data parallelism (issue 13): tiny at dp 2, 2 microbatches a replica (the
  # global batch of tiny_pp1's 4), the layouts of tiny's parity group.
  [tiny_dp2_pp1]="models/tiny.json --microbatches 2 --dp 2 --pp 1"
  # The distributed optimizer (zero1: Adam's moments sharded) gives the same bits.
  [tiny_dp2_pp2_vpp2]="models/tiny.json --microbatches 2 --dp 2 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_dp2_pp2_zb]="models/tiny.json --microbatches 2 --dp 2 --pp 2 --layout Ett|ttmL --schedule zb-h1"
  [tiny_dp2_zero1_pp1]="models/tiny.json --microbatches 2 --dp 2 --pp 1 --distributed-optimizer"
  [tiny_dp2_zero1_pp2]="models/tiny.json --microbatches 2 --dp 2 --pp 2 --layout Ett|ttmL --distributed-optimizer"
  [tiny_bf16_dp2_pp1]="models/tiny_bf16.json --microbatches 2 --dp 2 --pp 1"
  [tiny_bf16_dp2_pp2_vpp2]="models/tiny_bf16.json --microbatches 2 --dp 2 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_bf16_dp2_zero1_pp2]="models/tiny_bf16.json --microbatches 2 --dp 2 --pp 2 --layout Ett|ttmL --distributed-optimizer"
  # Tensor parallelism (issue 13): tiny at tp 2, tiny_pp1's 4 microbatches
  # (tp 2 against tp 1 on the same batch), the layouts of tiny's group, MTP
  # on the last stage; and composed with dp 2 (8 ranks at PP2).
  [tiny_tp2_pp1]="models/tiny.json --microbatches 4 --tp 2 --pp 1"
  [tiny_tp2_pp2]="models/tiny.json --microbatches 4 --tp 2 --pp 2 --layout Ett|ttmL"
  [tiny_tp2_pp2_vpp2]="models/tiny.json --microbatches 4 --tp 2 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_tp2_pp2_zb]="models/tiny.json --microbatches 4 --tp 2 --pp 2 --layout Ett|ttmL --schedule zb-h1"
  [tiny_bf16_tp2_pp1]="models/tiny_bf16.json --microbatches 4 --tp 2 --pp 1"
  [tiny_bf16_tp2_pp2_vpp2]="models/tiny_bf16.json --microbatches 4 --tp 2 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_bf16_tp2_pp2_zb]="models/tiny_bf16.json --microbatches 4 --tp 2 --pp 2 --layout Ett|ttmL --schedule zb-h1"
  [small_bf16_tp2_m2_pp1]="models/small_bf16.json --microbatches 2 --tp 2 --pp 1"
  [small_bf16_tp2_m2_pp2_vpp2]="models/small_bf16.json --microbatches 2 --tp 2 --pp 2 --vpp 2"
  [c4096_bf16_tp2_pp1]="models/transport_c4096_bf16.json --microbatches 2 --tp 2 --pp 1"
  [c4096_bf16_tp2_pp2_vpp2]="models/transport_c4096_bf16.json --microbatches 2 --tp 2 --pp 2 --vpp 2"
  [c7168_bf16_tp2_pp1]="models/transport_c7168_bf16.json --microbatches 2 --tp 2 --pp 1"
  [c7168_bf16_tp2_pp2_vpp2]="models/transport_c7168_bf16.json --microbatches 2 --tp 2 --pp 2 --vpp 2"
  # Sequence parallelism (each rank S/tp of every sequence outside the GEMMs).
  [tiny_tp2_sp_pp1]="models/tiny.json --microbatches 4 --tp 2 --sequence-parallel --pp 1"
  [tiny_tp2_sp_pp2]="models/tiny.json --microbatches 4 --tp 2 --sequence-parallel --pp 2 --layout Ett|ttmL"
  [tiny_tp2_sp_pp2_vpp2]="models/tiny.json --microbatches 4 --tp 2 --sequence-parallel --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_tp2_sp_pp2_zb]="models/tiny.json --microbatches 4 --tp 2 --sequence-parallel --pp 2 --layout Ett|ttmL --schedule zb-h1"
  [tiny_bf16_tp2_sp_pp1]="models/tiny_bf16.json --microbatches 4 --tp 2 --sequence-parallel --pp 1"
  [tiny_bf16_tp2_sp_pp2_vpp2]="models/tiny_bf16.json --microbatches 4 --tp 2 --sequence-parallel --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_dp2_tp2_sp_pp1]="models/tiny.json --microbatches 2 --dp 2 --tp 2 --sequence-parallel --pp 1"
  [tiny_dp2_tp2_sp_pp2]="models/tiny.json --microbatches 2 --dp 2 --tp 2 --sequence-parallel --pp 2 --layout Ett|ttmL"
  [c4096_bf16_tp2_sp_pp1]="models/transport_c4096_bf16.json --microbatches 2 --tp 2 --sequence-parallel --pp 1"
  [c4096_bf16_tp2_sp_pp2_vpp2]="models/transport_c4096_bf16.json --microbatches 2 --tp 2 --sequence-parallel --pp 2 --vpp 2"
  [c7168_bf16_tp2_sp_pp1]="models/transport_c7168_bf16.json --microbatches 2 --tp 2 --sequence-parallel --pp 1"
  [c7168_bf16_tp2_sp_pp2_vpp2]="models/transport_c7168_bf16.json --microbatches 2 --tp 2 --sequence-parallel --pp 2 --vpp 2"
  # Gated DeltaNet heads split as attention's (out_norm's gradient summed), an empty chunk.
  [hybrid_tp2_pp1]="models/hybrid_tiny.json --microbatches 4 --tp 2 --pp 1"
  [hybrid_tp2_pp2_vpp2_empty]="models/hybrid_tiny.json --microbatches 4 --tp 2 --pp 2 --vpp 2 --layout Ettt|ttt||ttmL"
  [hybrid_tp2_sp_pp1]="models/hybrid_tiny.json --microbatches 4 --tp 2 --sequence-parallel --pp 1"
  [hybrid_tp2_sp_pp2_vpp2_empty]="models/hybrid_tiny.json --microbatches 4 --tp 2 --sequence-parallel --pp 2 --vpp 2 --layout Ettt|ttt||ttmL"
  [tiny_dp2_tp2_pp1]="models/tiny.json --microbatches 2 --dp 2 --tp 2 --pp 1"
  [tiny_dp2_tp2_pp2]="models/tiny.json --microbatches 2 --dp 2 --tp 2 --pp 2 --layout Ett|ttmL --distributed-optimizer"
  # Context parallelism (issue 16): tiny at cp 2 (each rank chunks i and 3 -
  # i of every sequence), tiny_pp1's 4 microbatches (cp 2 against cp 1),
  # MTP on the last stage; flash attention (small_bf16), Gated DeltaNet with
  # an empty chunk, and cp 2 x tp 2 (with and without SP).
  [tiny_cp2_pp1]="models/tiny.json --microbatches 4 --cp 2 --pp 1"
  [tiny_cp2_pp2]="models/tiny.json --microbatches 4 --cp 2 --pp 2 --layout Ett|ttmL"
  [tiny_cp2_pp2_vpp2]="models/tiny.json --microbatches 4 --cp 2 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_cp2_edge_chunks]="models/tiny.json --microbatches 4 --cp 2 --pp 2 --vpp 2 --layout E|tttt||mL"
  [tiny_cp2_pp2_zb]="models/tiny.json --microbatches 4 --cp 2 --pp 2 --layout Ett|ttmL --schedule zb-h1"
  # The distributed optimizer over the context ranks alone (dp 1).
  [tiny_cp2_zero1_pp2]="models/tiny.json --microbatches 4 --cp 2 --pp 2 --layout Ett|ttmL --distributed-optimizer"
  [tiny_bf16_cp2_pp1]="models/tiny_bf16.json --microbatches 4 --cp 2 --pp 1"
  [tiny_bf16_cp2_pp2_vpp2]="models/tiny_bf16.json --microbatches 4 --cp 2 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_bf16_cp2_pp2_zb]="models/tiny_bf16.json --microbatches 4 --cp 2 --pp 2 --layout Ett|ttmL --schedule zb-h1"
  [small_bf16_cp2_m2_pp1]="models/small_bf16.json --microbatches 2 --cp 2 --pp 1"
  [small_bf16_cp2_m2_pp2_vpp2]="models/small_bf16.json --microbatches 2 --cp 2 --pp 2 --vpp 2"
  [hybrid_cp2_pp1]="models/hybrid_tiny.json --microbatches 4 --cp 2 --pp 1"
  [hybrid_cp2_pp2_vpp2_empty]="models/hybrid_tiny.json --microbatches 4 --cp 2 --pp 2 --vpp 2 --layout Ettt|ttt||ttmL"
  [tiny_cp4_pp1]="models/tiny.json --microbatches 4 --cp 4 --pp 1"
  [tiny_cp4_pp2_vpp2]="models/tiny.json --microbatches 4 --cp 4 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [small_bf16_cp4_m2_pp1]="models/small_bf16.json --microbatches 2 --cp 4 --pp 1"
  [tiny_dp2_cp2_pp1]="models/tiny.json --microbatches 2 --dp 2 --cp 2 --pp 1"
  [tiny_dp2_cp2_zero1_pp2]="models/tiny.json --microbatches 2 --dp 2 --cp 2 --pp 2 --layout Ett|ttmL --distributed-optimizer"
  [tiny_tp2_cp2_pp1]="models/tiny.json --microbatches 4 --tp 2 --cp 2 --pp 1"
  [tiny_tp2_cp2_pp2_vpp2]="models/tiny.json --microbatches 4 --tp 2 --cp 2 --pp 2 --vpp 2 --layout Et|t|t|tmL"
  [tiny_tp2_sp_cp2_pp1]="models/tiny.json --microbatches 4 --tp 2 --sequence-parallel --cp 2 --pp 1"
  [tiny_tp2_sp_cp2_pp2]="models/tiny.json --microbatches 4 --tp 2 --sequence-parallel --cp 2 --pp 2 --layout Ett|ttmL"
  # Four GPUs (issue 6): interleaving over 4 ranks wants m a multiple of 4.
  [small_m4_pp1]="models/small.json --microbatches 4 --pp 1"
  [small_m4_pp4]="models/small.json --microbatches 4 --pp 4"
  [small_m4_pp4_vpp2]="models/small.json --microbatches 4 --pp 4 --vpp 2"
  [c7168_m4_pp1]="models/transport_c7168.json --microbatches 4 --pp 1"
  [c7168_m4_pp4]="models/transport_c7168.json --microbatches 4 --pp 4"
  [c7168_m4_pp4_vpp2]="models/transport_c7168.json --microbatches 4 --pp 4 --vpp 2"
  # Benchmarks: 8 microbatches.
  [small_pp1]="models/small.json --microbatches 8 --pp 1"
  [small_n1_pp1]="models/small_n1.json --microbatches 8 --pp 1"
  [small_pp2]="models/small.json --microbatches 8 --pp 2"
  [small_pp2_vpp2]="models/small.json --microbatches 8 --pp 2 --vpp 2"
  [small_pp2_zb]="models/small.json --microbatches 8 --pp 2 --schedule zb-h1"
  [1b_pp1]="models/1b.json --microbatches 8 --pp 1"
  # Gated DeltaNet beside attention at seq 4096 (run with GPU_SUITE_PROFILE).
  [hybrid_1b_m1_pp1]="models/hybrid_1b.json --microbatches 1 --pp 1"
  [1b_m1_pp1]="models/1b.json --microbatches 1 --pp 1"
  [1b_f32_pp1]="models/1b_f32.json --microbatches 8 --pp 1"
  [1b_n1_pp1]="models/1b_n1.json --microbatches 8 --pp 1"
  # The fp32 residual stream's cost (its kernels move it in quads, unfused).
  [1b_fp32_residual_pp1]="models/1b_fp32_residual.json --microbatches 8 --pp 1"
  [1b_pp2]="models/1b.json --microbatches 8 --pp 2"
  [1b_pp2_vpp2]="models/1b.json --microbatches 8 --pp 2 --vpp 2"
  [small_pp4]="models/small.json --microbatches 8 --pp 4"
  [small_pp4_vpp2]="models/small.json --microbatches 8 --pp 4 --vpp 2"
  [1b_pp4]="models/1b.json --microbatches 8 --pp 4"
  [1b_pp4_vpp2]="models/1b.json --microbatches 8 --pp 4 --vpp 2"
  # The mesh on two GPUs (issues 13, 16): 1b_pp1's global batch of 8
  # microbatches over two data-parallel replicas (with and without the
  # distributed optimizer), and split by tp 2 + SP and by cp 2.
  [1b_dp2_pp1]="models/1b.json --microbatches 4 --pp 1 --dp 2"
  [1b_dp2_zero1_pp1]="models/1b.json --microbatches 4 --pp 1 --dp 2 --distributed-optimizer"
  [1b_tp2_sp_pp1]="models/1b.json --microbatches 8 --pp 1 --tp 2 --sequence-parallel"
  [1b_cp2_pp1]="models/1b.json --microbatches 8 --pp 1 --cp 2"
)
BENCH_DEFAULT="small_pp1 small_n1_pp1 small_pp2 small_pp2_zb small_pp2_vpp2 small_pp4 small_pp4_vpp2
               1b_pp1 1b_n1_pp1 1b_pp2 1b_pp2_vpp2 1b_pp4 1b_pp4_vpp2
               1b_dp2_pp1 1b_dp2_zero1_pp1 1b_tp2_sp_pp1 1b_cp2_pp1"
# H200 SXM peaks MFU is judged against: fp32 without tensor cores (the
# backend runs fp32 without TF32), and dense bf16 tensor cores (measured,
# docs/gpu_results.md) for bf16 models.
PEAK_F32=67
PEAK_BF16=790
peak_of() { grep -q '"dtype": "bf16"' "models/$(model_of "$1").json" 2>/dev/null && echo $PEAK_BF16 || echo $PEAK_F32; }
model_of() { local spec=${ARTIFACT[$1]:-}; spec=${spec%% *}; spec=${spec#models/}; echo "${spec%.json}"; }

case "${1:-}" in
bundle)
  # Our own libraries linked in statically, so the binaries travel alone
  # (system libraries: CUDA, cuBLAS, NCCL, MPI come from the GPU machine).
  targets=("${GPU_TESTS[@]}" //tools:mhcrun //tools:libmhcc_mpi.so //tools:gemm_bench //tools:attention_bench
           //compiler:mhcc //tools:mhc-prep)
  for a in "${TINY[@]}"; do targets+=("//tests:$a"); done
  build=(bazel build --dynamic_mode=off "${targets[@]}")
  "${build[@]}" >/dev/null 2>&1 || { "${build[@]}"; exit 1; }
  rm -rf "$bundle" && mkdir -p "$bundle"
  for t in "${GPU_TESTS[@]}"; do
    path=${t#//}
    cp "bazel-bin/${path/://}" "$bundle/${t##*:}"
  done
  cp bazel-bin/tools/mhcrun bazel-bin/tools/libmhcc_mpi.so bazel-bin/tools/gemm_bench bazel-bin/tools/attention_bench \
     "$bundle/"
  [ -n "${GPU_SUITE_BASELINE:-}" ] && cp "$GPU_SUITE_BASELINE" "$bundle/mhcrun_baseline"
  if [ -n "${GPU_SUITE_BASELINE_MHCC:-}" ]; then
    mkdir -p "$bundle/baseline"
    for name in $BENCH_DEFAULT hybrid_1b_m1_pp1; do
      # shellcheck disable=SC2086
      "$GPU_SUITE_BASELINE_MHCC" --cuda-arch sm_90 ${ARTIFACT[$name]} --emit=artifact -o "$bundle/baseline/$name.mhcc" ||
        exit 1
    done
  fi
  for a in "${TINY[@]}"; do cp "bazel-bin/tests/$a.mhcc" "$bundle/"; done
  for name in "${!ARTIFACT[@]}"; do
    # shellcheck disable=SC2086
    bazel-bin/compiler/mhcc --cuda-arch sm_90 ${ARTIFACT[$name]} --emit=artifact -o "$bundle/$name.mhcc" \
      --trace "$bundle/$name.trace.json" || exit 1
    peak_of "$name" > "$bundle/$name.peak"
    # The H200 profile of the model's dtype, as the artifact's own prediction.
    profile=$([ "$(cat "$bundle/$name.peak")" = $PEAK_BF16 ] && echo h200-bf16 || echo h200-fp32)
    # shellcheck disable=SC2086
    bazel-bin/compiler/mhcc --cuda-arch none --device-profile $profile ${ARTIFACT[$name]} --print-schedule 2>/dev/null |
      sed -n 's/^predicted bubble fraction[^:]*: \([0-9.]*\);.*/\1/p' > "$bundle/$name.bubble"
  done
  cp data/corpus.txt tools/metrics_to_golden.py tools/kernel_table.py tests/runtime/check_trace.py \
     docs/data/convergence_1b_fp32_h200.jsonl "$bundle/"
  # The corpus as documents (one per line) for the packed-document cases.
  bazel-bin/tools/mhc-prep --input data/corpus.txt --output-prefix "$bundle/corpus_docs" > /dev/null || exit 1
  for recipe in tiny tiny_pp2_vpp2 tiny_pp4_vpp2 tiny_bf16 tiny_bf16_pp2_vpp2 tiny_bf16_fp32_residual hybrid_tiny; do
    [ -f "goldens/$recipe/golden_values_h200.json" ] && cp "goldens/$recipe/golden_values_h200.json" "$bundle/golden_h200_$recipe.json"
  done
  git rev-parse HEAD > "$bundle/COMMIT"
  git status --porcelain | grep -q . && echo "(with uncommitted changes)" >> "$bundle/COMMIT"
  echo "bundled into $bundle ($(du -sh $bundle | cut -f1), commit $(head -1 $bundle/COMMIT))"
  ;;
prune)
  gpus=${2:?usage: tools/gpu_suite.sh prune GPUS (1 or 2)}
  [ -d "$bundle" ] || { echo "gpu_suite: no $bundle; run 'tools/gpu_suite.sh bundle' first"; exit 2; }
  cd "$bundle" || exit 2
  if [ "${3:-}" = memory ] && [ "$gpus" != 1 ]; then
    echo "gpu_suite: prune $gpus memory: the memory part runs on one GPU (its PP2 ranks share it); use prune 1 memory"
    exit 2
  fi
  # Four GPUs are not lent: the PP4 artifacts and the 4-microbatch models they compare against.
  rm -f ./*_pp4* ./*_m4_*
  if [ "$gpus" -ge 2 ]; then
    # Two GPUs: every PP2 artifact stays (parity, traces, goldens, the
    # PP2 / PP2-VPP2 / ZB-H1 benchmarks); the one-GPU kernel studies go.
    # So do the fp32-residual and n = 1 bf16 groups, the hybrid and the
    # small packed groups (their one-GPU runs share it) and small's fp32
    # layouts (recorded on two GPUs in sessions 2-4).
    rm -f ./hybrid_1b_m1_pp1* ./1b_m1_pp1* ./1b_f32_pp1* ./1b_fp32_residual_pp1* ./attention_bench \
      ./tiny_bf16_fp32_residual* ./tiny_n1_* ./hybrid_pp* ./small_bf16_m2_* ./small_m2_* ./tiny_bf16_pp1_vpp2*
  elif [ "${3:-}" = mesh ]; then
    # One GPU, the data- and tensor-parallel groups (their ranks share it):
    # every dp / tp / SP artifact stays; the benchmarks, the kernel studies
    # and the transport models' plain layouts go.
    # So do the plain layouts of the tiny groups (tiny_pp1 stays: the tp 1
    # of the "vs" rows) and the transport models' tp 2 without SP (their
    # SP layouts stay): run it with GPU_SUITE_PARTS="checks checkpoint".
    rm -f ./1b_* ./hybrid_1b_* ./small_pp* ./small_n1_* ./small_m2_* ./small_bf16_m2_* ./c4096_pp* ./c7168_pp* \
      ./c4096_bf16_pp* ./c7168_bf16_pp* ./attention_bench ./gemm_bench ./tiny_bf16_fp32_residual* ./tiny_n1_* \
      ./tiny_bf16_pp* ./tiny_bf16_edge* ./hybrid_pp* ./tiny_pp2* ./tiny_edge* ./cuda_fp32_residual_kernels_test \
      ./c4096_bf16_tp2_pp* ./c7168_bf16_tp2_pp*
  elif [ "${3:-}" = context ]; then
    # One GPU, the context-parallel groups (their ranks share it) with the
    # tiny references of the "vs" rows and the goldens: every other
    # artifact and the benchmarks go. Run it with GPU_SUITE_PARTS="checks goldens".
    for a in ./*.mhcc ./*.bubble; do
      case $a in
      ./*_cp2_* | ./tiny_pp1.* | ./tiny_pp2_vpp2.* | ./tiny_bf16_pp1.* | ./tiny_bf16_pp2_vpp2.* | ./hybrid_pp1.* | \
        ./tiny_no_kernels.*) ;;
      *) rm -f "$a" ;;
      esac
    done
    rm -f ./attention_bench ./gemm_bench ./cuda_fp32_residual_kernels_test
  elif [ "${3:-}" = transport ]; then
    # One GPU, the transport models: their bf16 layouts (ranks sharing the
    # GPU) and the tiny groups; the benchmarks and every fp32 large model go.
    rm -f ./1b_* ./hybrid_1b_* ./small_* ./c4096_pp* ./c7168_pp* ./tiny_bf16_fp32_residual* ./tiny_n1_*
  elif [ "${3:-}" = memory ]; then
    : # below: the memory part's 1b artifacts alone
  else
    # One GPU: the parity groups' PP2 layouts stay (their ranks share the
    # GPU: gpu_training_test, runtime/cuda/RankLinks.h) but for the
    # transport models' (`prune 1 transport` keeps those instead of the
    # benchmarks); the PP2 benchmarks and the fp32 1b studies go, but
    # 1b_m1_pp1 (tools/gpu_probe.sh's ncu step runs it). (The fp32
    # residual's edge chunks too: its other layouts stay.) To fit the
    # carry since session 33's artifacts: the small_bf16 groups' layouts and
    # attention_bench (the opt-in kernels part: bundle apart for it).
    rm -f ./1b_pp2* ./c4096_* ./c7168_* ./small_pp2* ./small_m2_* ./1b_f32_pp1* ./1b_fp32_residual_pp1* \
      ./hybrid_1b_m1_pp1* ./tiny_bf16_fp32_residual_edge_chunks* ./small_bf16_m2_* ./attention_bench
  fi
  if [ "${3:-}" = memory ]; then
    # One GPU, the memory and repeat parts alone (GPU_SUITE_PARTS="memory
    # repeat"): their 1b artifacts (compiled by bundle; `prune 1` above
    # removed the PP2 and fp32 ones, so prune from a fresh bundle) and mhcrun.
    for a in ./*.mhcc ./*.bubble ./*.peak ./*.trace.json; do
      case $a in
      ./1b_pp1.mhcc | ./1b_pp2.mhcc | ./1b_pp2_vpp2.mhcc | ./1b_dp2_pp1.mhcc | ./1b_dp2_zero1_pp1.mhcc | \
        ./1b_f32_pp1.mhcc) ;;
      *) rm -f "$a" ;;
      esac
    done
    rm -f ./gpu_test ./gpu_training_test ./cuda_*kernels_test ./attention_bench ./gemm_bench
  fi
  if [ "${3:-}" = bench ]; then
    # Two GPUs, the benchmarks and traces alone (GPU_SUITE_PARTS="trace
    # bench"): every parity, golden and checkpoint artifact and the tests go.
    for a in ./*.mhcc ./*.bubble ./*.peak ./*.trace.json; do
      case $a in
      ./1b_* | ./small_*) ;;
      *) rm -f "$a" ;;
      esac
    done
    rm -f ./gpu_test ./gpu_training_test ./cuda_*kernels_test ./attention_bench
  fi
  if [ "${3:-}" != context ] && [ "${3:-}" != bench ]; then
    # The cp groups but the artifact of the "vs" rows (`prune 1 context`
    # keeps them all, and the cp checkpoint rows' artifacts).
    for a in ./*_cp2_* ./*_cp4_*; do
      case $a in
      ./tiny_cp2_pp1.*) ;;
      *) rm -f "$a" ;;
      esac
    done
  fi
  if [ "${3:-}" != mesh ] && [ "${3:-}" != context ] && [ "${3:-}" != bench ] && [ "${3:-}" != memory ]; then
    # The dp / tp groups but the artifacts of the "vs" and checkpoint rows
    # (`prune 1 mesh` keeps them all; `transport` the transport models').
    for a in ./*_dp2_* ./*_tp2_*; do
      case $a in
      ./tiny_dp2_pp1.* | ./tiny_dp2_zero1_pp1.* | ./tiny_tp2_pp1.* | ./tiny_tp2_pp2.* | ./tiny_tp2_sp_pp1.*) ;;
      ./c4096_bf16_tp2_* | ./c7168_bf16_tp2_*) [ "${3:-}" = transport ] || rm -f "$a" ;;
      *) rm -f "$a" ;;
      esac
    done
  fi
  cd .. || exit 2
  check_carry "$(du -sb "$bundle" | cut -f1)" "pruned $bundle for $gpus GPU(s)" ||
    { echo "gpu_suite: still over 64 MiB unpacked: prune more, or carry it packed (tools/gpu_suite.sh pack)"; exit 1; }
  ;;
pack)
  # Binaries and kernel images compress well (xz: 173 MiB to 10), so the
  # whole bundle travels without pruning; the lent machine unpacks it with
  # Python's tarfile (its image has no promise of xz).
  [ -d "$bundle" ] || { echo "gpu_suite: no $bundle; run 'tools/gpu_suite.sh bundle' first"; exit 2; }
  rm -f "$archive"
  XZ_OPT=-T0 tar -cJf "$archive" "$bundle" || { rm -f "$archive"; exit 1; }
  check_carry "$(stat -c %s "$archive")" "packed $bundle into $archive" ||
    { rm -f "$archive"; echo "gpu_suite: over 64 MiB: prune the bundle first (tools/gpu_suite.sh prune)"; exit 1; }
  echo "carry [\"$archive\"] and start the command with: bash tools/gpu_suite.sh unpack &&"
  ;;
unpack)
  [ -f "$archive" ] || { echo "gpu_suite: no $archive: carry it (tools/gpu_suite.sh pack makes it)"; exit 2; }
  # Its members are checked before anything is written: plain files and
  # folders under .gpu_bundle/, no path out of it, the bundle's COMMIT.
  # Python's tarfile reads it (the lent machine's image promises Python,
  # not xz).
  python3 - "$archive" "$bundle" <<'PY' || exit 1
import sys, tarfile
archive, bundle = sys.argv[1], sys.argv[2]
try:
    with tarfile.open(archive) as t:
        members = t.getmembers()
except (tarfile.TarError, OSError, EOFError) as e:
    sys.exit(f"gpu_suite: cannot unpack {archive} ({e})")
bad = [m.name for m in members if not (m.name == bundle or m.name.startswith(bundle + "/"))
       or ".." in m.name.split("/") or not (m.isreg() or m.isdir())]
if bad or bundle + "/COMMIT" not in {m.name for m in members}:
    sys.exit(f"gpu_suite: {archive} holds no {bundle}/COMMIT, or something other than files and folders "
             f"under {bundle} ({', '.join(bad[:3]) or 'no COMMIT'}): not a packed bundle")
PY
  rm -rf "$bundle"
  python3 -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(".", **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' "$archive" ||
    { rm -rf "$bundle"; echo "gpu_suite: cannot unpack $archive"; exit 1; }
  echo "unpacked $archive: $bundle $(du -sh "$bundle" | cut -f1), commit $(head -1 "$bundle/COMMIT")"
  ;;
adopt-goldens)
  dir=${2:?usage: tools/gpu_suite.sh adopt-goldens DIR}
  for recipe in tiny tiny_pp2_vpp2 tiny_pp4_vpp2 tiny_bf16 tiny_bf16_pp2_vpp2 tiny_bf16_fp32_residual hybrid_tiny; do
    src="$dir/golden_values_h200_$recipe.json"
    [ -f "$src" ] || { echo "no $src (not run: fewer GPUs?)"; continue; }
    mkdir -p "goldens/$recipe"
    cp "$src" "goldens/$recipe/golden_values_h200.json"
    echo "goldens/$recipe/golden_values_h200.json <- $src"
  done
  ;;
run)
  [ -d "$bundle" ] || { echo "gpu_suite: no $bundle; run 'tools/gpu_suite.sh bundle' first and carry it"; exit 2; }
  export NCCL_NVLS_ENABLE=0
  out="${OUT:-/tmp/gpu_suite}"
  logs=/tmp/gpu_suite_logs
  rm -rf "$logs" && mkdir -p "$logs" "$out"
  cd "$bundle" || exit 2
  parts=" ${GPU_SUITE_PARTS:-checks goldens checkpoint bench} "
  # A misspelt part would run nothing and say nothing: refuse it before any GPU time.
  known=" checks goldens checkpoint bench ceilings sanitizers profiles faults repeat memory trace convergence kernels "
  for part in $parts; do
    [[ $known == *" $part "* ]] || { echo "gpu_suite: GPU_SUITE_PARTS: no part '$part' (the parts:$known)"; exit 2; }
  done
  gpus=$(nvidia-smi --list-gpus | wc -l)
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpus.txt"
  failed=0
  # The table lives in $OUT from the first row, so a run cut short by the
  # call's time limit still brings back what it checked.
  table="$out/table.txt"
  printf '%-34s %-6s %s\n' check result detail > "$table"
  row() { printf '%-34s %-6s %s\n' "$1" "$2" "$3" >> "$table"; [ "$2" = PASS ] || [ "$2" = SKIP ] || failed=$((failed + 1)); }
  same_json() { python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])) == json.load(open(sys.argv[2])) else 1)" "$1" "$2"; }
  # shellcheck source=tools/gpu_suite_optin.sh
  source "$tools/gpu_suite_optin.sh"
  # shellcheck source=tools/gpu_suite_parts.sh
  source "$tools/gpu_suite_parts.sh"

  if [[ $parts == *" ceilings "* ]]; then
    # Copy bandwidth and every 1b GEMM shape in bf16 (cuBLASLt) and fp32: the
    # ceilings issue 12's kernels are judged against (opt-in part).
    if timeout 300 ./gemm_bench > "$logs/gemm_bench.log" 2>&1; then r=PASS; else r=FAIL; fi
    row "ceilings (gemm_bench)" $r "$(grep '^copy' "$logs/gemm_bench.log"); table in gemm_bench.log"
    cp "$logs/gemm_bench.log" "$out/" 2>/dev/null
    # Flash attention against a naive fp32 reference, determinism, TFLOP/s.
    if timeout 300 ./attention_bench > "$logs/attention_bench.log" 2>&1; then r=PASS; else r=FAIL; fi
    row "flash attention (attention_bench)" $r "$(grep -E 'TFLOP/s' "$logs/attention_bench.log" | tr '\n' ';' | cut -c1-200)"
    cp "$logs/attention_bench.log" "$out/" 2>/dev/null
  fi

  if [[ $parts == *" kernels "* ]]; then
    # Every kernel of one 1b step (one microbatch) under Nsight Compute: time
    # and DRAM bytes from the hardware counters, GB/s against the copy
    # bandwidth gemm_bench measures in the same run (opt-in part).
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    copy=$(timeout 120 ./gemm_bench 2>/dev/null | sed -n 's/^copy: \([0-9.]*\) GB.*/\1/p' | head -1)
    if [ -n "$ncu" ] && timeout 400 "$ncu" --clock-control none --csv --launch-skip 0 --launch-count 2000 \
         --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
         ./mhcrun 1b_m1_pp1.mhcc --data corpus.txt --steps 1 --no-progress > "$logs/ncu_1b.csv" 2> "$logs/ncu_1b.err" &&
       python3 kernel_table.py "$logs/ncu_1b.csv" "${copy:-4300}" > "$out/kernel_table.txt"; then r=PASS; else r=FAIL; fi
    row "kernel table (ncu, 1b step)" $r "copy ${copy:-?} GB/s; $(head -3 "$out/kernel_table.txt" 2>/dev/null | tail -1 | cut -c1-120)"
  fi

  [[ $parts == *" sanitizers "* ]] && run_sanitizers

  [[ $parts == *" checks "* ]] && run_checks

  if [[ $parts == *" goldens "* ]]; then
    # 20 iterations per recipe: in-process PP1, one process per GPU
    # (mhcrun --gpus), and mpirun; each run twice and compared exactly.
    golden() { # name artifact launcher...
      local name=$1 artifact=$2; shift 2
      for k in 1 2; do
        # shellcheck disable=SC2086
        timeout 300 "$@" ./mhcrun "$artifact.mhcc" --data corpus.txt --steps 20 --no-progress ${GOLDEN_FLAGS:-} ${GPU_SUITE_MHCRUN_FLAGS:-} \
          --metrics "$logs/$name.$k.jsonl" > "$logs/golden_$name.$k.log" 2>&1 || return 1
        python3 metrics_to_golden.py "$logs/$name.$k.jsonl" > "$logs/golden_values_h200_$name.$k.json" || return 1
      done
      same_json "$logs/golden_values_h200_$name.1.json" "$logs/golden_values_h200_$name.2.json" || return 2
      cp "$logs/golden_values_h200_$name.1.json" "$logs/golden_values_h200_$name.json"
    }
    check_golden() { # name committed-name
      if [ "${GPU_SUITE_GOLDENS:-}" != regen ] && [ -f "golden_h200_$2.json" ] &&
         ! same_json "golden_h200_$2.json" "$logs/golden_values_h200_$1.json"; then
        echo "differs from goldens/$2/golden_values_h200.json"; return 1
      fi
      echo "same bits on rerun$( [ -f golden_h200_$2.json ] && [ "${GPU_SUITE_GOLDENS:-}" != regen ] && echo ' and as the committed golden')"
    }
    if golden tiny tiny_pp1 && detail=$(check_golden tiny tiny); then r=PASS; else r=FAIL; detail=${detail:-run failed}; fi
    row "golden tiny (PP1)" $r "$detail; $(tail -1 "$logs/golden_tiny.1.log" | cut -c1-80)"
    # hybrid_tiny at PP1 (its layouts are bit-identical: parity hybrid).
    if golden hybrid_tiny hybrid_pp1 && detail=$(check_golden hybrid_tiny hybrid_tiny); then r=PASS; else r=FAIL; detail=${detail:-run failed}; fi
    row "golden hybrid_tiny (PP1)" $r "$detail; $(tail -1 "$logs/golden_hybrid_tiny.1.log" | cut -c1-80)"
    # The PP2/VPP2 goldens: one process a GPU on two, else both ranks on one
    # GPU (--ranks-per-gpu 2: device copies for NCCL, the same bits).
    share=; how="--gpus 2"
    [ "$gpus" -lt 2 ] && share="--ranks-per-gpu 2" && how="one GPU, --ranks-per-gpu 2"
    detail=
    if GOLDEN_FLAGS=$share golden tiny_pp2_vpp2 tiny_pp2_vpp2 env && detail=$(check_golden tiny_pp2_vpp2 tiny_pp2_vpp2) &&
       same_json "$logs/golden_values_h200_tiny.json" "$logs/golden_values_h200_tiny_pp2_vpp2.json"; then
      r=PASS; detail+="; equal to PP1's"
    else r=FAIL; detail="${detail:-run failed}; PP1 vs PP2/VPP2 $(same_json "$logs/golden_values_h200_tiny.json" "$logs/golden_values_h200_tiny_pp2_vpp2.json" 2>/dev/null && echo equal || echo differ)"; fi
    row "golden tiny PP2/VPP2 ($how)" $r "$detail"
    if [ "$gpus" -ge 2 ]; then
      # The same model under mpirun: MPI bootstrap, one process per GPU.
      detail=
      if golden tiny_pp2_mpirun tiny_pp2 mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH &&
         same_json "$logs/golden_values_h200_tiny.json" "$logs/golden_values_h200_tiny_pp2_mpirun.json"; then
        r=PASS; detail="same bits on rerun; equal to PP1's"
      else r=FAIL; detail="$(tail -2 "$logs/golden_tiny_pp2_mpirun.1.log" | tr '\n' ' ' | cut -c1-150)"; fi
      row "golden tiny PP2 (mpirun -np 2)" $r "$detail"
    fi
    # bf16 (tiny's reference attention core, cuBLASLt): PP1 and PP2/VPP2 equal.
    if golden tiny_bf16 tiny_bf16_pp1 && detail=$(check_golden tiny_bf16 tiny_bf16); then r=PASS; else r=FAIL; detail=${detail:-run failed}; fi
    row "golden tiny_bf16 (PP1)" $r "$detail; $(tail -1 "$logs/golden_tiny_bf16.1.log" | cut -c1-80)"
    detail=
    if GOLDEN_FLAGS=$share golden tiny_bf16_pp2_vpp2 tiny_bf16_pp2_vpp2 env &&
       detail=$(check_golden tiny_bf16_pp2_vpp2 tiny_bf16_pp2_vpp2) &&
       same_json "$logs/golden_values_h200_tiny_bf16.json" "$logs/golden_values_h200_tiny_bf16_pp2_vpp2.json"; then
      r=PASS; detail+="; equal to PP1's"
    else r=FAIL; detail="${detail:-run failed}; PP1 vs PP2/VPP2 $(same_json "$logs/golden_values_h200_tiny_bf16.json" "$logs/golden_values_h200_tiny_bf16_pp2_vpp2.json" 2>/dev/null && echo equal || echo differ)"; fi
    row "golden tiny_bf16 PP2/VPP2 ($how)" $r "$detail"
    cp "$logs"/golden_values_h200_tiny_bf16.json "$logs"/golden_values_h200_tiny_bf16_pp2_vpp2.json "$out/" 2>/dev/null
    # bf16 with an fp32 residual stream (its layouts are bit-identical: parity tiny_bf16_fp32_residual).
    if golden tiny_bf16_fp32_residual tiny_bf16_fp32_residual_pp1 &&
       detail=$(check_golden tiny_bf16_fp32_residual tiny_bf16_fp32_residual); then r=PASS; else r=FAIL; detail=${detail:-run failed}; fi
    row "golden tiny_bf16_fp32_residual (PP1)" $r "$detail; $(tail -1 "$logs/golden_tiny_bf16_fp32_residual.1.log" | cut -c1-80)"
    if [ "$gpus" -ge 4 ]; then
      detail=
      if golden tiny_pp4_vpp2 tiny_pp4_vpp2 env && detail=$(check_golden tiny_pp4_vpp2 tiny_pp4_vpp2) &&
         same_json "$logs/golden_values_h200_tiny.json" "$logs/golden_values_h200_tiny_pp4_vpp2.json"; then
        r=PASS; detail+="; equal to PP1's"
      else r=FAIL; detail="${detail:-run failed}"; fi
      row "golden tiny PP4/VPP2 (--gpus 4)" $r "$detail"
    else
      row "golden tiny PP4/VPP2" SKIP "needs 4 GPUs, $gpus visible"
    fi
    cp "$logs"/golden_values_h200_tiny.json "$logs"/golden_values_h200_tiny_pp2_vpp2.json "$logs"/golden_values_h200_hybrid_tiny.json \
       "$logs"/golden_values_h200_tiny_pp4_vpp2.json "$out/" 2>/dev/null
  fi

  [[ $parts == *" checkpoint "* ]] && run_checkpoint

  [[ $parts == *" convergence "* ]] && run_convergence

  [[ $parts == *" faults "* ]] && run_faults

  [[ $parts == *" repeat "* ]] && run_repeat

  [[ $parts == *" memory "* ]] && run_memory

  if [[ $parts == *" trace "* ]]; then
    # The measured timeline (CUDA events on the streams that ran each
    # instruction) names the predicted instructions step by step; the two
    # spans and bubbles are computed alike from the slices (check_trace.py).
    for name in ${GPU_SUITE_TRACE:-1b_pp1 small_pp1 small_pp2 small_pp2_vpp2 1b_pp2_vpp2}; do
      case "$name" in
        *_pp2*) [ "$gpus" -ge 2 ] || { row "trace $name" SKIP "needs 2 GPUs, $gpus visible"; continue; } ;;
      esac
      # Into the logs' archive: the device brings back few files a call.
      if timeout 300 ./mhcrun "$name.mhcc" --data corpus.txt --steps 3 --no-progress --trace "$logs/trace_$name.json" \
           > "$logs/trace_$name.log" 2>&1 &&
         python3 check_trace.py "$name.trace.json" "$logs/trace_$name.json" 3 > "$logs/trace_$name.check" 2>&1; then
        r=PASS
      else r=FAIL; fi
      cp "$name.trace.json" "$logs/trace_${name}_predicted.json" 2>/dev/null
      detail=$(tail -1 "$logs/trace_$name.check" 2>/dev/null || tail -1 "$logs/trace_$name.log")
      row "trace $name" $r "$(echo "$detail" | cut -c1-220)"
    done
  fi

  if [[ $parts == *" profiles "* ]]; then
    # Device profiles (passes/DeviceProfile.h) measured on this GPU, one per
    # artifact, into $OUT/profile_NAME.json, with the measured step beside
    # the prediction the artifact carries (opt-in). 1b gives the built-in
    # h200-bf16 / h200-fp32, hybrid_1b its gdn unit; small checks a profile
    # measured on one model predicting another.
    for spec in 1b_pp1:6 1b_f32_pp1:4 small_pp1:6 small_bf16_m2_pp1:6 hybrid_1b_m1_pp1:3; do
      name=${spec%%:*} steps=${spec#*:}
      if timeout 300 ./mhcrun "$name.mhcc" --data corpus.txt --steps "$steps" --no-progress \
           --device-profile-out "$out/profile_$name.json" > "$logs/profile_$name.log" 2>&1; then r=PASS; else r=FAIL; fi
      row "device profile $name" $r "$(grep -o 'measured step.*' "$logs/profile_$name.log" | cut -c1-150)"
      cp "$logs/profile_$name.log" "$out/" 2>/dev/null
    done
    # The NVTX ranges around every instruction: an Nsight Systems capture of
    # two tiny steps names them as the trace does (FWD(s0,mb0), ...).
    nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    if [ -z "$nsys" ] && [ -n "$ncu" ]; then
      # Without nsys: Nsight Compute profiles only the kernels inside the
      # push/pop range named FWD(s0,mb1), which exists only if mhcrun marks it.
      timeout 180 "$ncu" --nvtx --nvtx-include "FWD(s0,mb1)/" --metrics gpu__time_duration.sum --csv \
        ./mhcrun tiny_pp1.mhcc --data corpus.txt --steps 1 --no-progress > "$out/nvtx_ncu.csv" 2> "$logs/nvtx_ncu.err"
      kernels=$(grep -c '"gpu__time_duration.sum"' "$out/nvtx_ncu.csv")
      if [ "$kernels" -ge 1 ]; then r=PASS; else r=FAIL; fi
      row "NVTX ranges (ncu --nvtx)" $r "$kernels kernels profiled inside the range FWD(s0,mb1)"
    elif [ -z "$nsys" ]; then
      row "NVTX ranges" SKIP "neither nsys nor ncu on this machine"
    else
      timeout 180 "$nsys" profile --trace=cuda,nvtx --force-overwrite true -o "$logs/nvtx_tiny" \
        ./mhcrun tiny_pp1.mhcc --data corpus.txt --steps 2 --no-progress > "$logs/nvtx.log" 2>&1
      timeout 120 "$nsys" stats --report nvtx_sum --format csv "$logs/nvtx_tiny.nsys-rep" > "$out/nvtx_sum.csv" 2>&1
      ranges=$(grep -c 'FWD(s0,mb\|BWD(s0,mb\|OPTIM' "$out/nvtx_sum.csv")
      if [ "$ranges" -ge 3 ]; then r=PASS; else r=FAIL; fi
      row "NVTX ranges (nsys)" $r "$ranges FWD/BWD/OPTIM range names in nvtx_sum.csv"
    fi
  fi

  # bench_numbers MHCRUN NAME LOGPREFIX: 5 iterations, medians of the last 4,
  # into $numbers; fails when the run fails or the reserved memory grew.
  bench_numbers() {
    local bin=$1 name=$2 log=$3 dir=${4:-.}
    # shellcheck disable=SC2086
    local peak dtype
    peak=$(cat "$name.peak" 2>/dev/null || echo $PEAK_F32)
    dtype=$([ "$peak" = $PEAK_BF16 ] && echo bf16 || echo fp32)
    # GPU_SUITE_BENCH_DATA=corpus_docs with GPU_SUITE_MHCRUN_FLAGS='--reset-position-ids --reset-attention-mask':
    # packed documents (TFLOP/s and MFU then count full causal attention, more than is computed).
    if ! timeout 400 "$bin" "$dir/$name.mhcc" --data "${GPU_SUITE_BENCH_DATA:-corpus.txt}" --steps 5 --no-progress --peak-tflops $peak \
        ${GPU_SUITE_MHCRUN_FLAGS:-} --metrics "$log.jsonl" > "$log.log" 2>&1; then
      numbers=$(tail -1 "$log.log" | cut -c1-150); return 1
    fi
    numbers=$(python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open('$log.jsonl')][1:]
tflops = statistics.median(r['tflops'] for r in rows)
# No device allocation after the first step: the same bytes reserved from step 2 on.
steady = all(r['device_reserved_bytes_per_rank'] == rows[0]['device_reserved_bytes_per_rank'] for r in rows)
print('%.1f ms/iter, %.0f tokens/s, %.2f TFLOP/s, MFU %.1f%% ($dtype), peak MiB %s, memory %s' % (
      statistics.median(r['elapsed_ms'] for r in rows), statistics.median(r['tokens_per_second'] for r in rows),
      tflops, 100 * tflops / ($peak * len(rows[-1]['peak_bytes_per_rank'])),
      ' '.join('%.0f' % (b / 2**20) for b in rows[-1]['peak_bytes_per_rank']),
      'steady' if steady else 'GREW after step 2'))
sys.exit(0 if steady else 1)")
  }

  if [[ $parts == *" bench "* ]]; then
    for name in ${GPU_SUITE_BENCH:-$BENCH_DEFAULT}; do
      [ -f "$name.mhcc" ] || { row "bench $name" SKIP "not in this bundle (pruned)"; continue; }
      case "$name" in
        *_pp4*) [ "$gpus" -ge 4 ] || { row "bench $name" SKIP "needs 4 GPUs, $gpus visible"; continue; } ;;
        *_pp2* | *_dp2_* | *_tp2_* | *_cp2_*)
          [ "$gpus" -ge 2 ] || { row "bench $name" SKIP "needs 2 GPUs, $gpus visible"; continue; } ;;
      esac
      bench_numbers ./mhcrun "$name" "$logs/bench_$name" && r=PASS || r=FAIL
      if [ -x ./mhcrun_baseline ]; then
        ours=$numbers
        bench_numbers ./mhcrun_baseline "$name" "$logs/baseline_$name" "$([ -f "baseline/$name.mhcc" ] && echo baseline || echo .)"
        numbers="$ours; baseline $(python3 -c "
import json, statistics
med = lambda p: statistics.median(json.loads(l)['tokens_per_second'] for l in list(open(p))[1:])
print('%.0f tokens/s, new/baseline %.3f' % (med('$logs/baseline_$name.jsonl'), med('$logs/bench_$name.jsonl') / med('$logs/baseline_$name.jsonl')))" 2>/dev/null || echo failed)"
      fi
      row "bench $name" $r "$numbers"
    done
    for name in ${GPU_SUITE_PROFILE:-}; do
      timeout 200 ./mhcrun "$name.mhcc" --data corpus.txt --steps 3 --no-progress --profile --in-process \
        > "$logs/profile_$name.log" 2>&1 && r=PASS || r=FAIL
      # Measured bubble: idle / (ranks x pipeline wall), the busy time being
      # the sum of each rank's timed primitives; beside mhcc's prediction.
      measured=$(python3 -c "
import re, sys
busy, wall = {}, None
for line in open(sys.argv[1]):
    m = re.match(r'\s*([0-9.]+)\s+rank (\d+) ', line)
    if m: busy[m.group(2)] = busy.get(m.group(2), 0.0) + float(m.group(1))
    m = re.match(r'\s*([0-9.]+)\s+host: pipeline', line)
    if m: wall = float(m.group(1))
print('%.3f' % (1 - sum(busy.values()) / (len(busy) * wall)) if wall and busy else '?')" "$logs/profile_$name.log")
      row "profile $name" $r "bubble measured $measured, predicted $(cat "$name.bubble" 2>/dev/null || echo ?); top items in profile_$name.log"
    done
  fi

  echo "commit $(head -1 COMMIT)$(sed -n 2p COMMIT), $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$table"
  cp "$table" "$logs/"
  tar czf "$out/suite_logs.tgz" -C "$logs" .
  cat "$table"
  for name in ${GPU_SUITE_PROFILE:-}; do grep -v iteration "$logs/profile_$name.log" | head -16; done
  exit $((failed > 0))
  ;;
*)
  echo "usage: tools/gpu_suite.sh bundle|pack|unpack|prune GPUS [SET]|run|adopt-goldens DIR"
  exit 2
  ;;
esac
