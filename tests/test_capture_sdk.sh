#!/usr/bin/env bash
# test_capture_sdk.sh — the official Anthropic and OpenAI SDKs (from the npm registry) talking
# to tests/fake_upstream through `sparsetrace capture`, the way users run their agents.
#
# Installs @anthropic-ai/sdk and openai into a temporary directory; skips (exit 77) when node
# or npm is missing or the registry cannot be reached within 60 s. Then, with each SDK pointed at
# the proxy (baseURL), it runs: Anthropic messages.create and messages.stream (text + tool_use,
# finalMessage()), an Anthropic 529 surfacing as the SDK's APIError, an Anthropic stream cut by
# an upstream reset surfacing as an error that names the proxy; OpenAI chat.completions (plain
# and streamed with usage), completions, responses (plain and streamed with a function call).
# Every answer must parse in the SDK; every request must be in the store with the right state;
# the API keys the SDKs sent must appear in no file written.
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
FAKE=${ST_BUILD_DIR:?ST_BUILD_DIR must point at the build tree}/tests/fake_upstream
command -v node > /dev/null && command -v npm > /dev/null || { echo "skip: node/npm not installed"; exit 77; }
T=$(mktemp -d /tmp/st_capture_sdk.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

if ! (cd "$T" && timeout 60 npm install --no-audit --no-fund --silent --no-save \
        @anthropic-ai/sdk openai > "$T/npm.log" 2>&1); then
  echo "skip: could not install the SDKs from the npm registry:"; tail -5 "$T/npm.log"
  exit 77
fi
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy

"$FAKE" --port-file "$T/fake.port" > /dev/null &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$T/fake.port" ] && break; sleep 0.05; done
"$BIN" capture --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$(cat "$T/fake.port")" \
  --store "$T/store" --ready-file "$T/ready" 2> "$T/proxy.log" &
PROXY_PID=$!
PIDS+=($PROXY_PID)
for _ in $(seq 200); do [ -s "$T/ready" ] && break; sleep 0.05; done

cat > "$T/clients.js" <<'EOF'
const Anthropic = require('@anthropic-ai/sdk');
const OpenAI = require('openai');
const base = process.argv[2];
const failures = [];
function check(what, ok, detail) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${ok ? '' : ': ' + JSON.stringify(detail)}`);
  if (!ok) failures.push(what);
}
const TEXT = 'Héllo 🌍 w1 w2 w3 w4 ';
(async () => {
  const anthropic = new Anthropic({ apiKey: 'sk-ant-SDKPLANTED-0001', baseURL: base, maxRetries: 0 });
  const msg = await anthropic.messages.create({
    model: 'claude-sdk', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] });
  check('anthropic messages.create', msg.content[0].text === TEXT, msg);
  const stream = anthropic.messages.stream(
    { model: 'claude-sdk', max_tokens: 64, messages: [{ role: 'user', content: 'weather?' }] },
    { headers: { 'x-fake-tool': '1' } });
  let deltas = 0;
  stream.on('text', () => deltas++);
  const final = await stream.finalMessage();
  const tool = final.content.find((b) => b.type === 'tool_use');
  check('anthropic messages.stream text', final.content[0].text === TEXT && deltas === 5, final);
  check('anthropic messages.stream tool_use', tool && tool.input.location === 'San Francisco', final);
  try {
    await anthropic.messages.create({ model: 'claude-sdk', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] },
                                    { headers: { 'x-fake-status': '529' } });
    check('anthropic 529 raises', false, 'no error');
  } catch (e) {
    check('anthropic 529 raises APIError 529', e.status === 529, String(e));
  }
  try {
    const s = anthropic.messages.stream(
      { model: 'claude-sdk', max_tokens: 64, messages: [{ role: 'user', content: 'x' }] },
      { headers: { 'x-fake-fail': 'reset-mid-stream' } });
    await s.finalMessage();
    check('anthropic stream cut by upstream reset raises', false, 'no error');
  } catch (e) {
    check('anthropic stream cut raises an error naming the proxy', /sparsetrace capture/.test(String(e.message || e)), String(e));
  }

  const openai = new OpenAI({ apiKey: 'sk-SDKPLANTED-0002', baseURL: base + '/v1', maxRetries: 0 });
  const chat = await openai.chat.completions.create({ model: 'gpt-sdk', messages: [{ role: 'user', content: 'hi' }] });
  check('openai chat.completions.create', chat.choices[0].message.content === TEXT, chat);
  let text = '', usage = null;
  const chunks = await openai.chat.completions.create({
    model: 'gpt-sdk', stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'hi' }] });
  for await (const c of chunks) {
    if (c.choices[0] && c.choices[0].delta.content) text += c.choices[0].delta.content;
    if (c.usage) usage = c.usage;
  }
  check('openai chat stream', text === TEXT && usage && usage.completion_tokens === 5, { text, usage });
  const comp = await openai.completions.create({ model: 'gpt-sdk', prompt: 'hi' });
  check('openai completions.create', comp.choices[0].text === TEXT, comp);
  const resp = await openai.responses.create({ model: 'gpt-sdk', input: 'hi' });
  check('openai responses.create', resp.output_text === TEXT, resp);
  const rs = await openai.responses.create({ model: 'gpt-sdk', input: 'weather?', stream: true },
                                           { headers: { 'x-fake-tool': '1' } });
  let completed = null, rtext = '';
  for await (const ev of rs) {
    if (ev.type === 'response.output_text.delta') rtext += ev.delta;
    if (ev.type === 'response.completed') completed = ev.response;
  }
  const call = completed && completed.output.find((o) => o.type === 'function_call');
  check('openai responses stream', rtext === TEXT && call && JSON.parse(call.arguments).location === 'San Francisco', completed);
  process.exit(failures.length ? 1 : 0);
})().catch((e) => { console.log('FAIL unexpected error: ' + (e.stack || e)); process.exit(1); });
EOF
(cd "$T" && timeout 60 node clients.js "$(cat "$T/ready")")
rc=$?
kill -TERM "$PROXY_PID"
wait "$PROXY_PID"
stop_rc=$?
"$BIN" requests --store "$T/store" list --limit 0 > "$T/list.out"
cat "$T/list.out"
fails=0
[ $rc -eq 0 ] || { echo "FAIL SDK checks"; fails=$((fails + 1)); }
[ $stop_rc -eq 0 ] || { echo "FAIL proxy exit status $stop_rc"; fails=$((fails + 1)); }
n=$(grep -c '^[0-9a-f]\{8\} ' "$T/list.out")
[ "$n" -eq 9 ] || { echo "FAIL expected 9 requests in the store, found $n"; fails=$((fails + 1)); }
complete=$(grep -c ' complete ' "$T/list.out")
[ "$complete" -eq 8 ] || { echo "FAIL expected 8 complete requests, found $complete"; fails=$((fails + 1)); }
grep -q ' upstream_error ' "$T/list.out" || { echo "FAIL the reset stream is not recorded as upstream_error"; fails=$((fails + 1)); }
if grep -rlaF -e SDKPLANTED "$T/store" "$T/proxy.log"; then
  echo "FAIL an SDK's API key was written to the files above"; fails=$((fails + 1))
fi
[ $fails -eq 0 ] || { cat "$T/proxy.log"; exit 1; }
echo "all checks passed"
