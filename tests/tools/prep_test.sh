#!/usr/bin/env bash
# mhc-prep (issue 16) end to end:
# 1. text and JSONL (two inputs, one run) with the bytes tokenizer: each
#    document's tokens and the boundaries read back exactly by an independent
#    Python reader of the .idx/.bin (struct only), the runtime's reader
#    (TokenDataset::fromIndexed, prep_dataset_dump) gives the same stream,
#    and mhcrun trains two steps of tiny on it, printing a validation loss
#    (--eval-interval, the default --split 98,2), and on a blend of it with
#    the text file;
# 2. sentencepiece: a model trained here with spm_train; mhc-prep's ids for
#    every line equal spm_encode's, with --append-eod the model's eos id
#    ends each document, dtype uint16 for its 300 ids;
# 3. bad input (a missing file, a JSONL line that is not JSON, lacks the key
#    or holds no string, an empty corpus, an unreadable model, an id too
#    large for --dtype, --append-eod without an eos id, the output over an
#    input, ...): exit 1, one line on stderr naming the file and line,
#    nothing on stdout, no file written or left behind (an old dataset at the
#    prefix stays as it was); a killed run leaves no temporary file.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
prep="${root}/tools/mhc-prep"
dump="${root}/tests/prep_dataset_dump"
mhcc="${root}/compiler/mhcc"
mhcrun="${root}/tools/mhcrun"
tiny="${root}/models/tiny.json"
corpus="${root}/data/corpus.txt"
work="${TEST_TMPDIR}/prep"
rm -rf "${work}" && mkdir -p "${work}/out"
cd "${work}"
python=/usr/bin/python3
fail() { echo "prep_test: FAIL: $*" >&2; exit 1; }

