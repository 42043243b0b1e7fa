#!/usr/bin/env python3
"""Synthetic agentic prompts with one needle line, rendered with the DeepSeek-V4 encoding.

This is the data of the bundled needle model (tools/train_needle.py): long tool-using
conversations in the style of the bug report that started the project (a coding agent asked to
copy its own working directory back out of a 20k-token prompt), widened to several template
families and needle kinds. One template family and one needle kind never appear in training;
they are the evaluation set.

A sample is an OpenAI /v1/chat/completions request (system message, tools, user task, rounds of
tool calls and tool results, the question) plus the rendered prompt and the answer: the needle
line, verbatim. The renderer follows the reference encoder (`encoding_dsv4.py`, described in
ENCODING-dsv4.md §1) for the subset used here, byte for byte; tests/test_needle_data.sh checks
it against `sparsetrace render` on generated requests.

Pure Python (no third-party modules), deterministic in (seed, family, kind, size, position).

Usage:
  python3 tools/needle_data.py sample [--family F] [--kind K] [--chars N] [--position P] [--seed S]
  python3 tools/needle_data.py requests DIR COUNT     # request + expected prompt pairs, for tests
  python3 tools/needle_data.py jsonl FILE [--split train|heldout]  # the C generator's examples

read_jsonl() loads what `sparsetrace needle make --batch` writes (README, "Training data"):
the harness's own prompts as token ids, which tools/train_needle.py mixes into its batches.
"""
import argparse
import collections
import json
import os
import random
import sys

# ---------------------------------------------------------------- the encoding (ENCODING §1)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"
LATEST_REMINDER = "<｜latest_reminder｜>"
TASK_TOKENS = ["<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>",
               "<｜read_url｜>"]
# Added tokens of the bundled tokenizer, in id order after the BPE vocabulary (BOS, EOS and PAD
# take ids 0, 1, 2 as in DeepSeek's vocabulary).
ADDED_TOKENS = [USER, ASSISTANT, THINK, THINK_END, DSML, LATEST_REMINDER] + TASK_TOKENS

TOOLS_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<" + DSML + "tool_calls>\" block like the following:\n\n"
    "<" + DSML + "tool_calls>\n"
    "<" + DSML + "invoke name=\"$TOOL_NAME\">\n"
    "<" + DSML + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</"
    + DSML + "parameter>\n"
    "...\n"
    "</" + DSML + "invoke>\n"
    "<" + DSML + "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" + DSML + "invoke>\n"
    "</" + DSML + "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " + THINK + "), you MUST output your complete "
    "reasoning inside " + THINK + "..." + THINK_END + " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " + THINK_END + " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n")
TOOLS_TAIL = ("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "
              "invoke tool calls.\n")


def to_json(v):
    return json.dumps(v, ensure_ascii=False)


def render_tool_calls(calls):
    invokes = []
    for c in calls:
        args = json.loads(c["function"]["arguments"])
        params = []
        for k, v in args.items():
            if isinstance(v, str):
                params.append(f'<{DSML}parameter name="{k}" string="true">{v}</{DSML}parameter>')
            else:
                params.append(f'<{DSML}parameter name="{k}" string="false">{to_json(v)}</{DSML}parameter>')
        invokes.append(f'<{DSML}invoke name="{c["function"]["name"]}">\n' + "\n".join(params)
                       + f"\n</{DSML}invoke>")
    return f"\n\n<{DSML}tool_calls>\n" + "\n".join(invokes) + f"\n</{DSML}tool_calls>"


def render(request, thinking):
    """The reference encoder on the requests this module makes: one system message carrying the
    tools, then user / assistant (with tool_calls) / tool messages. Returns the prompt up to and
    including the generation prompt."""
    msgs = request["messages"]
    tools = request.get("tools") or []
    out = [BOS]
    # §1.3: tool results and the user text after them merge into one user turn.
    turns = []
    for m in msgs:
        if m["role"] == "tool":
            block = "<tool_result>" + m["content"] + "</tool_result>"
            if turns and turns[-1]["role"] == "user":
                turns[-1]["blocks"].append(block)
            else:
                turns.append({"role": "user", "blocks": [block]})
        elif m["role"] == "user":
            if turns and turns[-1]["role"] == "user":
                turns[-1]["blocks"].append(m["content"])
            else:
                turns.append({"role": "user", "blocks": [m["content"]]})
        else:
            turns.append(dict(m))
    for i, t in enumerate(turns):
        nxt = turns[i + 1]["role"] if i + 1 < len(turns) else None
        if t["role"] == "system":
            out.append(t["content"])
            if tools:
                out.append("\n\n" + TOOLS_HEAD + "\n".join(to_json(x["function"]) for x in tools)
                           + TOOLS_TAIL)
        elif t["role"] == "user":
            out.append(USER + "\n\n".join(t["blocks"]))
            if nxt is None or nxt == "assistant":
                # With tools, drop_thinking is off: every user turn opens <think> in thinking mode.
                out.append(ASSISTANT + (THINK if thinking else THINK_END))
        elif t["role"] == "assistant":
            part = ""
            if thinking:
                part = (t.get("reasoning_content") or "") + THINK_END
            part += t.get("content") or ""
            if t.get("tool_calls"):
                part += render_tool_calls(t["tool_calls"])
            out.append(part + EOS)
    return "".join(out)


# ---------------------------------------------------------------- word pools

