#!/usr/bin/env python3
"""make_tokenizer_corpus.py — the tokenizer parity corpus (tests/data/tokenizer/corpus.jsonl).

Deterministic (one seeded random.Random, no clocks, no set ordering), python3 stdlib only:

    python3 tools/make_tokenizer_corpus.py > tests/data/tokenizer/corpus.jsonl

Each line is {"id": N, "kind": K, "text": T} (ASCII JSON). Kinds cover what a DeepSeek-V4
serving engine tokenises in agentic traffic and what stresses the pre-tokenizer: agentic
prompts, JSON tool schemas, code, paths/URLs, CJK, emoji, digit runs, whitespace runs, unusual
spaces, mixed scripts, special-token strings embedded in text, control characters, seeded fuzz,
whole rendered prompts, long strings, and "unicode15": characters assigned after Unicode 14,
where PCRE2 10.42 (Unicode 14) and HF's Oniguruma may disagree (reported, not required equal).

The expected ids come from HF `tokenizers` via tools/tokenizer_parity.py (run where it is
installed); tests/test_tokenizer.c compares sparsetrace's ids with them.
"""
import json
import random
import sys

SEED = 20260829

WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which have not "
    "file function return value error request response model token layer cache index query key "
    "server client config path build test run user assistant system tool call result output input "
    "agent task step plan read write edit search open close list create delete update patch diff "
    "commit branch merge rebase deploy container image volume network port host address timeout "
    "retry budget context window prompt attention sparse indexer compressor rotation hadamard fp8 "
    "quantize dequantize scale block tile kernel stream batch prefill decode sample logits softmax "
    "Hello World OK JSON HTTP API URL UUID SHA CPU GPU NVIDIA AMD ROCm CUDA PyTorch DeepSeek "
    "don't can't it's we're they've I'm you'll she'd isn't won't"
).split()

IDENTS = (
    "get_weather searchWeb read_file writeFile run_shell_command list_dir apply_patch "
    "max_tokens top_p temperature tool_choice parallel_tool_calls reasoning_effort "
    "kv_cache num_heads head_dim rope_theta index_topk hc_mult __init__ _private MAX_LEN "
    "camelCaseName snake_case_name kebab-case-name SCREAMING_CASE x y i j k idx tmp buf ptr"
).split()

CJK_ZH = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"
CJK_JA = "これはテストです。日本語の文章を書きます。カタカナとひらがな、漢字が混ざっています。ツール呼び出しの結果を確認してください。"
CJK_KO = "안녕하세요 세계 한국어 문장입니다 도구 호출 결과를 확인하세요"
CJK_PUNCT = "、。「」『』（）！？：；，．【】《》〈〉・ー〜"
FULLWIDTH = "ＡＢＣＤＥａｂｃｄｅ０１２３４５６７８９！＂＃＄％＆"
HALFWIDTH_KANA = "ｱｲｳｴｵｶｷｸｹｺﾞﾟｰ"
CJK_EXT_A = "".join(chr(c) for c in range(0x3400, 0x3400 + 40))
CJK_BEYOND_9FA5 = "".join(chr(c) for c in range(0x9FA6, 0x9FB6))  # outside the DeepSeek CJK split
EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸", "🇨🇳", "❤️", "✅", "⚠️", "🧑‍💻", "🚀", "🔥", "💡", "🤖",
         "😂", "🙏🏿", "☕", "⭐", "🎉", "🏳️‍🌈", "👩🏻‍🔬", "✍️", "🫠", "🥲"]
DIGIT_EXTRA = ["¹²³", "₁₂₃", "①②③", "ⅠⅡⅫ", "０１２３", "٠١٢٣٤", "०१२३", "½⅓¾", "๑๒๓", "߀߁", "𝟘𝟙𝟚"]
SPACES = ["\u00a0", "\u3000", "\u202f", "\u2007", "\u2009", "\u200a", "\u2028", "\u2029",
          "\u0085", "\u180e", "\u200b", "\ufeff", "\u205f", "\u1680", "\x0b", "\x0c", "\u2003"]
