//! Proposers by name, as `specdec generate --proposer` spells them:
//! `none`, `ngram`, `draft:PATH`, `early-exit:L`, `dflash:PATH`,
//! `dflash-iter:PATH`. The one parser of proposer names and the one
//! builder of proposers: the end-to-end section of the suite reads its names
//! (`draft:seeded`, `dflash:trained`, ...) with it too, and gives its own
//! [`DraftSource`] for what their argument stands for.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use specdec_backend::NgramConfig;
use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_models::DflashDraft;

use crate::error::DecodeError;
use crate::proposer::{DflashMode, DflashProposer, DraftModelProposer, NgramProposer, NoProposer, Proposer};

/// The unmasking of `dflash-iter`: two steps, cosine schedule.
pub const ITERATIVE: DflashMode = DflashMode::Iterative { steps: 2, schedule: specdec_models::dflash::Schedule::Cosine };

/// A proposer named on a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposerChoice {
    None,
    Ngram,
    /// A draft model file (GGUF or HF layout) sharing the target's vocabulary.
    Draft(PathBuf),
    /// The target's first `L` layers.
    EarlyExit(usize),
    /// A DFlash block-draft checkpoint (HF layout with `dflash_config`).
    Dflash(PathBuf),
    /// The same checkpoint drafting by iterative unmasking ([`ITERATIVE`]).
    DflashIter(PathBuf),
}

impl std::str::FromStr for ProposerChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("unknown proposer `{s}`: expected none, ngram, draft:PATH, early-exit:L, dflash:PATH or dflash-iter:PATH");
        Ok(match s.split_once(':') {
            None if s == "none" => ProposerChoice::None,
            None if s == "ngram" => ProposerChoice::Ngram,
            Some(("draft", p)) if !p.is_empty() => ProposerChoice::Draft(p.into()),
            Some(("dflash", p)) if !p.is_empty() => ProposerChoice::Dflash(p.into()),
            Some(("dflash-iter", p)) if !p.is_empty() => ProposerChoice::DflashIter(p.into()),
            Some(("early-exit", l)) => ProposerChoice::EarlyExit(l.parse().map_err(|_| format!("early-exit:{l}: L must be a layer count"))?),
            _ => return Err(bad()),
        })
    }
}

/// The name as `--proposer` spells it: `FromStr` reads back what this writes.
impl std::fmt::Display for ProposerChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposerChoice::None => write!(f, "none"),
            ProposerChoice::Ngram => write!(f, "ngram"),
            ProposerChoice::Draft(path) => write!(f, "draft:{}", path.display()),
            ProposerChoice::EarlyExit(l) => write!(f, "early-exit:{l}"),
            ProposerChoice::Dflash(path) => write!(f, "dflash:{}", path.display()),
            ProposerChoice::DflashIter(path) => write!(f, "dflash-iter:{}", path.display()),
        }
    }
}

/// What the argument of `draft:ARG`, `dflash:ARG` and `dflash-iter:ARG` stands for.
pub trait DraftSource {
    /// The draft model `draft:ARG` names, for `target` (borrowed when it is `target` itself).
    fn draft_model<'t>(&self, arg: &Path, target: &'t LlamaWeights) -> Result<Cow<'t, LlamaWeights>, DecodeError>;
    /// The DFlash checkpoint `dflash:ARG` names, validated against `target`.
    fn dflash_draft(&self, arg: &Path, target: &LlamaWeights) -> Result<DflashDraft, DecodeError>;
}

/// Drafts from files, as the command line names them: `ARG` is a path.
pub struct DraftFiles;

impl DraftSource for DraftFiles {
    fn draft_model<'t>(&self, arg: &Path, _: &'t LlamaWeights) -> Result<Cow<'t, LlamaWeights>, DecodeError> {
        let draft = specdec_models::load(arg).map_err(|e| DecodeError::Config(format!("draft model: {e}")))?;
        Ok(Cow::Owned(draft.weights))
    }

    fn dflash_draft(&self, arg: &Path, target: &LlamaWeights) -> Result<DflashDraft, DecodeError> {
        specdec_models::load_dflash(arg, &target.config).map_err(|e| DecodeError::Config(format!("dflash checkpoint: {e}")))
    }
}

impl ProposerChoice {
    /// Builds the proposer for `target` on `backend`, drafting at most `k`
    /// tokens a step, its drafts read from files ([`DraftFiles`]).
    pub fn build<B: ModelBackend>(&self, backend: &B, target: &Arc<LlamaWeights>, k: usize) -> Result<Box<dyn Proposer<B>>, DecodeError> {
        self.build_from(backend, target, k, &DraftFiles)
    }

    /// [`build`](Self::build) with the drafts `drafts` names. A DFlash
    /// drafter keeps reading the target's embedding and head, so it shares
    /// `target` rather than copying it.
    pub fn build_from<B: ModelBackend>(&self, backend: &B, target: &Arc<LlamaWeights>, k: usize, drafts: &dyn DraftSource) -> Result<Box<dyn Proposer<B>>, DecodeError> {
        let vocab = target.config.vocab_size;
        let dflash =
            |arg: &Path, mode| -> Result<Box<dyn Proposer<B>>, DecodeError> { Ok(Box::new(DflashProposer::new(self.to_string(), drafts.dflash_draft(arg, target)?, Arc::clone(target), mode)?)) };
        Ok(match self {
            ProposerChoice::None => Box::new(NoProposer),
            ProposerChoice::Ngram => Box::new(NgramProposer::new(NgramConfig { k: k.max(1), ..NgramConfig::default() }, vocab)?),
            ProposerChoice::Draft(arg) => Box::new(DraftModelProposer::new(backend, self.to_string(), &*drafts.draft_model(arg, target)?, vocab)?),
            ProposerChoice::EarlyExit(l) => Box::new(DraftModelProposer::early_exit(backend, target, *l)?),
            ProposerChoice::Dflash(arg) => dflash(arg, DflashMode::Parallel)?,
            ProposerChoice::DflashIter(arg) => dflash(arg, ITERATIVE)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_what_from_str_reads() {
        for name in ["none", "ngram", "draft:models/d.gguf", "early-exit:10", "dflash:ckpt", "dflash-iter:ckpt"] {
            let choice: ProposerChoice = name.parse().unwrap();
            assert_eq!(choice.to_string(), name);
            assert_eq!(choice.to_string().parse::<ProposerChoice>().unwrap(), choice);
        }
    }
}
