"""wsnorm (lab/kernels/wsnorm_gemm.py): wstream with RMSNorm folded into its x loads."""

from __future__ import annotations

import pytest

from kimictl.kernels.toolchain import build as kbuild
from lab.kernels.families import LAB_FAMILIES
from lab.kernels.wsnorm_gemm import NORM_CONFIGS, WsNormConfig


def test_wsnorm_is_an_experimental_wstream_with_its_own_names():
    assert "wsnorm_gemm" not in kbuild.FAMILIES
    assert "wsnorm_gemm" not in {c.kernel for c in kbuild.ALL_CONFIGS}
    names = [c.name for c in NORM_CONFIGS]
    assert len(set(names)) == len(names) and all(n.startswith("wsnorm_m") for n in names)
    assert WsNormConfig(2, 64, 7, 2, residual=True, early=True).name == "wsnorm_m2_t64_u7_r2_res_et"
    # its kernel body extends wstream's: a change there must rebuild wsnorm too
    assert "kimictl.kernels.gemm.wstream_gemm_dsl" in LAB_FAMILIES["wsnorm_gemm"].sources
    with pytest.raises(ValueError, match="persistent"):
        WsNormConfig(1, 128, 7, 2, ctas=264)