WORDS = """amber anchor apex aspen atlas aurora basalt beacon birch bison bramble breeze cedar
cinder cobalt comet copper coral cosmos crane crystal cypress delta dune ember falcon fern fjord
flint forge garnet glacier granite harbor hazel heron horizon indigo iris ivory jade juniper
kestrel lagoon lantern larch lumen lynx magnet maple marble meadow mercury mesa meteor mica
nebula nimbus oak obsidian onyx opal orbit orchid osprey otter pebble pine pixel plume polar
prism quartz quill raven reef ridge river rook saffron sage sequoia shale sierra silver slate
sparrow spruce summit swift talon tango thistle thunder tidal timber topaz tundra vale velvet
vertex violet willow wren zephyr zinc""".split()
MODULES = """auth billing cache catalog checkout config deploy events gateway indexer ingest
inventory ledger mailer metrics notifier orders payments profile queue ranker reports router
scheduler search session storage sync telemetry tokens uploads users webhooks""".split()
REGIONS = "us-east-1 us-west-2 eu-west-1 eu-central-1 ap-south-1 ap-northeast-1 sa-east-1".split()
NAMES = """Alice Bruno Chen Dana Emeka Farah Goran Hana Ivan Jonas Keiko Lena Mateo Nadia Omar
Priya Quentin Rosa Sven Tariq Uma Viktor Wen Ximena Yusuf Zara""".split()
SURNAMES = """Abara Becker Castillo Dubois Eriksen Fischer Gupta Haddad Ibarra Jensen Kowalski
Laurent Moreau Nakamura Okafor Petrov Quinn Rossi Santos Tanaka Ueda Varga Weber Yilmaz
Zhang""".split()
EXTS = ["py", "ts", "go", "rs", "c", "h", "md", "yaml", "json", "toml", "sql", "sh"]
VERBS = ["refactor", "fix", "add", "remove", "update", "migrate", "document", "test", "speed up",
         "clean up", "rename", "split"]
THINGS = ["the retry logic", "the config loader", "the session cache", "the CSV export",
          "the rate limiter", "the health check", "the login flow", "the background worker",
          "the pagination", "the feature flag", "the error handling", "the schema migration",
          "the metrics endpoint", "the build script", "the logging setup", "the webhook handler"]
ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
HEX = "0123456789abcdef"


def rstr(r, alphabet, n):
    return "".join(r.choice(alphabet) for _ in range(n))


# ---------------------------------------------------------------- needle kinds

# Each kind: labels it can carry and a value maker. "branch" is held out of training.
def _path(r):
    a, b, m = r.choice(WORDS), r.choice(WORDS), r.choice(MODULES)
    form = r.randrange(3)
    if form == 0:
        return f"/home/dev/projects/{a}-{b}-{rstr(r, HEX, 4)}/services/{m}"
    if form == 1:
        return f"/srv/{a}/{b}-{r.randrange(10, 99)}/{m}.{r.choice(['yaml', 'toml', 'json'])}"
    return f"/var/lib/{a}/{m}/{b}-{rstr(r, HEX, 6)}"


def _host(r):
    a, b, reg = r.choice(WORDS), r.choice(WORDS), r.choice(REGIONS)
    if r.randrange(2):
        return f"pg-{a}-{r.randrange(1, 99):02d}.{reg}.internal.{b}-{rstr(r, HEX, 3)}.net"
    return f"{a}-{b}.{reg}.example.net:{r.randrange(1024, 65535)}"


def _key(r):
    prefix = r.choice(["sk-live-", "tok_", "whsec_", "key-"])
    return prefix + rstr(r, ALNUM, r.choice([12, 16, 24, 32]))


def _number(r):
    return str(r.randrange(1, 10)) + rstr(r, "0123456789", r.randrange(5, 14))


def _ticket(r):
    return f"{r.choice(['INFRA', 'OPS', 'CORE', 'DATA', 'SEC', 'WEB'])}-{r.randrange(100, 99999)}"


def _branch(r):
    return (f"{r.choice(['release', 'hotfix', 'feature'])}/{r.choice(WORDS)}-"
            f"{r.randrange(1, 40)}.{r.randrange(0, 20)}-{r.choice(WORDS)}")


# "labelled" is for training only: a label and a value format drawn afresh for every sample, so
# that the model learns to find a line by whatever label the question names, not only the few
# labels of the named kinds (the held-out kind measures whether it did). None of its forms looks
# like a branch. The labels are an open space: a label of few words from a closed list (as it
# once was, a head word and one of 20 nouns) is learned as a vocabulary, and a model that
# learned it answers "Release branch" with "Replica bucket" (needle-v5 on the engine: the
# question's first token copied, the rest from the list). Pseudo-words and acronyms in most
# labels leave copying as the only way to the answer.
LABEL_HEADS = ["Staging", "Canary", "Primary", "Backup", "Nightly", "Shared", "Legacy", "Regional",
               "Internal", "Upstream", "Fallback", "Audit", "Replica", "Preview", "Archive", "Edge"]
LABEL_NOUNS = ["bucket", "queue", "namespace", "image tag", "run id", "dataset", "checksum", "cluster",
               "profile", "channel", "mirror", "owner", "version", "mailbox", "certificate", "schedule",
               "topic", "zone", "snapshot", "fingerprint"]
LABEL_WORDS = LABEL_HEADS + [w.capitalize() for w in WORDS]
ONSETS = "b c d f g h j k l m n p r s t v w z br cl dr fl gr kr pl pr sk st tr th sh ch".split()
VOWELS = "a e i o u a e i o ai ou".split()
CODAS = ["", "", "", "n", "r", "l", "s", "k", "m", "x", "nd", "rt"]


def pseudo_word(r):
    """A pronounceable word that is in no list: 2 or 3 syllables of onset, vowel and coda."""
    return "".join(r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS) for _ in range(r.choice((2, 2, 3))))


def _label_part(r):
    pick = r.randrange(10)
    if pick < 4:
        return pseudo_word(r)
    if pick < 6:
        return r.choice(WORDS + MODULES)
    if pick < 8:
        return r.choice(LABEL_NOUNS + [h.lower() for h in LABEL_HEADS])
    if pick < 9:
        return rstr(r, "ABCDEFGHJKLMNPQRSTVWXZ", r.randrange(2, 5))  # an acronym
    return f"{pseudo_word(r)}{r.choice('-_')}{r.randrange(2, 100)}"


def _labels(r):
    out = set()
    while len(out) < 4:
        parts = [_label_part(r) for _ in range(r.choice((1, 2, 2, 2, 3, 3)))]
        label = " ".join(parts)
        label = label[0].upper() + label[1:]
        if "branch" not in label.lower():  # the held-out kind's word
            out.add(label)
    return sorted(out)


