#!/usr/bin/env bash
# tools/gpu_suite.sh pack / unpack: the bundle packed here and unpacked on
# the lent machine is the bundle, file for file and mode for mode (the
# binaries stay executable); a missing, corrupt or foreign archive, or one
# with files outside .gpu_bundle, is one clear line and a non-zero exit,
# with nothing written; unpack replaces a stale .gpu_bundle.
set -euo pipefail
suite="${TEST_SRCDIR}/${TEST_WORKSPACE}/tools/gpu_suite.sh"
work="${TEST_TMPDIR}/pack"
rm -rf "${work}" && mkdir -p "${work}/here/tools" "${work}/there/tools"
cp "${suite}" "${work}/here/tools/" && cp "${suite}" "${work}/there/tools/"
fail() { echo "gpu_suite_pack_test: $*" >&2; exit 1; }

# A bundle: a binary, an artifact-like blob, a read-only file, the COMMIT.
cd "${work}/here"
mkdir .gpu_bundle
printf '#!/bin/sh\necho ran\n' > .gpu_bundle/mhcrun && chmod 555 .gpu_bundle/mhcrun
head -c 300000 /dev/urandom > .gpu_bundle/tiny_pp1.mhcc && chmod 444 .gpu_bundle/tiny_pp1.mhcc
echo "0123abcd" > .gpu_bundle/COMMIT
bash tools/gpu_suite.sh pack > pack.txt || fail "pack failed: $(cat pack.txt)"
grep -q "packed .gpu_bundle into .gpu_bundle.tar.xz" pack.txt || fail "pack said: $(cat pack.txt)"
grep -q 'carry \[".gpu_bundle.tar.xz"\]' pack.txt || fail "pack does not say what to carry: $(cat pack.txt)"

# There: unpack over a stale bundle.
cd "${work}/there"
mkdir .gpu_bundle && echo stale > .gpu_bundle/stale
cp "${work}/here/.gpu_bundle.tar.xz" .
bash tools/gpu_suite.sh unpack > unpack.txt || fail "unpack failed: $(cat unpack.txt)"
grep -q "unpacked .gpu_bundle.tar.xz: .gpu_bundle .*, commit 0123abcd" unpack.txt || fail "unpack said: $(cat unpack.txt)"
[ ! -e .gpu_bundle/stale ] || fail "the stale bundle's file survived the unpack"
diff -r "${work}/here/.gpu_bundle" .gpu_bundle || fail "the unpacked bundle differs"
for f in mhcrun tiny_pp1.mhcc COMMIT; do
  [ "$(stat -c %a ".gpu_bundle/$f")" = "$(stat -c %a "${work}/here/.gpu_bundle/$f")" ] ||
    fail "$f: mode $(stat -c %a ".gpu_bundle/$f"), packed as $(stat -c %a "${work}/here/.gpu_bundle/$f")"
done
[ "$(.gpu_bundle/mhcrun)" = ran ] || fail "the unpacked binary does not run"
[ "$(stat -c %a .gpu_bundle/tiny_pp1.mhcc | cut -c1)" != 0 ] || fail "the artifact lost its owner's read bit"

# Refusals: no archive, a corrupt one, one that holds no bundle.
expect_refusal() { # CODE PATTERN: unpack exits CODE and says PATTERN on one line
  set +e
  bash tools/gpu_suite.sh unpack > refusal.txt 2>&1
  local code=$?
  set -e
  [ "${code}" = "$1" ] || fail "unpack exited ${code}, not $1: $(cat refusal.txt)"
  grep -q "$2" refusal.txt || fail "unpack said '$(cat refusal.txt)', not '$2'"
}
rm .gpu_bundle.tar.xz
expect_refusal 2 "gpu_suite: no .gpu_bundle.tar.xz: carry it (tools/gpu_suite.sh pack makes it)"
head -c 4096 /dev/urandom > .gpu_bundle.tar.xz
expect_refusal 1 "gpu_suite: cannot unpack .gpu_bundle.tar.xz"
mkdir -p other && echo x > other/file && tar -cJf .gpu_bundle.tar.xz other
expect_refusal 1 "holds no .gpu_bundle/COMMIT, or something other than files and folders under .gpu_bundle (other, other/file): not a packed bundle"
# A bundle with a file beside it is refused before anything is written.
mkdir -p .gpu_bundle && echo 1 > .gpu_bundle/COMMIT && echo tracked > README.md
echo intruder > beside.md && tar -cJf .gpu_bundle.tar.xz .gpu_bundle beside.md && rm beside.md
expect_refusal 1 "under .gpu_bundle (beside.md): not a packed bundle"
[ ! -e beside.md ] || fail "a refused archive wrote beside.md"
# Links are refused too (a symbolic link out of the bundle, then a file
# through it; a hard link to a tracked file), and names that only look like
# the bundle's ("Xgpu_bundle", "/gpu_bundle").
ln -s "${work}/outside" .gpu_bundle/link && tar -cJf .gpu_bundle.tar.xz .gpu_bundle && rm .gpu_bundle/link
expect_refusal 1 "(.gpu_bundle/link): not a packed bundle"
python3 - <<'PY'
import io, tarfile
with tarfile.open(".gpu_bundle.tar.xz", "w:xz") as t:
    for name in (".gpu_bundle/COMMIT", "Xgpu_bundle/y", "/gpu_bundle/x"):
        data = b"1\n"
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
PY
expect_refusal 1 "(Xgpu_bundle/y, /gpu_bundle/x): not a packed bundle"
[ ! -e Xgpu_bundle ] && [ ! -e "${work}/outside" ] || fail "a refused archive wrote a file"
echo "gpu_suite_pack_test: passed"
