//! The batched n-gram proposer (NGRAM-1 .. NGRAM-5, NGRAM-7) as whole-array
//! suffix matching: for each n (largest first) every candidate start of
//! every sequence is compared with the suffix at once.

use ndarray::{Array1, Array2, ArrayD, ArrayView1, ArrayView2, Axis, Zip, s};
use specdec_backend::{NgramConfig, PAD};
use specdec_reference::ngram::NgramPolicy;

use crate::check::{d2, lens_in, valid_id};
use crate::kernels::{arange, below, take_along_last, take_along_last2};

/// NGRAM-1/4/5/7 fast check: returns the context lengths when valid.
pub(crate) fn ngram_ok(contexts: &ArrayD<i64>, lens: &ArrayD<i64>, vocab: usize, cfg: &NgramConfig) -> Option<Array1<usize>> {
    cfg.validate().ok()?;
    let c = d2(contexts)?;
    let (batch, width) = c.dim();
    let lens = lens_in(lens, batch, 1, width).filter(|_| batch >= 1)?;
    let live = below(lens.view(), width);
    let ids_ok = Zip::from(&c).and(&live).all(|&t, &l| if l { valid_id(t, vocab) } else { t == PAD });
    let fits = cfg.max_model_len.is_none_or(|max| Zip::from(&lens).all(|&len| len <= max));
    (ids_ok && fits).then_some(lens)
}

/// `hit[b, i]`: start `i < len_b - n` whose n-gram equals the last `n` tokens.
fn suffix_matches(c: ArrayView2<'_, i64>, lens: ArrayView1<'_, usize>, n: usize) -> Array2<bool> {
    let (batch, width) = c.dim();
    let pos = arange(width);
    let grid = pos.broadcast((batch, width)).expect("a row broadcasts to any number of rows");
    let mut hit = Zip::from(grid).and_broadcast(lens.insert_axis(Axis(1))).map_collect(|&i, &len| i + n < len);
    // One whole-array compare per offset of the n-gram (n <= ngram_max).
    for t in 0..n {
        let key = take_along_last(c, lens.mapv(|len| (len + t).saturating_sub(n)).view());
        Zip::from(hit.slice_mut(s![.., ..width - t])).and(c.slice(s![.., t..])).and_broadcast(key.view().insert_axis(Axis(1))).for_each(|h, &x, &k| *h &= x == k);
    }
    hit
}

/// NGRAM-2: whether a row has a hit, and the start the policy picks.
fn pick(hit: ArrayView2<'_, bool>, policy: NgramPolicy) -> (Array1<bool>, Array1<usize>) {
    let width = hit.ncols();
    let pos = arange(width);
    let found = hit.fold_axis(Axis(1), false, |a, &h| *a || h);
    let positions = |miss: usize| Zip::from(&hit).and_broadcast(pos.view().insert_axis(Axis(0))).map_collect(move |&h, &i| if h { i } else { miss });
    let start = match policy {
        NgramPolicy::LargestNMostRecent => positions(0).fold_axis(Axis(1), 0, |a, &i| (*a).max(i)),
        NgramPolicy::LargestNEarliest => positions(width).fold_axis(Axis(1), width, |a, &i| (*a).min(i)),
    };
    (found, start)
}

/// NGRAM-2 .. NGRAM-5 on validated input: drafts `[B, k]` and lengths `[B]`.
pub(crate) fn propose(c: ArrayView2<'_, i64>, lens: ArrayView1<'_, usize>, cfg: &NgramConfig) -> (Array2<i64>, Array1<i64>) {
    let (batch, width) = c.dim();
    let mut found = Array1::from_elem(batch, false);
    let mut cont = Array1::<usize>::zeros(batch);
    // Control loop over n-gram sizes, largest first: the first n with a hit wins.
    for n in (cfg.ngram_min..=cfg.ngram_max).rev().filter(|&n| n < width) {
        let (hit, start) = pick(suffix_matches(c, lens, n).view(), cfg.policy);
        Zip::from(&mut found).and(&mut cont).and(&hit).and(&start).for_each(|f, cont, &h, &s| {
            if !*f && h {
                *f = true;
                *cont = s + n;
            }
        });
    }
    // NGRAM-5: leave room for the context, the drafts and the bonus token.
    let cap = lens.mapv(|len| cfg.max_model_len.map_or(cfg.k, |max| cfg.k.min(max.saturating_sub(len + 1))));
    let plen = Zip::from(&found).and(&cont).and(&lens).and(&cap).map_collect(|&f, &s, &len, &cap| if f { cap.min(len - s) } else { 0 });
    let pos = arange(cfg.k);
    let grid = pos.broadcast((batch, cfg.k)).expect("a row broadcasts to any number of rows");
    let idx = Zip::from(grid).and_broadcast(cont.view().insert_axis(Axis(1))).map_collect(|&j, &s| s + j);
    let tokens = take_along_last2(c, idx.view());
    let drafts = Zip::from(&tokens).and_broadcast(pos.view().insert_axis(Axis(0))).and_broadcast(plen.view().insert_axis(Axis(1))).map_collect(|&t, &j, &n| if j < n { t } else { PAD });
    (drafts, plen.mapv(|n| n as i64))
}
