#!/bin/bash
# The recipe of the shipped DFlash draft of SmolLM2-135M-Instruct
# (fixtures/dflash/smollm2-135m-instruct), run on a GPU machine.
#
#   train/gpu-recipe.sh BIN GGUF HF OUT
#
# BIN: a folder with `specdec-train` from `cargo xtask cuda`; GGUF: the
# SmolLM2 GGUF (`cargo xtask model`); HF: its export (`specdec model export
# GGUF HF`); OUT: where the data and the draft go. Needs a CUDA GPU, and a
# Python with torch, transformers and safetensors (the GPU machines' PyTorch);
# run from the repository root, with PyTorch's torch/lib on LD_LIBRARY_PATH.
#
# The data: the prompt file's held-out prompts (measuring only) and training
# prompts, plus 8192 user messages the target writes itself (about 6,600
# kept), each continued greedily up to 256 tokens (160 for the held-out
# split, as in `cargo xtask train-dflash`): about 1.4 million tokens and
# their hidden states at layers 1, 14 and 27. Then 4000 training steps of 32
# sequences x 32 anchored blocks on the GPU. The CPU recipe, `cargo xtask
# train-dflash`, is the same training on a few hundred prompts.
#
# For more volume on a lent GPU's few minutes, the environment may set
# SYNTHESIZE (user messages, default 8192), BATCH (generation batch, default
# 1024), STEPS (default 4000), SEQS (sequences per step, default 32) and
# TIME_BUDGET (seconds after which the training data's generation begins no
# new batch and keeps what it has; default none).
set -euo pipefail
[ $# -eq 4 ] || { sed -n '2,8p' "$0"; exit 2; }
BIN=$1 GGUF=$2 HF=$3 OUT=$4
LAYERS=1,14,27
# `<empty_output>`: a special token no prompt or continuation contains.
MASK_TOKEN_ID=16
SYNTHESIZE=${SYNTHESIZE:-8192} BATCH=${BATCH:-1024} STEPS=${STEPS:-4000} SEQS=${SEQS:-32}
BUDGET=()
[ -z "${TIME_BUDGET:-}" ] || BUDGET=(--time-budget "$TIME_BUDGET")
python3 train/python/draft_data_hf.py --model "$HF" --prompts fixtures/dflash/prompts.json --split heldout \
    --layers $LAYERS --max-tokens 160 --batch 128 --out "$OUT/data/heldout"
python3 train/python/draft_data_hf.py --model "$HF" --prompts fixtures/dflash/prompts.json --split train \
    --synthesize "$SYNTHESIZE" --seed 0 --layers $LAYERS --max-tokens 256 --batch "$BATCH" "${BUDGET[@]}" --out "$OUT/data/train"
"$BIN/specdec-train" --target "$GGUF" --data "$OUT/data/train" --heldout "$OUT/data/heldout" --out "$OUT/draft" \
    --steps "$STEPS" --seqs-per-step "$SEQS" --anchors-per-seq 32 --eval-every 1000 --mask-token-id $MASK_TOKEN_ID \
    --device cuda --threads 8
# The draft in fixtures/dflash (the one this recipe replaced, when it ran), on the same held-out data.
"$BIN/specdec-train" --target "$GGUF" --mask-token-id $MASK_TOKEN_ID --evaluate fixtures/dflash/smollm2-135m-instruct \
    --heldout "$OUT/data/heldout" --device cuda
