//! The compute kernels, on validated inputs: pure libtorch tensor expressions that run
//! unchanged on any device. Floats arrive as f32; decisions (accept tests, cumulative
//! sums, race scores, normalisations) are taken in f64.

use specdec_backend::{Comparator, PAD};
use tch::{Kind, TchError, Tensor};

pub(crate) type TResult<T> = Result<T, TchError>;

/// Draw noise already on the device, validated (SAMPLE-1/2).
pub(crate) enum Noise<'a> {
    /// `[R]` uniforms (one per draw).
    Uniform(&'a Tensor),
    /// `[R, V]` exponentials (one per id per draw).
    Exponential(&'a Tensor),
}

/// `0..n` as i64 on the device of `like`.
pub(crate) fn arange(n: i64, like: &Tensor) -> TResult<Tensor> {
    Tensor::f_arange(n, (Kind::Int64, like.device()))
}

/// Size of the last axis.
fn last_dim(t: &Tensor) -> i64 {
    t.size().last().copied().unwrap_or(0)
}

/// `[B, n]` mask `j < lens[b]` (or `j <= lens[b]` when `inclusive`): the rows a sequence reads.
pub(crate) fn readable(lens: &Tensor, n: i64, inclusive: bool) -> TResult<Tensor> {
    let j = arange(n, lens)?.f_unsqueeze(0)?;
    let l = lens.f_unsqueeze(1)?;
    if inclusive { j.f_le_tensor(&l) } else { j.f_lt_tensor(&l) }
}

/// Last-axis argmax with ties to the lowest id (CONV-8), written so that it does not
/// depend on which maximum the device's argmax kernel happens to return. Rows must hold
/// a comparable maximum (no NaN): callers mask padding rows first.
pub(crate) fn argmax_lowest(x: &Tensor) -> TResult<Tensor> {
    let v = last_dim(x);
    let is_max = x.f_eq_tensor(&x.f_amax(-1, true)?)?;
    arange(v, x)?.f_where_scalarother(&is_max, v)?.f_amin(-1, false)
}

/// Length of the leading run of `true` along axis 1: `sum(cumprod(m))` (GREEDY-3, DFLASH-2).
pub(crate) fn leading_run(m: &Tensor) -> TResult<Tensor> {
    m.f_to_kind(Kind::Int64)?.f_cumprod(1, Kind::Int64)?.f_sum_dim_intlist(1, false, Kind::Int64)
}

/// GREEDY-4 / REJECT-5 output rows: drafts before `n`, `next` at `n`, PAD after.
/// `drafts [B, k]`, `n [B]`, `next [B]` give `[B, k+1]`.
pub(crate) fn assemble(drafts: &Tensor, n: &Tensor, next: &Tensor) -> TResult<Tensor> {
    let b = drafts.size()[0];
    let k = drafts.size()[1];
    let pad = Tensor::f_full([b, 1], PAD, (Kind::Int64, drafts.device()))?;
    let padded = Tensor::f_cat(&[drafts, &pad], 1)?;
    let j = arange(k + 1, drafts)?.f_unsqueeze(0)?;
    let n = n.f_unsqueeze(1)?;
    let tail = next.f_unsqueeze(1)?.f_expand([b, k + 1], false)?.f_where_scalarother(&j.f_eq_tensor(&n)?, PAD)?;
    padded.f_where_self(&j.f_lt_tensor(&n)?, &tail)
}

/// GREEDY-1 .. GREEDY-4: `scores [B, k+1, V]`, `drafts [B, k]`, `lens [B]` give
/// `(tokens [B, k+1], num_accepted [B])`.
pub(crate) fn greedy(scores: &Tensor, drafts: &Tensor, lens: &Tensor) -> TResult<(Tensor, Tensor)> {
    let k = drafts.size()[1];
    // CONV-7: rows past len may hold NaN; replace them before the row reductions.
    let rows = readable(lens, k + 1, true)?.f_unsqueeze(-1)?;
    let scores = scores.f_where_scalarother(&rows, 0.0)?;
    let top = argmax_lowest(&scores)?;
    let matched = drafts.f_eq_tensor(&top.f_narrow(1, 0, k)?)?.f_logical_and(&readable(lens, k, false)?)?;
    let n = leading_run(&matched)?;
    let next = top.f_gather(1, &n.f_unsqueeze(1)?, false)?.f_squeeze_dim(1)?;
    Ok((assemble(drafts, &n, &next)?, n))
}

/// DFLASH-2/3: `(accept_len [bs], bonus [bs])`.
pub(crate) fn dflash(candidates: &Tensor, predict: &Tensor) -> TResult<(Tensor, Tensor)> {
    let block = candidates.size()[1];
    let same = candidates.f_narrow(1, 1, block - 1)?.f_eq_tensor(&predict.f_narrow(1, 0, block - 1)?)?;
    let len = leading_run(&same)?;
    let bonus = predict.f_gather(1, &len.f_unsqueeze(1)?, false)?.f_squeeze_dim(1)?;
    Ok((len, bonus))
}

/// ACCEPT-1 .. ACCEPT-3 elementwise, in f64.
fn accept(cmp: Comparator, u: &Tensor, p: &Tensor, q: &Tensor) -> TResult<Tensor> {
    let (u, p, q) = (u.f_to_kind(Kind::Double)?, p.f_to_kind(Kind::Double)?, q.f_to_kind(Kind::Double)?);
    match cmp {
        Comparator::Strict => u.f_mul(&q)?.f_lt_tensor(&p),
        Comparator::Seed004LessEq => {
            // q = 0: p/0 would be +inf (accept) or NaN (reject): accept iff p > 0.
            let positive = q.f_gt(0.0)?;
            let ratio = p.f_div(&q.f_where_scalarother(&positive, 1.0)?)?.f_clamp_max(1.0)?;
            u.f_le_tensor(&ratio)?.f_where_self(&positive, &p.f_gt(0.0)?)
        }
    }
}

/// RESID-1 (and RESID-3): `max(0, p - q)` per row, or `p` where that has zero mass.
pub(crate) fn residual_weights(p: &Tensor, q: &Tensor) -> TResult<Tensor> {
    fallback_to_p(&p.f_sub(q)?.f_clamp_min(0.0)?, p)
}

/// RESID-2 (and RESID-3): `p` with the drafted id `x [R]` zeroed, or `p` if that has zero mass.
pub(crate) fn residual_weights_one_hot(p: &Tensor, x: &Tensor) -> TResult<Tensor> {
    let drafted = arange(last_dim(p), p)?.f_unsqueeze(0)?.f_eq_tensor(&x.f_unsqueeze(1)?)?;
    fallback_to_p(&p.f_where_scalarother(&drafted.f_logical_not()?, 0.0)?, p)
}

/// RESID-3: rows of `r` whose f64 mass is exactly 0 are replaced by `p`.
fn fallback_to_p(r: &Tensor, p: &Tensor) -> TResult<Tensor> {
    let mass = r.f_sum_dim_intlist(-1, true, Kind::Double)?;
    r.f_where_self(&mass.f_gt(0.0)?, p)
}

/// Rows scaled to sum 1, in f64.
fn normalise_f64(w: &Tensor) -> TResult<Tensor> {
    let w = w.f_to_kind(Kind::Double)?;
    w.f_div(&w.f_sum_dim_intlist(-1, true, Kind::Double)?)
}

/// Rows scaled to sum 1, normalised in f64 and stored as f32.
pub(crate) fn normalise(w: &Tensor) -> TResult<Tensor> {
    normalise_f64(w)?.f_to_kind(Kind::Float)
}

/// RESID-1 .. RESID-3 as distributions: `p [R, V]`, `q [R, V]` or the drafted ids `x [R]`.
pub(crate) fn residual(p: &Tensor, q: Option<&Tensor>, x: &Tensor) -> TResult<Tensor> {
    let w = match q {
        Some(q) => residual_weights(p, q)?,
        None => residual_weights_one_hot(p, x)?,
    };
    normalise(&w)
}

/// SAMPLE-1/2 row-wise on non-negative weights `[R, V]` with positive mass: `[R]` ids.
pub(crate) fn draw(w: &Tensor, noise: Noise<'_>) -> TResult<Tensor> {
    match noise {
        Noise::Uniform(v) => inverse_cdf(w, v),
        Noise::Exponential(e) => exponential_race(w, e),
    }
}

/// SAMPLE-1: the smallest `i` with `v S < C_i` (f64 running sums, `S` the last of them);
/// if rounding leaves none, the largest `i` with `w_i > 0`.
fn inverse_cdf(w: &Tensor, v: &Tensor) -> TResult<Tensor> {
    let n = last_dim(w);
    let ids = arange(n, w)?.f_unsqueeze(0)?;
    let c = w.f_cumsum(-1, Kind::Double)?;
    let target = v.f_to_kind(Kind::Double)?.f_unsqueeze(1)?.f_mul(&c.f_narrow(-1, n - 1, 1)?)?;
    let first = ids.f_where_scalarother(&target.f_lt_tensor(&c)?, n)?.f_amin(-1, false)?;
    let last_positive = ids.f_where_scalarother(&w.f_gt(0.0)?, -1)?.f_amax(-1, false)?;
    first.f_where_self(&first.f_lt(n)?, &last_positive)
}

/// SAMPLE-2: `argmax` over positive-weight ids of `w / e` (f64), ties to the lowest id.
fn exponential_race(w: &Tensor, e: &Tensor) -> TResult<Tensor> {
    let score = w.f_to_kind(Kind::Double)?.f_div(&e.f_to_kind(Kind::Double)?)?;
    // Positive weights give scores >= 0, so -1 keeps zero-weight ids out of the race.
    argmax_lowest(&score.f_where_scalarother(&w.f_gt(0.0)?, -1.0)?)
}

/// Validated inputs of one rejection-sampling verify (REJECT-1), all on one device.
pub(crate) struct Rejection<'a> {
    pub p: &'a Tensor,
    pub q: Option<&'a Tensor>,
    pub drafts: &'a Tensor,
    pub lens: &'a Tensor,
    pub u: &'a Tensor,
    /// `[B, k+1]` uniforms or `[B, k+1, V]` exponentials.
    pub noise: Noise<'a>,
}

