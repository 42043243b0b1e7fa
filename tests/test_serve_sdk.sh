#!/usr/bin/env bash
# test_serve_sdk.sh — the official OpenAI and Anthropic SDKs (from the npm registry) pointed at
# `sparsetrace serve` on the bundled needle model, unchanged: OpenAI chat.completions.create
# (plain, and streamed with usage), responses.create (plain and streamed), Anthropic
# messages.create and messages.stream (finalMessage()). Every answer must parse in the SDK, the
# streamed text must equal the plain answer's (greedy decoding), usage must be there, and every
# request must be a served row of the store with the SDKs' API keys written nowhere.
#
# Then the agent loop: a second server whose answers are scripted (--script-answers: a thinking
# part, text and a DSML tool call, then a plain answer, fed through the engine token by token and
# parsed by the same code as generated text) and each SDK's tool-call round trip, streamed and
# not: chat tool_calls, messages tool_use blocks, responses function_call items, the reasoning in
# each API's field (Anthropic's thinking block with its signature); the client runs the tool,
# sends the result back and gets the final answer, and the prompt the engine ran (vLLM's
# prompt_token_ids, decoded) holds the call and the result.
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
    await anthropic.messages.create({ model: 'needle-v4', max_tokens: 4, temperature: 3,
                                      messages: [{ role: 'user', content: 'x' }] });
    check('anthropic temperature 3 raises', false, 'no error');
  } catch (e) {
    check("anthropic temperature 3 (past Anthropic's 0..1) raises BadRequestError 400", e.status === 400, String(e));
  }
  const warm = await anthropic.messages.create({ model: 'needle-v4', max_tokens: 4, temperature: 1,
                                                 messages: [{ role: 'user', content: question }] });
  check('anthropic temperature 1 is sampled and answered', warm.type === 'message' &&
        warm.usage.output_tokens > 0, warm);
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
if [ "$n" = 7 ] && [ "$r" = 1 ]; then echo "ok   every SDK request is a served row ($n complete, $r rejected)"; else echo "FAIL served rows: $n complete, $r rejected"; fails=$((fails + 1)); fi
if grep -rqa SDKSERVEPLANTED "$T/store" "$T/serve.log"; then echo "FAIL an SDK key was written"; fails=$((fails + 1)); else echo "ok   no SDK key written"; fi

# ---- the agent loop: tool calls and reasoning through each SDK ---------------------------------
cat > "$T/answers.json" <<'EOF'
["The user wants the line count; read the file first.</think>Let me read it.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"count_lines\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/srv/notes <draft>.txt</｜DSML｜parameter>\n<｜DSML｜parameter name=\"max\" string=\"false\">500</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
 "</think>The file has 42 lines."]
EOF
"$BIN" serve --model "$MODEL" --store "$T/store2" --port 0 --ready-file "$T/ready2" --quiet \
  --script-answers "$T/answers.json" 2> "$T/serve2.log" &
