#!/usr/bin/env bash
# One CPU-only call on a lent device machine (no GPU setting is read or changed): the fidelity
# matrix (64, 256 streams x 1.2 ms; workers 1, 2, 4, 8) on uvloop, then the in-process CPU A/B
# (client_cpu_ab.py --loops) of asyncio's loop against uvloop at 64 and 256 streams. With an
# older kimictl unpacked in .before (`git archive REV kimictl | tar -x -C .before`), its cells run
# beside this checkout's in the matrix, and a CPU A/B of the two trees (both on asyncio) follows.
# kimictl's pure-Python deps and uvloop come as Python 3.12 wheels in .whl (the machine has no
# network). Results go to $OUT. The device tool sends the checkout its session started in: from a
# helper's worktree, copy this tree with .whl (and .before) into a folder of that checkout that
# .git/info/exclude ignores, carry it, cd there.
set -u
OUT=${OUT:-/tmp/kimictl-client-cpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "== $(date -u +%FT%TZ) $(nproc) cores"
lscpu | grep -E "Model name|^CPU\(s\)|MHz|Thread|Socket" || true
PY=${PY:-python3}
if [ -z "${SKIP_WHEELS:-}" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
PYTHONPATH=$PWD:${PYTHONPATH:-} $PY -c \
    'import kimictl, orjson, typer, uvloop, sys; print("kimictl from", kimictl.__file__,
     "uvloop", uvloop.__version__, sys.version)' || exit 1
BEFORE=()
[ -d .before/kimictl ] && BEFORE=(--before .before)
uptime
$PY lab/bench/client_fidelity.py ${FIDELITY_ARGS:---concurrency 64,256 --workers 1,2,4,8} \
    --interval-ms 1.2 --no-vllm --loop uvloop "${BEFORE[@]}" --json "$OUT/fidelity.json"
uptime
$PY lab/bench/client_cpu_ab.py --loops ${LOOPS_ARGS:---concurrency 64,256 --pairs 4}
if [ ${#BEFORE[@]} -gt 0 ]; then
    uptime
    $PY lab/bench/client_cpu_ab.py "${BEFORE[@]}" ${AB_ARGS:---concurrency 64,256 --pairs 4}
fi
echo "== done $(date -u +%FT%TZ)"
