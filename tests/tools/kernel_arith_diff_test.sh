#!/usr/bin/env bash
# tools/kernel_arith_diff.py's comparison on hand-written PTX (no nvcc
# needed): a kernel with other registers, another load base and its
# independent instructions in another order has the same arithmetic; one
# whose sum is associated otherwise, summed in another order, or contracted
# (mul + add against fma) does not, and is named; a missing file is an
# error (exit 2).
set -euo pipefail
tool="${TEST_SRCDIR}/${TEST_WORKSPACE}/tools/kernel_arith_diff.py"
work="${TEST_TMPDIR}/arith"
rm -rf "${work}" && mkdir -p "${work}" && cd "${work}"
fail() { echo "kernel_arith_diff_test: $*" >&2; exit 1; }

# kernel(a, b, c) = (a * b) + c, then s = x0 + x1 + x2 over three loads.
kernel() { # NAME BODY
  printf '.visible .entry %s(\n\t.param .u64 p\n)\n{\n%s\n}\n' "$1" "$2"
}
base=$(kernel k '	ld.param.u64 	%rd1, [p];
	ld.global.f32 	%f1, [%rd1];
	ld.global.f32 	%f2, [%rd1+4];
	ld.global.f32 	%f3, [%rd1+8];
	fma.rn.f32 	%f4, %f1, %f2, %f3;
	add.f32 	%f5, %f1, %f2;
	add.f32 	%f6, %f5, %f3;
	st.global.f32 	[%rd1+12], %f4;
	st.global.f32 	[%rd1+16], %f6;')
echo "${base}" > base.ptx
# Other registers, another base register, a copy, the two results in another order.
kernel k '	ld.param.u64 	%rd7, [p];
	add.s64 	%rd8, %rd7, 0;
	ld.global.f32 	%f11, [%rd8];
	ld.global.f32 	%f12, [%rd8+4];
	add.f32 	%f15, %f11, %f12;
	ld.global.f32 	%f13, [%rd8+8];
	mov.f32 	%f9, %f13;
	add.f32 	%f16, %f15, %f9;
	fma.rn.f32 	%f14, %f11, %f12, %f13;
	st.global.f32 	[%rd8+16], %f16;
	st.global.f32 	[%rd8+12], %f14;' > same.ptx
python3 "${tool}" --ptx base.ptx same.ptx > out.txt || fail "a renamed, reordered kernel differs: $(cat out.txt)"
grep -q "1 kernels, the same arithmetic" out.txt || fail "said: $(cat out.txt)"

expect_differs() { # FILE WHY
  set +e
  python3 "${tool}" --ptx base.ptx "$1" > out.txt 2>&1
  local code=$?
  set -e
  [ "${code}" = 1 ] || fail "$2: exit ${code}, not 1: $(cat out.txt)"
  grep -q "ptx: k: " out.txt || fail "$2: the kernel is not named: $(cat out.txt)"
}
sed 's/add.f32 \t%f5, %f1, %f2;/add.f32 \t%f5, %f2, %f3;/; s/add.f32 \t%f6, %f5, %f3;/add.f32 \t%f6, %f1, %f5;/' base.ptx > assoc.ptx
expect_differs assoc.ptx "x0 + (x1 + x2)"
sed 's/add.f32 \t%f5, %f1, %f2;/add.f32 \t%f5, %f1, %f3;/; s/add.f32 \t%f6, %f5, %f3;/add.f32 \t%f6, %f5, %f2;/' base.ptx > order.ptx
expect_differs order.ptx "x0 + x2 + x1"
sed 's/fma.rn.f32 \t%f4, %f1, %f2, %f3;/mul.rn.f32 \t%f7, %f1, %f2;\n\tadd.rn.f32 \t%f4, %f7, %f3;/' base.ptx > contracted.ptx
expect_differs contracted.ptx "mul + add for fma"
cmp -s base.ptx assoc.ptx && fail "the test's own edit did not apply"

set +e
python3 "${tool}" --ptx base.ptx missing.ptx > out.txt 2>&1
code=$?
set -e
[ "${code}" = 1 ] && fail "a missing file gave exit 1"
grep -q "kernel_arith_diff: missing.ptx" out.txt || fail "a missing file said: $(cat out.txt)"
echo "kernel_arith_diff_test: passed"
