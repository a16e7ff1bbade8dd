"""vLLM 0.33.0's real K3 decoder layer code, run on a CPU box for kimictl's layer switch.

`python tests/vllm_layer_src.py` (a child process: tests/vllm_src.py's stubs change imports for
the whole process) imports vLLM's real model.py, mla.py, kda.py, latent_moe_runner.py and
linear.py from the wheel's sources (torch and CUDA stubbed), then prints one JSON object:

- "forward": the calls vLLM's real `KimiDecoderLayer.forward` makes, in order, with AttnRes on
  and off (its norms, attention, MLP and `attn_res` replaced by recorders);
- "o_proj": the calls the real `RowParallelLinear.forward` makes at TP 8 and TP 1 (the GEMM and
  the all-reduce, recorded);
- "latent": the calls the real `LatentMoERunner.allreduce_norm_latent_out` makes at TP 8 and 1;
- "plugin_off": whether vLLM's install hook (the name model.py bound) stays vLLM's own through
  kimictl's real `register()` with both switches off, and "plugin_on" whether it is wrapped with
  KIMICTL_VLLM_LAYER=1. What the wrapped hook does: tests/vllm_front_src.py.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from tests import vllm_src

    sources, why = vllm_src.ensure_sources()
    if sources is None:
        print(json.dumps({"skip": why}))
        return 0
    vllm_src.load(sources)
    import vllm.model_executor.layers.fused_allreduce_gemma_rms_norm as fused  # type: ignore[import-not-found]
    import vllm.model_executor.layers.linear as linear  # type: ignore[import-not-found]
    import vllm.models.kimi_k3.nvidia.latent_moe_runner as lmr  # type: ignore[import-not-found]
    import vllm.models.kimi_k3.nvidia.mla as mla  # type: ignore[import-not-found]
    import vllm.models.kimi_k3.nvidia.model as model  # type: ignore[import-not-found]

    calls: list[str] = []

    def rec(name: str, ret: Any = "x") -> Any:
        def f(*a: Any, **k: Any) -> Any:
            calls.append(name)
            return ret

        return f

    def decoder_layer(attn: type, attn_res: bool, idx: int, moe: bool = True) -> Any:
        layer = model.KimiDecoderLayer.__new__(model.KimiDecoderLayer)
        w = types.SimpleNamespace(weight="g", variance_epsilon=1e-6)
        layer.__dict__.update(
            layer_idx=idx, is_moe_layer=moe, use_attn_res=attn_res, use_sequence_parallel=False,
            self_attn=attn.__new__(attn), input_layernorm=w, post_attention_layernorm=w,
            self_attention_res_norm=w, mlp_res_norm=w, prev_valid_blocks=1,
            is_block_write_layer=False, block_write_idx=0,
            self_attention_res_proj=types.SimpleNamespace(weight=types.SimpleNamespace(
                squeeze=lambda i: "p")),
            mlp_res_proj=types.SimpleNamespace(weight=types.SimpleNamespace(squeeze=lambda i: "p")),
        )  # fmt: skip
        return layer

    out: dict[str, Any] = {}
    # 1. the decoder layer's forward, AttnRes on and off
    model.attn_res = rec("attn_res")
    out["forward"] = {}
    for attn_res in (True, False):
        layer = decoder_layer(mla.MultiHeadLatentAttention, attn_res, 3)
        norm = types.SimpleNamespace(weight="g", variance_epsilon=1e-6)
        layer.__dict__.update(
            input_layernorm=type("N", (), {"weight": "g", "variance_epsilon": 1e-6,
                                           "__call__": rec("input_layernorm", ("h", "r"))})(),
            post_attention_layernorm=type("N", (), {"weight": "g", "variance_epsilon": 1e-6,
                                                    "__call__": rec("post_attention_layernorm",
                                                                    ("h", "r"))})(),
            _run_self_attn=rec("self_attn"), mlp=rec("mlp"), self_attention_res_norm=norm,
        )  # fmt: skip
        calls.clear()
        model.KimiDecoderLayer.forward(layer, "pos", "h", "r", "prefix")
        out["forward"]["attn_res" if attn_res else "plain"] = list(calls)

    # 2. o_proj: vLLM's RowParallelLinear, as mla.py and kda.py build it (reduce_results default)
    linear.tensor_model_parallel_all_reduce = rec("all_reduce")
    out["o_proj"] = {}
    for tp in (8, 1):
        row = linear.RowParallelLinear.__new__(linear.RowParallelLinear)
        row.__dict__.update(
            input_is_parallel=True, tp_rank=0, tp_size=tp, skip_bias_add=False, bias=None,
            reduce_results=True, return_bias=False,
            quant_method=types.SimpleNamespace(apply=rec("o_proj_gemm")),
        )  # fmt: skip
        calls.clear()
        linear.RowParallelLinear.forward(row, "a")
        out["o_proj"][str(tp)] = list(calls)

    # 3. the routed latent before its norm (the no-flashinfer path: flashinfer is not here)
    lmr.tensor_model_parallel_all_reduce = rec("all_reduce")
    fused.flashinfer_trtllm_fused_allreduce_norm = None
    out["latent"] = {}
    for tp in (8, 1):
        runner = lmr.LatentMoERunner.__new__(lmr.LatentMoERunner)
        runner.__dict__["moe_config"] = types.SimpleNamespace(tp_size=tp)
        calls.clear()
        lmr.LatentMoERunner.allreduce_norm_latent_out(runner, "latent", rec("latent_norm"))
        out["latent"][str(tp)] = list(calls)

    # 4. kimictl's plugin through register(), around vLLM's install hook as model.py bound it
    from kimictl.kernels.vllm import plugin

    own = model.enable_kimi_k3_low_latency_gemm
    os.environ.pop(plugin.ENV_VAR, None)
    os.environ.pop("KIMICTL_VLLM_LAYER", None)
    plugin.register()
    out["plugin_off"] = {"hook_is_vllms": model.enable_kimi_k3_low_latency_gemm is own}
    os.environ["KIMICTL_VLLM_LAYER"] = "1"
    plugin.register()
    hook = model.enable_kimi_k3_low_latency_gemm
    out["plugin_on"] = {"wrapped": getattr(hook, "__kimictl_wrapped__", False)
                        and hook.__wrapped__ is own}  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
