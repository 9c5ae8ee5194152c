//! `specdec stats`: the statistics campaign behind the word "lossless".
//!
//! One run executes the reference's lossless family (Holm at 1e-4) and the
//! negative controls, and writes `report.md`, `report.json` and one SVG per
//! check comparing observed with expected frequencies. `--sweep N` reruns
//! the lossless family over seeds 1..=N and reports the false-failure count
//! against the stated rate, per-test rejection rates at 0.01, and a
//! uniformity test of the p-values.

use std::fmt::Write as _;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;
use specdec_conformance::lossless::{Outcome, controls, lossless_checks, passed, run_controls, run_lossless_family};
use specdec_conformance::shard::{Shard, check_complete};
use specdec_conformance::stat::{BETA, DETECTABLE_DELTA, FAMILY_ALPHA};
use specdec_stats::{chi_squared_gof, clopper_pearson_interval};

fn bar(len: usize, prefix: &str) -> ProgressBar {
    let b = ProgressBar::new(len as u64).with_style(ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {wide_msg}").expect("valid template").progress_chars("=> "));
    b.set_prefix(prefix.to_string());
    b
}

fn outcome_json(o: &Outcome) -> serde_json::Value {
    json!({ "name": o.name, "rules": o.rules, "report": o.report, "tv_distance": o.tv_distance, "observed": o.observed, "expected": o.expected })
}

fn row(o: &Outcome) -> String {
    let r = &o.report;
    let opt = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.3e}"));
    format!(
        "| `{}` | {} | {} ({} pooled) | {} | {} | {} | {} | {} | {:.4} | {:?} |",
        o.name,
        r.n,
        r.cells,
        r.cells_pooled,
        opt(r.statistic),
        r.df.map_or("-".into(), |d| d.to_string()),
        if r.impossible_outcome { "0 (impossible outcome)".into() } else { opt(r.p_value) },
        opt(r.alpha),
        opt(r.power.map(|p| p.detectable_delta)),
        o.tv_distance,
        r.decision
    )
}

const HEADER: &str = "| check | n | cells | statistic | df | p-value | alpha | detectable TV | observed TV | decision |\n|---|---|---|---|---|---|---|---|---|---|";

/// Observed versus expected frequencies, cells ordered by expected mass.
fn plot(o: &Outcome, path: &Path) -> Result<(), String> {
    let n: u64 = o.observed.iter().sum();
    let mut cells: Vec<usize> = (0..o.expected.len()).filter(|&i| o.expected[i] > 0.0 || o.observed[i] > 0).collect();
    cells.sort_by(|&a, &b| o.expected[b].total_cmp(&o.expected[a]).then(a.cmp(&b)));
    cells.truncate(48);
    let top = cells.iter().map(|&i| o.expected[i].max(o.observed[i] as f64 / n as f64)).fold(0.0, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let title = format!("{}  (p = {})", o.name, o.report.p_value.map_or("-".into(), |p| format!("{p:.3e}")));
        let mut chart =
            ChartBuilder::on(&root).caption(title, ("sans-serif", 16)).margin(12).x_label_area_size(32).y_label_area_size(56).build_cartesian_2d(0f64..cells.len() as f64, 0f64..top.max(1e-9))?;
        chart.configure_mesh().x_desc("cell (by expected probability)").y_desc("frequency").x_label_formatter(&|x| format!("{}", *x as usize)).disable_x_mesh().draw()?;
        chart
            .draw_series(cells.iter().enumerate().map(|(x, &i)| Rectangle::new([(x as f64 + 0.1, 0.0), (x as f64 + 0.9, o.observed[i] as f64 / n as f64)], BLUE.mix(0.45).filled())))?
            .label("observed")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE.mix(0.45).filled()));
        chart
            .draw_series(cells.iter().enumerate().map(|(x, &i)| PathElement::new(vec![(x as f64 + 0.05, o.expected[i]), (x as f64 + 0.95, o.expected[i])], RED.stroke_width(2))))?
            .label("expected")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], RED.stroke_width(2)));
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("cannot plot {}: {e}", path.display()))
}

fn file_stem(name: &str) -> String {
    name.replace('/', "__")
}