/// REJECT-2 .. REJECT-5, vectorised over the batch: every accept test at once, the
/// accepted prefix by `cumprod`, then one draw per sequence from the row it stops at
/// (the residual of a rejection, or `p[len]` for the bonus).
pub(crate) fn rejection(r: &Rejection<'_>, cmp: Comparator) -> TResult<(Tensor, Tensor)> {
    let (b, k, v) = (r.p.size()[0], r.drafts.size()[1], last_dim(r.p));
    // CONV-7: unread rows (possibly NaN) become all-ones rows that no decision uses.
    let p = r.p.f_where_scalarother(&readable(r.lens, k + 1, true)?.f_unsqueeze(-1)?, 1.0)?;
    let slots = readable(r.lens, k, false)?;
    let q = r.q.map(|q| q.f_where_scalarother(&slots.f_unsqueeze(-1)?, 1.0)).transpose()?;
    let x = r.drafts.f_clamp_min(0)?.f_unsqueeze(-1)?; // PAD -> 0: masked by `slots`
    let p_x = p.f_narrow(1, 0, k)?.f_gather(2, &x, false)?.f_squeeze_dim(-1)?;
    let q_x = match &q {
        Some(q) => q.f_gather(2, &x, false)?.f_squeeze_dim(-1)?,
        None => p_x.f_ones_like()?, // RESID-2: q is one-hot at the draft
    };
    let n = leading_run(&accept(cmp, r.u, &p_x, &q_x)?.f_logical_and(&slots)?)?;

    // The row each sequence draws from: its first rejection, or row len for the bonus.
    let row = n.f_view([b, 1, 1])?.f_expand([b, 1, v], false)?;
    let p_n = p.f_gather(1, &row, false)?.f_squeeze_dim(1)?;
    let q_row = n.f_clamp_max(k - 1)?; // row k has no draft; unused when n == len == k
    let residual = match &q {
        Some(q) => {
            let idx = q_row.f_view([b, 1, 1])?.f_expand([b, 1, v], false)?;
            residual_weights(&p_n, &q.f_gather(1, &idx, false)?.f_squeeze_dim(1)?)?
        }
        None => {
            let x_n = r.drafts.f_clamp_min(0)?.f_gather(1, &q_row.f_unsqueeze(1)?, false)?.f_squeeze_dim(1)?;
            residual_weights_one_hot(&p_n, &x_n)?
        }
    };
    let rejected = n.f_lt_tensor(r.lens)?.f_unsqueeze(1)?;
    let w = residual.f_where_self(&rejected, &p_n)?;
    let next = match r.noise {
        Noise::Uniform(u) => draw(&w, Noise::Uniform(&u.f_gather(1, &n.f_unsqueeze(1)?, false)?.f_squeeze_dim(1)?))?,
        Noise::Exponential(e) => draw(&w, Noise::Exponential(&e.f_gather(1, &row, false)?.f_squeeze_dim(1)?))?,
    };
    Ok((assemble(r.drafts, &n, &next)?, n))
}

