//! Sharded runs: a partition of a run's checks into `N` shards that needs no
//! coordination (each shard owns the checks whose name hashes to its index),
//! and the merge of the shards' reports back into the run's.
//!
//! Invariants: every check is owned by exactly one shard, whatever the
//! backend, filter or selection, so `N` processes started with `I/N` for
//! `I = 0..N` cover the run once. A shard samples its own statistical checks
//! but their verdicts are the merge's: the merge judges every Holm family
//! again over the members of all shards (STAT-2), never per shard, so the
//! merged report equals the unsharded run's (timings aside). A missing or
//! duplicated shard, shards of different runs, or a shard that ran a check it
//! does not own is an error naming it.

use std::collections::BTreeMap;

pub use crate::check::Shard;
use crate::check::{CheckResult, Selection, Status, settle};
use crate::report::{Report, Summary};
use crate::stat::{FAMILY_ALPHA, verdict_of};

/// Merges shard reports, each with where it was read from (for errors), into
/// one report per backend, in the order the backends first appear.
pub fn merge(shards: Vec<(String, Report)>) -> Result<Vec<Report>, String> {
    let mut by_backend: Vec<(String, Vec<(String, Report)>)> = Vec::new();
    for (from, report) in shards {
        match by_backend.iter_mut().find(|(b, _)| *b == report.backend) {
            Some((_, group)) => group.push((from, report)),
            None => by_backend.push((report.backend.clone(), vec![(from, report)])),
        }
    }
    by_backend.into_iter().map(|(backend, group)| merge_backend(&backend, group)).collect()
}

fn merge_backend(backend: &str, group: Vec<(String, Report)>) -> Result<Report, String> {
    let shard_of = |from: &str, r: &Report| r.shard.ok_or_else(|| format!("{from}: `{backend}` is a whole run, not a shard (no `shard`)"));
    let count = shard_of(&group[0].0, &group[0].1)?.count;
    let mut slots: BTreeMap<usize, (String, Report)> = BTreeMap::new();
    let mut given = Vec::new();
    for (from, report) in group {
        let shard = shard_of(&from, &report)?;
        if shard.count != count {
            return Err(format!("{from}: `{backend}` shard {shard} is of {} shards, another of {count}", shard.count));
        }
        given.push((shard.index, from.clone()));
        slots.insert(shard.index, (from, report));
    }
    check_complete(&format!("`{backend}` shard"), count, given)?;
    let (first_from, first) = &slots[&0];
    for (from, r) in slots.values() {
        let same = r.device == first.device && r.precision == first.precision && r.seed == first.seed && r.specdec_version == first.specdec_version && r.engine_version == first.engine_version;
        if !same {
            return Err(format!("{from} and {first_from}: shards of different runs of `{backend}` (device, precision, seed or version differ)"));
        }
        let names = |x: &Report| x.results.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        if names(r) != names(first) {
            return Err(format!("{from} and {first_from}: shards of `{backend}` list different checks"));
        }
    }
    let mut results = Vec::with_capacity(first.results.len());
    for (j, check) in first.results.iter().enumerate() {
        let owner = Shard::owner(&check.name, count);
        for (index, (from, r)) in &slots {
            if *index != owner.index && r.results[j].status != Status::Skipped {
                return Err(format!("{from}: shard {index}/{count} ran `{}`, which shard {owner} owns", check.name));
            }
        }
        results.push(slots[&owner.index].1.results[j].clone());
    }
    judge_families(&mut results);
    let base = &slots[&0].1;
    Ok(Report { shard: None, summary: Summary::of(&results), results, ..base.clone() })
}

/// Checks that the shards given, each an index with the file it came from,
/// are every shard `0..count` once; `what` names them in the error.
pub fn check_complete(what: &str, count: usize, given: Vec<(usize, String)>) -> Result<(), String> {
    let mut seen: BTreeMap<usize, String> = BTreeMap::new();
    for (index, from) in given {
        if index >= count {
            return Err(format!("{from}: {what} {index}/{count} is not a shard of {count}"));
        }
        if let Some(first) = seen.insert(index, from.clone()) {
            return Err(format!("{what} {index}/{count} appears twice: {first} and {from}"));
        }
    }
    match (0..count).find(|i| !seen.contains_key(i)) {
        Some(missing) => Err(format!("{what} {missing}/{count} is missing ({} of {count} given)", seen.len())),
        None => Ok(()),
    }
}

/// Judges every Holm family of `results` again over all its members, as the
/// unsharded run does at the end of each section.
fn judge_families(results: &mut [CheckResult]) {
    let mut families: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in results.iter().enumerate() {
        if let (Some(f), Some(_)) = (&r.family, &r.statistics) {
            families.entry(f.clone()).or_default().push(i);
        }
    }
    for members in families.into_values() {
        let mut reports: Vec<_> = members.iter().map(|&i| results[i].statistics.clone().expect("members have statistics")).collect();
        if specdec_stats::judge_holm(&mut reports, FAMILY_ALPHA).is_err() {
            continue; // empty: cannot happen, members were collected above
        }
        for (&i, report) in members.iter().zip(reports) {
            let r = &mut results[i];
            // A listed xfail shows as XFail or XPass in its shard; it stays listed.
            let selection = Selection { xfail: if matches!(r.status, Status::XFail | Status::XPass) { vec![r.name.clone()] } else { Vec::new() }, ..Selection::default() };
            let verdict = verdict_of(&report);
            r.statistics = Some(report);
            settle(r, verdict, &selection);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_or_say_why_and_partition_every_name_once() {
        assert_eq!("2/5".parse::<Shard>().unwrap(), Shard { index: 2, count: 5 });
        for bad in ["", "3", "5/5", "0/0", "-1/4", "a/4", "1/b", "1/4/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        for count in 1..7 {
            for name in ["kernel/a", "e2e/ngram/sampled/t1", "engine/exec/eos", ""] {
                let owners = (0..count).filter(|&index| Shard { index, count }.owns(name)).count();
                assert_eq!(owners, 1, "{name} in {count} shards");
            }
            let seeds = (0..100u64).filter(|&i| (0..count).filter(|&index| Shard { index, count }.owns_index(i)).count() == 1).count();
            assert_eq!(seeds, 100);
        }
    }
}
