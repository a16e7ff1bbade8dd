#!/usr/bin/env bash
# One CPU-only call on a lent device machine (no GPU setting is read or changed): the fidelity
# matrix (64, 256 streams x 1.2 ms; workers 1, 2, 4, 8) for this checkout and, beside it in the
# same run, an older kimictl unpacked in .before (`git archive REV kimictl | tar -x -C .before`),
# then the in-process CPU A/B (client_cpu_ab.py) of the two. kimictl's pure-Python deps come as
# Python wheels in .whl (the machine has no network). Results go to $OUT.
set -u
OUT=${OUT:-/tmp/kimictl-client-cpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "== $(date -u +%FT%TZ) $(nproc) cores"
lscpu | grep -E "Model name|^CPU\(s\)|MHz|Thread|Socket" || true
python3 -m venv /tmp/v >/dev/null 2>&1 && PY=/tmp/v/bin/python || PY=python3
$PY -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -2 \
    || $PY -m pip install -q --break-system-packages --no-index --no-deps .whl/*.whl
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
$PY -c 'import kimictl, sys; print("kimictl from", kimictl.__file__, sys.version.split()[0])'
uptime
$PY lab/bench/client_fidelity.py --concurrency 64,256 --interval-ms 1.2 --workers 1,2,4,8 \
    --no-vllm --before .before --json "$OUT/fidelity.json"
uptime
$PY lab/bench/client_cpu_ab.py --before .before --concurrency 32,64,256 --pairs 4
echo "== done $(date -u +%FT%TZ)"