SERVER2_PID=$!
PIDS+=($SERVER2_PID)
for _ in $(seq 300); do [ -s "$T/ready2" ] && break; sleep 0.05; done
cat > "$T/agent.js" <<'EOF'
const Anthropic = require('@anthropic-ai/sdk');
const OpenAI = require('openai');
const fs = require('fs');
const base = process.argv[2], idsFile = process.argv[3];
const failures = [];
function check(what, ok, detail) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${ok ? '' : ': ' + JSON.stringify(detail)}`);
  if (!ok) failures.push(what);
}
const wantArgs = { path: '/srv/notes <draft>.txt', max: 500 };
const countLines = (args) => (args.path === wantArgs.path ? '42' : 'no such file');
const sameArgs = (a) => JSON.stringify(a) === JSON.stringify(wantArgs);
const schema = { type: 'object', properties: { path: { type: 'string' }, max: { type: 'integer' } }, required: ['path'] };
const question = 'How many lines has /srv/notes <draft>.txt?';
const final = 'The file has 42 lines.';
const reasoning = 'The user wants the line count; read the file first.';
(async () => {
  const openai = new OpenAI({ apiKey: 'sk-SDKSERVEPLANTED-0003', baseURL: base + '/v1', maxRetries: 0 });
  const tools = [{ type: 'function', function: { name: 'count_lines', description: 'Counts lines', parameters: schema } }];
  for (const stream of [false, true]) {
    const messages = [{ role: 'user', content: question }];
    let msg, finish;
    if (!stream) {
      const r = await openai.chat.completions.create({ model: 'needle-v4', max_tokens: 200, messages, tools });
      msg = r.choices[0].message;
      finish = r.choices[0].finish_reason;
    } else {
      const s = await openai.chat.completions.create({ model: 'needle-v4', max_tokens: 200, messages, tools, stream: true });
      const calls = [];
      let content = '';
      for await (const c of s) {
        const ch = c.choices[0];
        if (!ch) continue;
        if (ch.delta.content) content += ch.delta.content;
        for (const tc of ch.delta.tool_calls || []) {
          calls[tc.index] = calls[tc.index] || { id: tc.id, type: 'function', function: { name: '', arguments: '' } };
          if (tc.function.name) calls[tc.index].function.name += tc.function.name;
          if (tc.function.arguments) calls[tc.index].function.arguments += tc.function.arguments;
        }
        if (ch.finish_reason) finish = ch.finish_reason;
      }
      msg = { content, tool_calls: calls };
    }
    const call = msg.tool_calls && msg.tool_calls[0];
    check(`openai chat${stream ? ' stream' : ''}: a tool call (finish_reason tool_calls, arguments as sent)`,
          finish === 'tool_calls' && msg.tool_calls.length === 1 && call.type === 'function' &&
          call.function.name === 'count_lines' && sameArgs(JSON.parse(call.function.arguments)) &&
          msg.content === 'Let me read it.', msg);
    if (!stream)
      check('openai chat: the reasoning in message.reasoning_content', msg.reasoning_content === reasoning, msg);
    messages.push({ role: 'assistant', content: msg.content, tool_calls: msg.tool_calls });
    messages.push({ role: 'tool', tool_call_id: call.id, content: countLines(JSON.parse(call.function.arguments)) });
    const r2 = await openai.chat.completions.create({ model: 'needle-v4', max_tokens: 200, messages, tools,
                                                     return_token_ids: true });
    check(`openai chat${stream ? ' stream' : ''}: the tool's result sent back, the final answer`,
          r2.choices[0].message.content === final && r2.choices[0].finish_reason === 'stop', r2.choices[0]);
    if (!stream) fs.writeFileSync(idsFile, JSON.stringify(r2.prompt_token_ids));
  }

  const anthropic = new Anthropic({ apiKey: 'sk-ant-SDKSERVEPLANTED-0004', baseURL: base, maxRetries: 0 });
  const atools = [{ name: 'count_lines', description: 'Counts lines', input_schema: schema }];
  for (const stream of [false, true]) {
    const messages = [{ role: 'user', content: question }];
    const req = { model: 'needle-v4', max_tokens: 2000, messages, tools: atools,
                  thinking: { type: 'enabled', budget_tokens: 1024 } };
    const m = stream ? await anthropic.messages.stream(req).finalMessage() : await anthropic.messages.create(req);
    const types = m.content.map((b) => b.type).join(',');
    const use = m.content.find((b) => b.type === 'tool_use');
    const think = m.content.find((b) => b.type === 'thinking');
    check(`anthropic messages${stream ? '.stream' : '.create'}: thinking, text, tool_use (stop_reason tool_use)`,
          types === 'thinking,text,tool_use' && m.stop_reason === 'tool_use' && use.name === 'count_lines' &&
          sameArgs(use.input) && think.thinking === reasoning && typeof think.signature === 'string' &&
          think.signature.length > 0, m);
    messages.push({ role: 'assistant', content: m.content });
    messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: countLines(use.input) }] });
    const m2 = await anthropic.messages.create({ ...req, messages });
    const text = m2.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    check(`anthropic messages${stream ? '.stream' : '.create'}: tool_result sent back, the final answer`,
          text === final && m2.stop_reason === 'end_turn', m2);
  }

  const rtools = [{ type: 'function', name: 'count_lines', description: 'Counts lines', parameters: schema }];
  for (const stream of [false, true]) {
    let r;
    if (!stream) {
      r = await openai.responses.create({ model: 'needle-v4', input: question, tools: rtools });
    } else {
      const s = await openai.responses.create({ model: 'needle-v4', input: question, tools: rtools, stream: true });
      let args = '';
      for await (const ev of s) {
        if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
        if (ev.type === 'response.completed') r = ev.response;
      }
      check("openai responses stream: function_call_arguments deltas add up to the item's arguments",
            r && sameArgs(JSON.parse(args)), args);
    }
    const fc = r.output.find((o) => o.type === 'function_call');
    const rs = r.output.find((o) => o.type === 'reasoning');
    check(`openai responses${stream ? ' stream' : ''}: reasoning, message, function_call items`,
          r.output.map((o) => o.type).join(',') === 'reasoning,message,function_call' && fc.name === 'count_lines' &&
          sameArgs(JSON.parse(fc.arguments)) && rs.summary[0].text === reasoning &&
          (stream || r.output_text === 'Let me read it.'), r.output);
    const input = [{ role: 'user', content: question }, ...r.output.filter((o) => o.type === 'function_call'),
                   { type: 'function_call_output', call_id: fc.call_id, output: countLines(JSON.parse(fc.arguments)) }];
    const r2 = await openai.responses.create({ model: 'needle-v4', input, tools: rtools });
    check(`openai responses${stream ? ' stream' : ''}: function_call_output sent back, the final answer`,
          r2.output_text === final && r2.status === 'completed', r2.output);
  }
  process.exit(failures.length ? 1 : 0);
})().catch((e) => { console.log('FAIL unexpected error: ' + (e.stack || e)); process.exit(1); });
EOF
(cd "$T" && timeout 300 node agent.js "$(cat "$T/ready2")" "$T/ids.json")
[ $? -eq 0 ] || { echo "FAIL the agent loop through the SDKs"; fails=$((fails + 1)); }
# The prompt the engine ran for the round trip's second request, decoded: the assistant's DSML call
# and the tool's result must both be there, as the encoder renders them (ENCODING-dsv4.md §1.6).
if [ -s "$T/ids.json" ] && "$BIN" tokenize --model "$MODEL" --decode --json < "$T/ids.json" > "$T/prompt.json" &&
   /usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
call = "<｜DSML｜invoke name=\"count_lines\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/srv/notes <draft>.txt</｜DSML｜parameter>\n<｜DSML｜parameter name=\"max\" string=\"false\">500</｜DSML｜parameter>\n</｜DSML｜invoke>"
assert call in p and "<tool_result>42</tool_result>" in p, p[-600:]' "$T/prompt.json"; then
  echo "ok   the round trip's prompt holds the model's call and the tool's result"
else
  echo "FAIL the round trip's prompt (prompt_token_ids decoded)"; fails=$((fails + 1))
fi
kill -TERM "$SERVER2_PID"
wait "$SERVER2_PID" || { echo "FAIL the scripted serve's exit status"; fails=$((fails + 1)); }
if grep -rqa SDKSERVEPLANTED "$T/store2" "$T/serve2.log"; then echo "FAIL an SDK key was written (agent loop)"; fails=$((fails + 1)); fi
echo "$fails failure(s)"
[ "$fails" = 0 ]