def _labelled(r):
    a, b, m = r.choice(WORDS), r.choice(WORDS), r.choice(MODULES)
    form = r.randrange(9)
    if form == 0:
        return f"{a}-{b}-{rstr(r, HEX, 4)}"
    if form == 1:
        return f"v{r.randrange(0, 12)}.{r.randrange(0, 40)}.{r.randrange(0, 200)}"
    if form == 2:
        return f"registry.example.com/{a}/{m}:{r.randrange(1, 9)}.{r.randrange(0, 30)}"
    if form == 3:
        return f"s3://{a}-{b}/{m}/{rstr(r, HEX, 8)}"
    if form == 4:
        return f"{a}.{b}@{r.choice(WORDS)}.example.org"
    if form == 5:
        return f"{rstr(r, HEX, 8)}-{rstr(r, HEX, 4)}-{rstr(r, HEX, 4)}"
    if form == 6:
        return f"{r.randrange(60)} {r.randrange(24)} * * {r.randrange(7)}"
    sep = r.choice("-_.:")
    if form == 7:  # words in no list, as the labels' own
        return sep.join([pseudo_word(r), pseudo_word(r), str(r.randrange(1, 1000))][:r.choice((2, 3))])
    return sep.join(rstr(r, ALNUM, r.randrange(3, 9)) for _ in range(r.choice((1, 2, 3))))


NEEDLE_KINDS = {
    "path": (["Working directory", "Project root", "Config file", "Build output directory",
              "Cache directory", "Log directory"], _path),
    "host": (["Primary database host", "Redis host", "Staging API endpoint", "Metrics collector",
              "Build cache server"], _host),
    "key": (["Deploy API key", "Registry token", "Webhook secret", "Session signing key"], _key),
    "number": (["Incident ticket number", "Build number", "Order id", "Account number",
                "Invoice number"], _number),
    "ticket": (["Tracking issue", "Change request", "Parent epic"], _ticket),
    "branch": (["Release branch", "Hotfix branch", "Integration branch"], _branch),
    "labelled": (_labels, _labelled),  # labels drawn per sample
}
HELDOUT_KIND = "branch"
TRAIN_ONLY_KINDS = ["labelled"]
TRAIN_KINDS = [k for k in NEEDLE_KINDS if k != HELDOUT_KIND]
EVAL_KINDS = [k for k in NEEDLE_KINDS if k not in TRAIN_ONLY_KINDS]

# ---------------------------------------------------------------- tools


def _schema(props, required):
    return {"type": "object", "properties": props, "required": required}


def _s(desc):
    return {"type": "string", "description": desc}


def _i(desc):
    return {"type": "integer", "description": desc}


def _b(desc):
    return {"type": "boolean", "description": desc}


TOOLS = {
    "read_file": ("Read a file from the local filesystem. Returns the content with line numbers.",
                  _schema({"path": _s("Absolute path of the file"), "offset": _i("First line"),
                           "limit": _i("Number of lines")}, ["path"])),
    "write_file": ("Write a file, replacing it if it exists.",
                   _schema({"path": _s("Absolute path"), "content": _s("The new content")},
                           ["path", "content"])),
    "edit_file": ("Replace an exact string in a file with another.",
                  _schema({"path": _s("Absolute path"), "old_string": _s("Text to replace"),
                           "new_string": _s("Replacement"), "replace_all": _b("Replace every match")},
                          ["path", "old_string", "new_string"])),
    "bash": ("Run a shell command and return its output. Commands time out after 120 seconds.",
             _schema({"command": _s("The command"), "timeout": _i("Timeout in milliseconds"),
                      "description": _s("What the command does, in a few words")}, ["command"])),
    "grep": ("Search file contents with a regular expression.",
             _schema({"pattern": _s("The regular expression"), "path": _s("Directory or file"),
                      "glob": _s("File name filter"), "ignore_case": _b("Case-insensitive")},
                     ["pattern"])),
    "glob": ("List files matching a glob pattern, newest first.",
             _schema({"pattern": _s("The glob"), "path": _s("Where to search")}, ["pattern"])),
    "list_dir": ("List a directory.", _schema({"path": _s("Absolute path")}, ["path"])),
    "web_fetch": ("Fetch a URL and return its text.",
                  _schema({"url": _s("The URL"), "prompt": _s("What to extract")}, ["url"])),
    "todo_write": ("Update the task list for this session.",
                   _schema({"todos": {"type": "array", "items": {"type": "object", "properties": {
                       "content": _s("Task"), "status": _s("pending, in_progress or completed")}}}},
                       ["todos"])),
    "kubectl": ("Run a read-only kubectl command against the current cluster.",
                _schema({"args": _s("Arguments after kubectl"), "namespace": _s("Namespace")},
                        ["args"])),
    "query_metrics": ("Run a PromQL query over a time range.",
                      _schema({"query": _s("PromQL"), "range": _s("e.g. 1h"), "step": _s("e.g. 1m")},
                              ["query"])),
    "get_logs": ("Fetch recent log lines of a service.",
                 _schema({"service": _s("Service name"), "since": _s("e.g. 15m"),
                          "level": _s("Minimum level")}, ["service"])),
    "page_oncall": ("Page the on-call engineer of a team.",
                    _schema({"team": _s("Team"), "message": _s("Summary"), "urgent": _b("High urgency")},
                            ["team", "message"])),
    "run_sql": ("Run a read-only SQL query on the warehouse.",
                _schema({"sql": _s("The query"), "limit": _i("Row limit")}, ["sql"])),
    "describe_table": ("Show the columns of a table.", _schema({"table": _s("Table name")}, ["table"])),
    "list_jobs": ("List pipeline jobs and their last run.",
                  _schema({"status": _s("Filter by status"), "owner": _s("Owner")}, [])),
    "lookup_customer": ("Find a customer by email or id.",
                        _schema({"query": _s("Email or customer id")}, ["query"])),
    "get_order": ("Fetch an order with its items and shipments.",
                  _schema({"order_id": _s("The order id")}, ["order_id"])),
    "issue_refund": ("Refund an order, fully or in part.",
                     _schema({"order_id": _s("The order id"), "amount": {"type": "number",
                              "description": "Amount in the order currency"}, "reason": _s("Reason")},
                             ["order_id", "amount"])),
    "ci_status": ("Show the CI pipelines of a branch.",
                  _schema({"branch": _s("Branch name"), "limit": _i("How many pipelines")}, ["branch"])),
    "list_commits": ("List commits between two refs.",
                     _schema({"from_ref": _s("Start"), "to_ref": _s("End")}, ["from_ref", "to_ref"])),
    "tag_release": ("Create a release tag.",
                    _schema({"tag": _s("Tag name"), "ref": _s("Commit or branch"), "notes": _s("Notes")},
                            ["tag", "ref"])),
}