/// One campaign run; `Ok(false)` if a lossless check failed or a control passed.
pub fn run(seed: u64, out: &Path) -> Result<bool, String> {
    let plots = out.join("plots");
    std::fs::create_dir_all(&plots).map_err(|e| format!("cannot create {}: {e}", plots.display()))?;
    let pb = bar(lossless_checks().len() + controls().len(), "stats");
    let mut tick = |name: &str| {
        pb.set_message(name.to_string());
        pb.inc(1);
    };
    let family = run_lossless_family(seed, &mut tick)?;
    let ctrls = run_controls(seed, &mut tick)?;
    pb.finish_and_clear();

    let lossless_ok = family.iter().all(|o| passed(&o.report));
    let controls_ok = ctrls.iter().all(|(_, o)| !passed(&o.report));
    let mut md = String::new();
    let _ = writeln!(md, "# specdec statistics campaign\n");
    let _ = writeln!(md, "- seed: {seed} (rerun: `specdec stats --seed {seed}`)");
    let _ = writeln!(md, "- family-wise false-failure rate: {FAMILY_ALPHA:e} (Holm); every check can detect a total variation of {DETECTABLE_DELTA} with probability {} before it samples", 1.0 - BETA);
    let _ = writeln!(md, "- lossless family: **{}**; negative controls: **{}**\n", if lossless_ok { "PASS" } else { "FAIL" }, if controls_ok { "all rejected" } else { "SOME NOT DETECTED" });
    let _ = writeln!(md, "## Lossless checks of the reference\n\n{HEADER}");
    for o in &family {
        let _ = writeln!(md, "{}", row(o));
        plot(o, &plots.join(format!("{}.svg", file_stem(&o.name))))?;
    }
    let _ = writeln!(md, "\n## Negative controls (each must be rejected)\n\n{HEADER}");
    for (_, o) in &ctrls {
        let _ = writeln!(md, "{}", row(o));
        plot(o, &plots.join(format!("{}.svg", file_stem(&o.name))))?;
    }
    let _ = writeln!(md, "\nPlots: `plots/<check>.svg` (observed bars, expected lines).");
    let report = json!({
        "seed": seed, "family_alpha": FAMILY_ALPHA, "detectable_delta": DETECTABLE_DELTA, "beta": BETA,
        "lossless_pass": lossless_ok, "controls_rejected": controls_ok,
        "lossless": family.iter().map(outcome_json).collect::<Vec<_>>(),
        "controls": ctrls.iter().map(|(_, o)| outcome_json(o)).collect::<Vec<_>>(),
    });
    write(&out.join("report.md"), &md)?;
    write(&out.join("report.json"), &serde_json::to_string_pretty(&report).expect("serializes"))?;
    for o in family.iter().chain(ctrls.iter().map(|(_, o)| o)) {
        println!("{}  TV={:.4}", o.report, o.tv_distance);
    }
    println!("\nreport: {}/report.md, {}/report.json, plots in {}", out.display(), out.display(), plots.display());
    Ok(lossless_ok && controls_ok)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// What a sweep's seeds showed, additive over shards: the merge of a sharded
/// sweep sums shards' tallies and only then judges them ([`sweep_summary`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepTally {
    /// Always `stats-sweep`: what the file is, for `specdec report merge`.
    pub kind: String,
    /// The campaign's seeds are `1..=seeds`.
    pub seeds: u64,
    /// The shard this tally holds; none for a whole sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    pub seeds_run: u64,
    pub checks_per_seed: usize,
    pub family_failures: u64,
    pub failed_seeds: Vec<u64>,
    pub rejections_at_0_01: u64,
    pub chi_squared_checks: u64,
    /// p-values of the continuous tests in 10 equal bins.
    pub p_value_bins: Vec<u64>,
}

/// The kind of a sweep's JSON.
pub const SWEEP_KIND: &str = "stats-sweep";