SCRIPTS = ["Привет, мир! Как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم، كيف حالك؟", "שלום עולם",
           "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง", "नमस्ते दुनिया, यह हिंदी है।", "Tiếng Việt có dấu: ế ộ ữ",
           "e\u0301le\u0300ve cafe\u0301 n\u0303", "ქართული ენა", "Հայերեն լեզու", "ሰላም ዓለም",
           "∑∫√≤≥≠∞∂∇ ∀x∈ℝ", "→⇒←↔⇔↑↓", "─│┌┐└┘├┤┬┴┼", "€£¥₹₽₿¢", "“quoted” ‘single’ — – … • ·",
           "ɐɑɒɓɔɕɖɗ ʃʒθð", "Ĺ Ŀ ŉ Ÿ ſ", "Ω≈ç√∫˜µ≤≥÷", "ℌℑℜℭ 𝔄𝔅", "Ｈｅｌｌｏ", "ÀÉÎÕÜ àéîõü ß"]
SPECIALS_V3 = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
               "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
               "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁outputs▁begin｜>",
               "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>",
               "<｜fim▁end｜>", "<｜place▁holder▁no▁7｜>", "<｜▁pad▁｜>"]
NEAR_MISSES = ["<｜User|>", "<|User|>", "<｜User｜", "｜User｜>", "<｜Use r｜>", "<｜user｜>",
               "<｜end▁of▁sentence｜", "<｜begin_of_sentence｜>", "<think>", "</think>", "｜DSML｜",
               "<｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"get_weather\">", "<｜latest_reminder｜>",
               "<｜action｜>", "<tool_result>", "</tool_result>", "<|im_start|>", "<s>", "</s>"]
UNICODE15 = ["\U00031350\U00031351\U00031352", "𑼀𑼁𑼂 Kawi", "\U0001E4D0\U0001E4D1 Nag Mundari",
             "🫨 shaking face", "\U0001FAE8\U0001FA75", "\U0002EBF0\U0002EBF1 ext I",
             "\U0001D2C0\U0001D2C1 Kaktovik", "\U00011B00 Devanagari ext A", "世界\U00031350世界"]


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def sentence(rng):
    s = words(rng, rng.randint(4, 14))
    return s[0].upper() + s[1:] + rng.choice([".", "!", "?", ":", ";", "...", ""])


def zh(rng, n):
    return "".join(rng.choice(CJK_ZH) for _ in range(n))


def digits(rng, n):
    return "".join(rng.choice("0123456789") for _ in range(n))


def path(rng):
    parts = [rng.choice(IDENTS + WORDS) for _ in range(rng.randint(1, 6))]
    ext = rng.choice([".py", ".c", ".h", ".json", ".md", ".rs", ".ts", ".tar.gz", "", ".safetensors"])
    kind = rng.randint(0, 6)
    if kind == 0:
        return "/" + "/".join(parts) + ext
    if kind == 1:
        return "C:\\Users\\" + "\\".join(parts) + ext
    if kind == 2:
        return "~/." + "/".join(parts) + ext
    if kind == 3:
        q = "&".join(f"{rng.choice(IDENTS)}={rng.choice(WORDS)}" for _ in range(rng.randint(1, 3)))
        return f"https://{rng.choice(WORDS)}.example.com/" + "/".join(parts) + "?" + q + "#frag"
    if kind == 4:
        return f"./{'/'.join(parts)}{ext}:{rng.randint(1, 9999)}:{rng.randint(1, 120)}"
    if kind == 5:
        return f"git@github.com:{rng.choice(WORDS)}/{rng.choice(IDENTS)}.git"
    return "../" * rng.randint(1, 3) + "/".join(parts) + ext