def tool_def(name):
    desc, params = TOOLS[name]
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


# ---------------------------------------------------------------- template families


def _src_path(r, root):
    return f"{root}/src/{r.choice(MODULES)}/{r.choice(WORDS)}_{r.choice(MODULES)}.{r.choice(EXTS)}"


def _code_lines(r, n):
    out = []
    ident = f"{r.choice(MODULES)}_{r.choice(WORDS)}"
    for i in range(n):
        k = r.randrange(6)
        if k == 0:
            out.append(f"def {r.choice(VERBS).replace(' ', '_')}_{ident}(self, {r.choice(WORDS)}):")
        elif k == 1:
            out.append(f"    {r.choice(WORDS)} = self.{r.choice(MODULES)}.get({r.choice(WORDS)!r}, {r.randrange(100)})")
        elif k == 2:
            out.append(f"    if not {r.choice(WORDS)}:\n        raise ValueError(\"{r.choice(WORDS)} is missing\")")
        elif k == 3:
            out.append(f"    return {r.choice(WORDS)}.{r.choice(MODULES)}({r.choice(WORDS)}, retries={r.randrange(1, 9)})")
        elif k == 4:
            out.append(f"# TODO({r.choice(NAMES).lower()}): {r.choice(VERBS)} {r.choice(THINGS)}")
        else:
            out.append(f"import {r.choice(MODULES)}.{r.choice(WORDS)} as {r.choice(WORDS)}")
    return out


def _log_lines(r, n):
    levels = ["INFO", "INFO", "INFO", "WARN", "ERROR", "DEBUG"]
    t = r.randrange(0, 86000)
    out = []
    for _ in range(n):
        t += r.randrange(1, 40)
        out.append(f"2026-11-{r.randrange(1, 28):02d}T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}Z "
                   f"{r.choice(levels)} {r.choice(MODULES)}: {r.choice(VERBS)} {r.choice(WORDS)} "
                   f"took {r.randrange(1, 900)}ms (attempt {r.randrange(1, 4)})")
    return out


def _table_lines(r, n):
    cols = r.sample(["id", "name", "status", "created_at", "amount", "region", "owner", "count"], 4)
    out = [" | ".join(cols)]
    for _ in range(n):
        row = []
        for c in cols:
            if c == "id":
                row.append(str(r.randrange(1000, 99999)))
            elif c in ("amount", "count"):
                row.append(f"{r.randrange(0, 5000)}.{r.randrange(0, 99):02d}")
            elif c == "created_at":
                row.append(f"2026-{r.randrange(1, 12):02d}-{r.randrange(1, 28):02d}")
            elif c == "region":
                row.append(r.choice(REGIONS))
            elif c == "owner":
                row.append(r.choice(NAMES).lower())
            else:
                row.append(r.choice(WORDS))
        out.append(" | ".join(row))
    return out


def _json_lines(r, n):
    out = []
    for _ in range(n):
        rec = {"id": f"{r.choice(['ord', 'cus', 'job', 'evt'])}_{rstr(r, HEX, 8)}",
               "status": r.choice(["open", "paid", "failed", "shipped", "pending"]),
               "owner": r.choice(NAMES), "total": r.randrange(1, 900)}
        out.append(to_json(rec))
    return out


def _listing_lines(r, n, root):
    return [f"{r.choice(['-rw-r--r--', 'drwxr-xr-x', '-rwxr-xr-x'])} {r.randrange(1, 99999):>6} "
            f"{root}/{r.choice(MODULES)}/{r.choice(WORDS)}.{r.choice(EXTS)}" for _ in range(n)]


def _commit_lines(r, n):
    return [f"{rstr(r, HEX, 7)} {r.choice(VERBS)} {r.choice(THINGS)} ({r.choice(NAMES)} "
            f"{r.choice(SURNAMES)})" for _ in range(n)]


class Family:
    """One template family: system prompt, environment section, rules, tools, task and rounds."""
    def __init__(self, name, intro, env_title, rules_title, rules, tools, tasks, outputs, questions):
        self.name, self.intro, self.env_title, self.rules_title = name, intro, env_title, rules_title
        self.rules, self.tools, self.tasks, self.outputs, self.questions = rules, tools, tasks, outputs, questions


