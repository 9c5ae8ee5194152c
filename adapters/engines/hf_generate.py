"""HF transformers' `generate` as an engine under test (spec section 21, PROTO-9).

    hf_generate.py MODEL_DIR --speculation none|prompt-lookup:K|assistant:self|early-exit:L

MODEL_DIR is an HF-layout Llama (`specdec model tiny --preset tiny-v12-l2 DIR` writes the
engine checks' model). Each request runs alone (batch size 1, as HF's assisted generation
requires), seeded with `torch.manual_seed(seed)`, through `model.generate` unchanged:
greedy or multinomial sampling with HF's own temperature, top-k and top-p warpers, the
request's eos ids, and with speculation on the candidate generator the flag names
(`prompt_lookup_num_tokens`, `assistant_model`, `assistant_early_exit`). Only the calling
convention is translated here; every decision the checks judge is HF's.

Stop strings go to HF's own `StopStringCriteria` (`stop_strings` with `tokenizer`), which
needs a tokenizer: the tiny model's is built here as its ids read (`tiny_text`: id i is the
two letters chr(65 + i) chr(97 + i)), a word-level tokenizer whose decoder joins pieces
without spaces, plus six single letters outside the model's vocabulary, which HF's criteria
need to clean a vocabulary (they tokenize "abcdef"); the model never generates those. When
and where generation stops is HF's decision; the finish reason says `stop` when the text of
the generated tokens holds a stop string, so tokens HF lets through after one are seen.
"""

import argparse
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig

from engine_loop import check_fields, serve


def tiny_tokenizer(vocab_size):
    """The tiny model's ids as text, for HF's stop-string criteria (module doc)."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(65 + i) + chr(97 + i): i for i in range(vocab_size)}
    vocab.update({c: vocab_size + j for j, c in enumerate("abcdef")})
    tok = Tokenizer(WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[A-Z][a-z]|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_text(ids):
    return "".join(chr(65 + i) + chr(97 + i) for i in ids)


def load(path):
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except TypeError:  # releases before `dtype` was the argument's name
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model.eval()
    # No defaults of the model's own generation config (eos, top-k 50) leak into a request.
    model.generation_config = GenerationConfig()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--speculation", default="none")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load(args.model)
    kind, _, arg = args.speculation.partition(":")
    assistant = load(args.model) if args.speculation == "assistant:self" else None
    if kind not in ("none", "prompt-lookup", "assistant", "early-exit") or (kind == "assistant" and arg != "self"):
        sys.exit(f"unknown --speculation {args.speculation}")
    info = {
        "name": f"hf-transformers/{args.speculation}",
        "version": transformers.__version__,
        "speculation": args.speculation,
        "vocab": model.config.vocab_size,
        # float32 logits: a greedy token may differ from the f64 reference's only near a tie.
        "greedy_epsilon": 1e-4,
        "batch_invariant": True,
        "stop_strings": True,
    }
    tokenizer = tiny_tokenizer(model.config.vocab_size)

    def generate(r):
        check_fields(r)
        sample = r["temperature"] > 0
        config = GenerationConfig(
            max_new_tokens=r["max_new_tokens"],
            do_sample=sample,
            temperature=r["temperature"] if sample else 1.0,
            top_k=r["top_k"] if sample else None,
            top_p=r["top_p"] if sample else None,
            eos_token_id=r["eos"] or None,
            pad_token_id=0,
        )
        extra = {}
        if r["stop"]:
            config.stop_strings = r["stop"]
            extra["tokenizer"] = tokenizer
        if r["speculation"] and kind == "prompt-lookup":
            config.prompt_lookup_num_tokens = int(arg)
        elif r["speculation"] and kind == "assistant":
            extra["assistant_model"] = assistant
        elif r["speculation"] and kind == "early-exit":
            config.assistant_early_exit = int(arg)
        torch.manual_seed(r["seed"])
        prompt = torch.tensor([r["prompt"]], dtype=torch.long)
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config, **extra)
        tokens = out[0, prompt.shape[1]:].tolist()
        if tokens and tokens[-1] in r["eos"]:
            finish = "eos"
        elif any(stop in tiny_text(tokens) for stop in r["stop"]):
            finish = "stop"
        elif len(tokens) >= r["max_new_tokens"]:
            finish = "length"
        else:
            finish = "capacity"
        return {"tokens": tokens, "finish": finish}

    serve(info, generate)

if __name__ == "__main__":
    main()
