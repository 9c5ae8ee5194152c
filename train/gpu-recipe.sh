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
set -euo pipefail
[ $# -eq 4 ] || { sed -n '2,8p' "$0"; exit 2; }
BIN=$1 GGUF=$2 HF=$3 OUT=$4
LAYERS=1,14,27
# `<empty_output>`: a special token no prompt or continuation contains.
MASK_TOKEN_ID=16
python3 train/python/draft_data_hf.py --model "$HF" --prompts fixtures/dflash/prompts.json --split heldout \
    --layers $LAYERS --max-tokens 160 --batch 128 --out "$OUT/data/heldout"
python3 train/python/draft_data_hf.py --model "$HF" --prompts fixtures/dflash/prompts.json --split train \
    --synthesize 8192 --seed 0 --layers $LAYERS --max-tokens 256 --batch 1024 --out "$OUT/data/train"
"$BIN/specdec-train" --target "$GGUF" --data "$OUT/data/train" --heldout "$OUT/data/heldout" --out "$OUT/draft" \
    --steps 4000 --seqs-per-step 32 --anchors-per-seq 32 --eval-every 1000 --mask-token-id $MASK_TOKEN_ID \
    --device cuda --threads 8
# The draft in fixtures/dflash (the one this recipe replaced, when it ran), on the same held-out data.
"$BIN/specdec-train" --target "$GGUF" --mask-token-id $MASK_TOKEN_ID --evaluate fixtures/dflash/smollm2-135m-instruct \
    --heldout "$OUT/data/heldout" --device cuda
