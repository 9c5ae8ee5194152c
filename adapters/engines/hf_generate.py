"""HF transformers' `generate` as an engine under test (spec section 21, PROTO-9).

    hf_generate.py MODEL_DIR --speculation none|prompt-lookup:K|assistant:self|early-exit:L|dflash:DRAFT_DIR

MODEL_DIR is an HF-layout Llama (`specdec model tiny --preset tiny-v12-l2 DIR` writes the
engine checks' model). Each request runs alone (batch size 1, as HF's assisted generation
requires), seeded with `torch.manual_seed(seed)`, through `model.generate` unchanged:
greedy or multinomial sampling with HF's own temperature, top-k and top-p warpers, the
request's eos ids, and with speculation on the candidate generator the flag names
(`prompt_lookup_num_tokens`, `assistant_model`, `assistant_early_exit`, and
`speculation_type="dflash"` with its block-diffusion assistant). Only the calling convention
is translated here; every decision the checks judge is HF's.

DFlash: DRAFT_DIR is a DFlash draft checkpoint in the layout seed 000 describes (DRAFT-6:
`config.json` with `dflash_config`, `model.safetensors` with `fc`, `hidden_norm`, Llama layers
and `norm`; `specdec model tiny --dflash` writes the section's seeded one), loaded into HF's
DFlash assistant (`MuseGlimmerAssistantModel`, which `DFlashTokenCandidateGenerator` drives):
`fc` and `hidden_norm` are its context projection's `encoder.fc` and
`encoder.output_norm_enc`, the layers and `norm` keep their names, every layer attends in
full (no sliding window), with the draft's RoPE base. HF drafts other tokens than specdec's
drafter from the same weights, for two reasons: its assistant normalizes each head's queries
and keys (a QK-norm, `q_norm`/`k_norm`, here at gain 1), which DRAFT-8 has not; and the
hidden states it hands the drafter for the target's last layer are after the final norm,
where DRAFT-7 takes them before it (the seeded drafter reads both layers of the tiny model).
The checks judge the target's output only, so any drafts will do; what they judge is HF's
DFlash loop.

Stop strings go to HF's own `StopStringCriteria` (`stop_strings` with `tokenizer`), which
needs a tokenizer: the tiny model's is built here as its ids read (`tiny_text`: id i is the
two letters chr(65 + i) chr(97 + i)), a word-level tokenizer whose decoder joins pieces
without spaces, plus six single letters outside the model's vocabulary, which HF's criteria
need to clean a vocabulary (they tokenize "abcdef"); the model never generates those. When
and where generation stops is HF's decision; the finish reason says `stop` when the text of
the generated tokens holds a stop string, so tokens HF lets through after one are seen.

The processors HF has go to its own: min-p as `min_p` (its `MinPLogitsWarper`, after
temperature, top-k and top-p, LOGITS-10's place), a logit bias as `sequence_bias` of
one-token sequences, the repetition penalty as `repetition_penalty` (over prompt and output,
the `context` scope). HF has no presence or frequency penalty: not stated, so not asked.
Logprobs (LOGPROB-1/2) come from HF's own `output_logits` (raw: the model's logits) and
`output_scores` (processed: the scores HF sampled from, after its processors and warpers),
one per emitted token as HF returns them, assisted generation included (it returns the
verify rows of the tokens it keeps); here they are only put in LOGPROB-3's form.

A regex constraint (CONSTRAIN-1) goes to HF's own constraint path, `prefix_allowed_tokens_fn`
(its `PrefixConstrainedLogitsProcessor`, which assisted generation applies to every row of a
verify window with the drafts before it, and hands to the assistant for its drafts). The
function given to it is CONSTRAIN-2's plain rule over the tiny text, with the `regex`
module HF itself depends on: a token is allowed iff the output's text with the token's
appended is still a prefix of a match (`fullmatch(..., partial=True)`), an eos iff the
output's text matches. HF has no JSON-schema path; a schema is not stated, so not asked.
"""

import argparse
import json
import sys

import regex
import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig

from engine_loop import check_fields, logprob_entries, serve


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


def allowed_tokens(request, prompt_len, vocab_size):
    """HF's `prefix_allowed_tokens_fn` for the request's regex constraint (module doc), or None."""
    constraint = request.get("constraint")
    if constraint is None:
        return None
    if set(constraint) != {"regex"}:
        raise ValueError(f"constraint {sorted(constraint)}: only a regex is stated")
    pattern, eos = regex.compile(constraint["regex"]), request["eos"]
    if not eos:
        raise ValueError("a constraint needs an eos id to end where the output matches")
    texts = [tiny_text([t]) for t in range(vocab_size)]

    def allowed(_batch, input_ids):
        generated = input_ids[prompt_len:].tolist()
        if any(t in eos for t in generated):
            # A window row after a drafted eos: never emitted (the output ends at the eos),
            # and HF refuses an empty list, so every id.
            return list(range(vocab_size))
        text = tiny_text(generated)
        ids = [t for t in range(vocab_size) if t not in eos and pattern.fullmatch(text + texts[t], partial=True)]
        return ids + (eos if pattern.fullmatch(text) else [])

    return allowed


def load(path):
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except TypeError:  # releases before `dtype` was the argument's name
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model.eval()
    # No defaults of the model's own generation config (eos, top-k 50) leak into a request.
    model.generation_config = GenerationConfig()
    return model


