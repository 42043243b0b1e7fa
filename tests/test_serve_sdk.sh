#!/usr/bin/env bash
# test_serve_sdk.sh — the official OpenAI and Anthropic SDKs (from the npm registry) pointed at
# `sparsetrace serve` on the bundled needle model, unchanged: OpenAI chat.completions.create
# (plain, and streamed with usage), responses.create (plain and streamed), Anthropic
# messages.create and messages.stream (finalMessage()). Every answer must parse in the SDK, the
# streamed text must equal the plain answer's (greedy decoding), usage must be there, and every
# request must be a served row of the store with the SDKs' API keys written nowhere.
#
# Installs openai and @anthropic-ai/sdk into a temporary directory; skips (exit 77) when node or
# npm is missing or the registry cannot be reached within 60 s (the SDKs are not vendored).
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
SRC=$(cd "${ST_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
MODEL=$SRC/models/needle-v4
[ -f "$MODEL/model.safetensors" ] || { echo "skip: models/needle-v4 is not there"; exit 77; }
command -v node > /dev/null && command -v npm > /dev/null || { echo "skip: node/npm not installed"; exit 77; }
T=$(mktemp -d /tmp/st_serve_sdk.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
if ! (cd "$T" && timeout 60 npm install --no-audit --no-fund --silent --no-save \
        @anthropic-ai/sdk openai > "$T/npm.log" 2>&1) || [ ! -d "$T/node_modules/openai" ]; then
  echo "skip: could not install the SDKs from the npm registry:"; tail -5 "$T/npm.log"
  exit 77
fi
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy

"$BIN" serve --model "$MODEL" --store "$T/store" --port 0 --ready-file "$T/ready" --quiet 2> "$T/serve.log" &
SERVER_PID=$!
PIDS+=($SERVER_PID)
for _ in $(seq 300); do [ -s "$T/ready" ] && break; sleep 0.05; done

cat > "$T/clients.js" <<'EOF'
const Anthropic = require('@anthropic-ai/sdk');
const OpenAI = require('openai');
const base = process.argv[2];
const failures = [];
function check(what, ok, detail) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${ok ? '' : ': ' + JSON.stringify(detail)}`);
  if (!ok) failures.push(what);
}
const system = 'You are a coding agent.\nEnvironment:\nWorking directory: /home/kai/src/tern\nShell: bash';
const question = 'What is the working directory? Copy that line verbatim.';
(async () => {
  const openai = new OpenAI({ apiKey: 'sk-SDKSERVEPLANTED-0001', baseURL: base + '/v1', maxRetries: 0 });
  const messages = [{ role: 'system', content: system }, { role: 'user', content: question }];
  const chat = await openai.chat.completions.create({ model: 'needle-v4', max_tokens: 12, messages });
  const text = chat.choices[0].message.content;
  check('openai chat.completions.create', typeof text === 'string' && text.length > 0 &&
        chat.usage.completion_tokens > 0 && chat.usage.prompt_tokens > 0, chat);
  let streamed = '', usage = null, finish = null;
  const chunks = await openai.chat.completions.create({ model: 'needle-v4', max_tokens: 12, messages,
    stream: true, stream_options: { include_usage: true } });
  for await (const c of chunks) {
    if (c.choices[0] && c.choices[0].delta.content) streamed += c.choices[0].delta.content;
    if (c.choices[0] && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    if (c.usage) usage = c.usage;
  }
  check('openai chat stream == plain answer, with usage', streamed === text && finish ===
        chat.choices[0].finish_reason && usage && usage.total_tokens === chat.usage.total_tokens,
        { streamed, text, usage, finish });

  const resp = await openai.responses.create({ model: 'needle-v4', instructions: system, input: question,
                                               max_output_tokens: 12 });
  check('openai responses.create (output_text)', typeof resp.output_text === 'string' &&
        resp.output_text.length > 0 && resp.usage.output_tokens > 0, resp);
  const rs = await openai.responses.create({ model: 'needle-v4', instructions: system, input: question,
                                             max_output_tokens: 12, stream: true });
  let rtext = '', final = null;
  for await (const ev of rs) {
    if (ev.type === 'response.output_text.delta') rtext += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  check('openai responses stream == plain answer', rtext === resp.output_text && final &&
        final.status === resp.status, { rtext, status: final && final.status });

  const anthropic = new Anthropic({ apiKey: 'sk-ant-SDKSERVEPLANTED-0002', baseURL: base, maxRetries: 0 });
  const msg = await anthropic.messages.create({ model: 'needle-v4', max_tokens: 12, system,
                                                messages: [{ role: 'user', content: question }] });
  const mtext = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check('anthropic messages.create', msg.type === 'message' && mtext.length > 0 &&
        msg.usage.output_tokens > 0, msg);
  const stream = anthropic.messages.stream({ model: 'needle-v4', max_tokens: 12, system,
                                             messages: [{ role: 'user', content: question }] });
  let deltas = '';
  stream.on('text', (t) => { deltas += t; });
  const fm = await stream.finalMessage();
  const ftext = fm.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check('anthropic messages.stream finalMessage == plain answer', ftext === mtext && deltas === mtext &&
        fm.stop_reason === msg.stop_reason && fm.usage.output_tokens === msg.usage.output_tokens,
        { ftext, mtext, deltas });
  try {
    await anthropic.messages.create({ model: 'needle-v4', max_tokens: 4, temperature: 1,
                                      messages: [{ role: 'user', content: 'x' }] });
    check('anthropic temperature 1 raises', false, 'no error');
  } catch (e) {
    check('anthropic temperature 1 raises BadRequestError 400', e.status === 400, String(e));
  }
  process.exit(failures.length ? 1 : 0);
})().catch((e) => { console.log('FAIL unexpected error: ' + (e.stack || e)); process.exit(1); });
EOF
(cd "$T" && timeout 120 node clients.js "$(cat "$T/ready")")
rc=$?
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"
stop_rc=$?
fails=0
[ $rc -eq 0 ] || { echo "FAIL SDK checks"; fails=$((fails + 1)); }
[ $stop_rc -eq 0 ] || { echo "FAIL serve exit status $stop_rc after SIGTERM"; fails=$((fails + 1)); }
n=$(sqlite3 "$T/store/index.sqlite" "SELECT count(*) FROM requests WHERE origin = 'served' AND state = 'complete'")
r=$(sqlite3 "$T/store/index.sqlite" "SELECT count(*) FROM requests WHERE origin = 'served' AND state = 'rejected' AND status = 400")
if [ "$n" = 6 ] && [ "$r" = 1 ]; then echo "ok   every SDK request is a served row ($n complete, $r rejected)"; else echo "FAIL served rows: $n complete, $r rejected"; fails=$((fails + 1)); fi
if grep -rqa SDKSERVEPLANTED "$T/store" "$T/serve.log"; then echo "FAIL an SDK key was written"; fails=$((fails + 1)); else echo "ok   no SDK key written"; fi
echo "$fails failure(s)"
[ "$fails" = 0 ]