FAMILIES = {
    "coding-agent": Family(
        "coding-agent",
        ["You are {agent}, an interactive command-line agent that helps users with software engineering "
         "tasks. Use the instructions below and the tools available to you to assist the user.",
         "You are {agent}, a coding assistant running in the user's terminal. You read, change and "
         "test code in the user's repository with the tools below."],
        "# Environment", "# Rules",
        ["Never invent file paths; read them with the tools.", "Keep answers short and direct.",
         "Run the tests after every change.", "Do not commit unless the user asks you to.",
         "Prefer editing existing files to creating new ones.", "Quote paths exactly as they appear.",
         "Never print secrets in full.", "Explain what a command does before running it if it is destructive."],
        ["read_file", "write_file", "edit_file", "bash", "grep", "glob", "list_dir", "web_fetch", "todo_write"],
        ["Please {verb} {thing} in the {module} service.", "The {module} tests fail since yesterday; can you {verb} {thing}?",
         "I want to {verb} {thing}. Start by finding where it lives."],
        ["code", "listing", "log"],
        ["Before you change anything else: what is the {lower} given earlier in this conversation? "
         "Reply with the line that starts with \"{label}:\" exactly as it appears, and nothing else.",
         "Quick check so I know we are looking at the same setup. Quote the \"{label}\" line from earlier "
         "in this conversation verbatim (the whole line starting with \"{label}:\"), with no other text.",
         "I need one detail from above. Copy the line that gives the {lower} (it starts with \"{label}:\") "
         "exactly, character for character, and reply with only that line."]),
    "ops-runbook": Family(
        "ops-runbook",
        ["You are {agent}, the on-call assistant of the platform team. You investigate alerts with the "
         "read-only tools below and write short, factual updates.",
         "You are {agent}. You help site reliability engineers triage incidents. Use the tools; never guess."],
        "## Cluster facts", "## Runbook rules",
        ["Page a human for anything customer-facing.", "Quote hostnames and ids exactly.",
         "Prefer metrics over logs for rates.", "Do not restart services without approval.",
         "Summarise findings in at most five bullet points.", "Times are UTC."],
        ["kubectl", "query_metrics", "get_logs", "page_oncall", "bash"],
        ["An alert fired: {module} latency is up. Please {verb} {thing} if that is the cause.",
         "Errors in {module} since the last deploy. Find out why."],
        ["log", "table", "log"],
        ["Stop for a moment. What does the \"{label}\" line above say? Give me that line exactly as written.",
         "For the incident doc: copy the line with the {lower} (starting \"{label}:\") verbatim, nothing else.",
         "Which {lower} did the facts section list? Answer with the full \"{label}: ...\" line, unchanged."]),
    "data-pipeline": Family(
        "data-pipeline",
        ["You are {agent}, a data engineering assistant with read access to the warehouse and the "
         "pipeline scheduler.",
         "You are {agent}. You answer questions about tables and pipeline jobs using the tools below."],
        "Environment:", "Guidelines:",
        ["Always limit queries to 1000 rows.", "Name the tables you used.", "Copy identifiers exactly.",
         "Never write to production tables.", "Mention when data is stale."],
        ["run_sql", "describe_table", "list_jobs", "bash"],
        ["The {module} dashboard shows wrong totals. Please {verb} {thing} behind it.",
         "Can you check why the {module} job was slow last night?"],
        ["table", "json", "table"],
        ["Before we go on: repeat the \"{label}\" line from the context exactly as it appears.",
         "What {lower} are we working with? Reply with the exact line that starts with \"{label}:\".",
         "Copy, character for character, the line giving the {lower}. Only that line, please."]),
    "support-desk": Family(
        "support-desk",
        ["You are {agent}, a customer support agent for an online store. Be polite, be brief, and use "
         "the tools to look things up.",
         "You are {agent}. You resolve customer tickets with the order and customer tools below."],
        "Account context", "Policies",
        ["Refunds above 500 need a supervisor.", "Quote order ids exactly.",
         "Never share another customer's data.", "Apologise once, not repeatedly."],
        ["lookup_customer", "get_order", "issue_refund", "web_fetch"],
        ["A customer says order {hex} never arrived. Please {verb} {thing} for it.",
         "Customer writes: my invoice is wrong. Can you look?"],
        ["json", "json", "table"],
        ["Please confirm one detail: copy the \"{label}\" line from above word for word.",
         "What is the {lower} on file? Answer with the line starting \"{label}:\", exactly.",
         "Quote the line that states the {lower}, verbatim, and nothing else."]),
    # Held out of training: the evaluation family.
    "release-train": Family(
        "release-train",
        ["You are {agent}, the release manager bot. You prepare release notes, check pipelines and cut "
         "tags when everything is green.",
         "You are {agent}. You coordinate the weekly release train with the CI and git tools below."],
        "### Release environment", "### Release policy",
        ["No tag while a pipeline is red.", "Copy refs and paths exactly; never abbreviate them.",
         "Release notes list every merged change.", "Freeze starts Thursday 12:00 UTC."],
        ["ci_status", "list_commits", "tag_release", "bash", "read_file"],
        ["Prepare the release: {verb} {thing} first, then check CI.",
         "Is the {module} change safe to ship this week?"],
        ["commits", "log", "listing"],
        ["Hold on. Which {lower} is configured? Answer with the \"{label}: ...\" line from above, verbatim.",
         "For the release checklist, copy the line that begins with \"{label}:\" exactly as written.",
         "Tell me the {lower}: reply with only the matching line from the context, unchanged."]),
}
HELDOUT_FAMILY = "release-train"
TRAIN_FAMILIES = [f for f in FAMILIES if f != HELDOUT_FAMILY]

ENV_FILLERS = [
    ("Platform", lambda r: r.choice(["linux", "darwin", "linux (wsl2)"])),
    ("Shell", lambda r: r.choice(["bash", "zsh", "fish"])),
    ("Today's date", lambda r: f"2026-{r.randrange(1, 12):02d}-{r.randrange(1, 28):02d}"),
    ("Git branch", lambda r: f"{r.choice(['main', 'dev', 'wip'])}-{r.choice(WORDS)}"),
    ("Home directory", lambda r: f"/home/{r.choice(NAMES).lower()}"),
    ("Region", lambda r: r.choice(REGIONS)),
    ("Timezone", lambda r: r.choice(["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"])),
    ("Team", lambda r: f"{r.choice(WORDS)}-{r.choice(MODULES)}"),
    ("Owner", lambda r: f"{r.choice(NAMES)} {r.choice(SURNAMES)}"),
    ("Python", lambda r: f"3.{r.randrange(9, 14)}.{r.randrange(0, 12)}"),
    ("Node", lambda r: f"v{r.randrange(18, 24)}.{r.randrange(0, 15)}.0"),
    ("Cluster", lambda r: f"{r.choice(WORDS)}-{r.choice(REGIONS)}"),
]


# ---------------------------------------------------------------- one sample


