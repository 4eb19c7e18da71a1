#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cpp) with clang++-22 and
# runs each over a copy of its seed corpus (tests/fuzz/corpus/TARGET).
#
#   tools/fuzz.sh [--runs N | --max-time S] [--out DIR] [--build-only] [TARGET...]
#
# They are built outside Bazel, one compile at a time (the machines are
# small and shared): the readers' plain C++ from the source tree, and for the
# MLIR targets (importer, pipe_ir, mhcc_flags) also the dialects and passes,
# with the headers mlir-tblgen generates taken from Bazel's output tree
# (FUZZ_GEN_DIR, else `bazel build` of the tblgen rules). The suite's smoke
# run of those three is tests/fuzz/fuzz_replay_main.cpp, built by Bazel. A crash, leak,
# timeout (-timeout=10) or sanitizer report fails the target: its input is
# saved under OUT/crashes/TARGET/ and the script exits non-zero.
# Environment: CXX (default clang++-22), FUZZ_SKIP_IF_NO_CLANG=1 exits 0 with
# a message when the compiler is missing (the test suite on a machine that
# did not run tools/setup.sh).
set -uo pipefail

# Resolved through links: under Bazel the script is a runfiles link into the
# source tree, and the targets compile from that tree.
ROOT="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
RUNS=1000000
MAX_TIME=""
OUT="$ROOT/out/fuzz"
BUILD_ONLY=0
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --max-time) MAX_TIME="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done

# Each target's reader sources: what runtime/BUILD, compiler/BUILD and
# passes/pipeline/BUILD compile for that reader, and the system libraries.
declare -A SOURCES=(
  [model_graph]="compiler/ModelGraph.cpp"
  [layout]="passes/pipeline/Layout.cpp"
  [artifact]="runtime/artifact/Artifact.cpp runtime/artifact/Validate.cpp runtime/program/Collectives.cpp runtime/program/Instructions.cpp runtime/program/Program.cpp"
  [safetensors]="runtime/io/Safetensors.cpp"
  [dataset]="runtime/data/Dataset.cpp"
  [checkpoint]="runtime/io/Checkpoint.cpp runtime/io/Safetensors.cpp runtime/artifact/Artifact.cpp runtime/artifact/Validate.cpp runtime/program/Collectives.cpp runtime/program/Instructions.cpp runtime/program/Program.cpp"
  [checkpoint_tensors]="runtime/io/Checkpoint.cpp runtime/io/Safetensors.cpp runtime/artifact/Artifact.cpp runtime/artifact/Validate.cpp runtime/program/Collectives.cpp runtime/program/Instructions.cpp runtime/program/Program.cpp"
  [mhcrun_flags]="runtime/cli/RunFlags.cpp runtime/cli/FlagChecks.cpp"
  [prep]="tools/prep/Prep.cpp tools/prep/IndexedWriter.cpp runtime/cli/FlagChecks.cpp runtime/data/Dataset.cpp"
)
# The MLIR targets: the dialects, passes and compiler sources they run, built
# with the headers mlir-tblgen generates (Bazel's; see GEN below) and linked
# with Debian's libMLIR.so and libLLVM.so (not instrumented: the fuzzer's
# coverage and sanitizers are on mhcc's own code).
MLIR_CORE="compiler/ModelGraph.cpp compiler/Importer.cpp compiler/Pipeline.cpp
  dialects/mhc/IR/MhcDialect.cpp dialects/mhc/IR/MhcOps.cpp dialects/pipe/IR/PipeDialect.cpp
  passes/CostModel.cpp passes/DeviceProfile.cpp passes/ModelSummary.cpp passes/ModelUnits.cpp passes/PipeInsertP2P.cpp
  passes/PipePartition.cpp passes/PipeSchedule.cpp passes/PipeVerifySchedule.cpp passes/PipelineIR.cpp
  passes/TestMisorderP2P.cpp passes/pipeline/AutoPartition.cpp passes/pipeline/Layout.cpp
  passes/pipeline/Schedule.cpp passes/pipeline/Simulator.cpp
  runtime/program/Collectives.cpp runtime/program/Instructions.cpp runtime/program/Program.cpp runtime/program/Trace.cpp"