def schema(rng, depth=0):
    props = {}
    for _ in range(rng.randint(1, 5)):
        name = rng.choice(IDENTS)
        t = rng.choice(["string", "integer", "number", "boolean", "array", "object"])
        p = {"type": t, "description": sentence(rng)}
        if t == "string" and rng.random() < 0.3:
            p["enum"] = [rng.choice(WORDS) for _ in range(3)]
        if t == "integer" and rng.random() < 0.5:
            p["minimum"], p["maximum"] = 0, rng.randint(1, 100000)
        if t == "number" and rng.random() < 0.5:
            p["default"] = round(rng.random() * 10, rng.randint(0, 4))
        if t == "array":
            p["items"] = {"type": rng.choice(["string", "integer"])}
        if t == "object" and depth < 2:
            p = schema(rng, depth + 1)
        props[name] = p
    return {"type": "object", "properties": props, "required": list(props)[:1],
            "additionalProperties": False}


def tool(rng):
    return {"type": "function", "function": {"name": rng.choice(IDENTS),
            "description": sentence(rng), "parameters": schema(rng)}}


def dump(rng, obj):
    style = rng.randint(0, 4)
    if style == 0:
        return json.dumps(obj)
    if style == 1:
        return json.dumps(obj, ensure_ascii=False)
    if style == 2:
        return json.dumps(obj, indent=2)
    if style == 3:
        return json.dumps(obj, separators=(",", ":"))
    return json.dumps(obj, indent="\t", ensure_ascii=False)


def code(rng):
    f, a, b = rng.choice(IDENTS), rng.choice(IDENTS), rng.choice(IDENTS)
    ind = rng.choice(["    ", "  ", "\t", "        "])
    n = digits(rng, rng.randint(1, 6))
    templates = [
        f"def {f}({a}, {b}=None):\n{ind}\"\"\"{sentence(rng)}\"\"\"\n{ind}if {a} is None:\n{ind}{ind}return {n}\n{ind}return {a} + {b}  # {sentence(rng)}\n",
        f"static int {f}(const char *{a}, size_t {b}) {{\n{ind}if (!{a}) return -{n};\n{ind}for (size_t i = 0; i < {b}; i++) {{\n{ind}{ind}{a}[i] ^= 0x{n};\n{ind}}}\n{ind}return 0;\n}}\n",
        f"const {f} = async ({a}) => {{\n{ind}const res = await fetch(`/api/{b}?id=${{{a}}}`);\n{ind}return res.json();\n}};\n",
        f"fn {f}(&self, {a}: &str) -> Result<Vec<u8>, Error> {{\n{ind}let {b} = {a}.as_bytes().to_vec();\n{ind}Ok({b})\n}}\n",
        f"$ cd /tmp/{a} && make -j{rng.randint(1, 64)} 2>&1 | tail -n {n}\n$ git diff --stat HEAD~{rng.randint(1, 9)}\n",
        f"SELECT {a}, COUNT(*) AS n FROM {b} WHERE {f} > {n} GROUP BY {a} ORDER BY n DESC LIMIT 10;",
        f"<div class=\"{a}\" id=\"{b}-{n}\">\n{ind}<span>{sentence(rng)}</span>\n</div>",
        f"```python\nimport {a}\nprint({a}.{f}({n}))\n```\n",
        f"diff --git a/{a}.py b/{a}.py\n@@ -{n},7 +{n},8 @@\n-{ind}{b} = {a}()\n+{ind}{b} = {a}(timeout={n})\n",
        f"{a}:\n  {b}: {n}\n  {f}: [\"{rng.choice(WORDS)}\", \"{rng.choice(WORDS)}\"]\n",
        f"#include <stdio.h>\n#define {f.upper()} {n}\nint main(void) {{ printf(\"%d\\n\", {f.upper()}); }}\n",
    ]
    return rng.choice(templates)