def load_dflash(path, target):
    """HF's DFlash assistant holding the DRAFT-6 checkpoint at `path` (module doc)."""
    from safetensors.torch import load_file
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    with open(f"{path}/config.json") as f:
        c = json.load(f)
    d = c["dflash_config"]
    mask, layers, block = d.get("mask_token_id", d.get("mask_token")), d["target_layer_ids"], d["block_size"]
    # DRAFT-6's bounds, on the fields this loader reads.
    if type(mask) is not int or not 0 <= mask < target.config.vocab_size:
        raise ValueError(f"{path}: the mask must be an id below the vocabulary (`mask_token_id`), got {mask!r}")
    if not layers or len(set(layers)) != len(layers) or not all(0 <= i < target.config.num_hidden_layers for i in layers):
        raise ValueError(f"{path}: target_layer_ids {layers}: non-empty, distinct, each a layer of the target")
    if not 2 <= block <= 64:
        raise ValueError(f"{path}: block_size {block} outside [2, 64]")
    if c.get("rope_scaling") or "rope_parameters" in c:
        raise ValueError(f"{path}: only a plain RoPE (`rope_theta`) is read here")
    heads = c["num_attention_heads"]
    config = MuseGlimmerAssistantConfig(
        hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=heads, num_key_value_heads=c.get("num_key_value_heads", heads),
        head_dim=c.get("head_dim") or c["hidden_size"] // heads, rms_norm_eps=c["rms_norm_eps"],
        max_position_embeddings=c["max_position_embeddings"], layer_types=["full_attention"] * c["num_hidden_layers"],
        rope_parameters={"rope_type": "default", "rope_theta": c.get("rope_theta", 10000.0)},
        block_size=block, mask_token_id=mask, target_layer_ids=layers,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if config.hidden_size != target.config.hidden_size:
        raise ValueError(f"{path}: hidden size {config.hidden_size}, the target's {target.config.hidden_size}")
    renamed = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
    state = {renamed.get(k, k): v.to(torch.float32) for k, v in load_file(f"{path}/model.safetensors").items()}
    assistant = MuseGlimmerAssistantModel(config)
    for name, param in assistant.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            state[name] = torch.ones_like(param)
    assistant.load_state_dict(state, strict=True)
    return assistant.eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--speculation", default="none")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load(args.model)
    kind, _, arg = args.speculation.partition(":")
    if kind not in ("none", "prompt-lookup", "assistant", "early-exit", "dflash") or (kind == "assistant" and arg != "self"):
        sys.exit(f"unknown --speculation {args.speculation}")
    assistant = load(args.model) if kind == "assistant" else load_dflash(arg, model) if kind == "dflash" else None
    # A draft's directory is named by its checkpoint's folder, never by a path of this machine.
    label = f"dflash:{arg.rstrip('/').rsplit('/', 1)[-1]}" if kind == "dflash" else args.speculation
    info = {
        "name": f"hf-transformers/{label}",
        "version": transformers.__version__,
        "speculation": label,
        "vocab": model.config.vocab_size,
        # float32 logits: a greedy token may differ from the f64 reference's only near a tie.
        "greedy_epsilon": 1e-4,
        "batch_invariant": True,
        "stop_strings": True,
        "constraints": ["regex"],
        "processors": ["min_p", "logit_bias", "repetition_penalty"],
        "penalty_scopes": ["context"],
        # float32 logits against the reference's f64.
        "logprobs": {"modes": ["raw", "processed"], "max_top": 20, "epsilon": 1e-4},
    }
    tokenizer = tiny_tokenizer(model.config.vocab_size)

    def generate(r):
        check_fields(r, stated={"constraint", "min_p", "logit_bias", "repetition_penalty", "penalty_scope", "logprobs"})
        if r.get("penalty_scope", "context") != "context":
            raise ValueError("HF's repetition penalty counts the prompt too: only the `context` scope")
        sample = r["temperature"] > 0
        config = GenerationConfig(
            max_new_tokens=r["max_new_tokens"],
            do_sample=sample,
            temperature=r["temperature"] if sample else 1.0,
            top_k=r["top_k"] if sample else None,
            top_p=r["top_p"] if sample else None,
            eos_token_id=r["eos"] or None,
            pad_token_id=0,
            min_p=r.get("min_p") or None,
            repetition_penalty=r.get("repetition_penalty", 1.0),
            sequence_bias=[[[i], b] for i, b in r.get("logit_bias", [])] or None,
        )
        ask = r.get("logprobs")
        if ask:
            config.return_dict_in_generate = True
            config.output_logits = ask["mode"] == "raw"
            config.output_scores = ask["mode"] == "processed"
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
        elif r["speculation"] and kind == "dflash":
            config.speculation_type = "dflash"
            extra["assistant_model"] = assistant
        prompt = torch.tensor([r["prompt"]], dtype=torch.long)
        constrained = allowed_tokens(r, prompt.shape[1], model.config.vocab_size)
        if constrained is not None:
            extra["prefix_allowed_tokens_fn"] = constrained
        torch.manual_seed(r["seed"])
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config, **extra)
        sequences = out.sequences if ask else out
        tokens = sequences[0, prompt.shape[1]:].tolist()
        if tokens and tokens[-1] in r["eos"]:
            finish = "eos"
        elif any(stop in tiny_text(tokens) for stop in r["stop"]):
            finish = "stop"
        elif len(tokens) >= r["max_new_tokens"]:
            finish = "length"
        else:
            finish = "capacity"
        reply = {"tokens": tokens, "finish": finish}
        if ask:
            rows = out.logits if ask["mode"] == "raw" else out.scores
            # f64 log-softmax of each row HF returns for an emitted token.
            lp = [torch.log_softmax(row[0].to(torch.float64), dim=-1).tolist() for row in rows]
            reply["logprobs"] = logprob_entries(lp, tokens, ask["top"])
        return reply

    serve(info, generate)

if __name__ == "__main__":
    main()
