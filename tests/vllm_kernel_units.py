"""The CuTe DSL compile units vLLM 0.33.0's OWN code asks for, recorded on a CPU box.

Used by tests/test_kernel_plan_vs_vllm.py. In a child process (the stubs of tests/vllm_src.py
change imports for the whole process): `python tests/vllm_kernel_units.py CASE_JSON` builds vLLM's
real `SpecializedDecode` (specialized_decode/runtime/decode.py: `__init__`, `build_providers()`,
every layer's real `Attention`, `PreparedOproj`, `PreparedProjection`, `SkinnyProjection`,
`PreparedKda.prepare_caches`, `PreparedMla.prepare_cache`, `PreparedAttnRes` with `bind_ring`)
over a fake K3 backbone whose layer attributes follow nvidia/model.py for the layout kimictl
assumes, and prints every compile call as JSON.

Recorded, not compiled: each `@cache`'d compile function is replaced by a recorder that notes its
arguments (vLLM's cache key) and, for the o-projection, the AttnRes consumers and the MLA core,
then runs vLLM's REAL compile body with `cute.compile`, the fake-tensor helpers and the kernel
classes replaced by recorders; what that body passes to `cute.compile` (kernel class, its
constructor arguments, every fake argument's shape/stride/dtype) is the unit's signature: two keys
with one signature compile the same code. Stubbed by hand (not vLLM's logic): the multicast
mailboxes, the MoE providers (SharedFront, PersistentExperts, PreparedTail, PreparedMoE,
SmallBatchChain, PreparedDenseMLP), the embedding and the prefetch controller.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


class FakeTensor:
    """Shape, dtype and device; every view returns another FakeTensor (no data)."""

    def __init__(self, shape: Any = (1,), dtype: Any = None) -> None:
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        import torch

        self.dtype = dtype if dtype is not None else torch.bfloat16
        self.device = types.SimpleNamespace(index=0, type="cuda")
        self.is_cuda = False

    def stride(self, i: int | None = None) -> Any:
        st = tuple(math.prod(self.shape[j + 1 :]) for j in range(len(self.shape)))
        return st if i is None else st[i]

    def element_size(self) -> int:
        return int(getattr(self.dtype, "itemsize", 2))

    def data_ptr(self) -> int:
        return 0

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return True

    def __getitem__(self, item: Any) -> FakeTensor:
        first = item[0] if isinstance(item, tuple) else item
        if isinstance(first, slice):
            n = len(range(*first.indices(self.shape[0])))
            return FakeTensor((n, *self.shape[1:]), self.dtype)
        return FakeTensor(self.shape[1:] or (1,), self.dtype)

    def __iter__(self) -> Any:
        return iter(self[i] for i in range(self.shape[0]))

    def view(self, *a: Any) -> FakeTensor:
        return self

    def squeeze(self, *a: Any) -> FakeTensor:
        return FakeTensor(tuple(s for s in self.shape if s != 1) or (1,), self.dtype)

    reshape = detach = float = contiguous = transpose = unsqueeze = fill_ = zero_ = view

    def new_zeros(self, shape: Any, *a: Any, **k: Any) -> FakeTensor:
        return FakeTensor(shape, self.dtype)

    new_empty = new_zeros


def _tensor_factory(*shape: Any, dtype: Any = None, **kw: Any) -> FakeTensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return FakeTensor(shape if shape else (1,), dtype)


class Bag:
    """A permissive module stand-in: unknown attributes are Bags, `weight` a [7168] tensor, eps
    fields 1e-6; names in `missing` raise AttributeError (so hasattr() tells KDA from MLA)."""

    def __init__(self, missing: tuple[str, ...] = (), **attrs: Any) -> None:
        self.__dict__["_missing"] = missing
        self.__dict__.update(attrs)

    def __getattr__(self, name: str) -> Any:
        if name in self._missing or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        if name == "weight":
            return FakeTensor((7168,))
        if name in ("variance_epsilon", "eps", "rms_norm_eps"):
            return 1e-6
        value = Bag()
        self.__dict__[name] = value
        return value

    def __call__(self, *a: Any, **k: Any) -> Bag:
        return Bag()


def _sig(value: Any) -> Any:
    """A JSON-able, hashable-as-string rendering of a recorded compile argument."""
    if isinstance(value, (tuple, list)):
        return [_sig(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _sig(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__name__, *(_sig(v) for v in dataclasses.astuple(value))]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


def _kernel(name: str) -> Any:
    return lambda *a, **k: ("kernel", name, a, k)


def _signature_module(module: Any, kernels: tuple[str, ...]) -> None:
    """Make `module`'s compile bodies return what they would hand to cute.compile."""

    def fake(shape: Any, stride: Any = None, dtype: Any = "bf16", align: int = 16) -> Any:
        return ("fake", shape, stride, repr(dtype), align)

    module.cute = types.SimpleNamespace(compile=lambda kernel, *a, **k: ("compile", kernel, a, k))
    module.fake = fake
    if hasattr(module, "dynamic_fake"):
        module.dynamic_fake = lambda rank, dtype="bf16": ("dynamic", rank, repr(dtype))
    module.make_fake_stream = lambda *a, **k: "stream"
    module.cutlass = types.SimpleNamespace(
        Int64=lambda v: ("i64", v), Int32=lambda v: ("i32", v), Float32=lambda v: ("f32", v)
    )
    for name in kernels:
        setattr(module, name, _kernel(name))


