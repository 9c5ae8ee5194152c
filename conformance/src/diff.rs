//! Differential cases (CASE-6): seeded random inputs for every op, with the
//! expectation computed by the reference, judged like golden cases.
//!
//! The generators aim at the known bug classes rather than at typical
//! inputs: tied scores, exact zeros, `q(x) = 0`, `p == q`, disjoint
//! supports, uniforms of exactly 0, NaN padding rows (CONV-7), PAD-heavy
//! batches, trims to zero, and one injected defect in about one case in
//! eight (so error kinds are compared too).

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;
use serde_json::{Map, Value, json};
use specdec_backend::{HostTensor, Op, PAD};

use crate::bless::bless;
use crate::format::{Case, CaseError, ExpectedBy, encode_f64, encode_i64};

pub use crate::check::DEFAULT_CASES_PER_OP;

/// The ops with a differential generator: every op but the seeded verify,
/// which is checked statistically, and the glue ops (GLUE-1 .. GLUE-4), exact
/// data movement and integer arithmetic with no decision for a generator to
/// aim at: their hand-worked golden cases check them.
pub fn ops() -> impl Iterator<Item = Op> {
    Op::ALL.into_iter().filter(|&op| op != Op::RejectionVerifySeeded && !op.is_glue())
}

/// The name of differential case `index` of `op`.
pub fn name(op: Op, index: usize) -> String {
    format!("diff/{}/{index:03}", op.name())
}

