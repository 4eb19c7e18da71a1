#!/usr/bin/env bash
# Fails if the runtime's dependency closure (a genquery output) reaches MLIR,
# LLVM or any compiler-side package.
set -euo pipefail
deps_file="$1"
[ -s "$deps_file" ] || { echo "FAIL: empty dependency list $deps_file"; exit 1; }
forbidden='^(@llvm//|//compiler[:/]|//dialects[:/]|//passes[:/])'
if grep -E "$forbidden" "$deps_file"; then
  echo "FAIL: the runtime depends on the targets above; it must not link MLIR or the compiler"
  exit 1
fi
echo "runtime closure: $(wc -l < "$deps_file") targets, none from MLIR or the compiler"