def run(case: dict[str, Any]) -> dict[str, Any]:
    import vllm_src

    sources, why = vllm_src.ensure_sources()
    if sources is None:
        raise SystemExit(f"vLLM sources unavailable: {why}")
    vllm_src.load(sources)
    import torch

    torch.empty = torch.zeros = torch.full = _tensor_factory  # type: ignore[attr-defined]
    base = "vllm.models.kimi_k3.nvidia.specialized_decode"
    import importlib

    decode = importlib.import_module(f"{base}.runtime.decode")
    providers = importlib.import_module(f"{base}.runtime.providers")
    oproj = importlib.import_module(f"{base}.cutedsl.oproj.prepared")
    attn_res = importlib.import_module(f"{base}.cutedsl.attn_res.prepared")
    projection = importlib.import_module(f"{base}.cutedsl.gemm.projection")
    kda = importlib.import_module(f"{base}.cutedsl.kda.prepared")
    mla = importlib.import_module(f"{base}.cutedsl.mla.prepared")
    chain = importlib.import_module(f"{base}.cutedsl.moe.small_batch.chain")

    for cuda in {id(m): m for m in (torch.cuda, sys.modules.get("torch.cuda")) if m}.values():
        cuda.get_device_properties = lambda d: types.SimpleNamespace(multi_processor_count=148)
        cuda.get_device_capability = lambda d: (10, 3)
    tp, layout = case["tp"], case["layout"]
    calls: list[dict[str, Any]] = []

    def recorder(family: str, fn: Any, signature: bool) -> Any:
        def record(*args: Any) -> Any:
            entry: dict[str, Any] = {"family": family, "key": _sig(args)}
            calls.append(entry)
            if signature:
                entry["signature"] = _sig(fn.__wrapped__(*args))
            return ("code", family, args)

        return record

    _signature_module(oproj, ("OprojProducer", "OprojUmma", "OprojConsumer", "OprojFused"))
    oproj.compile_oproj = recorder("oproj", oproj.compile_oproj, True)
    oproj.to_cute = lambda t, *a: t
    _signature_module(attn_res, ("ClusterAttnRes",))
    attn_res.compile_consumer = recorder("attn_res", attn_res.compile_consumer, True)
    attn_res.to_cute = lambda t, *a: t
    attn_res.architecture = lambda device: "sm_103a"
    projection.compile_projection = recorder(
        "splitk_projection", projection.compile_projection, False
    )
    projection.architecture = lambda device: "sm_103a"
    projection.matrix_view = lambda t, **k: t
    projection.weight_map = lambda weight, rows: FakeTensor((rows,))
    kda.executable = recorder("kda_core", kda.executable, False)
    kda.to_cute = lambda t, *a: t
    kda.decode_conv_weight = lambda w: w
    _signature_module(mla, ("MlaQuery", "MlaValue"))
    mla.prepare_shared_carveout = lambda kernel, device, percent: kernel
    mla.compile_value = recorder("mla_dcp_value", mla.compile_value, False)
    mla.compile_core = recorder("mla_core", mla.compile_core, True)
    mla.to_cute = lambda t, *a: t

    def skinny(x: Any, weight: Any, config: Any, residual: Any) -> Any:
        key = (repr(x.dtype), config, residual is not None)  # ShapeDynamicSkinnyGemm's key
        calls.append({"family": "skinny_projection", "key": _sig(key)})
        return x

    providers.shape_dynamic_skinny_gemm = skinny
    providers.is_conv_state_dim_first = lambda: True

    class Mailbox:
        def __init__(self, group: Any, device: Any, tp_: int, rank: int, shape: Any = None):
            self.tp, self.rank = tp_, rank
            self.buffer = FakeTensor((2, tp_, 64, 7168) if shape is None else shape)

        def slot(self, parity: int) -> Any:
            return self.buffer[parity], 0

    class TwoShot:
        def __init__(self, *a: Any) -> None:
            pass

        def views(self, parity: int) -> Any:
            return FakeTensor((tp, 64, 7168 // tp)), FakeTensor((tp,)), FakeTensor((64, 7168)), 0

    class DcpBox:
        def __init__(self, size: int) -> None:
            self.size, self.rank = size, 0
            self.q = self.partial = self.lse = FakeTensor((2, 64, 96, 576))
            self.rows = self.rows_lse = FakeTensor((64, 96, 512))
            self.peers = self.lse_peers = FakeTensor((size,))

        def mc(self, parity: int) -> int:
            return 0

    class PreparedMoE:  # the isinstance() check in SpecializedDecode.__init__ binds the ring
        def __init__(self, front: Any, experts: Any, tail: Any, state: Any, **kw: Any) -> None:
            self.tail = tail

    def prepared_tail(op: Any, norm: Any, up: Any, batches: Any, placement: Any) -> Any:
        return types.SimpleNamespace(tail_box=placement[0])

    chain.OprojMailbox = Mailbox
    chain.initialize_designated = lambda *a: None
    nothing = lambda *a, **k: types.SimpleNamespace()  # noqa: E731
    decode.get_tp_group = lambda: types.SimpleNamespace(
        world_size=tp, rank_in_group=0, device_group=None
    )
    decode.current_platform = types.SimpleNamespace(current_device=lambda: 0)
    decode.pack_front = nothing
    decode.PrefetchController = nothing
    decode.MoEScratch = lambda *a: types.SimpleNamespace(front=None, plan=None, shared=None)
    decode.OprojMailbox = Mailbox
    decode.MoeTailBox = lambda *a: types.SimpleNamespace(out=Mailbox(*a, (1, 64, 7168)))
    decode.TwoShot = TwoShot
    decode.PreparedDenseMLP = decode.SharedFront = decode.PersistentExperts = nothing
    decode.PreparedTail = prepared_tail
    decode.PreparedMoE = PreparedMoE
    decode.small_batch_chain.SmallBatchChain = nothing
    decode.PreparedEmbedding = nothing
    providers.dcp_box = lambda runtime, heads: DcpBox(runtime.dcp)
    providers.scratch = lambda runtime, name, shape, dtype=None: FakeTensor(shape, dtype)

    # The backbone: layer attributes as nvidia/model.py derives them from the config.
    heads, block = 96 // tp, layout["attn_res_block_size"]
    layers = []
    for i in range(layout["num_layers"]):
        if i in layout["mla_layers"]:
            attention = Bag(
                missing=("in_proj_qkvgfab",),
                fused_qkv_a_g_proj=Bag(weight=FakeTensor((2112 + heads * 128, 7168))),
                num_local_heads=heads,
                W_UK_T=FakeTensor((heads, 128, 512)),
                W_UV=FakeTensor((heads, 512, 128)),
                _q_scale_inv=FakeTensor((1,), torch.float32),
                _k_scale_inv=FakeTensor((1,), torch.float32),
                q_b_proj=Bag(weight=FakeTensor((heads * 192, 1536))),
                _k_scale_float=1.0,
                _q_scale_float=1.0,
                scale=0.1,
                kv_cache=[FakeTensor((1, 64, 656), torch.uint8)],
            )
        else:
            h = heads
            attention = Bag(
                in_proj_qkvgfab=Bag(
                    weight=FakeTensor((math.ceil((4 * h * 128 + 128 + h) / 16) * 16, 7168))
                ),
                conv1d=Bag(bias=None, weight=FakeTensor((3 * h * 128, 1, 4))),
                A_log=FakeTensor((h,)),
                dt_bias=FakeTensor((h * 128,)),
                gate_lower_bound=-5.0,
                kv_cache=[FakeTensor((8, 3 * h * 128, 3)), FakeTensor((8, h, 128, 128))],
            )
        attention.o_proj = Bag(weight=FakeTensor((7168, heads * 128)))
        is_moe = i >= layout["first_k_dense_replace"] and i % layout["moe_layer_freq"] == 0
        layers.append(
            Bag(
                layer_idx=i,
                self_attn=attention,
                is_moe_layer=is_moe,
                is_block_write_layer=i % block == 0,
                block_write_idx=i // block,
                prev_valid_blocks=-(-i // block),
                mlp=Bag(),
            )
        )
    backbone = Bag(
        layers=layers,
        start_layer=0,
        end_layer=len(layers),
        num_attn_res_blocks=-(-len(layers) // block),
        aux_hidden_state_layers=(),
        config=Bag(activation_situ_beta=4.0, activation_situ_linear_beta=25.0),
    )
    config = importlib.import_module(f"{base}.runtime").DecodeConfig(
        max_context=case["max_context"],
        mla_core=case["mla_core"],
        dcp=case["dcp"],
        q=case["q"],
        capture_sizes=tuple(case["capture_sizes"]),
    )
    executor = decode.SpecializedDecode(backbone, config)
    executor.prepare_kv()  # the KDA / MLA cores compile for the bound KV layout here
    return {"batches": list(executor.batches), "calls": calls}


if __name__ == "__main__":
    result = run(json.loads(sys.argv[1]))
    sys.__stdout__.write(json.dumps(result) + "\n")  # type: ignore[union-attr]
