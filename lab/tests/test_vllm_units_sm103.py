"""The KDA and MLA core layouts lab/bench/vllm_units_sm103.py compiles for sm_103a.

Those units compile from tensor layouts, not plain keys: the script runs vLLM 0.33.0's own
`PreparedKda.prepare_caches` / `PreparedMla.prepare_cache` on strided tensors without data and
records what they pass to the compile functions. Checked here, in a child process (the stubs of
tests/vllm_src.py change imports), without compiling: vLLM's classes ask for exactly one compile
per unit of `kimictl kernels plan k3-tp8-latency`, and the layouts they pass follow the packed
projection, the conv-state layout and the KV pages the script models.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kimictl.deployment.profiles import load_profile
from kimictl.kernels.vllm.plan import plan_units

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import vllm_src

pytestmark = pytest.mark.vllm_src
ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
sys.path.insert(0, "lab/bench")
import vllm_units_sm103 as v
out = {}
for family, keys in json.loads(sys.argv[1]).items():
    units = v._vllm_units(family, keys, 8, 8)
    out[family] = [
        [key, [[list(s), list(st), repr(d)] for s, st, d in args[3 if family == "mla_core" else 0]],
         [a for a in args if isinstance(a, (int, float, bool))]]
        for key, args in v.RECORDED[family]
    ] + [len(units)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    sources, why = vllm_src.ensure_sources()
    if sources is None:
        pytest.skip(why)
    plan = plan_units(load_profile("k3-tp8-latency").spec)
    families = ("kda_core", "mla_core")
    keys = {fam: [list(u.key) for u in plan.units if u.family == fam] for fam in families}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(keys)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["plan"] = keys
    return out


def test_kda_layouts_from_vllms_prepared_kda(recorded: dict[str, Any]) -> None:
    rows, count = recorded["kda_core"][:-1], recorded["kda_core"][-1]
    assert count == len(recorded["plan"]["kda_core"]) == 15
    assert [r[0] for r in rows] == recorded["plan"]["kda_core"]
    for (batch, heads, mode, tokens), specs, scalars in rows:
        assert scalars[:2] == [heads, mode] and scalars[-1] == tokens
        # the projected Q/K/V slice of the packed [B, 6288] projection, its row pitch kept
        assert specs[0][:2] == [[batch, 3 * heads * 128], [6288, 1]]
        # "SD" conv state [blocks, 3 + 7, D] transposed to (D, state_len): dim 1 is unit-stride
        assert specs[3][0] == [1024, 3 * heads * 128, 10] and specs[3][1][1] == 1
        assert specs[9][1][-2:] == [128, 1] and specs[9][2] == "torch.float32"
        assert len(specs) == (15 if tokens > 1 else 14)  # verify steps add the accepted counts


def test_mla_layouts_from_vllms_prepared_mla(recorded: dict[str, Any]) -> None:
    rows, count = recorded["mla_core"][:-1], recorded["mla_core"][-1]
    assert count == len(recorded["plan"]["mla_core"]) == 15
    for (batch, heads, pitch, dcp, q), specs, scalars in rows:
        assert scalars[:3] == [batch, heads, pitch] and scalars[-1] == q and dcp == 0
        assert specs[3] == [[heads, 128, 512], [256 * 512, 512, 1], "torch.bfloat16"]  # W_UK_T
        assert specs[7] == [[1024, 64, 656], [64 * 656, 656, 1], "torch.uint8"]  # KV pages
