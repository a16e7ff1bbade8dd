"""A kimictl capture loads unchanged in a peer: AIPerf's own Mooncake trace loader
(`aiperf.dataset.loader.mooncake_trace.MooncakeTraceDatasetLoader`, what `aiperf profile
--custom-dataset-type mooncake_trace` reads a file with), run in AIPerf's own venv.

AIPerf (1.2 GB of dependencies) is not in kimictl's environment: .ci/run installs the pinned
version into a venv of its own and names its interpreter in KIMICTL_AIPERF_PYTHON. Without it this
test skips, unless KIMICTL_TEST_NEEDS_AIPERF is set (CI), where it fails.

The loader is constructed as AIPerf's dataset manager does, minus a tokenizer: `load_dataset` only
parses, validates, filters and groups rows (prompts are generated later, in
`convert_to_conversations`), so the prompt generator it is given is a stand-in with the two
attributes `load_dataset` touches (the per-file hash-id RNG scope and the block cache).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kimictl.runtime.observe.capture import CaptureWriter
from kimictl.runtime.observe.otlp import TracedRequest

PEER = """
import json, sys
from types import SimpleNamespace
from aiperf.dataset.loader.mooncake_trace import MooncakeTraceDatasetLoader

stand_in = SimpleNamespace(tokenizer=None, _cache={},
                           _hash_id_corpus_rng=SimpleNamespace(set_trace_id=lambda _: None))
loader = MooncakeTraceDatasetLoader(filename=sys.argv[1], prompt_generator=stand_in)
data = loader.load_dataset()
print(json.dumps({"sessions": len(data), "rows": sorted(
    [t.timestamp, t.input_length, t.output_length, t.session_id or ""]
    for traces in data.values() for t in traces)}))
"""


def peer_python() -> str:
    path = os.environ.get("KIMICTL_AIPERF_PYTHON")
    if path and Path(path).exists():
        return path
    if os.environ.get("KIMICTL_TEST_NEEDS_AIPERF"):
        pytest.fail("KIMICTL_AIPERF_PYTHON does not name AIPerf's interpreter (.ci/run sets it)")
    pytest.skip("AIPerf is not installed: set KIMICTL_AIPERF_PYTHON (see .ci/run)")


def test_aiperfs_own_loader_reads_a_capture(tmp_path: Path) -> None:
    python = peer_python()
    t0 = 1_800_000_000.0
    spans = [
        TracedRequest("127.0.0.1:8000", t0 + i + 1, 0.01, 1.0, 0.0, 0.9, 10 + i, 2 + i,
                      request_id=f"cmpl-{i}-0", arrived_at=t0 + i * 0.25,
                      session_id="4bf92f3577b34da6a3ce929d0e0e4736" if i % 2 else None)
        for i in range(6)
    ]  # fmt: skip
    capture = tmp_path / "capture.jsonl"
    writer = CaptureWriter(capture, arm_of=lambda _: "stock", hold_s=0.0)
    writer.take(spans)
    writer.close()
    done = subprocess.run(
        [python, "-c", PEER, str(capture)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [json.loads(line) for line in capture.read_text().splitlines()]
    assert peer["rows"] == sorted(
        [r["timestamp"], r["input_length"], r["output_length"], r.get("session_id", "")]
        for r in ours
    )
    assert [r["timestamp"] for r in ours] == [0, 250, 500, 750, 1000, 1250]
    # rows with the client's session id are one AIPerf session; each other row its own
    assert peer["sessions"] == 1 + 3