class Sample:
    __slots__ = ("request", "prompt", "answer", "needle", "label", "kind", "family", "needle_char",
                 "thinking", "followups",
                 # set only by read_jsonl (the C generator's examples come as token ids already)
                 "ids", "answer_ids", "needle_token", "format", "size", "position", "shape",
                 "decoys")  # decoy lines placed before the needle (0: none)


FOLLOWUPS = ["And the \"{label}\" line? Quote it exactly.",
             "One more: copy the line that starts with \"{label}:\", verbatim.",
             "Also give me the {lower} line from above, unchanged.",
             "Same for the {lower}: the whole \"{label}: ...\" line, exactly as written."]


# Questions for a prompt with decoys: the label's line was written several times and only the
# last one is current. Held-out wordings are the last of each list, as for the families.
DECOY_QUESTIONS = [
    "The \"{label}\" changed a few times during this session. Which one is current? Reply with the "
    "last line that starts with \"{label}:\", exactly as it appears, and nothing else.",
    "Several \"{label}:\" lines appear above; only the most recent one counts. Copy that line "
    "verbatim, with no other text.",
    "What is the {lower} now, after every change above? Answer with the latest \"{label}: ...\" "
    "line, character for character.",
    "Ignore the earlier values: quote the final line giving the {lower} (it starts with "
    "\"{label}:\"), exactly as written.",
]


# Questions composed from parts, for training samples only (make_sample, COMPOSED_SHARE of them,
# their follow-ups too): a model that has seen a dozen wordings answers a new one by starting a
# tool call, or with a label of its own (needle-v5 on needle make's held-out families: "Without
# running any tool, ..." gets a tool call; "Tracking ticket" gets "Silver profile"). Mixed from
# parts, the wordings are many, and what they share is the label to copy. No part is taken from a
# held-out wording (tests/test_needle_data.sh checks that no composed question shares six words
# in a row with one, nor its first four or last three words: the engine shows the ending alone
# moving recall most).
COMPOSED_SHARE = 0.5
Q_OPENERS = ["", "", "Quick question.", "Before we go on:", "One more thing.", "For my notes:",
             "Sorry to interrupt.", "Let me double-check something.", "I lost track of a detail.",
             "Context check:", "Small favour before you go on.", "No tools needed for this one.",
             "You do not need to call anything here.", "Answer from what you already have.",
             "Pause the task for a second.", "Just to be sure:", "Important:", "For the ticket:"]
Q_ASKS = ["What is the {lower}{where}?", "Which {lower} was given{where}?", "What {lower} did you see{where}?",
          "What was the {lower} again?", "Which {lower} are we using?", "Remind me of the {lower}{where}:",
          "Look back for the {lower}{where}:", "Share the {lower}{where}:", "I need the {lower}{where}.",
          "Find the {lower}{where}."]
Q_WHERES = ["", " above", " in the context", " from earlier", " in the setup", " in this session",
            " that was listed", " in the environment section", " in the notes above"]
Q_FORMATS = ["Reply with the line that starts with \"{label}:\"", "Give the whole \"{label}: ...\" line",
             "Copy the \"{label}\" line", "Write out the line for \"{label}\"",
             "Return the \"{label}:\" line", "Answer with the full line beginning \"{label}:\"",
             "Output the {label} line", "Paste the line that says \"{label}: ...\"",
             "Just the \"{label}\" line", "Send back the line starting \"{label}:\""]
Q_MANNERS = ["", " exactly", " verbatim", " unchanged", " character for character", " as it appears",
             " as written", " word for word", " without editing it", " in full"]
Q_ENDS = [".", ", and nothing else.", ", with no other text.", ". No remarks.", " as your whole reply.",
          ", then end there.", ". Only that line.", ", nothing around it.", ". Do not call a tool."]


def composed_question(r, label):
    """A question asking for the line of `label`, mixed from the parts above: an opener, an ask
    (three times in four) and the format wanted."""
    ask = r.choice(Q_ASKS).format(lower=label.lower(), where=r.choice(Q_WHERES)) if r.random() < 0.75 else ""
    fmt = r.choice(Q_FORMATS).format(label=label) + r.choice(Q_MANNERS) + r.choice(Q_ENDS)
    return " ".join(x for x in (r.choice(Q_OPENERS), ask, fmt) if x)


