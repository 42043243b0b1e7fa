#!/usr/bin/env bash
# test_crash.sh — tools/crash.sh in CI: kill -9 at random moments of `run`, `replay --sweep` and
# `capture` (CRASH_TRIALS per kind, default 10, each kind stopped after CRASH_BUDGET_S seconds,
# default 10), each kill followed by `store check`, `--repair` and the next command. Its work dir
# (and so every command's TMPDIR) lives in the build tree, not in the shared /tmp.
set -u
ST_SOURCE_DIR=${ST_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
parent=${ST_BUILD_DIR:-}/tests
[[ -n "${ST_BUILD_DIR:-}" && -d "$parent" ]] || parent=$(pwd)
export CRASH_WORK_PARENT=$parent
export CRASH_TRIALS=${CRASH_TRIALS:-10}
export CRASH_BUDGET_S=${CRASH_BUDGET_S:-10}
export CRASH_KEEP_TRACES=${CRASH_KEEP_TRACES:-1} # store check verifies every trace: keep few
export CRASH_SEED=${CRASH_SEED:-$(( $(date +%s) % 100000 ))}
echo "test_crash: seed $CRASH_SEED (CRASH_SEED=$CRASH_SEED reproduces it), $CRASH_TRIALS trials or $CRASH_BUDGET_S s per kind"
exec bash "$ST_SOURCE_DIR/tools/crash.sh"
