"""The layer's elementwise ops as kimictl PDL kernels (lab/kernels/layer_elem.py):
the variants follow the layer's op list, stay out of the shipped build, and compile for sm_90a to
objects whose wrapper entry carries static-shape tensors (no DSL: the build test is skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimictl.kernels.layer.ops import dense_layer_ops
from kimictl.kernels.toolchain import build as kbuild
from lab.kernels.families import ALL_FAMILIES, LAB_FAMILIES
from lab.kernels.layer_elem import LAYER_MS, LayerElemConfig, elem_configs


def test_variants_follow_the_layer_op_list():
    cfgs = elem_configs()
    names = [c.name for c in cfgs]
    assert len(set(names)) == len(names)
    mla = {op.name: op for op in dense_layer_ops("mla")}
    for m in LAYER_MS:
        at_m = {(c.op, c.width) for c in cfgs if c.m == m}
        assert at_m == {
            ("addrms", mla["input_norm"].k),
            ("rms", mla["post_attention_norm"].k),
            ("rms", mla["latent_norm"].k),
            ("situ", mla["shared_act"].n),
            ("rmssitu", mla["latent_norm"].k),  # then the act columns (seg2)
            ("qkvnorm", mla["q_b"].k),  # the q_a part; kv_a is the second segment
            ("gate", mla["out_gate"].n),
            ("copy", mla["attention_core"].n),  # the stand-ins (layer_h200's _pdlsi layers)
            ("copy", mla["routed_experts"].n),
        }
    situ = next(c for c in cfgs if c.op == "situ")
    assert situ.x_w == mla["router"].n + mla["latent_down"].n + mla["shared_gate_up"].n
    assert situ.aux_w == mla["router"].n and situ.off == situ.aux_w + mla["latent_down"].n
    # rmssitu: x of latent_up + shared_down as one GEMM, K = latent_up's K + shared_down's K
    cat = next(c for c in cfgs if c.op == "rmssitu")
    assert cat.width + cat.seg2 == mla["latent_up"].k + mla["shared_down"].k
    assert (cat.off, cat.aux_w, cat.beta, cat.lbeta) == (situ.off, situ.x_w, situ.beta, situ.lbeta)
    qkv = next(c for c in cfgs if c.op == "qkvnorm")
    assert qkv.width + qkv.seg2 == mla["q_kv_a_norm"].k and qkv.x_w == mla["qkv_a_g"].n
    # each stand-in copy reads its input at the row stride the layer hands it, or contiguous
    copies = {(c.width, c.x_w) for c in cfgs if c.op == "copy" and c.m == 1 and c.late}
    assert copies == {(c.width, c.x_w) for c in cfgs if c.op == "copy" and c.m == 1 and not c.late}
    core, lat = mla["attention_core"].n, mla["routed_experts"].n
    kda = {op.name: op for op in dense_layer_ops("kda")}
    assert copies == {(core, mla["q_b"].n), (core, kda["kda_in"].n), (core, 0), (lat, situ.x_w),
                      (lat, 0)}  # fmt: skip
    # KDA has no q/kv norms and no output gate
    assert {c.op for c in elem_configs(("kda",))} == {"addrms", "rms", "situ", "rmssitu", "copy"}


def test_not_shipped_and_bad_shapes_refused():
    assert "layer_elem" in LAB_FAMILIES and "layer_elem" not in kbuild.FAMILIES
    assert "layer_elem" not in {c.kernel for c in kbuild.ALL_CONFIGS}
    with pytest.raises(ValueError, match="multiples of 8"):
        LayerElemConfig("rms", 1, 7164)
    with pytest.raises(ValueError, match="late applies"):
        LayerElemConfig("rms", 1, 64, late=True)
    with pytest.raises(ValueError, match="op must be"):
        LayerElemConfig("softmax", 1, 64)
    assert LayerElemConfig("rms", 4, 3584).name == "elem_rms_m4_w3584"


def test_every_op_compiles_for_sm90a(tmp_path: Path):
    if kbuild.dsl_version() is None:
        pytest.skip("nvidia-cutlass-dsl is not installed (pip install -e '.[test]')")
    one_each = {c.op: c for c in elem_configs(ms=(2,))}
    res = kbuild.build("sm_90a", tmp_path, configs=list(one_each.values()), families=ALL_FAMILIES)
    assert {k["name"] for k in res.kernels} == {c.name for c in one_each.values()}
    wrapper = (res.out_dir / kbuild.WRAPPER).read_text()
    for cfg in one_each.values():
        assert kbuild.embedded_sm(res.out_dir / f"{cfg.name}.o") == 90
        # static shapes: the flat entry passes bare pointers, whatever the ABI's n and k say
        assert f"k_{cfg.name}_Tensor_mY_t t_mY = {{(void*)y}};" in wrapper