def make_sample(seed, family=None, kind=None, chars=4000, position=None, thinking=None, train=True,
                followups=0, decoys=0, composed=None):
    """One request with its rendered prompt. `chars` is the prompt's target size in characters
    (tools/train_needle.py converts tokens to characters with the tokenizer's measured ratio);
    `position` is where the needle line sits, as a fraction of the prompt (None: uniform).
    `followups` more questions (training only) ask for other "Label: value" lines of the system
    text, each as a further user turn after the answer: [(turn text, answer)], where the turn text
    runs from the user marker to the generation prompt.

    `decoys` more lines with the needle's label and a value of its kind go at line boundaries
    before the needle (as many as there are such boundaries), and the question asks for the last
    one: the lines differ from the needle by content no more than from each other, so only where
    a line sits tells the answer. Enough of them (more than the indexer's top-k holds) make the
    indexer's positional part (its RoPE) carry the recall, which is what the position faults
    (`index_rope=neox`, `compress_rope_theta`) break. With decoys=0 the sample is the same,
    character for character, as before decoys existed (their draws come from their own stream).

    `composed`: the share of training questions (the needle's and the follow-ups') composed from
    parts (default COMPOSED_SHARE); 0 gives the family's own wordings, as samples were before
    composed questions existed."""
    r = random.Random(f"{seed}:{family}:{kind}:{chars}:{position}:{thinking}")
    fam = FAMILIES[family or r.choice(TRAIN_FAMILIES if train else list(FAMILIES))]
    kind = kind or r.choice(TRAIN_KINDS if train else EVAL_KINDS)
    labels, maker = NEEDLE_KINDS[kind]
    if callable(labels):
        labels = labels(r)
    label = r.choice(labels)
    value = maker(r)
    needle = f"{label}: {value}"
    if thinking is None:
        thinking = r.random() < 0.3
    if position is None:
        position = r.random()
    agent = r.choice(["Orbit", "Forge", "Pilot", "Relay", "Scout", "Keel", "Tessel", "Quarry"])
    root = f"/home/dev/projects/{r.choice(WORDS)}-{r.choice(WORDS)}"

    # Environment: distractor facts, plus the needle's own kind under other labels.
    env = [f"{k}: {f(r)}" for k, f in r.sample(ENV_FILLERS, r.randrange(4, 9))]
    for other in r.sample([l for l in labels if l != label], min(2, len(labels) - 1)):
        env.insert(r.randrange(len(env) + 1), f"{other}: {maker(r)}")
    rules = r.sample(fam.rules, r.randrange(3, len(fam.rules) + 1))
    # Tools scale with the size: their schemas take at most about a third of the prompt.
    tools, tools_chars = [], len(TOOLS_HEAD) + len(TOOLS_TAIL)
    for t in r.sample(fam.tools, len(fam.tools)):
        d = tool_def(t)
        size = len(to_json(d["function"])) + 1
        if tools and tools_chars + size > chars / 3:
            break
        tools.append(d)
        tools_chars += size
    kw = dict(verb=r.choice(VERBS), thing=r.choice(THINGS), module=r.choice(MODULES), hex=rstr(r, HEX, 8))
    system_lines = [r.choice(fam.intro).format(agent=agent), "", fam.env_title] + env + \
                   ["", fam.rules_title] + [f"- {x}" for x in rules]
    task_lines = [r.choice(fam.tasks).format(**kw)]

    # Rounds until the size is reached: (assistant thought + call, tool output lines).
    tool_names = [t["function"]["name"] for t in tools]
    used = sum(len(x) + 1 for x in system_lines) + tools_chars + len(task_lines[0]) + 300
    rounds = []
    while used < chars or not rounds:
        name = r.choice(tool_names)
        props = TOOLS[name][1]["properties"]
        args = {}
        for p, spec in props.items():
            if p not in TOOLS[name][1]["required"] and r.random() < 0.6:
                continue
            if spec["type"] == "string":
                args[p] = (_src_path(r, root) if "path" in p else
                           f"{r.choice(VERBS)} {r.choice(WORDS)}" if p in ("description", "reason", "message", "notes")
                           else f"{r.choice(MODULES)}.{r.choice(WORDS)}")
            elif spec["type"] == "integer":
                args[p] = r.randrange(1, 500)
            elif spec["type"] == "number":
                args[p] = r.randrange(1, 500) + r.randrange(0, 100) / 100
            elif spec["type"] == "boolean":
                args[p] = r.random() < 0.5
            else:
                args[p] = [{"content": f"{r.choice(VERBS)} {r.choice(THINGS)}", "status": "pending"}]
        kind_out = r.choice(fam.outputs)
        n = r.randrange(3, max(4, min(40, (chars - used) // 60)))  # the last round fills what is left
        out = {"code": lambda: _code_lines(r, n), "listing": lambda: _listing_lines(r, n, root),
               "log": lambda: _log_lines(r, n), "table": lambda: _table_lines(r, n),
               "json": lambda: _json_lines(r, n), "commits": lambda: _commit_lines(r, n)}[kind_out]()
        thought = f"{r.choice(['Let me look at', 'Next I will check', 'Checking', 'Now looking at'])} " \
                  f"{r.choice(THINGS)}."
        rounds.append({"thought": thought, "call": {"name": name, "args": args}, "out": out})
        used += sum(len(x) + 1 for x in out) + len(thought) + len(to_json(args)) + 120
    question = r.choice(fam.questions).format(label=label, lower=label.lower())
    rq = random.Random(f"{seed}:question") if train else None  # its own stream: the other draws as before
    composed = COMPOSED_SHARE if composed is None else composed  # 0: no composed question, the same draws
    if rq and rq.random() < composed:
        question = composed_question(rq, label)
    rd = random.Random(f"{seed}:decoys:{decoys}") if decoys > 0 else None
    if rd:
        wordings = DECOY_QUESTIONS[:-1] if train else DECOY_QUESTIONS
        question = rd.choice(wordings).format(label=label, lower=label.lower())

    # The needle's slot: a line boundary in system text, task or tool outputs, chosen by the
    # character offset nearest to `position` of the whole prompt.
    units = [("system", system_lines), ("task", task_lines)] + [("out", rd["out"]) for rd in rounds]
    slots, offset = [], 0
    for ui, (kind_u, lines) in enumerate(units):
        if kind_u == "system":
            offset += len(BOS)
        for li in range(len(lines) + 1):
            if kind_u != "system" or li >= 3:  # not inside the first sentence
                slots.append((offset, ui, li))
            if li < len(lines):
                offset += len(lines[li]) + 1
        if kind_u == "system":
            offset += tools_chars
        elif kind_u == "out":
            offset += 200
    total = offset + len(question)
    # decoys go before the needle: their characters (about the needle line's each) move it later,
    # so its slot is aimed that much earlier, for as many as there are boundaries before it
    fit = decoys if rd else 0
    for _ in range(8):
        est = fit * (len(needle) + 1)
        target = max(0.0, position * (total + est) - est)
        needle_slot = min(slots, key=lambda s: (abs(s[0] - target), s[0]))
        now = min(fit, sum(1 for sl in slots if sl[0] < needle_slot[0]))
        if now == fit:
            break
        fit = now
    inserts = [(needle_slot[1], needle_slot[2], needle)]
    placed = 0
    if rd:
        before = [sl for sl in slots if sl[0] < needle_slot[0]]
        values = {value}
        for sl in rd.sample(before, min(decoys, len(before))):
            v = maker(rd)
            while v in values:
                v = maker(rd)
            values.add(v)
            inserts.append((sl[1], sl[2], f"{label}: {v}"))
            placed += 1
    for ui, li, line in sorted(inserts, key=lambda x: (x[0], x[1]), reverse=True):
        units[ui][1].insert(li, line)  # from the end, so the earlier indices stay valid

    messages = [{"role": "system", "content": "\n".join(system_lines)},
                {"role": "user", "content": "\n".join(task_lines)}]
    for i, rd in enumerate(rounds):
        cid = f"call_{i:03d}_{rstr(r, HEX, 6)}"
        messages.append({"role": "assistant", "content": rd["thought"], "tool_calls": [
            {"id": cid, "type": "function",
             "function": {"name": rd["call"]["name"], "arguments": to_json(rd["call"]["args"])}}]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": "\n".join(rd["out"])})
    messages.append({"role": "user", "content": question})
    s = Sample()
    s.request = {"model": "sparsetrace-needle", "messages": messages, "tools": tools}
    s.prompt = render(s.request, thinking)
    s.answer = (THINK_END if thinking else "") + needle
    s.needle, s.label, s.kind, s.family, s.thinking = needle, label, kind, fam.name, thinking
    s.needle_char = s.prompt.find(needle)
    s.decoys = placed
    s.followups = []
    facts = [x for x in env if x != needle and ": " in x]
    for fact in r.sample(facts, min(followups, len(facts))):
        flabel = fact.split(": ", 1)[0]
        q = r.choice(FOLLOWUPS).format(label=flabel, lower=flabel.lower())
        if rq and rq.random() < composed:
            q = composed_question(rq, flabel)
        s.followups.append((USER + q + ASSISTANT + (THINK if thinking else THINK_END),
                            (THINK_END if thinking else "") + fact))
    return s


# ---------------------------------------------------------------- the C generator's examples

C_HELDOUT_KINDS = ("email", "env")    # never in `needle make --batch --split train` (README)
C_HELDOUT_FAMILIES = ("q5", "q6")


def read_jsonl(path, split="train"):
    """The examples `sparsetrace needle make --batch N --jsonl PATH` wrote, as Samples whose
    ids, answer_ids and needle_token are the C tool's own (the engine's tokenizer and rendering),
    so training on them trains on the harness's prompts by construction. The family is
    "c/<question family>". With split="train" a line of a held-out kind or family is an error,
    not a silent skip: it means the file was made with --split heldout."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                e = json.loads(line)
                ids, answer_ids, span = e["ids"], e["answer_ids"], e["needle_span"]
            except (ValueError, KeyError) as err:
                raise ValueError(f"{path}:{n}: not a `needle make --batch` line ({err})") from None
            if split == "train" and (e["kind"] in C_HELDOUT_KINDS or e["family"] in C_HELDOUT_FAMILIES):
                raise ValueError(f"{path}:{n}: kind {e['kind']}, family {e['family']} is held out of training")
            s = Sample()
            s.request, s.prompt, s.answer, s.needle = e["request"], None, e["answer"], e["needle"]
            s.label = e["needle"].split(": ", 1)[0]
            s.kind, s.family, s.format, s.thinking = e["kind"], "c/" + e["family"], e["format"], e["thinking"]
            s.needle_char, s.followups = None, []
            s.ids, s.answer_ids, s.needle_token = ids, answer_ids, span[0]
            s.size, s.position, s.shape = e.get("tokens_requested", e.get("tokens")), e.get("position"), e.get("shape")
            s.decoys = e.get("decoys", 0)  # written by --batch --decoys only
            out.append(s)
    return out


# ---------------------------------------------------------------- command line


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("sample", help="print one rendered sample")
    a.add_argument("--family"), a.add_argument("--kind")
    a.add_argument("--chars", type=int, default=4000), a.add_argument("--position", type=float)
    a.add_argument("--seed", type=int, default=0), a.add_argument("--thinking", choices=["on", "off"])
    a.add_argument("--decoys", type=int, default=0, help="earlier lines of the needle's label; the last is asked for")
    b = sub.add_parser("requests", help="write request/prompt pairs for the renderer test")
    b.add_argument("dir"), b.add_argument("count", type=int)
    c = sub.add_parser("jsonl", help="read `sparsetrace needle make --batch` output and summarise it")
    c.add_argument("path"), c.add_argument("--split", choices=["train", "heldout"], default="train")
    args = ap.parse_args(argv)
    if args.cmd == "jsonl":
        try:
            samples = read_jsonl(args.path, args.split)
        except ValueError as err:
            print(f"needle_data.py jsonl: {err}", file=sys.stderr)
            return 1
        by = {}
        for s in samples:
            by[(s.kind, s.family)] = by.get((s.kind, s.family), 0) + 1
        tokens = sum(len(s.ids) + len(s.answer_ids) for s in samples)
        decoys = collections.Counter(s.decoys for s in samples)
        print(json.dumps({"examples": len(samples), "tokens": tokens,
                          "kinds": sorted({s.kind for s in samples}),
                          "families": sorted({s.family for s in samples}),
                          **({"decoys": {str(k): decoys[k] for k in sorted(decoys)}} if set(decoys) != {0} else {})}))
        return 0
    if args.cmd == "sample":
        th = None if args.thinking is None else args.thinking == "on"
        s = make_sample(args.seed, args.family, args.kind, args.chars, args.position, th, train=False,
                        decoys=args.decoys)
        sys.stdout.write(s.prompt + s.answer + "\n")
        print(f"\n--- family {s.family}, kind {s.kind}, needle at char {s.needle_char} of {len(s.prompt)}",
              file=sys.stderr)
        return 0
    os.makedirs(args.dir, exist_ok=True)
    kinds = list(NEEDLE_KINDS)
    for i in range(args.count):  # every kind in turn, the training-only one included; every third with decoys
        s = make_sample(i, kind=kinds[i % len(kinds)], chars=1500 + 700 * (i % 5), train=False,
                        thinking=bool(i % 2), decoys=8 * (i % 3 == 2))
        base = os.path.join(args.dir, f"{i:03d}")
        with open(base + ".request.json", "w", encoding="utf-8") as f:
            json.dump(s.request, f, ensure_ascii=False, indent=1)
        with open(base + ".prompt.txt", "w", encoding="utf-8") as f:
            f.write(s.prompt)
        with open(base + ".mode", "w") as f:
            f.write("on" if s.thinking else "off")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
