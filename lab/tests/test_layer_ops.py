"""kimictl's op list of a K3 decode layer's dense part against vLLM 0.33.0's own sources.

The sources are the vLLM wheel's `.py` files (tests/vllm_k3_gemm_src.py fetches them once into
~/.cache/kimictl/vllm-src/0.33.0). Nothing is imported from vLLM here: the files are read and
parsed (ast), so the check runs without torch or a GPU. It fails when vLLM moves or changes a line
the list cites, or when a GEMM shape derived from K3_SHAPES disagrees with vLLM's own tables.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path
from typing import Any

import pytest

from kimictl.deployment.k3 import K3_SHAPES
from kimictl.kernels.layer.ops import KINDS, VLLM_K3, dense_layer_ops
from lab.kernels.layer_ops import gemm_ops, weight_bytes
from tests.vllm_k3_gemm_src import ensure_sources


@pytest.fixture(scope="module")
def nvidia() -> Path:
    root, why = ensure_sources()
    if root is None:
        pytest.skip(why)
    return root / VLLM_K3


def _line(nvidia: Path, ref: str) -> str:
    name, _, number = ref.partition(":")
    return (nvidia / name).read_text().splitlines()[int(number) - 1]


def _eval(node: ast.expr) -> Any:
    """Integer arithmetic and tuples of constants, nothing else (vLLM's module constants)."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e) for e in node.elts)
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        return ops[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError(ast.dump(node))


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _constants(tree: ast.Module) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
            try:
                out[target.id] = _eval(node.value)  # type: ignore[arg-type]
            except ValueError:
                out[target.id] = node.value
    return out


def _projection_table(tree: ast.Module, name: str) -> dict[tuple[int, int], str]:
    """vLLM's (N, K) -> name="..." label of one low-latency GEMM table ("" when unlabelled)."""
    table = _constants(tree)[name]
    assert isinstance(table, ast.Dict), name
    out: dict[tuple[int, int], str] = {}
    for key, value in zip(table.keys, table.values, strict=True):
        assert key is not None
        label = ""
        if isinstance(value, ast.Call):
            label = next((str(_eval(kw.value)) for kw in value.keywords if kw.arg == "name"), "")
        out[_eval(key)] = label
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_every_op_cites_the_vllm_line_that_runs_it(nvidia: Path, kind: str) -> None:
    for op in dense_layer_ops(kind):
        assert op.call_text in _line(nvidia, op.call), (op.name, op.call)
        if op.built:
            assert op.built_text in _line(nvidia, op.built), (op.name, op.built)


@pytest.mark.parametrize("kind", KINDS)
def test_gemm_shapes_match_vllm_projection_tables(nvidia: Path, kind: str) -> None:
    tree = _module(nvidia / "low_latency_gemm.py")
    labelled = _projection_table(tree, "KIMI_K3_PROJECTIONS")  # B300 table: carries the names
    h200 = _projection_table(tree, "KIMI_K3_PROJECTIONS_SM90")  # what vLLM plans on the H200
    for op in gemm_ops(kind):
        if op.name == "router":  # GateLinear: not a low-latency projection (checked below)
            continue
        if op.name == "qkv_a_g":  # vLLM runs it as fused_qkv_a + the gate slice at small M
            qkv_a = K3_SHAPES["q_lora_rank"] + K3_SHAPES["kv_lora_rank"]
            qkv_a += K3_SHAPES["qk_rope_head_dim"]
            parts = {(qkv_a, op.k): "fused_qkv_a_proj", (op.n - qkv_a, op.k): "mla_g_proj"}
        else:
            parts = {(op.n, op.k): op.vllm_name}
        for shape, label in parts.items():
            assert label in labelled.get(shape, "").split("/"), (op.name, shape, labelled)
            assert shape in h200, (op.name, shape)


def test_kda_packed_projection_matches_vllm(nvidia: Path) -> None:
    consts = _constants(_module(nvidia / "low_latency_gemm.py"))
    (kda_in,) = (op for op in gemm_ops("kda") if op.name == "kda_in")
    heads, d = K3_SHAPES["kda_heads"] // 8, K3_SHAPES["kda_head_dim"]
    assert consts["_KDA_TP_SIZE"] == 8
    assert consts["_KDA_QKVG_SIZE"] == 4 * heads * d
    assert consts["_KDA_FAB_SIZE"] == d + heads
    assert kda_in.n == consts["_KDA_PACKED_SIZE"]


def test_router_and_latent_widths_match_the_specialized_front(nvidia: Path) -> None:
    """vLLM's MoE front mailbox row holds the bf16 latent then the fp32 logits (2 words each)."""
    consts = _constants(_module(nvidia / "specialized_decode/cutedsl/moe/front.py"))
    ops = {op.name: op for op in gemm_ops("mla")}
    assert ops["router"].fp32_out
    assert consts["WIDTH"] == ops["latent_down"].n + 2 * ops["router"].n


def test_op_list_shapes_chain() -> None:
    """Each op reads what the op before it in the data flow wrote (no vLLM needed)."""
    h = K3_SHAPES["hidden_size"]
    for kind in KINDS:
        ops = {op.name: op for op in dense_layer_ops(kind)}
        assert ops["o_proj"].k == ops["attention_core"].n and ops["o_proj"].n == h
        for name in ("router", "latent_down", "shared_gate_up"):
            assert ops[name].k == ops["post_attention_norm"].n == h
        assert ops["shared_act"].k == ops["shared_gate_up"].n == 2 * ops["shared_down"].k
        assert ops["latent_up"].k == ops["latent_norm"].k == ops["routed_experts"].n
        assert ops["latent_up"].residual and ops["latent_up"].n == ops["shared_down"].n
    mla = {op.name: op for op in dense_layer_ops("mla")}
    assert mla["q_b"].k == K3_SHAPES["q_lora_rank"]
    # about 230 MB (MLA) and 261 MB (KDA) of bf16 weights per GPU per layer
    assert 225e6 < weight_bytes("mla") < 235e6 and 255e6 < weight_bytes("kda") < 265e6
    with pytest.raises(ValueError, match="kind must be one of"):
        dense_layer_ops("gdn")


def test_docs_table_lists_every_op_with_its_source() -> None:
    doc = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for kind in KINDS:
        for op in dense_layer_ops(kind):
            row = f"| `{op.name}` | {op.kind}"
            cells = f"| {op.k} -> {op.n} |"
            assert row in doc and cells in doc and f"`{op.call}`" in doc, (kind, op.name)
