"""Random-weight checkpoints of the Llama-family architectures, with HF
transformers' own logits on them: the oracle of MODEL-17.

Run by ``cargo xtask architectures`` with the peers' environment (torch and
transformers pinned from PyPI); by hand: ``PYTHON adapters/peers/hf_architectures.py
fixtures/architectures``. Nothing is downloaded: each model is built from a
config written here, its weights drawn from a fixed seed, and saved with
``save_pretrained`` (float32 safetensors, HF's own config.json). Its logits
on fixed token ids come from HF's modeling code unchanged, run in float64
(``model.to(torch.float64)``; HF's RMSNorm and rotary tables still compute in
float32 inside, which is what the stated tolerance of the Rust check
allows for).

Every parameter is redrawn after HF's initialisation, which sets biases to
zero and norms to one: a forward that dropped a bias or a norm would then
agree with HF and the check could not fail.

Each checkpoint carries a tokenizer of its 48 ids (``tokenizer``): a byte-level
BPE whose ids 3..46 are one byte each (space, ``a``-``z``, ``0``-``8``,
``.,:"{}[]``), id 47 the one merge, space and ``t`` (llama.cpp's loader wants
a BPE to have merges, and its converter writes none when there are none),
and ids 0..2 the specials ``<|unk|>`` (what any
other character encodes as, never dropped), ``<|startoftext|>`` (bos) and
``<|endoftext|>`` (eos), so that ``--model`` and ``generate`` take the
checkpoints (prompts and constraints of that alphabet). HF's ids of
``TEXT`` are stored beside the logits, the oracle of our tokenizer.

Cases: ``llama3`` (Llama with Llama 3's rotary scaling), ``mistral`` (no
sliding window), ``qwen2`` (q/k/v biases), ``qwen3`` (per-head q/k RMSNorm,
an explicit head_dim other than hidden/heads), ``phi3`` (q/k/v and gate/up
each stored as one fused projection).

And one model the reference cannot run, on purpose (``FOREIGN``): ``gpt2``,
GPT-2 (learned absolute positions, LayerNorm with biases, GELU), written the
same way with the same tokenizer and no logits. It is what ENGINE-10 is for:
a server of it (llama.cpp's, from the GGUF its converter writes) is checked
against its own plain decoding given only the tokenizer, and the Rust loader
refuses the checkpoint, naming its architecture (``cli/tests/engine.rs``).
"""

import json
import os
import sys

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

SIZES = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
TOKENS = [[1, 5, 9, 2, 7, 7, 30, 41, 3, 12, 0, 47], [44, 3, 3, 8]]
# Text for the tokenizer's oracle: every piece of the alphabet, and characters outside it.
TEXT = 'the quick brown fox: {"jumps": [1, 2.5]}, over the 0346789 lazy dogs. The Caf\u00e9'
SEED = 20261128

CASES = {
    "llama3": (LlamaConfig, LlamaForCausalLM, dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=None, head_dim=8)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict()),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=16)),
    # Phi3Config's default pad id is of its 32k vocabulary: ours has none.
    "phi3": (Phi3Config, Phi3ForCausalLM, dict(pad_token_id=None)),
}

# GPT-2's own names for the sizes; positions enough for ENGINE-10's prompts and outputs
# (`n_ctx`, their old name, is what llama.cpp's converter reads; it writes the MLP as four
# times `n_embd` wide whatever `n_inner` says, so that is left to its default, the same).
FOREIGN = {
    "gpt2": (GPT2Config, GPT2LMHeadModel, dict(vocab_size=48, n_embd=32, n_layer=2, n_head=4, n_positions=256, n_ctx=256, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
}


def redraw(model, gen):
    """Every parameter from a fixed seed: matrices and biases centred on 0,
    norm weights on 1, none of them HF's zero or one."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight") or "layernorm" in name or ".ln_" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5 * 1.5)


SPECIALS = ["<|unk|>", "<|startoftext|>", "<|endoftext|>"]
ALPHABET = " abcdefghijklmnopqrstuvwxyz012345678.,:\"{}[]"
MERGES = [("\u0120", "t")]


def tokenizer():
    """The checkpoints' tokenizer (module doc): byte-level pieces, GPT-2's
    byte-to-character table (space is ``Ġ``), one merge."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    assert len(SPECIALS) + len(ALPHABET) + len(MERGES) == SIZES["vocab_size"]
    pieces = SPECIALS + ["\u0120" if c == " " else c for c in ALPHABET] + [a + b for a, b in MERGES]
    tok = Tokenizer(BPE({t: i for i, t in enumerate(pieces)}, MERGES, unk_token=SPECIALS[0], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=SPECIALS[0], bos_token=SPECIALS[1], eos_token=SPECIALS[2])


def write_foreign(out):
    """The ``FOREIGN`` checkpoints: weights and tokenizer, no logits (module doc)."""
    for case, (config_cls, model_cls, sizes) in FOREIGN.items():
        model = model_cls(config_cls(**sizes)).eval()
        redraw(model, torch.Generator().manual_seed(SEED))
        folder = os.path.join(out, case)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer().save_pretrained(folder)
        drop_generation_config(folder)
        print(f"{case}: {model_cls.__name__}, {sum(p.numel() for p in model.parameters())} parameters (no logits: the reference cannot run it)")


def drop_generation_config(folder):
    path = os.path.join(folder, "generation_config.json")
    if os.path.exists(path):
        os.remove(path)


def main(out):
    write_foreign(out)
    for case, (config_cls, model_cls, extra) in CASES.items():
        config = config_cls(**SIZES, **extra)
        model = model_cls(config).eval()
        redraw(model, torch.Generator().manual_seed(SEED))
        folder = os.path.join(out, case)
        model.save_pretrained(folder, safe_serialization=True)
        tok = tokenizer()
        tok.save_pretrained(folder)
        model = model.to(torch.float64)
        logits = []
        with torch.no_grad():
            for ids in TOKENS:
                out_logits = model(torch.tensor([ids])).logits[0]
                logits.append(out_logits.tolist())
        record = {
            "about": f"HF transformers' logits of {model_cls.__name__} on the checkpoint beside this file (adapters/peers/hf_architectures.py)",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "tokens": TOKENS,
            "logits": logits,
            "text": TEXT,
            "text_ids": tok(TEXT).input_ids,
        }
        with open(os.path.join(folder, "logits.json"), "w") as f:
            json.dump(record, f)
        drop_generation_config(folder)
        print(f"{case}: {model_cls.__name__}, {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/architectures")
