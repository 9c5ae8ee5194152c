//! Seed 001's dynamic speculation controller, with its metrics corrected
//! (CTRL-1 .. CTRL-6).

use serde::{Deserialize, Serialize};

use crate::error::{Result, SpecError};

/// Which proposer feeds the verifier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SpecMode {
    #[default]
    None,
    Ngram,
    Draft,
}

/// Seed 001's `SpecDecodeConfig` (the fields the algorithms read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpecConfig {
    pub mode: SpecMode,
    pub num_speculative_tokens: usize,
    /// `0` never disables.
    pub disable_by_batch_size: usize,
    pub ngram_max: usize,
    pub ngram_min: usize,
    pub draft_model_path: Option<String>,
    pub dynamic_enabled: bool,
    pub acceptance_rate_threshold: f64,
    pub acceptance_rate_ema_alpha: f64,
    pub adaptive_k: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            mode: SpecMode::None,
            num_speculative_tokens: 5,
            disable_by_batch_size: 8,
            ngram_max: 4,
            ngram_min: 1,
            draft_model_path: None,
            dynamic_enabled: true,
            acceptance_rate_threshold: 0.3,
            acceptance_rate_ema_alpha: 0.1,
            adaptive_k: true,
        }
    }
}

/// The largest `num_speculative_tokens` seed 001 accepts.
pub const MAX_SPECULATIVE_TOKENS: usize = 20;

impl SpecConfig {
    /// CTRL-1: seed 001's `validate()`, rejecting NaN as well.
    pub fn validate(&self) -> Result<()> {
        if self.mode == SpecMode::Draft && self.draft_model_path.as_deref().is_none_or(str::is_empty) {
            return Err(SpecError::param("draft_model_path", "none", "is required when mode is draft"));
        }
        let k = self.num_speculative_tokens;
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&k) {
            return Err(SpecError::param("num_speculative_tokens", k, "must be in [1, 20]"));
        }
        if self.ngram_min < 1 {
            return Err(SpecError::param("ngram_min", self.ngram_min, "must be >= 1"));
        }
        if self.ngram_max < self.ngram_min {
            return Err(SpecError::param("ngram_max", self.ngram_max, "must be >= ngram_min"));
        }
        let t = self.acceptance_rate_threshold;
        if !(0.0..=1.0).contains(&t) {
            return Err(SpecError::param("acceptance_rate_threshold", t, "must be in [0, 1]"));
        }
        let a = self.acceptance_rate_ema_alpha;
        if !(a > 0.0 && a <= 1.0) {
            return Err(SpecError::param("acceptance_rate_ema_alpha", a, "must be in (0, 1]"));
        }
        Ok(())
    }
}

/// Cumulative statistics (CTRL-5/6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecStats {
    /// Batched verify steps.
    pub steps: u64,
    /// Sequences verified, summed over steps (each emits accepted + 1 tokens).
    pub sequence_steps: u64,
    pub proposed: u64,
    pub accepted: u64,
    /// Sequences whose every draft was accepted (the +1 was a bonus token).
    pub bonus_tokens: u64,
    pub fallback_steps: u64,
}

impl SpecStats {
    /// Accepted over proposed drafts; 0 before any proposal.
    pub fn acceptance_rate(&self) -> f64 {
        if self.proposed == 0 { 0.0 } else { self.accepted as f64 / self.proposed as f64 }
    }

    /// CTRL-5: tokens emitted per verified sequence. Each verified sequence
    /// emits its accepted drafts plus exactly one token (correction or
    /// bonus), so a fully accepted step of k drafts counts k + 1. Seed 001
    /// added the bonus tokens on top (k + 2) and counted +1 per batch step
    /// instead of per sequence (erratum E6).
    pub fn tokens_per_sequence_step(&self) -> f64 {
        if self.sequence_steps == 0 { 1.0 } else { (self.accepted + self.sequence_steps) as f64 / self.sequence_steps as f64 }
    }
}

/// One batched verify step's counts, as reported to the controller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounts {
    pub sequences: u64,
    pub proposed: u64,
    pub accepted: u64,
    pub bonus: u64,
}

/// The EMA-driven controller (CTRL-2 .. CTRL-4).
#[derive(Debug, Clone, PartialEq)]
pub struct DynamicController {
    config: SpecConfig,
    ema: f64,
    stats: SpecStats,
}

/// Seed 001's optimistic starting EMA.
pub const INITIAL_EMA: f64 = 0.7;

impl DynamicController {
    pub fn new(config: SpecConfig) -> Result<Self> {
        config.validate()?;
        Ok(DynamicController { config, ema: INITIAL_EMA, stats: SpecStats::default() })
    }

    pub fn acceptance_rate_ema(&self) -> f64 {
        self.ema
    }

    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    pub fn config(&self) -> &SpecConfig {
        &self.config
    }

    /// CTRL-3.
    pub fn should_speculate(&self, batch_size: usize) -> bool {
        let c = &self.config;
        if c.mode == SpecMode::None {
            return false;
        }
        if c.disable_by_batch_size > 0 && batch_size >= c.disable_by_batch_size {
            return false;
        }
        !c.dynamic_enabled || self.ema >= c.acceptance_rate_threshold
    }

    /// CTRL-4: the draft length for this step (0 = do not speculate).
    pub fn k(&self, batch_size: usize) -> usize {
        if !self.should_speculate(batch_size) {
            return 0;
        }
        let k = self.config.num_speculative_tokens;
        // Adaptive k is part of dynamic control: off when dynamic is off.
        if !(self.config.dynamic_enabled && self.config.adaptive_k) {
            return k;
        }
        // should_speculate already guarantees ema >= threshold, so the
        // lowest band is 1, never a contradictory 0 (erratum E7).
        if self.ema > 0.8 {
            k
        } else if self.ema > 0.5 {
            k.saturating_sub(2).max(1)
        } else {
            1
        }
    }

    /// CTRL-2/5: records one batched verify step.
    pub fn update(&mut self, step: StepCounts) -> Result<()> {
        if step.accepted > step.proposed {
            return Err(SpecError::param("accepted", step.accepted, "must be <= proposed"));
        }
        if step.bonus > step.sequences {
            return Err(SpecError::param("bonus", step.bonus, "must be <= sequences"));
        }
        let s = &mut self.stats;
        s.steps += 1;
        s.sequence_steps += step.sequences;
        s.proposed += step.proposed;
        s.accepted += step.accepted;
        s.bonus_tokens += step.bonus;
        if step.proposed > 0 {
            let rate = step.accepted as f64 / step.proposed as f64;
            let alpha = self.config.acceptance_rate_ema_alpha;
            self.ema = alpha * rate + (1.0 - alpha) * self.ema;
        }
        Ok(())
    }

    /// CTRL-6: a step that ran without speculation.
    pub fn record_fallback(&mut self) {
        self.stats.fallback_steps += 1;
    }
}
