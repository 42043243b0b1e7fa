#!/usr/bin/env python3
"""A loopback stand-in for an OpenAI / Anthropic compatible server that "recalls" needles, for
tests/test_needle.sh. Python standard library only. Not a test itself.

    needle_fake_server.py --port-file FILE [--lose-before F] [--lose-above-bytes B]
                          [--lose-odd-after F] [--max-body B] [--require-key KEY] [--log FILE]

POST .../v1/chat/completions, .../v1/messages, .../v1/responses. The answer is found the way a
perfect model would: the final question names the needle's label (... starts with "LABEL:" ...,
or "starting with"); the server finds the line "LABEL: VALUE" in the request and answers it
verbatim, unless a rule says the needle is lost, in which case it answers a wrong line. Rules
(the table the test expects follows from them):

  --lose-before F        lose needles that sit before fraction F of the prompt text ...
  --lose-above-bytes B   ... in request bodies larger than B bytes (default: any size)
  --lose-odd-after F     lose needles after fraction F whose value's byte sum is odd
  --max-body B           answer 400 (context length exceeded, in the API's error shape) to
                         bodies larger than B bytes
  --require-key KEY      401 unless the request carries KEY (Authorization: Bearer or x-api-key)

The prompt text is the request's strings in the order a DeepSeek-V4 rendering shows them:
system text, tool definitions, then the conversation. Requests must say temperature 0 and
"stream": false (400 otherwise). Prints "listening PORT" on stdout once ready.
"""
import argparse
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def strings(v, out):
    if isinstance(v, str):
        out.append(v)
    elif isinstance(v, list):
        for x in v:
            strings(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            strings(x, out)
    return out


def prompt_text(api, req):
    parts = []
    if api == "anthropic":
        strings(req.get("system", ""), parts)
        for t in req.get("tools", []):
            strings(t, parts)
        strings(req.get("messages", []), parts)
    elif api == "openai":
        msgs = req.get("messages", [])
        lead = [m for m in msgs[:1] if m.get("role") == "system"]
        strings(lead, parts)
        for t in req.get("tools", []):
            strings(t, parts)
        strings(msgs[len(lead):], parts)
    else:
        parts.append(req.get("instructions", ""))
        for t in req.get("tools", []):
            strings(t, parts)
        strings(req.get("input", []), parts)
    return "\n".join(parts)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, api, status, message):
        if api == "anthropic":
            self.reply(status, {"type": "error", "error": {"type": "invalid_request_error", "message": message}})
        else:
            self.reply(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def do_POST(self):
        o = self.server.opts
        path = self.path.split("?")[0]
        api = ("anthropic" if path.endswith("/v1/messages") else "openai" if path.endswith("/v1/chat/completions")
               else "responses" if path.endswith("/v1/responses") else None)
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if api is None:
            return self.reply(404, {"error": {"message": "no route " + path}})
        if o.require_key:
            auth = self.headers.get("Authorization", "")
            if auth != "Bearer " + o.require_key and self.headers.get("x-api-key", "") != o.require_key:
                return self.error(api, 401, "invalid api key")
        if o.max_body and len(raw) > o.max_body:
            return self.error(api, 400, "This model's maximum context length is exceeded (%d bytes)" % len(raw))
        try:
            req = json.loads(raw)
        except ValueError as e:
            return self.error(api, 400, "body is not JSON: %s" % e)
        if req.get("temperature") != 0 or req.get("stream") is not False:
            return self.error(api, 400, "the harness must ask for temperature 0 and stream false")
        text = prompt_text(api, req)
        m = re.search(r'start(?:s|ing) with "([^"]+):"', text)
        label = m.group(1) if m else None
        needle, at = None, -1
        if label:
            for mm in re.finditer(r"(?m)^" + re.escape(label) + r": (\S+)$", text):
                needle, at = mm.group(1), mm.start()
                break
        frac = at / len(text) if at >= 0 else -1
        lost = needle is None
        if needle is not None:
            if o.lose_before is not None and frac < o.lose_before and len(raw) > o.lose_above_bytes:
                lost = True
            if o.lose_odd_after is not None and frac > o.lose_odd_after and sum(needle.encode()) % 2 == 1:
                lost = True
        answer = ("%s: /nowhere/else" % label) if lost else ("%s: %s" % (label, needle))
        if o.log:
            with open(o.log, "a") as f:
                f.write(json.dumps({"api": api, "bytes": len(raw), "fraction": round(frac, 4), "needle": needle,
                                    "lost": lost}) + "\n")
        n_in, n_out = len(raw) // 4, len(answer) // 4 + 1
        if api == "anthropic":
            self.reply(200, {"id": "msg_fake", "type": "message", "role": "assistant", "model": req.get("model"),
                             "content": [{"type": "text", "text": answer}], "stop_reason": "end_turn",
                             "usage": {"input_tokens": n_in, "output_tokens": n_out}})
        elif api == "openai":
            self.reply(200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": req.get("model"),
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}})
        else:
            self.reply(200, {"id": "resp_fake", "object": "response", "model": req.get("model"), "status": "completed",
                             "output": [{"type": "message", "role": "assistant",
                                         "content": [{"type": "output_text", "text": answer}]}],
                             "usage": {"input_tokens": n_in, "output_tokens": n_out}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--lose-before", type=float)
    ap.add_argument("--lose-above-bytes", type=int, default=0)
    ap.add_argument("--lose-odd-after", type=float)
    ap.add_argument("--max-body", type=int, default=0)
    ap.add_argument("--require-key")
    ap.add_argument("--log")
    opts = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
    srv.opts = opts
    port = srv.server_address[1]
    if opts.port_file:
        with open(opts.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os
        os.replace(opts.port_file + ".tmp", opts.port_file)
    print("listening", port, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