# The independent reader: PREFIX -> checks the MMIDIDX header and layout,
# prints {"dtype": code, "docs": [[ids], ...]} as JSON.
cat > read_idx.py <<'EOF'
import json, struct, sys
prefix = sys.argv[1]
idx = open(prefix + ".idx", "rb").read()
bin_ = open(prefix + ".bin", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
version, = struct.unpack_from("<Q", idx, 9)
code = idx[17]
count, ndocs = struct.unpack_from("<QQ", idx, 18)
assert version == 1, version
fmt = {1: "B", 8: "H", 4: "i"}[code]
width = struct.calcsize(fmt)
sizes = struct.unpack_from("<%di" % count, idx, 34)
pointers = struct.unpack_from("<%dq" % count, idx, 34 + 4 * count)
doc_idx = struct.unpack_from("<%dq" % ndocs, idx, 34 + 12 * count)
assert len(idx) == 34 + 12 * count + 8 * ndocs, "trailing bytes in the .idx"
assert doc_idx[0] == 0 and doc_idx[-1] == count and list(doc_idx) == sorted(doc_idx), doc_idx
offset, docs = 0, []
for size, pointer in zip(sizes, pointers):
    assert pointer == offset, (pointer, offset)  # sequences tile the .bin
    docs.append(list(struct.unpack_from("<%d%s" % (size, fmt), bin_, pointer)))
    offset += size * width
assert offset == len(bin_), "trailing bytes in the .bin"
json.dump({"dtype": code, "docs": docs, "doc_idx": list(doc_idx)}, sys.stdout)
EOF

# PREFIX EXPECTED.json DTYPE: the reader's documents equal the expected ones,
# one sequence per document, and the runtime reads the same stream.
check_dataset() {
  local name
  name=$(basename "$1")
  "${python}" read_idx.py "$1" > "${name}.read.json" || fail "$1: the Python reader refused it"
  "${dump}" "$1" > "${name}.dump" || fail "$1: TokenDataset::fromIndexed refused it"
  "${python}" - "${name}.read.json" "$2" "$3" "${name}.dump" <<'EOF' || fail "$1 is not what was expected"
import json, sys
got, want, dtype = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
assert got["dtype"] == dtype, ("dtype", got["dtype"], dtype)
assert len(got["docs"]) == len(want), ("documents", len(got["docs"]), len(want))
for i, (g, w) in enumerate(zip(got["docs"], want)):
    assert g == w, ("document", i, g[:20], w[:20])
assert got["doc_idx"] == list(range(len(want) + 1)), "one sequence per document"
lines = open(sys.argv[4]).read().split("\n")
stream = [t for d in want for t in d]
assert int(lines[0]) == len(stream), ("runtime token count", lines[0], len(stream))
assert [int(t) for t in lines[1].split()] == stream, "the runtime's stream differs"
EOF
}

# 1. Bytes: a text file (an empty line, a CRLF line, UTF-8, no final newline)
# and a JSONL file (blank lines, escapes, a newline inside a value, other keys).
printf 'first line\n\nsecond \xc3\xa9t\xc3\xa9 line\r\n   \nlast line, no newline' > a.txt
cat > b.jsonl <<'EOF'
{"text": "json one", "id": 1}

{"id": 2, "text": "caf\u00e9\nnext line\ttab"}
   
{"text": "", "note": "empty: skipped"}
{"text": "quote \" and \\ backslash", "meta": {"text": "nested is ignored"}}
EOF
"${python}" - <<'EOF'
import json
docs = []
for line in open("a.txt", "rb").read().split(b"\n"):   # one line = one document
    line = line[:-1] if line.endswith(b"\r") else line
    if line:
        docs.append(list(line))
for line in open("b.jsonl", encoding="utf-8"):
    if line.strip():
        text = json.loads(line)["text"].encode("utf-8")
        if text:
            docs.append(list(text))
json.dump(docs, open("bytes.expected.json", "w"))
EOF
"${prep}" --input a.txt --input b.jsonl --output-prefix out/bytes > bytes.log 2> bytes.err || fail "bytes run: $(cat bytes.err)"
[ ! -s bytes.err ] || fail "bytes run wrote to stderr: $(cat bytes.err)"
[ "$(wc -l < bytes.log)" -eq 1 ] || fail "the summary is not one line: $(cat bytes.log)"
grep -Eq '^mhc-prep: 7 documents \(2 empty skipped\), 101 tokens, dtype uint8 \(bytes, vocabulary 256\), [0-9]+ tokens/s: wrote out/bytes\.bin, out/bytes\.idx$' \
  bytes.log || fail "summary: $(cat bytes.log)"
check_dataset out/bytes bytes.expected.json 1
[ "$(ls out | tr '\n' ' ')" = "bytes.bin bytes.idx " ] || fail "not just the two files: $(ls out)"
# --format text reads a .jsonl file's lines as text; --json-key picks another key.
"${prep}" --input b.jsonl --format text --output-prefix out/astext > /dev/null || fail "--format text"
"${python}" -c "
import json; json.dump([list(l.rstrip(b'\n')) for l in open('b.jsonl','rb') if l.rstrip(b'\n')], open('astext.json','w'))"
check_dataset out/astext astext.json 1
printf '{"body": "abc", "text": 5}\n{"body": "de"}\n' > keyed.jsonl
"${prep}" --input keyed.jsonl --json-key body --output-prefix out/keyed > /dev/null || fail "--json-key"
echo '[[97, 98, 99], [100, 101]]' > keyed.json
check_dataset out/keyed keyed.json 1

# The shipped corpus: mhcrun trains on the prefix.
"${prep}" --input "${corpus}" --output-prefix out/corpus > corpus.log || fail "corpus"
"${python}" -c "
import json; json.dump([list(l.rstrip(b'\n')) for l in open('${corpus}','rb') if l.rstrip(b'\n')], open('corpus.json','w'))"
check_dataset out/corpus corpus.json 1
"${mhcc}" "${tiny}" --pp 1 --microbatches 2 --cuda-arch none --emit=artifact -o tiny.mhcc
"${mhcrun}" tiny.mhcc --data out/corpus --steps 2 --no-progress --metrics run.jsonl --eval-interval 1 > run.log 2>&1 \
  || fail "mhcrun on the prepared corpus: $(tail -3 run.log)"
[ "$(wc -l < run.jsonl)" -eq 2 ] || fail "mhcrun did not train two steps: $(cat run.log)"
grep -q "^ validation loss at iteration 2 | lm loss value: " run.log || fail "no validation line: $(cat run.log)"
# Packed documents (Megatron's --reset-position-ids --reset-attention-mask):
# the same windows, another loss; a blend with the text file (no documents)
# is refused with one line.
"${mhcrun}" tiny.mhcc --data out/corpus --steps 2 --no-progress --metrics packed.jsonl --reset-position-ids \
  --reset-attention-mask > packed.log 2>&1 || fail "mhcrun with packed documents: $(tail -3 packed.log)"
[ "$(wc -l < packed.jsonl)" -eq 2 ] || fail "mhcrun did not train two packed steps: $(cat packed.log)"
[ "$(head -1 packed.jsonl | grep -o '"lm_loss":[^,]*')" != "$(head -1 run.jsonl | grep -o '"lm_loss":[^,]*')" ] \
  || fail "packed documents did not change the first loss"
if "${mhcrun}" tiny.mhcc --data "0.3 out/corpus 0.7 ${corpus}" --steps 1 --reset-attention-mask > nodocs.log 2>&1; then
  fail "--reset-attention-mask on a blend with a text file was accepted"
fi
[ "$(wc -l < nodocs.log)" -eq 1 ] && grep -q "has no document boundaries" nodocs.log \
  || fail "no one-line refusal of --reset-attention-mask without documents: $(cat nodocs.log)"
# A blend of the prepared corpus and the text file (Megatron's --data-path W P ... syntax).
"${mhcrun}" tiny.mhcc --data "0.3 out/corpus 0.7 ${corpus}" --steps 2 --no-progress --metrics blend.jsonl \
  > blend.log 2>&1 || fail "mhcrun on a blend: $(tail -3 blend.log)"
[ "$(wc -l < blend.jsonl)" -eq 2 ] || fail "mhcrun did not train two steps on the blend: $(cat blend.log)"

# 2. SentencePiece, against spm_encode.
command -v spm_train > /dev/null && command -v spm_encode > /dev/null \
  || fail "spm_train/spm_encode not found: install Debian's sentencepiece (tools/setup.sh)"
spm_train --input="${corpus}" --model_prefix=sp --vocab_size=300 --model_type=bpe --eos_id=2 > spm.log 2>&1 \
  || fail "spm_train: $(tail -3 spm.log)"
spm_train --input="${corpus}" --model_prefix=sp_noeos --vocab_size=300 --eos_id=-1 > spm.log 2>&1 \
  || fail "spm_train without eos: $(tail -3 spm.log)"
spm_encode --model=sp.model --output_format=id < "${corpus}" > spm_ids.txt
"${python}" - <<'EOF'
import json
lines = [l.split() for l in open("spm_ids.txt").read().split("\n")[:-1]]
docs = [[int(t) for t in l] for l in lines if l]
json.dump(docs, open("sp.json", "w"))
json.dump([d + [2] for d in docs], open("sp_eod.json", "w"))
first = next(i for i, d in enumerate(lines, 1) if any(int(t) > 255 for t in d))
open("sp_first_over_255.txt", "w").write(str(first))
EOF
"${prep}" --input "${corpus}" --tokenizer sentencepiece --tokenizer-model sp.model --output-prefix out/sp > sp.log \
  || fail "sentencepiece run"
grep -Eq '^mhc-prep: [0-9]+ documents \([0-9]+ empty skipped\), [0-9]+ tokens, dtype uint16 \(sentencepiece, vocabulary 300\)' \
  sp.log || fail "summary: $(cat sp.log)"
check_dataset out/sp sp.json 8
"${prep}" --input "${corpus}" --tokenizer sentencepiece --tokenizer-model sp.model --append-eod \
  --output-prefix out/sp_eod > /dev/null || fail "sentencepiece --append-eod"
check_dataset out/sp_eod sp_eod.json 8
# The same text as JSONL gives the same ids; --dtype int32 widens the .bin.
"${python}" -c "
import json
with open('corpus.jsonl', 'w') as f:
    for l in open('${corpus}', encoding='utf-8'):
        f.write(json.dumps({'text': l.rstrip('\n')}) + '\n')"
"${prep}" --input corpus.jsonl --tokenizer sentencepiece --tokenizer-model sp.model --dtype int32 \
  --output-prefix out/sp_jsonl > /dev/null || fail "sentencepiece JSONL"
check_dataset out/sp_jsonl sp.json 4

# 3. Bad input. An old dataset at the prefix must survive every failure.
"${prep}" --input a.txt --output-prefix out/old > /dev/null
old_sum=$(cat out/old.bin out/old.idx | md5sum)
printf '{"text": "fine"}\n{"text": "unterminated\n' > notjson.jsonl
printf '{"text": "a"}\n{"text": "b"}\n{"txt": "c", "id": 3}\n' > nokey.jsonl
printf '{"text": 42}\n' > number.jsonl
printf '{"text": "a", "n": 1e99999}\n' > hugenumber.jsonl
printf '[1, 2]\n' > array.jsonl
printf '{"text": "bad \xff byte"}\n' > badutf8.jsonl
printf '\n\n' > blank.txt
: > empty.txt
printf '{"text": ""}\n\n' > empty.jsonl
echo 'garbage' > garbage.model
mkdir -p adir
printf 'clash\n' > clash.idx
first=$(cat sp_first_over_255.txt)
cases=(
  "--input missing.txt|--input missing.txt: cannot open (No such file or directory)"
  "--input a.txt --input notjson.jsonl|notjson.jsonl:2: not JSON (column "
  "--input nokey.jsonl|nokey.jsonl:3: no \"text\" key (its keys: \"id\", \"txt\"); pick one with --json-key"
  "--input number.jsonl|number.jsonl:1: \"text\" is a number, not a string"
  "--input hugenumber.jsonl|hugenumber.jsonl:1: not JSON: a number out of range ("
  "--input array.jsonl|array.jsonl:1: a JSON array, not an object with a \"text\" string"
  "--input badutf8.jsonl|badutf8.jsonl:1: not JSON (column "
  "--input blank.txt|no documents: the inputs hold no non-empty line (2 empty skipped); nothing written"
  "--input empty.txt|no documents"
  "--input empty.jsonl|no documents: the inputs hold no non-empty \"text\" value (1 empty skipped)"
  "--input adir|--input adir: is a directory"
  "--input a.txt --tokenizer sentencepiece --tokenizer-model garbage.model|--tokenizer-model garbage.model: not a SentencePiece model"
  "--input a.txt --tokenizer sentencepiece --tokenizer-model nomodel.model|--tokenizer-model nomodel.model: cannot open"
  "--input a.txt --tokenizer sentencepiece|--tokenizer sentencepiece needs --tokenizer-model"
  "--input a.txt --tokenizer-model sp.model|--tokenizer-model is for --tokenizer sentencepiece"
  "--input ${corpus} --tokenizer sentencepiece --tokenizer-model sp.model --dtype uint8|${corpus}:${first}: token id "
  "--input a.txt --append-eod|--append-eod: the bytes tokenizer has no end-of-document id"
  "--input a.txt --tokenizer sentencepiece --tokenizer-model sp_noeos.model --append-eod|--append-eod: the model sp_noeos.model has no eos id"
  "--input a.txt --format xml|--format: xml not in {auto,text,jsonl}"
  "--input a.txt --dtype int64|--dtype: int64 not in"
  "--input a.txt --bogus|The following argument was not expected: --bogus"
)
for entry in "${cases[@]}"; do
  args="${entry%%|*}"
  want="${entry#*|}"
  rc=0
  # shellcheck disable=SC2086
  "${prep}" ${args} --output-prefix out/old > case.out 2> case.err || rc=$?
  [ "${rc}" -eq 1 ] || fail "'${args}': exit ${rc}, expected 1 ($(cat case.err))"
  [ "$(wc -l < case.err)" -eq 1 ] || fail "'${args}': stderr is not one line: $(cat case.err)"
  [ ! -s case.out ] || fail "'${args}': wrote to stdout: $(cat case.out)"
  grep -qF -- "mhc-prep: ${want}" case.err || fail "'${args}': got '$(cat case.err)', expected '${want}'"
  [ "$(cat out/old.bin out/old.idx | md5sum)" = "${old_sum}" ] || fail "'${args}' changed the old dataset"
  [ "$(ls out | grep -c -e tmp -e '^new')" -eq 0 ] || fail "'${args}' left $(ls out)"
done
# With the line of the id too large, the id and the dtype are named.
"${prep}" --input "${corpus}" --tokenizer sentencepiece --tokenizer-model sp.model --dtype uint8 \
  --output-prefix out/new 2> case.err && fail "--dtype uint8 for 300 ids succeeded"
grep -Eq "^mhc-prep: .*corpus.txt:${first}: token id (2[5-9][0-9]) does not fit the dtype uint8 \(0 to 255\); use --dtype auto$" case.err \
  || fail "the id too large is not named"
# Failures with no old dataset: neither file appears.
for args in "--input a.txt --input notjson.jsonl" "--input empty.txt" "--input a.txt --append-eod"; do
  # shellcheck disable=SC2086
  "${prep}" ${args} --output-prefix out/new 2> /dev/null && fail "'${args}' succeeded"
  [ ! -e out/new.bin ] && [ ! -e out/new.idx ] || fail "'${args}' left out/new.*: $(ls out)"
done
# The output may not replace an input, nor go to a missing folder.
rc=0
"${prep}" --input clash.idx --output-prefix clash 2> case.err || rc=$?
[ "${rc}" -eq 1 ] && grep -qF 'mhc-prep: --output-prefix clash.idx: is the input clash.idx' case.err \
  || fail "output over the input: exit ${rc}, $(cat case.err)"
[ "$(cat clash.idx)" = "clash" ] && [ ! -e clash.bin ] || fail "the input was touched"
rc=0
"${prep}" --input a.txt --output-prefix nowhere/d 2> case.err || rc=$?
[ "${rc}" -eq 1 ] && grep -qF 'mhc-prep: --output-prefix nowhere/d: the folder nowhere does not exist' case.err \
  || fail "missing folder: exit ${rc}, $(cat case.err)"

# A run killed while reading leaves no temporary file.
mkfifo feed
"${prep}" --input feed --output-prefix out/killed > /dev/null 2>&1 &
pid=$!
exec 3> feed
echo "a document" >&3
for _ in $(seq 100); do
  ls out | grep -q '^killed\.bin\.tmp-' && break
  sleep 0.1
done
ls out | grep -q '^killed\.bin\.tmp-' || fail "no temporary .bin while reading: $(ls out)"
kill -TERM "${pid}"
wait "${pid}" || true
exec 3>&-
[ "$(ls out | grep -c '^killed')" -eq 0 ] || fail "a killed run left $(ls out | grep killed)"

echo "prep_test: PASS"