/// Per-row sampling parameters on the device (LOGITS-1), validated.
pub(crate) struct Params<'a> {
    /// `[R]` float.
    pub temperature: &'a Tensor,
    /// `[R]` i64.
    pub top_k: &'a Tensor,
    /// `[R]` float.
    pub top_p: &'a Tensor,
}

/// LOGITS-2 .. LOGITS-6 on `z [R, V]`, each row with its own parameters.
pub(crate) fn process_logits(z: &Tensor, params: &Params<'_>) -> TResult<Tensor> {
    let v = last_dim(z);
    let col = |t: &Tensor| t.f_unsqueeze(1);
    let ids = arange(v, z)?.f_unsqueeze(0)?;
    // LOGITS-2: T = 0 rows are one-hot at the lowest-id argmax.
    let greedy = ids.f_eq_tensor(&col(&argmax_lowest(z)?)?)?.f_to_kind(Kind::Float)?;

    // The two sorts cost nearly all the time: each runs only when some row
    // needs it (one host read); otherwise its mask keeps every id, the same result.
    let top_k_off = params.top_k.f_le(0)?.f_logical_or(&params.top_k.f_ge(v)?)?;
    let nucleus_rows = params.top_p.f_lt(1.0)?.f_logical_and(&params.temperature.f_gt(0.0)?)?;
    let needs = Tensor::f_stack(&[top_k_off.f_logical_not()?.f_any()?, nucleus_rows.f_any()?], 0)?;
    let needs: Vec<bool> = Vec::<bool>::try_from(&needs)?;
    let (need_k, need_p) = (needs[0], needs[1]);

    // LOGITS-4: keep logits >= the k-th largest (boundary ties survive); 0 or >= V disables.
    let keep = if need_k {
        let (sorted, _) = z.f_sort(-1, true)?;
        let kth = sorted.f_gather(1, &col(&params.top_k.f_clamp(1, v)?.f_sub_scalar(1)?)?, false)?;
        Some(z.f_ge_tensor(&kth)?.f_logical_or(&col(&top_k_off)?)?)
    } else {
        None // every id kept: no mask to build or apply
    };

    // LOGITS-3/6: exp((l - max) / T) cannot overflow; T = 0 rows divide by 1 and are replaced.
    let t = params.temperature;
    let t = col(&t.f_where_scalarother(&t.f_gt(0.0)?, 1.0)?)?;
    let e = z.f_sub(&z.f_amax(-1, true)?)?.f_div(&t)?.f_exp()?;
    let probs = match &keep {
        Some(keep) => normalise_f64(&e.f_where_scalarother(keep, 0.0)?)?,
        None => normalise_f64(&e)?,
    };

    let sampled = if need_p {
        // LOGITS-5: descending probability, ties by ascending id (stable sort); keep an id iff
        // the f64 mass strictly before it is below top_p.
        let (sp, order) = probs.f_sort_stable(true, -1, true)?;
        let before = exclusive_prefix(&sp)?;
        let top_p = col(&params.top_p.f_to_kind(Kind::Double)?)?;
        let keep_sorted = before.f_lt_tensor(&top_p)?;
        let keep_p = keep_sorted.f_zeros_like()?.f_scatter(1, &order, &keep_sorted)?;
        let keep_p = keep_p.f_logical_or(&top_p.f_ge(1.0)?)?;
        let keep = match &keep {
            Some(keep) => keep.f_logical_and(&keep_p)?,
            None => keep_p,
        };
        normalise(&e.f_where_scalarother(&keep, 0.0)?)?
    } else {
        // No row keeps fewer ids than top-k: `probs` is already that softmax (in f64).
        probs.f_to_kind(Kind::Float)?
    };
    greedy.f_where_self(&col(&params.temperature.f_eq(0.0)?)?, &sampled)
}