def agentic(rng):
    user = rng.choice(["alice", "bob", "dev", "root", "runner"])
    rules = "\n".join(f"- {sentence(rng)}" for _ in range(rng.randint(2, 6)))
    env = (f"<env>\nWorking directory: /home/{user}/{rng.choice(IDENTS)}\nPlatform: linux\n"
           f"OS Version: Linux 6.{rng.randint(1, 12)}.{rng.randint(0, 99)}\n"
           f"Today's date: 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}\n</env>")
    parts = [f"You are an autonomous coding agent. {sentence(rng)}", "## Rules\n" + rules, env,
             f"# Task\n{sentence(rng)} See {path(rng)} and {path(rng)}.",
             f"Tool result:\n{dump(rng, {'ok': True, 'lines': rng.randint(1, 900), 'path': path(rng)})}",
             f"$ ls -la\ntotal {rng.randint(8, 400)}\ndrwxr-xr-x  {rng.randint(2, 9)} {user} {user} 4096 Jan  3 12:01 .\n"
             f"-rw-r--r--  1 {user} {user} {rng.randint(10, 99999)} Feb 11 09:{rng.randint(10, 59)} {rng.choice(IDENTS)}.py"]
    rng.shuffle(parts)
    return "\n\n".join(parts[: rng.randint(2, len(parts))])


def whitespace(rng):
    pieces = []
    for _ in range(rng.randint(1, 6)):
        ws = rng.choice([" ", "\t", "\n", "\r\n", "\r", " \n", "\n ", "  \t", "\n\n\n"]) * rng.randint(1, 12)
        pieces.append(ws)
        pieces.append(rng.choice(["", rng.choice(WORDS), digits(rng, 3), "{", "}", "#", zh(rng, 2)]))
    return "".join(pieces)


def fuzz(rng):
    palette = [lambda: rng.choice(WORDS), lambda: " ", lambda: "\n", lambda: "\t",
               lambda: digits(rng, rng.randint(1, 7)), lambda: zh(rng, rng.randint(1, 4)),
               lambda: rng.choice(EMOJI), lambda: rng.choice(SPACES), lambda: rng.choice(CJK_PUNCT),
               lambda: rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), lambda: rng.choice(SCRIPTS)[:6],
               lambda: rng.choice(DIGIT_EXTRA), lambda: rng.choice(SPECIALS_V3 + NEAR_MISSES),
               lambda: rng.choice(FULLWIDTH + HALFWIDTH_KANA + CJK_EXT_A + CJK_BEYOND_9FA5),
               lambda: chr(rng.randint(0x20, 0x7e)), lambda: chr(rng.choice([0, 1, 0x1b, 0x7f, 0x9f]))]
    return "".join(rng.choice(palette)() for _ in range(rng.randint(1, 40)))


def rendered_prompt(rng):
    tools = "\n".join(json.dumps(tool(rng)["function"], ensure_ascii=False) for _ in range(rng.randint(1, 3)))
    think = rng.random() < 0.5
    s = "<｜begin▁of▁sentence｜>" + sentence(rng) + "\n\n## Tools\n\n### Available Tool Schemas\n\n" + tools
    s += "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
    for _ in range(rng.randint(1, 3)):
        s += "<｜User｜>" + rng.choice([sentence(rng), zh(rng, 12), agentic(rng)])
        s += "<｜Assistant｜>" + ("<think>" + sentence(rng) + "</think>" if think else "</think>")
        s += sentence(rng) + "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"" + rng.choice(IDENTS) + "\">\n"
        s += "<｜DSML｜parameter name=\"path\" string=\"true\">" + path(rng) + "</｜DSML｜parameter>\n"
        s += "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
        s += "<｜User｜><tool_result>" + dump(rng, {"status": rng.randint(100, 599)}) + "</tool_result>"
    return s + "<｜Assistant｜>" + ("<think>" if think else "</think>")


