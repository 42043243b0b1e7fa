#!/usr/bin/env bash
# tools/train_needle.py lr_scale, the training stage's learning-rate multiplier, against its
# definition worked by hand: a linear warmup, then constant, or with --decay A:B a straight line
# from 1 at step A to DECAY_FLOOR at step B, flat after it; and the same multiplier for a step
# whether the stage started before A (one call) or between A and B (resumed in another call:
# past a fresh optimiser's warmup, or from its first step when the optimiser's state was
# restored). And stage --decay refuses what is not A < B, --decoys what is not SHARE:LO-HI,
# --labelled and --peak what is not a share, --composed what is not one in [0, 1], before any
# touches DIR.
set -uo pipefail
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
exec /usr/bin/python3 - "$src" <<'PY'
import os, subprocess, sys, tempfile
src = sys.argv[1]
never = os.path.join(tempfile.mkdtemp(), "never")
sys.path.insert(0, os.path.join(src, "tools"))
import train_needle as tn

fails = []
def want(got, expected, what):
    if abs(got - expected) > 1e-12:
        fails.append(f"{what}: {got}, expected {expected}")

f = tn.DECAY_FLOOR
# warmup 20 from step 100: (step - 100 + 1) / 20 until 1
want(tn.lr_scale(100, 100, 20), 1 / 20, "first step's warmup")
want(tn.lr_scale(109, 100, 20), 10 / 20, "tenth step's warmup")
want(tn.lr_scale(500, 100, 20), 1.0, "constant after the warmup")
# decay (200, 300): 1 at 200, halfway (1 + f) / 2 at 250, f at 300 and after
want(tn.lr_scale(150, 100, 20, (200, 300)), 1.0, "before the decay")
want(tn.lr_scale(200, 100, 20, (200, 300)), 1.0, "the decay's first step")
want(tn.lr_scale(250, 100, 20, (200, 300)), (1 + f) / 2, "halfway down")
want(tn.lr_scale(300, 100, 20, (200, 300)), f, "the decay's last step")
want(tn.lr_scale(900, 100, 20, (200, 300)), f, "after the decay")
# the same step, resumed in a later call (started at 230): the same point on the line once warm
want(tn.lr_scale(275, 230, 20, (200, 300)), tn.lr_scale(275, 100, 20, (200, 300)), "resumed mid-decay")
want(tn.lr_scale(230, 230, 20, (200, 300)), (1 - (1 - f) * 0.3) / 20, "afresh mid-decay: warmup times the decay")
# resumed with the optimiser's state (warmup 0): on the line from its first step, no second warmup
want(tn.lr_scale(230, 230, 0, (200, 300)), 1 - (1 - f) * 0.3, "resumed with its moments: no warmup")
want(tn.lr_scale(230, 230, 0), 1.0, "resumed with its moments, no decay: the full rate")
# stage --decoys SHARE:LO-HI: read as written
if tn.parse_decoys("0.25:8-40") != (0.25, 8, 40):
    fails.append(f"parse_decoys('0.25:8-40') = {tn.parse_decoys('0.25:8-40')}")
# refused before DIR is touched: --decay what is not A < B, --decoys what is not a share in (0, 1]
# with 1 <= LO <= HI, --labelled what is not a share in (0, 1]
for option, bads in (("--decay", ("300:200", "5", "a:b", "7:7")),
                     ("--decoys", ("0:1-2", "1.5:1-2", "0.5:3-2", "0.5:0-4", "0.5", "half:1-2")),
                     ("--labelled", ("0", "1.5", "-0.2", "half")), ("--peak", ("0", "2", "-1", "low")),
                     ("--composed", ("1.5", "-0.1", "half")),
                     ("--lengths", ("2048-1024", "64-1024", "1024-65536", "1024", "1k-2k"))):
    for bad in bads:
        r = subprocess.run([sys.executable, os.path.join(src, "tools", "train_needle.py"), "stage", "5", never,
                            option, bad], capture_output=True, text=True)
        if r.returncode == 0 or option not in r.stderr:
            fails.append(f"stage {option} {bad}: exit {r.returncode}, stderr {r.stderr.strip()[-200:]!r}")
        if os.path.exists(never):
            fails.append(f"stage {option} {bad}: refused after making its DIR")
# --peak scales the stage's learning rate and is logged with it; without it the stage's own
st = tn.stage_settings(5, peak=0.25)
if abs(st["lr"] - 0.25 * tn.STAGES[5]["lr"]) > 1e-15 or st.get("peak") != 0.25 or \
        tn.stage_settings(5)["lr"] != tn.STAGES[5]["lr"] or "peak" in tn.stage_settings(5):
    fails.append(f"stage_settings(5, peak=0.25): lr {st['lr']}, the stage's {tn.STAGES[5]['lr']}")
# --composed takes 0 too (the families' own wordings) and is logged with the stage; unset, no key
if tn.parse_share("--composed", "0", zero=True) != 0 or tn.stage_settings(5, composed=0.0).get("composed") != 0 \
        or "composed" in tn.stage_settings(5):
    fails.append(f"--composed 0: {tn.stage_settings(5, composed=0.0)}")
# --lengths LO-HI replaces the stage's prompt sizes and is logged with it; unset, the stage's own
if tn.parse_lengths("1024-2048") != (1024, 2048) or tn.stage_settings(5, lengths=(1024, 2048))["lengths"] != (1024, 2048) \
        or tn.stage_settings(5)["lengths"] != tn.STAGES[5]["lengths"]:
    fails.append(f"--lengths 1024-2048: {tn.stage_settings(5, lengths=(1024, 2048))['lengths']}")
if tn.parse_share("--labelled", "0.25") != 0.25:
    fails.append(f"parse_share('--labelled', '0.25') = {tn.parse_share('--labelled', '0.25')}")
if fails:
    sys.exit("FAIL: " + "\n".join(fails))
print("ok: warmup, decay and resumed decay as defined; bad --decay, --decoys, --labelled, --peak, --composed and "
      "--lengths refused; --composed 0 and --lengths logged")
PY
