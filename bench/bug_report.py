#!/usr/bin/env python3
# bug_report.py — a reproduction written the way bug reports write them: a system prompt of N
# one-line tool descriptions with an environment section in the middle holding a
# `Primary working directory:` line, one user question asking for that line verbatim,
# temperature 0, stream false, posted with urllib to an OpenAI-compatible server.
#
#   bug_report.py URL N_TOOLS [HEADER: VALUE]...    prints one JSON line: the answer, usage, and
#                                                  sparsetrace serve's run/trace/request headers
import json, sys, urllib.request

url, n_tools, extra = sys.argv[1], int(sys.argv[2]), dict(h.split(": ", 1) for h in sys.argv[3:])
kinds = [("read", "Reads", "file"), ("grep", "Searches", "tree"), ("edit", "Edits", "buffer"),
         ("lint", "Checks", "module"), ("test", "Runs", "suite")]
tools = [f"- {kinds[i % 5][0]}_{i}: {kinds[i % 5][1]} the {kinds[i % 5][2]} given by its path and report what changed."
         for i in range(n_tools)]
half = len(tools) // 2
system = "\n".join(["You are an autonomous coding agent working in the user's repository.", "# Tools"] + tools[:half] +
                   ["# Environment", "Platform: linux", "Primary working directory: /home/devon/work/lanternfish",
                    "Is directory a git repo: yes", "# More tools"] + tools[half:])
body = {"model": "deepseek-v4", "temperature": 0, "stream": False, "max_tokens": 24,
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "What is the primary working directory? Repeat that line verbatim."}]}
req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json", **extra})
with urllib.request.urlopen(req, timeout=600) as r:
    answer = json.load(r)
    print(json.dumps({"tools": n_tools, "text": answer["choices"][0]["message"]["content"],
                      "usage": answer["usage"], "run": r.headers["X-Sparsetrace-Run"],
                      "trace": r.headers["X-Sparsetrace-Trace"],
                      "request": r.headers["x-sparsetrace-request-id"]}))