/// The f64 running sum strictly before each position, `[0, C_0, .., C_{V-2}]`: shifted
/// from the inclusive cumsum (not `C - x`, which rounds differently from the reference's
/// sequential accumulation).
fn exclusive_prefix(x: &Tensor) -> TResult<Tensor> {
    let v = last_dim(x);
    let c = x.f_cumsum(-1, Kind::Double)?;
    let zero = c.f_narrow(-1, 0, 1)?.f_zeros_like()?;
    Tensor::f_cat(&[zero, c.f_narrow(-1, 0, v - 1)?], -1)
}

/// N-gram proposer settings in device-ready form (NGRAM-1, validated).
pub(crate) struct Ngram {
    pub ngram_min: i64,
    pub ngram_max: i64,
    pub k: i64,
    pub most_recent: bool,
    pub max_model_len: Option<i64>,
}

/// NGRAM-2 .. NGRAM-5, NGRAM-7 on `contexts [B, L]`, `lens [B]`: `(drafts [B, k], proposal_lens [B])`.
/// Each n is one vectorised comparison of every window with every sequence's suffix; the
/// host loop runs over n-gram sizes only (at most `ngram_max - ngram_min + 1` iterations).
pub(crate) fn ngram(ctx: &Tensor, lens: &Tensor, cfg: &Ngram) -> TResult<(Tensor, Tensor)> {
    let (b, width) = (ctx.size()[0], ctx.size()[1]);
    let dev = (Kind::Int64, ctx.device());
    let mut start = Tensor::f_full([b], -1, dev)?;
    let mut found = Tensor::f_zeros([b], (Kind::Bool, ctx.device()))?;
    for n in (cfg.ngram_min..=cfg.ngram_max).rev() {
        if width < n + 1 {
            continue; // no context of this width holds a suffix plus an earlier window
        }
        let windows = ctx.f_unfold(1, n, 1)?; // [B, L-n+1, n]
        let key_at = lens.f_sub_scalar(n)?.f_clamp_min(0)?.f_unsqueeze(1)?.f_add(&arange(n, ctx)?.f_unsqueeze(0)?)?;
        let key = ctx.f_gather(1, &key_at.f_clamp_max(width - 1)?, false)?;
        let same = windows.f_eq_tensor(&key.f_unsqueeze(1)?)?.f_all_dim(-1, false)?;
        let i = arange(width - n + 1, ctx)?.f_unsqueeze(0)?;
        // Candidate starts exclude the suffix itself: i in [0, len - n).
        let hit = same.f_logical_and(&i.f_lt_tensor(&lens.f_sub_scalar(n)?.f_unsqueeze(1)?)?)?;
        let pos = if cfg.most_recent { i.f_where_scalarother(&hit, -1)?.f_amax(-1, false)? } else { i.f_where_scalarother(&hit, width)?.f_amin(-1, false)? };
        let take = hit.f_any_dim(-1, false)?.f_logical_and(&found.f_logical_not()?)?;
        start = pos.f_add_scalar(n)?.f_where_self(&take, &start)?;
        found = found.f_logical_or(&take)?;
    }
    // NGRAM-5: k' = min(k, max_model_len - len - 1), saturating at 0.
    let cap = match cfg.max_model_len {
        Some(m) => lens.f_neg()?.f_add_scalar(m - 1)?.f_clamp(0, cfg.k)?,
        None => lens.f_full_like(cfg.k)?,
    };
    let len = cap.f_minimum(&lens.f_sub(&start)?)?.f_where_scalarother(&found, 0)?;
    let j = arange(cfg.k, ctx)?.f_unsqueeze(0)?;
    let src = start.f_clamp_min(0)?.f_unsqueeze(1)?.f_add(&j)?.f_clamp_max(width - 1)?;
    let drafts = ctx.f_gather(1, &src, false)?.f_where_scalarother(&j.f_lt_tensor(&len.f_unsqueeze(1)?)?, PAD)?;
    Ok((drafts, len))
}