/// Runs the lossless family at seeds `1..=n` (those of `shard` only, if given:
/// every N-th seed from its index) and writes `sweep.json` and `sweep.md`.
pub fn sweep(n: u64, shard: Option<Shard>, out: &Path) -> Result<bool, String> {
    let seeds: Vec<u64> = (1..=n).filter(|s| shard.is_none_or(|sh| sh.owns_index(s - 1))).collect();
    let pb = bar(seeds.len(), "sweep");
    let mut t = SweepTally {
        kind: SWEEP_KIND.into(),
        seeds: n,
        shard,
        seeds_run: seeds.len() as u64,
        checks_per_seed: lossless_checks().len(),
        family_failures: 0,
        failed_seeds: Vec::new(),
        rejections_at_0_01: 0,
        chi_squared_checks: 0,
        p_value_bins: vec![0; 10],
    };
    for seed in seeds {
        pb.set_message(format!("seed {seed}"));
        let outcomes = run_lossless_family(seed, &mut |_| {})?;
        if outcomes.iter().any(|o| !passed(&o.report)) {
            t.family_failures += 1;
            t.failed_seeds.push(seed);
        }
        for o in &outcomes {
            // Certain-outcome checks have p = 1 always; they carry no calibration information.
            if let Some(p) = o.report.p_value.filter(|_| o.report.df.is_some()) {
                t.chi_squared_checks += 1;
                t.rejections_at_0_01 += u64::from(p <= 0.01);
                // p-values of continuous tests under the null are ~uniform.
                t.p_value_bins[((p * 10.0) as usize).min(9)] += 1;
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    write_sweep(&t, out)
}

/// Writes a tally: a shard's as it is (judged at the merge), a whole sweep's
/// with its summary.
pub fn write_sweep(t: &SweepTally, out: &Path) -> Result<bool, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let (md, json) = match t.shard {
        Some(shard) => (
            format!("# specdec statistics sweep, shard {shard}\n\n{} of seeds 1..={}: judged when the shards are merged (`specdec report merge`).\n", t.seeds_run, t.seeds),
            serde_json::to_value(t).expect("serializes"),
        ),
        None => sweep_summary(t)?,
    };
    write(&out.join("sweep.md"), &md)?;
    write(&out.join("sweep.json"), &serde_json::to_string_pretty(&json).expect("serializes"))?;
    print!("{md}");
    Ok(true)
}

/// A whole sweep's verdicts: the family false-failure rate with its exact
/// 95 % interval against the stated level, the individual rejection rate,
/// and the uniformity of the p-values.
pub fn sweep_summary(t: &SweepTally) -> Result<(String, serde_json::Value), String> {
    let n = t.seeds;
    let mut uniformity = chi_squared_gof(&t.p_value_bins, &[0.1; 10]).map_err(|e| e.to_string())?.to_report("p-value uniformity");
    uniformity.judge(0.01).map_err(|e| e.to_string())?;
    let ffr = clopper_pearson_interval(t.family_failures, n, 0.05).map_err(|e| e.to_string())?;
    let expected_failures = n as f64 * FAMILY_ALPHA;
    let tested = t.chi_squared_checks;
    let mut md = String::new();
    let _ = writeln!(md, "# specdec statistics sweep over seeds 1..={n}\n");
    let _ = writeln!(md, "- lossless family: {} checks per seed, Holm at {FAMILY_ALPHA:e}", t.checks_per_seed);
    let _ = writeln!(
        md,
        "- family failures: **{}** of {n} runs (expected {expected_failures:.3}; a family fails with probability at most {FAMILY_ALPHA:e}){}",
        t.family_failures,
        if t.failed_seeds.is_empty() { String::new() } else { format!("; seeds {:?}", t.failed_seeds) }
    );
    let _ = writeln!(md, "- family false-failure rate: 95 % interval [{:.2e}, {:.2e}] (Clopper-Pearson), against the stated {FAMILY_ALPHA:e}", ffr.lower, ffr.upper);
    let _ = writeln!(md, "- individual rejections at 0.01: {} of {tested} chi-squared checks ({:.4}; expected about 0.01)", t.rejections_at_0_01, t.rejections_at_0_01 as f64 / tested.max(1) as f64);
    let _ = writeln!(md, "- p-value histogram (10 bins): {:?}; uniformity at level 0.01: {uniformity}", t.p_value_bins);
    let json = json!({"seeds": n, "checks_per_seed": t.checks_per_seed, "family_failures": t.family_failures, "failed_seeds": t.failed_seeds,
        "expected_family_failures": expected_failures, "family_failure_rate_interval_95": [ffr.lower, ffr.upper],
        "rejections_at_0_01": t.rejections_at_0_01, "chi_squared_checks": tested, "p_value_bins": t.p_value_bins});
    Ok((md, json))
}

/// Sums the tallies of a sharded sweep: every shard `0..N` once, of one sweep.
pub fn merge_sweeps(shards: Vec<(String, SweepTally)>) -> Result<SweepTally, String> {
    let Some((first_from, first)) = shards.first().cloned() else { return Err("no sweep shards given".into()) };
    let count = first.shard.ok_or_else(|| format!("{first_from}: a whole sweep, not a shard"))?.count;
    let mut given = Vec::new();
    let mut total = SweepTally { shard: None, seeds_run: 0, family_failures: 0, failed_seeds: Vec::new(), rejections_at_0_01: 0, chi_squared_checks: 0, p_value_bins: vec![0; 10], ..first.clone() };
    for (from, t) in &shards {
        let shard = t.shard.ok_or_else(|| format!("{from}: a whole sweep, not a shard"))?;
        if shard.count != count || t.seeds != first.seeds || t.checks_per_seed != first.checks_per_seed || t.p_value_bins.len() != 10 {
            return Err(format!("{from} and {first_from}: shards of different sweeps (shard count, seeds or checks differ)"));
        }
        given.push((shard.index, from.clone()));
        let expected = (1..=t.seeds).filter(|s| shard.owns_index(s - 1)).count() as u64;
        if t.seeds_run != expected || t.failed_seeds.iter().any(|s| !shard.owns_index(s - 1)) {
            return Err(format!("{from}: shard {shard} ran {} seeds, not its {expected}", t.seeds_run));
        }
        total.seeds_run += t.seeds_run;
        total.family_failures += t.family_failures;
        total.failed_seeds.extend(&t.failed_seeds);
        total.rejections_at_0_01 += t.rejections_at_0_01;
        total.chi_squared_checks += t.chi_squared_checks;
        total.p_value_bins.iter_mut().zip(&t.p_value_bins).for_each(|(a, b)| *a += b);
    }
    check_complete("sweep shard", count, given)?;
    total.failed_seeds.sort_unstable();
    Ok(total)
}