SOURCES[importer]="$MLIR_CORE"
SOURCES[pipe_ir]="$MLIR_CORE"
SOURCES[mhcc_flags]="$MLIR_CORE compiler/DriverSteps.cpp compiler/AutoSchedule.cpp runtime/cli/FlagChecks.cpp"
MLIR_LIBS="-L/usr/lib/llvm-22/lib -Wl,-rpath,/usr/lib/llvm-22/lib -lMLIR -lLLVM"
declare -A LIBS=([artifact]="-lxxhash" [checkpoint]="-lxxhash" [checkpoint_tensors]="-lxxhash" [prep]="-lsentencepiece"
  [importer]="$MLIR_LIBS" [pipe_ir]="$MLIR_LIBS" [mhcc_flags]="$MLIR_LIBS")
MLIR_TARGETS=(importer pipe_ir mhcc_flags)
ALL=(model_graph layout artifact safetensors dataset checkpoint checkpoint_tensors mhcrun_flags prep importer pipe_ir mhcc_flags)
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [ -n "${SOURCES[$t]:-}" ] || { echo "fuzz.sh: unknown target '$t' (known: ${ALL[*]})" >&2; exit 2; }
done

needs_mlir=0
for t in "${TARGETS[@]}"; do
  for m in "${MLIR_TARGETS[@]}"; do [ "$t" != "$m" ] || needs_mlir=1; done
done

CXX="${CXX:-clang++-22}"
if ! command -v "$CXX" >/dev/null 2>&1; then
  if [ "${FUZZ_SKIP_IF_NO_CLANG:-0}" = 1 ]; then
    echo "fuzz.sh: SKIPPED: $CXX not found (tools/setup.sh installs clang-22 and libfuzzer-22-dev)"
    exit 0
  fi
  echo "fuzz.sh: $CXX not found; run tools/setup.sh (clang-22, libfuzzer-22-dev)" >&2
  exit 2
fi

# UBSan aborts at its first report (no recovery), so every report is a crash.
# vptr checks are off as in Bazel's asan configuration (.bazelrc): Debian's
# LLVM has no RTTI, so UBSan cannot check the dynamic type of its objects.
CXXFLAGS=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize=vptr -fno-sanitize-recover=all -I"$ROOT")
MLIR_FLAGS=()
mkdir -p "$OUT"
if [ $needs_mlir = 1 ]; then
  # The dialects' and passes' generated headers (*.h.inc): FUZZ_GEN_DIR, or
  # Bazel's output tree after building just the mlir-tblgen rules.
  GEN="${FUZZ_GEN_DIR:-}"
  if [ -z "$GEN" ]; then
    (cd "$ROOT" && bazel build //dialects/mhc:mhc_inc_gen //dialects/pipe:pipe_inc_gen //passes:passes_inc_gen \
      >"$OUT/bazel.log" 2>&1) || { cat "$OUT/bazel.log" >&2; echo "fuzz.sh: bazel could not generate the MLIR headers" >&2; exit 1; }
    GEN="$(cd "$ROOT" && bazel info bazel-bin 2>/dev/null)"
  fi
  [ -f "$GEN/dialects/mhc/IR/MhcOps.h.inc" ] || { echo "fuzz.sh: no generated MLIR headers under '$GEN'" >&2; exit 1; }
  # LLVM's inline allocators must not poison memory the uninstrumented
  # libMLIR also allocates from (tests/fuzz/llvm_no_poisoning.h says why).
  MLIR_FLAGS=(-I"$GEN" -I/usr/lib/llvm-22/include -include "$ROOT/tests/fuzz/llvm_no_poisoning.h")
fi
mkdir -p "$OUT/bin" "$OUT/logs"
: >"$OUT/logs/build.log"

# One object per source and flag set (obj/ for the plain readers, obj-mlir/
# for the MLIR targets), shared by the targets that use it, rebuilt when the
# source or a header it includes (clang's -MMD list) is newer, or when the
# flags changed (every object of the set then).
prepare_objects() { # DIR FLAGS...
  local dir="$1"; shift
  mkdir -p "$dir"
  if [ "$(cat "$dir/flags" 2>/dev/null)" != "$CXX $*" ]; then
    rm -f "$dir/"*.o "$dir/"*.d
    echo "$CXX $*" >"$dir/flags"
  fi
}
prepare_objects "$OUT/obj" "${CXXFLAGS[@]}"
[ $needs_mlir = 0 ] || prepare_objects "$OUT/obj-mlir" "${CXXFLAGS[@]}" "${MLIR_FLAGS[@]}"
stale() { # OBJECT: missing, or older than a file its .d lists
  local obj="$1" dep
  [ -f "$obj" ] && [ -f "$obj.d" ] || return 0
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
    [ "$dep" -nt "$obj" ] && return 0
  done
  return 1
}
compile() { # SOURCE (relative to ROOT) DIR FLAGS... -> prints the object's path
  local src="$ROOT/$1" obj="$2/${1//\//_}.o"
  shift 2
  if stale "$obj"; then
    "$CXX" "$@" -MMD -MF "$obj.d" -c "$src" -o "$obj.tmp" >>"$OUT/logs/build.log" 2>&1 || return 1
    mv "$obj.tmp" "$obj"
  fi
  echo "$obj"
}

