//! Training a DFlash block draft (DRAFT-6 .. DRAFT-8) against its target.
//!
//! Role: turn the target's greedy continuations and hidden states
//! ([`specdec_models::DraftData`], written by `specdec draft-data`) into a
//! drafter checkpoint the decoder loads with `--proposer dflash:DIR`. The
//! forward trained here is the one `specdec_models::dflash` runs at inference,
//! written with libtorch tensors so autograd can differentiate it: context
//! features `RMSNorm_hidden_norm(fc · [h_l for l in target_layer_ids])` enter
//! every draft layer's attention as keys and values (no input norm), the
//! block `[verified, mask, .., mask]` is embedded by the target's embedding,
//! attends to the context before its anchor and non-causally to itself, and
//! is read out by the draft's norm and the target's head. The target's
//! embedding and head are frozen; everything the checkpoint holds is trained.
//!
//! Invariants: training is a pure function of the data, the target, the
//! config and the seed on one device: anchors and initial noise come from
//! PCG64, libtorch runs with a fixed thread count (the CPU) or on one CUDA
//! device (whose kernels round differently), and the run length is a number
//! of steps, never a wall-clock budget. A block anchored at position `n`
//! of a sequence `x` (its labels `x[n+1 .. n+B]` are the target's greedy
//! tokens) sees exactly what the decoder's drafter sees when `x[..=n]` is
//! verified: the hidden rows of positions `< n`, and the token `x[n]`.
//! So the leading matches of a block's argmaxes with its labels are the
//! tokens greedy verification would accept, and the held-out estimate of the
//! mean accepted length per block is measured, not guessed.
//!
//! Layout: `trainer.rs` (many anchored blocks per sequence in one batch,
//! AdamW, the held-out estimate, export through
//! `specdec_models::export_dflash`), [`plot`] (the loss curve); the binary
//! `specdec-train` (`--device cuda` trains on a GPU, `--evaluate` measures an
//! existing draft). Built only with the `libtorch` feature, like the tch
//! backend. Recipes: `cargo xtask train-dflash` on the CPU, and
//! `gpu-recipe.sh`, the shipped draft's (`python/draft_data_hf.py` makes the
//! data at GPU volume with HF transformers' batched generation, in `specdec
//! draft-data`'s format). A crate of its own so that training code and its
//! autograd never enter the libraries.

pub mod plot;
#[cfg(feature = "libtorch")]
pub mod trainer;