/// KV-8: `pages [P, S, H, D]`, `table [B, M]`, `lens [B]` give `[B, max_len, H, D]`,
/// zero past each length.
pub(crate) fn paged_gather(pages: &Tensor, table: &Tensor, lens: &Tensor, max_len: i64) -> TResult<Tensor> {
    let [p, s, h, d] = pages.size()[..] else {
        return Err(TchError::Shape("pages must be [P, S, H, D]".into()));
    };
    let (b, m) = (table.size()[0], table.size()[1]);
    let t = arange(max_len, pages)?.f_unsqueeze(0)?;
    let valid = t.f_lt_tensor(&lens.f_unsqueeze(1)?)?; // [B, max_len]
    let slot = t.f_floor_divide_scalar(s)?.f_clamp_max(m - 1)?.f_expand([b, max_len], false)?;
    // Unread slots may hold PAD: index page 0 there and zero the result.
    let block = table.f_gather(1, &slot, false)?.f_where_scalarother(&valid, 0)?;
    let flat = block.f_mul_scalar(s)?.f_add(&t.f_remainder(s)?)?;
    let rows = pages.f_reshape([p * s, h * d])?.f_index_select(0, &flat.f_reshape([b * max_len])?)?;
    rows.f_reshape([b, max_len, h, d])?.f_where_scalarother(&valid.f_view([b, max_len, 1, 1])?, 0.0)
}