is_mlir_target() { local m; for m in "${MLIR_TARGETS[@]}"; do [ "$1" != "$m" ] || return 0; done; return 1; }

build() { # TARGET
  local t="$1" bin="$OUT/bin/${1}_fuzz" objs=() s obj start=$SECONDS dir="$OUT/obj" flags=("${CXXFLAGS[@]}")
  if is_mlir_target "$t"; then dir="$OUT/obj-mlir" flags+=("${MLIR_FLAGS[@]}"); fi
  for s in tests/fuzz/${t}_fuzz.cpp ${SOURCES[$t]}; do
    if ! obj=$(compile "$s" "$dir" "${flags[@]}"); then
      cat "$OUT/logs/build.log" >&2
      echo "fuzz.sh: $t: cannot compile $s" >&2
      return 1
    fi
    objs+=("$obj")
  done
  "$CXX" "${CXXFLAGS[@]}" "${objs[@]}" ${LIBS[$t]:-} -o "$bin" >>"$OUT/logs/build.log" 2>&1 ||
    { cat "$OUT/logs/build.log" >&2; echo "fuzz.sh: $t: link failed" >&2; return 1; }
  echo "fuzz.sh: built $t in $((SECONDS - start)) s"
}

status=0
for t in "${TARGETS[@]}"; do build "$t" || status=1; done
[ $status -eq 0 ] || exit 1
[ $BUILD_ONLY -eq 0 ] || exit 0

LIMIT=(-runs="$RUNS")
[ -z "$MAX_TIME" ] || LIMIT=(-max_total_time="$MAX_TIME")
printf '%-12s %10s %8s %6s  %s\n' target execs cov secs result
for t in "${TARGETS[@]}"; do
  # The fuzzer adds what it finds to a copy, so the seeds in the repo stay small.
  work="$OUT/corpus/$t" crashes="$OUT/crashes/$t" log="$OUT/logs/$t.log"
  rm -rf "$work" && mkdir -p "$work" "$crashes"
  cp "$ROOT/tests/fuzz/corpus/$t/"* "$work/" 2>/dev/null
  # A dictionary of the format's keys and names, where there is one, lets
  # mutations write whole JSON keys instead of guessing them byte by byte.
  # (The tensor-file and importer targets read the formats of two others.)
  declare -A SAME_FORMAT=([checkpoint_tensors]=safetensors [importer]=model_graph)
  dict=() format="${SAME_FORMAT[$t]:-$t}"
  [ ! -f "$ROOT/tests/fuzz/$format.dict" ] || dict=(-dict="$ROOT/tests/fuzz/$format.dict")
  # The dataset and checkpoint harnesses write files under $TMPDIR.
  tmp="$OUT/tmp/$t" && rm -rf "$tmp" && mkdir -p "$tmp"
  start=$SECONDS
  TMPDIR="$tmp" "$OUT/bin/${t}_fuzz" "${LIMIT[@]}" "${dict[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=131072 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "$work" >"$log" 2>&1
  rc=$?
  secs=$((SECONDS - start))
  rm -rf "$tmp"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  result=ok
  if [ $rc -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' "$log"; then
    result="FAILED (rc $rc; log $log; inputs: $(ls "$crashes" | tr '\n' ' '))"
    # A target may mute stderr while an input runs (mhcc_flags): replay each
    # saved input with it open, so the report is in the log.
    for input in "$crashes"/*; do
      [ -f "$input" ] && MHCC_FUZZ_VERBOSE=1 TMPDIR="$OUT" "$OUT/bin/${t}_fuzz" "$input" >>"$log" 2>&1
    done
    grep -m3 -E 'ERROR:|runtime error:|SUMMARY:' "$log" | sed 's/^/    /'
    status=1
  fi
  printf '%-12s %10s %8s %6s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "$secs" "$result"
done
exit $status