/// Builds differential case `index` of `op` for run seed `seed`, blessed by the reference.
pub fn case(op: Op, index: usize, seed: u64) -> Result<Case, CaseError> {
    let mut g = Gen(Pcg64::seed_from_u64(seed ^ (op as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (index as u64) << 20));
    let (params, inputs) = match op {
        Op::GreedyVerify => greedy(&mut g),
        Op::DflashAccept => dflash(&mut g),
        Op::RejectionVerify => rejection(&mut g),
        Op::Residual => residual(&mut g),
        Op::ProcessLogits => logits(&mut g),
        Op::Draw => draw(&mut g),
        Op::NgramPropose => ngram(&mut g),
        Op::KvCache => kv(&mut g),
        Op::PagedGather => paged(&mut g),
        Op::RejectionVerifySeeded => unreachable!("statistical, not differential"),
        Op::Reshape | Op::GatherRows | Op::ConcatRows | Op::AddI64 | Op::SubI64 => {
            return Err(CaseError::new(name(op, index), "glue ops have golden cases only, no differential generator"));
        }
    };
    let mut inputs = inputs;
    if g.chance(0.125) {
        inject_defect(&mut g, &mut inputs);
    }
    let case = Case {
        id: name(op, index),
        op: op.name().to_string(),
        description: String::new(),
        rules: Vec::new(),
        source: format!("differential generator, seed {seed}"),
        expected_by: ExpectedBy::Reference,
        params,
        inputs,
        expect: Map::new(),
    };
    bless(&case)
}

struct Gen(Pcg64);

impl Gen {
    fn int(&mut self, lo: usize, hi: usize) -> usize {
        self.0.random_range(lo..=hi)
    }
    fn unit(&mut self) -> f64 {
        self.0.random()
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    /// A uniform in [0, 1), exactly 0 now and then (the `<=` bug class).
    fn uniform(&mut self) -> f64 {
        if self.chance(0.05) { 0.0 } else { self.unit() }
    }
    fn exponential(&mut self) -> f64 {
        loop {
            let u = self.unit();
            if u > 0.0 {
                return -(-u).ln_1p();
            }
        }
    }
    /// A probability row with exact zeros and sometimes a single id.
    fn prob_row(&mut self, v: usize) -> Vec<f64> {
        if self.chance(0.1) {
            let mut row = vec![0.0; v];
            row[self.int(0, v - 1)] = 1.0;
            return row;
        }
        let mut w: Vec<f64> = (0..v).map(|_| if self.chance(0.25) { 0.0 } else { self.unit() }).collect();
        if w.iter().all(|&x| x == 0.0) {
            w[self.int(0, v - 1)] = 1.0;
        }
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    }
    /// A draft row related to `p`: equal, disjoint, one-hot, or independent.
    fn draft_row(&mut self, p: &[f64]) -> Vec<f64> {
        let v = p.len();
        match self.int(0, 5) {
            0 => p.to_vec(),
            1 => {
                let mut q: Vec<f64> = p.iter().map(|&x| if x > 0.0 { 0.0 } else { 1.0 }).collect();
                let s: f64 = q.iter().sum();
                if s == 0.0 {
                    return self.prob_row(v);
                }
                q.iter_mut().for_each(|x| *x /= s);
                q
            }
            2 => {
                let mut q = vec![0.0; v];
                q[self.int(0, v - 1)] = 1.0;
                q
            }
            _ => self.prob_row(v),
        }
    }
    /// Draws an id from `row` (so drafts look like real samples), or any id.
    fn sample(&mut self, row: &[f64]) -> i64 {
        if self.chance(0.15) {
            return self.int(0, row.len() - 1) as i64;
        }
        crate::stat::pick(row, self.unit())
    }
    fn garbage_row(&mut self, v: usize) -> Vec<f64> {
        let fill = if self.chance(0.5) { f64::NAN } else { -1.0 };
        vec![fill; v]
    }
}

fn f(shape: Vec<usize>, data: Vec<f64>) -> Value {
    encode_f64(&HostTensor::new(shape, data).expect("generator shapes match"))
}

fn i(shape: Vec<usize>, data: Vec<i64>) -> Value {
    encode_i64(&HostTensor::new(shape, data).expect("generator shapes match"))
}

fn obj(pairs: Vec<(&str, Value)>) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Proposal lengths in `[0, k]`, biased to full and empty proposals.
fn lens(g: &mut Gen, b: usize, k: usize) -> Vec<usize> {
    (0..b)
        .map(|_| match g.int(0, 4) {
            0 => 0,
            1 | 2 => k,
            _ => g.int(0, k),
        })
        .collect()
}

fn greedy(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (b, k, v) = (g.int(1, 4), g.int(1, 5), g.int(1, 12));
    let lens = lens(g, b, k);
    let mut scores = Vec::new();
    let mut drafts = vec![PAD; b * k];
    for s in 0..b {
        let mut rows = Vec::new();
        for j in 0..=k {
            // Small integer scores make ties (CONV-8); -inf masks some ids.
            let mut row: Vec<f64> = (0..v).map(|_| if g.chance(0.1) { f64::NEG_INFINITY } else { g.int(0, 3) as f64 }).collect();
            if row.iter().all(|x| x.is_infinite()) {
                row[0] = 0.0;
            }
            if j > lens[s] && g.chance(0.5) {
                row = g.garbage_row(v); // CONV-7: never read
            }
            rows.push(row);
        }
        for j in 0..lens[s] {
            let top = (0..v).fold(0, |m, x| if rows[j][x] > rows[j][m] { x } else { m });
            drafts[s * k + j] = if g.chance(0.75) { top as i64 } else { g.int(0, v - 1) as i64 };
        }
        scores.extend(rows.into_iter().flatten());
    }
    let lens = lens.into_iter().map(|l| l as i64).collect();
    (Map::new(), obj(vec![("target_scores", f(vec![b, k + 1, v], scores)), ("draft_tokens", i(vec![b, k], drafts)), ("proposal_lens", i(vec![b], lens))]))
}

fn dflash(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (bs, block, v) = (g.int(1, 4), g.int(2, 8), g.int(1, 5));
    let mut cand = Vec::new();
    let mut pred = Vec::new();
    for _ in 0..bs {
        let p: Vec<i64> = (0..block).map(|_| g.int(0, v - 1) as i64).collect();
        cand.push(g.int(0, v - 1) as i64);
        for j in 1..block {
            cand.push(if g.chance(0.7) { p[j - 1] } else { g.int(0, v - 1) as i64 });
        }
        pred.extend(p);
    }
    (obj(vec![("vocab", json!(v))]), obj(vec![("candidates", i(vec![bs, block], cand)), ("target_predict", i(vec![bs, block], pred))]))
}

fn rejection(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (b, k, v) = (g.int(1, 4), g.int(1, 4), g.int(1, 10));
    let lens = lens(g, b, k);
    let with_q = g.chance(0.75);
    let (mut p, mut q, mut drafts) = (Vec::new(), Vec::new(), vec![PAD; b * k]);
    for s in 0..b {
        for j in 0..=k {
            let row = if j <= lens[s] { g.prob_row(v) } else { g.garbage_row(v) };
            if j < k {
                let qrow = if j < lens[s] { g.draft_row(&row) } else { g.garbage_row(v) };
                if j < lens[s] {
                    drafts[s * k + j] = g.sample(&qrow);
                }
                q.extend(qrow);
            }
            p.extend(row);
        }
    }
    let u: Vec<f64> = (0..b * k).map(|_| g.uniform()).collect();
    let mut inputs = obj(vec![
        ("target_probs", f(vec![b, k + 1, v], p)),
        ("draft_tokens", i(vec![b, k], drafts)),
        ("proposal_lens", i(vec![b], lens.into_iter().map(|l| l as i64).collect())),
        ("accept_uniforms", f(vec![b, k], u)),
    ]);
    if with_q {
        inputs.insert("draft_probs".into(), f(vec![b, k, v], q));
    }
    if g.chance(0.5) {
        inputs.insert("draw_uniforms".into(), f(vec![b, k + 1], (0..b * (k + 1)).map(|_| g.uniform()).collect()));
    } else {
        inputs.insert("draw_exponentials".into(), f(vec![b, k + 1, v], (0..b * (k + 1) * v).map(|_| g.exponential()).collect()));
    }
    let cmp = if g.chance(0.2) { "Seed004LessEq" } else { "Strict" };
    (obj(vec![("comparator", json!(cmp))]), inputs)
}

fn residual(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (rows, v) = (g.int(1, 4), g.int(1, 10));
    let (mut p, mut q, mut x) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rows {
        let row = g.prob_row(v);
        let qrow = g.draft_row(&row);
        x.push(g.sample(&qrow));
        p.extend(row);
        q.extend(qrow);
    }
    let mut inputs = obj(vec![("target_probs", f(vec![rows, v], p)), ("drafted", i(vec![rows], x))]);
    if g.chance(0.7) {
        inputs.insert("draft_probs".into(), f(vec![rows, v], q));
    }
    (Map::new(), inputs)
}

fn logits(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (rows, v) = (g.int(1, 4), g.int(1, 16));
    let mut z = Vec::new();
    let (mut t, mut k, mut p) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rows {
        let mut row: Vec<f64> = (0..v)
            .map(|_| match g.int(0, 9) {
                0 => f64::NEG_INFINITY,
                1 | 2 => g.int(0, 2) as f64,
                _ => g.unit() * 8.0 - 4.0,
            })
            .collect();
        if row.iter().all(|x| x.is_infinite()) {
            row[0] = 1.0;
        }
        z.extend(row);
        t.push([0.0, 0.5, 1.0, 2.0][g.int(0, 3)]);
        k.push([0, 1, 2, v.saturating_sub(1), v][g.int(0, 4)] as i64);
        p.push([1.0, 0.95, 0.7, 0.3][g.int(0, 3)]);
    }
    let mut inputs = obj(vec![("logits", f(vec![rows, v], z)), ("temperature", f(vec![rows], t)), ("top_k", i(vec![rows], k)), ("top_p", f(vec![rows], p))]);
    // LOGITS-7 .. LOGITS-10 on about half the cases, each processor alone or together.
    let pick = |g: &mut Gen, xs: &[f64]| -> Vec<f64> { (0..rows).map(|_| xs[g.int(0, xs.len() - 1)]).collect() };
    if g.chance(0.4) {
        inputs.insert("min_p".into(), f(vec![rows], pick(g, &[0.0, 0.05, 0.2, 0.5])));
    }
    if g.chance(0.4) {
        let counts: Vec<f64> = (0..rows * v).map(|_| [0.0, 0.0, 1.0, 3.0][g.int(0, 3)]).collect();
        inputs.insert("penalty_counts".into(), f(vec![rows, v], counts));
        inputs.insert("repetition_penalty".into(), f(vec![rows], pick(g, &[1.0, 1.3, 0.8])));
        inputs.insert("presence_penalty".into(), f(vec![rows], pick(g, &[0.0, 0.5, -0.5])));
        inputs.insert("frequency_penalty".into(), f(vec![rows], pick(g, &[0.0, 0.3])));
    }
    if g.chance(0.3) {
        let bias: Vec<f64> = (0..rows * v).map(|_| if g.chance(0.3) { g.int(0, 6) as f64 - 3.0 } else { 0.0 }).collect();
        inputs.insert("logit_bias".into(), f(vec![rows, v], bias));
    }
    (Map::new(), inputs)
}

fn draw(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (rows, v) = (g.int(1, 4), g.int(1, 12));
    let mut w = Vec::new();
    for _ in 0..rows {
        // Unnormalised weights: draws must divide by the actual total.
        let scale = [1.0, 0.3, 7.0][g.int(0, 2)];
        w.extend(g.prob_row(v).into_iter().map(|x| x * scale));
    }
    let mut inputs = obj(vec![("weights", f(vec![rows, v], w))]);
    if g.chance(0.5) {
        inputs.insert("draw_uniforms".into(), f(vec![rows], (0..rows).map(|_| g.uniform()).collect()));
    } else {
        inputs.insert("draw_exponentials".into(), f(vec![rows, v], (0..rows * v).map(|_| g.exponential()).collect()));
    }
    (Map::new(), inputs)
}

fn ngram(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (b, width, alphabet) = (g.int(1, 3), g.int(1, 30), g.int(1, 4));
    let ngram_min = g.int(1, 3);
    let k = g.int(1, 6);
    let mut ctx = Vec::new();
    let mut lens = Vec::new();
    for _ in 0..b {
        let len = g.int(1, width);
        ctx.extend((0..width).map(|j| if j < len { g.int(0, alphabet - 1) as i64 } else { PAD }));
        lens.push(len as i64);
    }
    // NGRAM-5: most cases carry a max_model_len that binds. It is placed
    // against the longest context so that the draft room `max - len - 1` runs
    // from none (len = max) to k - 2 for the longest context, and now and then one context is
    // too long for it (ContextTooLong); a cap far above every length would
    // leave the rule untested.
    let longest = *lens.iter().max().expect("b >= 1") as usize;
    let max_model_len = if g.chance(0.6) {
        if g.chance(0.1) { json!(longest - 1) } else { json!(longest + g.int(0, k - 1)) }
    } else if g.chance(0.3) {
        json!(width + g.int(k + 1, k + 4)) // a cap that never binds
    } else {
        Value::Null
    };
    let cfg = json!({
        "ngram_min": ngram_min,
        "ngram_max": ngram_min + g.int(0, 2),
        "k": k,
        "policy": if g.chance(0.5) { "LargestNMostRecent" } else { "LargestNEarliest" },
        "max_model_len": max_model_len,
    });
    (obj(vec![("vocab", json!(alphabet)), ("config", cfg)]), obj(vec![("contexts", i(vec![b, width], ctx)), ("context_lens", i(vec![b], lens))]))
}

fn kv(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (b, h, d, cap) = (g.int(1, 3), g.int(1, 2), g.int(1, 3), g.int(4, 10));
    let mut lens = vec![0usize; b];
    let mut steps = Vec::new();
    for _ in 0..g.int(1, 5) {
        if g.chance(0.55) {
            let t = g.int(0, 4); // T = 0 is a valid empty append
            let counts: Vec<i64> = lens.iter().map(|&l| g.int(0, t.min(cap - l)) as i64).collect();
            for (l, c) in lens.iter_mut().zip(&counts) {
                *l += *c as usize;
            }
            let n = b * h * t * d;
            let keys: Vec<f64> = (0..n).map(|_| (g.unit() * 8.0).round() / 4.0).collect();
            let values: Vec<f64> = (0..n).map(|_| (g.unit() * 8.0).round() / 4.0).collect();
            steps.push(json!({"append": {
                "keys": f(vec![b, h, t, d], keys), "values": f(vec![b, h, t, d], values), "counts": i(vec![b], counts),
            }}));
        } else {
            let clamped = g.chance(0.3);
            let amounts: Vec<i64> = lens.iter().map(|&l| g.int(0, if clamped { l + 2 } else { l }) as i64).collect();
            for (l, a) in lens.iter_mut().zip(&amounts) {
                *l -= (*a as usize).min(*l);
            }
            steps.push(json!({"trim": {"amounts": i(vec![b], amounts), "mode": if clamped { "clamped" } else { "strict" }}}));
        }
    }
    (obj(vec![("batch", json!(b)), ("heads", json!(h)), ("head_dim", json!(d)), ("capacity", json!(cap))]), obj(vec![("steps", Value::Array(steps))]))
}

fn paged(g: &mut Gen) -> (Map<String, Value>, Map<String, Value>) {
    let (pages, size, h, d, b, slots) = (g.int(1, 6), g.int(1, 4), g.int(1, 2), g.int(1, 3), g.int(1, 3), g.int(1, 4));
    let data: Vec<f64> = (0..pages * size * h * d).map(|x| x as f64 + 0.5).collect();
    let mut table = Vec::new();
    let mut lens = Vec::new();
    for _ in 0..b {
        let len = g.int(1, slots * size);
        let used = len.div_ceil(size);
        table.extend((0..slots).map(|s| if s < used { g.int(0, pages - 1) as i64 } else { PAD }));
        lens.push(len as i64);
    }
    (Map::new(), obj(vec![("pages", f(vec![pages, size, h, d], data)), ("block_table", i(vec![b, slots], table)), ("context_lens", i(vec![b], lens))]))
}

/// Replaces one value of one input (walking into arrays and objects, so
/// `kv_cache` scripts are reached too) with a defect: NaN, infinity, a
/// negative or too-large probability, or an out-of-range id or length.
fn inject_defect(g: &mut Gen, inputs: &mut Map<String, Value>) {
    let names: Vec<String> = inputs.keys().filter(|k| inputs[*k].is_array()).cloned().collect();
    if names.is_empty() {
        return;
    }
    let name = names[g.int(0, names.len() - 1)].clone();
    // Choose a random leaf by reading, then replace it by its path.
    let mut path = Vec::new();
    let mut cur = &inputs[&name];
    loop {
        match cur {
            Value::Array(items) if !items.is_empty() => {
                let j = g.int(0, items.len() - 1);
                path.push(Value::from(j));
                cur = &items[j];
            }
            Value::Object(map) if !map.is_empty() => {
                let (key, next) = map.iter().nth(g.int(0, map.len() - 1)).expect("index below len");
                path.push(Value::from(key.as_str()));
                cur = next;
            }
            _ => break,
        }
    }
    let defect = match cur {
        Value::Number(n) if n.is_i64() => json!([-7, 99, 1_000_000][g.int(0, 2)]),
        Value::Number(_) => [json!("nan"), json!(-0.25), json!(1.5), json!("inf")][g.int(0, 3)].clone(),
        _ => return, // strings (modes, policies) are left alone
    };
    let mut slot = inputs.get_mut(&name).expect("listed");
    for step in &path {
        slot = match step {
            Value::String(key) => slot.get_mut(key.as_str()).expect("walked"),
            index => slot.get_mut(index.as_u64().expect("index") as usize).expect("walked"),
        };
    }
    *slot = defect;
}

/// The ops with large-vocabulary cases: the draw itself, and the verify
/// whose correction and bonus are draws (REJECT-3, REJECT-4).
pub const LARGE_VOCAB_OPS: [Op; 2] = [Op::Draw, Op::RejectionVerify];

/// How many large-vocabulary cases each op of [`LARGE_VOCAB_OPS`] has: every
/// combination of vocabulary (32768, 151936), row shape (head-heavy, flat,
/// Zipf, zero tail) and draw method.
pub const LARGE_VOCAB_CASES: usize = 16;

/// The rules the large-vocabulary cases of `op` check (the case and its suite item name them).
pub fn large_vocab_rules(op: Op) -> Vec<String> {
    let rules: &[&str] = match op {
        Op::Draw => &["SAMPLE-1", "SAMPLE-2", "SAMPLE-3", "BACKEND-4"],
        _ => &["REJECT-3", "REJECT-4", "RESID-1", "SAMPLE-1", "SAMPLE-2", "BACKEND-4"],
    };
    rules.iter().map(|r| r.to_string()).collect()
}

/// The name of large-vocabulary case `index` of `op`.
pub fn large_vocab_name(op: Op, index: usize) -> String {
    format!("diff/{}-large-vocab/{index:03}", op.name())
}

/// Row shapes of real vocabularies: most mass on a few ids, near-uniform,
/// Zipf over shuffled ids, and a zero-mass tail (a top-k or top-p cut).
const LARGE_VOCAB_SHAPES: [&str; 4] = ["head-heavy", "flat", "zipf", "zero-tail"];

/// Large-vocabulary case `index` of `op` (one of [`LARGE_VOCAB_OPS`]): the
/// declared accumulation dtype is exercised where it matters (BACKEND-4).
/// Vocabulary, row shape and draw method follow from `index`; with inverse-CDF
/// noise the uniform of the decisive draw sits between the f64 and the f32
/// running sums at the id where the two differ most (see
/// [`between_f64_and_f32_sums`]), so a scan accumulated in f32 where f64 is
/// declared picks another id. Exponential-race cases are random.
pub fn large_vocab_case(op: Op, index: usize, seed: u64) -> Result<Case, CaseError> {
    let (mut g, vocab, shape, inverse) = large_vocab_setup(op, index, seed);
    let (params, inputs) = match op {
        Op::Draw => large_vocab_draw(&mut g, vocab, shape, inverse),
        Op::RejectionVerify => large_vocab_rejection(&mut g, vocab, shape, inverse),
        other => return Err(CaseError::new(large_vocab_name(other, index), "no large-vocabulary generator for this op")),
    };
    let case = Case {
        id: large_vocab_name(op, index),
        op: op.name().to_string(),
        description: format!("{shape} row, V = {vocab}, {}", if inverse { "inverse CDF" } else { "exponential race" }),
        rules: large_vocab_rules(op),
        source: format!("large-vocabulary generator, seed {seed}"),
        expected_by: ExpectedBy::Reference,
        params,
        inputs,
        expect: Map::new(),
    };
    bless(&case)
}

/// The generator, vocabulary, row shape and draw method of large-vocabulary
/// case `index` of `op`.
fn large_vocab_setup(op: Op, index: usize, seed: u64) -> (Gen, usize, &'static str, bool) {
    // The draw cases keep the stream their margins were checked with (tests/large_vocab.rs).
    let op_stream = if op == Op::Draw { 0 } else { (op as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) };
    let g = Gen(Pcg64::seed_from_u64(seed ^ 0x4C41_5247_4556_4F43 ^ op_stream ^ (index as u64) << 20));
    (g, [32768, 151936][index % 2], LARGE_VOCAB_SHAPES[(index / 2) % 4], (index / 8).is_multiple_of(2))
}

/// Two rows of one shape. Row 0's uniform is aimed between the f64 and f32
/// running sums, with a reference margin above the f64 cap (and, on head-heavy
/// rows at 151936, above the f32 cap: equal tail weights make f32 drift
/// systematic); row 1's uniform is random, or just under 1 for a zero tail (the
/// last positive id, never a zero-weight one).
fn large_vocab_draw(g: &mut Gen, vocab: usize, shape: &str, inverse: bool) -> (Map<String, Value>, Map<String, Value>) {
    let rows: Vec<Vec<f64>> = (0..2).map(|_| large_vocab_row(g, vocab, shape)).collect();
    let mut inputs = obj(vec![("weights", f(vec![2, vocab], rows.concat()))]);
    if inverse {
        let tail_end = if shape == "zero-tail" { 1.0 - 1e-12 } else { g.unit() };
        inputs.insert("draw_uniforms".into(), f(vec![2], vec![between_f64_and_f32_sums(&rows[0]).unwrap_or_else(|| g.unit()), tail_end]));
    } else {
        inputs.insert("draw_exponentials".into(), f(vec![2, vocab], (0..2 * vocab).map(|_| g.exponential()).collect()));
    }
    (Map::new(), inputs)
}

/// The rows of a large-vocabulary verify, `k = 2`, both drafts proposed:
/// sequence 0 rejects its first draft, so its correction is drawn from the
/// residual `max(0, p - q)` of row 0 (REJECT-3); sequence 1 accepts both
/// (`q == p`), so its bonus is drawn from `p[1, 2]` (REJECT-4).
pub struct LargeVocabVerifyRows {
    /// `p[0, j]` for every j: a row of the case's shape.
    pub target0: Vec<f64>,
    /// `q[0, j]` for every j: half of `p[0, .]` plus four spikes of 1/8, so
    /// the residual keeps the row's shape (halved) with the spikes cut out.
    pub draft0: Vec<f64>,
    /// Sequence 0's drafts: two spikes, the first where `p / q < 0.9`.
    pub drafts0: [usize; 2],
    /// `p[1, j]` and `q[1, j]` for every j.
    pub target1: Vec<f64>,
    /// Sequence 1's drafts: twice the top id of `target1`.
    pub top1: usize,
}

impl LargeVocabVerifyRows {
    /// The residual whose draw sequence 0's correction is (RESID-1, unnormalised).
    pub fn residual0(&self) -> Vec<f64> {
        self.target0.iter().zip(&self.draft0).map(|(p, q)| (p - q).max(0.0)).collect()
    }

    fn generate(g: &mut Gen, vocab: usize, shape: &str) -> Self {
        let normalised = |w: Vec<f64>| {
            let total: f64 = w.iter().sum();
            w.into_iter().map(|x| x / total).collect::<Vec<f64>>()
        };
        let target0 = normalised(large_vocab_row(g, vocab, shape));
        // Spikes only where p < 0.1: there p / q = p / (p / 2 + 1/8) < 0.9, so an
        // accept uniform of 0.999 rejects under either comparator.
        let mut spike = || loop {
            let id = g.int(0, vocab - 1);
            if target0[id] < 0.1 {
                break id;
            }
        };
        let spikes: Vec<usize> = (0..4).map(|_| spike()).collect();
        let mut draft0: Vec<f64> = target0.iter().map(|x| x / 2.0).collect();
        spikes.iter().for_each(|&s| draft0[s] += 0.125);
        let draft0 = normalised(draft0);
        let target1 = normalised(large_vocab_row(g, vocab, shape));
        let top1 = (0..vocab).max_by(|&a, &b| target1[a].total_cmp(&target1[b])).unwrap_or(0);
        LargeVocabVerifyRows { target0, draft0, drafts0: [spikes[0], spikes[1]], target1, top1 }
    }
}

fn large_vocab_rejection(g: &mut Gen, vocab: usize, shape: &str, inverse: bool) -> (Map<String, Value>, Map<String, Value>) {
    let rows = LargeVocabVerifyRows::generate(g, vocab, shape);
    let (k, b) = (2, 2);
    let p = [&rows.target0, &rows.target0, &rows.target0, &rows.target1, &rows.target1, &rows.target1].map(|r| r.as_slice()).concat();
    let q = [&rows.draft0, &rows.draft0, &rows.target1, &rows.target1].map(|r| r.as_slice()).concat();
    let drafts = [rows.drafts0[0], rows.drafts0[1], rows.top1, rows.top1].map(|t| t as i64).to_vec();
    let mut inputs = obj(vec![
        ("target_probs", f(vec![b, k + 1, vocab], p)),
        ("draft_probs", f(vec![b, k, vocab], q)),
        ("draft_tokens", i(vec![b, k], drafts)),
        ("proposal_lens", i(vec![b], vec![2, 2])),
        ("accept_uniforms", f(vec![b, k], vec![0.999, g.unit(), 0.5, 0.5])),
    ]);
    if inverse {
        let mut aimed = |w: &[f64]| between_f64_and_f32_sums(w).unwrap_or_else(|| g.unit());
        let (correction, bonus) = (aimed(&rows.residual0()), aimed(&rows.target1));
        inputs.insert("draw_uniforms".into(), f(vec![b, k + 1], vec![correction, 0.5, 0.5, 0.5, 0.5, bonus]));
    } else {
        inputs.insert("draw_exponentials".into(), f(vec![b, k + 1, vocab], (0..b * (k + 1) * vocab).map(|_| g.exponential()).collect()));
    }
    (obj(vec![("comparator", json!(if g.chance(0.5) { "Seed004LessEq" } else { "Strict" }))]), inputs)
}

/// The verify rows of large-vocabulary `rejection_verify` case `index` for
/// `seed`, drawn from the case's own stream (for tests that check where the
/// decisive draws sit).
pub fn large_vocab_verify_rows(index: usize, seed: u64) -> LargeVocabVerifyRows {
    let (mut g, vocab, shape, _) = large_vocab_setup(Op::RejectionVerify, index, seed);
    LargeVocabVerifyRows::generate(&mut g, vocab, shape)
}

fn large_vocab_row(g: &mut Gen, vocab: usize, shape: &str) -> Vec<f64> {
    let scale = [1.0, 0.3, 7.0][g.int(0, 2)];
    let mut w: Vec<f64> = match shape {
        "head-heavy" => {
            // A few ids hold most of the mass over a flat floor of equal tail
            // weights, as after a softmax with a logit floor: the f32 running sum
            // rounds every tail addition the same way, so its drift is systematic.
            let mut w = vec![0.25 / vocab as f64; vocab];
            for _ in 0..8 {
                let id = g.int(0, vocab - 1);
                w[id] = 0.05 + g.unit() * 0.2;
            }
            w
        }
        // Equal weights (0.1 is not a binary fraction, so sums round), with one random bump.
        "flat" => {
            let mut w = vec![0.1; vocab];
            w[g.int(0, vocab - 1)] = 0.1 + g.unit();
            w
        }
        "zipf" => {
            // Rank r gets 1 / (r + 1); ranks are a Fisher-Yates shuffle of the ids.
            let mut rank: Vec<usize> = (0..vocab).collect();
            for i in (1..vocab).rev() {
                rank.swap(i, g.int(0, i));
            }
            rank.iter().map(|&r| 1.0 / (r as f64 + 1.0)).collect()
        }
        _ => {
            let live = vocab / 3;
            (0..vocab).map(|i| if i < live { g.unit() } else { 0.0 }).collect()
        }
    };
    w.iter_mut().for_each(|x| *x *= scale);
    w
}

/// A uniform on which the f64 and the f32 running sums (f32 values, f32
/// additions) decide differently, as far from the f64 boundary as possible, or
/// `None` when they never differ. At boundary `C_i` (the end of id `i`) the
/// normalised sums are `r` and `r32`; a uniform `d` from `r` towards `r32`
/// picks the neighbouring id on the f64 side with margin `d` and the other one
/// on the f32 side, where `d` is at most half the gap and half that id's share.
fn between_f64_and_f32_sums(w: &[f64]) -> Option<f64> {
    let (total, total32) = (w.iter().sum::<f64>(), w.iter().fold(0.0f32, |s, &x| s + x as f32) as f64);
    let (mut c, mut c32, mut best) = (0.0f64, 0.0f32, (0.0f64, 0.0f64));
    for (i, &x) in w[..w.len() - 1].iter().enumerate() {
        c += x;
        c32 += x as f32;
        let (r, r32) = (c / total, c32 as f64 / total32);
        // The f64 side's id: i + 1 above the boundary, i below it.
        let share = if r32 > r { w[i + 1] } else { x } / total;
        let d = (r32 - r).abs().min(share) / 2.0;
        if d > best.0 {
            best = (d, if r32 > r { r + d } else { r - d });
        }
    }
    Some(best.1).filter(|&u| best.0 > 0.0 && (0.0..1.0).contains(&u))
}