def main():
    rng = random.Random(SEED)
    out = []

    def add(kind, text):
        out.append({"id": len(out), "kind": kind, "text": text})

    # Hand-picked small cases first (stable ids for reading failures).
    for t in ["", " ", "  ", "\n", "a", "Hello", " Hello", "Hello world", "hello  world",
              "1 + 1 = 2", "12345", "1234567890", "3.14159", "-42", "v1.2.3", "0x1F",
              "你好", "推理", "答案", "毕老师", "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
              "<｜User｜>你好<｜Assistant｜>", "<｜User｜><｜User｜>", "abc<｜User｜>def",
              " <｜User｜> ", "x\u00a0y", "x\u3000y", "x\u180ey", "x\u2028y", "a\r\nb", "tab\tsep",
              "trailing   ", "   leading", "\n\n\n", "'s 't 're", "don't", "...", "!!!", "©®™",
              "😀", "👨‍👩‍👧‍👦", "\x00", "é", "e\u0301", "ＡＢＣ", "①②", "²³"]:
        add("hand", t)
    for t in SPECIALS_V3 + NEAR_MISSES:
        add("special", t)
        add("special", f"text {t} more")
        add("special", f"{t}{t}")
    for t in UNICODE15:
        add("unicode15", t)

    gens = [
        ("agentic", agentic, 300), ("schema", lambda r: dump(r, tool(r)), 250),
        ("code", code, 300), ("path", path, 200),
        ("cjk", lambda r: r.choice([zh(r, r.randint(1, 40)), CJK_JA, CJK_KO, zh(r, 5) + r.choice(CJK_PUNCT) + zh(r, 5),
                                    FULLWIDTH, HALFWIDTH_KANA, CJK_EXT_A[: r.randint(1, 40)],
                                    CJK_BEYOND_9FA5[: r.randint(1, 16)], zh(r, 3) + " " + words(r, 2) + zh(r, 3),
                                    zh(r, 4) + digits(r, r.randint(1, 8)) + zh(r, 2)]), 250),
        ("emoji", lambda r: "".join(r.choice(EMOJI + [" ", words(r, 1), zh(r, 1)]) for _ in range(r.randint(1, 12))), 150),
        ("digits", lambda r: r.choice([digits(r, r.randint(1, 25)), " " + digits(r, r.randint(1, 9)),
                                       f"{digits(r, 3)},{digits(r, 3)},{digits(r, 3)}.{digits(r, 2)}",
                                       f"{r.random() * 10 ** r.randint(-8, 8):.{r.randint(0, 12)}g}",
                                       words(r, 1) + digits(r, r.randint(1, 9)) + words(r, 1),
                                       r.choice(DIGIT_EXTRA) + digits(r, 4), f"{r.randint(-10**12, 10**12)}",
                                       f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00Z",
                                       f"{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(0, 255)}"]), 250),
        ("whitespace", whitespace, 250),
        ("spaces", lambda r: r.choice(SPACES).join([r.choice([words(r, 1), zh(r, 2), digits(r, 3), "", "x"]) for _ in range(r.randint(2, 5))]), 200),
        ("scripts", lambda r: " ".join(r.choice(SCRIPTS) for _ in range(r.randint(1, 3))), 150),
        ("embedded", lambda r: r.choice(SPECIALS_V3 + NEAR_MISSES).join([sentence(r), zh(r, 3), ""]) + r.choice(SPECIALS_V3), 150),
        ("control", lambda r: "".join(r.choice(["\x00", "\x01", "\x1b[31m", "\x1b[0m", "\x7f", "\x08", words(r, 1), " "]) for _ in range(r.randint(1, 10))), 60),
        ("fuzz", fuzz, 400),
        ("prompt", rendered_prompt, 60),
    ]
    for kind, fn, count in gens:
        for _ in range(count):
            add(kind, fn(rng))
    # Long strings: concatenations of the above, 3-12 kB.
    for _ in range(12):
        parts, size, target = [], 0, rng.randint(3000, 12000)
        while size < target:
            p = rng.choice([agentic, code, fuzz, rendered_prompt, whitespace])(rng)
            parts.append(p)
            size += len(p.encode("utf-8"))
        add("long", "\n".join(parts))

    w = sys.stdout
    for rec in out:
        w.write(json.dumps(rec, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
