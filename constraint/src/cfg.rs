//! A context-free constraint (CONSTRAIN-2, CONSTRAIN-5): a GBNF grammar
//! whose rules recurse (nested JSON, balanced brackets, a tool-call
//! language), which no DFA can hold, recognized by Earley's algorithm over
//! the bytes of the output.
//!
//! The grammar is first written as a plain byte-level BNF: a string is its
//! UTF-8 bytes in sequence, a character class (and `.`) one production per
//! UTF-8 byte-range sequence of its characters (regex-syntax's
//! `Utf8Sequences`), a group a fresh rule, `x{m,n}` m copies of `x` then a
//! chain of n - m optional ones, `x*` a left-recursive rule (`s -> s x |`,
//! so a long run costs Earley a constant number of items per byte). Rules that
//! derive no text at all are dropped with every production using them, so
//! that every symbol left derives some text; then Earley's algorithm has the
//! correct-prefix property the mask needs: the set after a prefix is empty
//! exactly when no match extends the prefix (the state is dead), and it
//! holds a finished `root` item from the start exactly when the prefix is a
//! match (the state accepts). Nullable rules are handled as Aycock and
//! Horspool do: predicting a nullable rule also steps over it.
//!
//! A chart is a chain of Earley sets shared between the states that extend
//! it (a walk adds one set per byte and copies nothing), so a state costs
//! one set per byte past its parent.

use std::collections::HashMap;
use std::sync::Arc;

use regex_syntax::hir::{ClassUnicode, ClassUnicodeRange};
use regex_syntax::utf8::Utf8Sequences;

use crate::ConstraintError;
use crate::gbnf::{Alternatives, Atom, Item as GbnfItem};

/// The most symbols a grammar's byte-level form may hold (its productions'
/// lengths summed): a server compiles its clients' grammars, so a hostile
/// one must fail fast; a JSON grammar takes a few thousand.
pub const MAX_GRAMMAR_SYMBOLS: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Symbol {
    Rule(u32),
    /// One byte in `lo ..= hi`.
    Bytes(u8, u8),
}

#[derive(Debug)]
struct Production {
    lhs: u32,
    rhs: Vec<Symbol>,
}

/// A grammar as byte-level BNF, every rule deriving some text.
#[derive(Debug)]
pub struct Grammar {
    productions: Vec<Production>,
    /// The productions of each rule.
    of_rule: Vec<Vec<u32>>,
    nullable: Vec<bool>,
    root: u32,
}

/// A chart's future ([`Grammar::future_key`]): (production, dot, the id of
/// the set at its origin, or `u64::MAX` for "here") of each item still
/// expecting a symbol, sorted.
pub type FutureKey = Vec<(u32, u32, u64)>;

/// Ids of charts, never reused: a set's id names it whatever output it is of.
static NEXT_CHART: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn chart_id() -> u64 {
    NEXT_CHART.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// An Earley item: production, dot, origin (the position it was predicted at).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Item {
    production: u32,
    dot: u32,
    origin: u32,
}

/// One Earley set after `position` bytes, and the chart before it.
pub struct Chart {
    items: Vec<Item>,
    position: u32,
    parent: Option<Arc<Chart>>,
    /// This set's id (never another's, [`chart_id`]).
    id: u64,
    /// An ancestor (skew-binary jump pointers, Myers' level ancestors): an
    /// origin far back is found in O(log n) steps, not one per byte, and
    /// each new chart's pointer costs O(1). `None` at position 0.
    jump: Option<Arc<Chart>>,
}

/// Dropped along the chain in a loop: the default drop recurses once per
/// byte of the output, which a long one would overflow the stack with.
impl Drop for Chart {
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(chart) = next {
            next = match Arc::try_unwrap(chart) {
                Ok(mut owned) => owned.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// Not the chain: a long output's chart would print (and recurse) for every byte.
impl std::fmt::Debug for Chart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Chart {{ position: {}, items: {} }}", self.position, self.items.len())
    }
}

impl Grammar {
    /// The byte-level form of a GBNF grammar's rules (rule `root` the whole
    /// output), as [`crate::gbnf`] parses them.
    pub(crate) fn new(rules: &[(String, Alternatives)]) -> Result<Grammar, ConstraintError> {
        let bad = |reason: String| ConstraintError::Grammar { reason };
        crate::gbnf::all_defined(rules).map_err(bad)?;
        let mut b = Builder { names: HashMap::new(), productions: Vec::new(), rules: 0, symbols: 0 };
        for (name, _) in rules {
            b.named(name);
        }
        for (name, alts) in rules {
            let lhs = b.names[name.as_str()];
            b.alternatives(lhs, alts).map_err(bad)?;
        }
        let root = *b.names.get("root").ok_or_else(|| bad("no rule `root`".into()))?;
        Ok(Grammar::reduced(b.productions, b.rules as usize, root))
    }

    /// The grammar without the rules that derive no text (and every
    /// production using one), with its nullable rules found.
    fn reduced(all: Vec<Production>, rules: usize, root: u32) -> Grammar {
        let derives = |s: &Symbol, set: &[bool]| match s {
            Symbol::Rule(r) => set[*r as usize],
            Symbol::Bytes(..) => true,
        };
        let mut productive = vec![false; rules];
        let mut changed = true;
        while changed {
            changed = false;
            for p in &all {
                if !productive[p.lhs as usize] && p.rhs.iter().all(|s| derives(s, &productive)) {
                    productive[p.lhs as usize] = true;
                    changed = true;
                }
            }
        }
        let productions: Vec<Production> = all.into_iter().filter(|p| productive[p.lhs as usize] && p.rhs.iter().all(|s| derives(s, &productive))).collect();
        let mut nullable = vec![false; rules];
        changed = true;
        while changed {
            changed = false;
            for p in &productions {
                if !nullable[p.lhs as usize] && p.rhs.iter().all(|s| matches!(s, Symbol::Rule(r) if nullable[*r as usize])) {
                    nullable[p.lhs as usize] = true;
                    changed = true;
                }
            }
        }
        let mut of_rule = vec![Vec::new(); rules];
        for (i, p) in productions.iter().enumerate() {
            of_rule[p.lhs as usize].push(i as u32);
        }
        Grammar { productions, of_rule, nullable, root }
    }

    /// The grammar in llguidance's Lark dialect, the same language byte for
    /// byte: each rule a lowercase rule `rN` of its productions (an empty
    /// one `""`), each byte range a one-byte terminal. Every terminal being
    /// one byte, the terminals are prefix-free, so llguidance's greedy lexer
    /// has one split of any text and its parse is this grammar's; a byte of
    /// a multi-byte character is a terminal of its own, so the grammar
    /// allows invalid UTF-8 (none derives it: classes are written as their
    /// UTF-8 sequences); and no bytes are forced, so every tokenization of a
    /// text is allowed, as CONSTRAIN-2 allows it. Rules that derive no text
    /// are gone already, which llguidance, pruning nothing, needs for its
    /// masks to be exact.
    pub fn to_lark(&self) -> String {
        let mut out = format!("%llguidance {{\"allow_invalid_utf8\": true, \"no_forcing\": true}}\nstart: r{}\n", self.root);
        for (rule, productions) in self.of_rule.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
            let alternatives: Vec<String> = productions
                .iter()
                .map(|&p| {
                    let rhs = &self.productions[p as usize].rhs;
                    if rhs.is_empty() {
                        return "\"\"".to_string();
                    }
                    let symbols: Vec<String> = rhs
                        .iter()
                        .map(|s| match *s {
                            Symbol::Rule(r) => format!("r{r}"),
                            Symbol::Bytes(lo, hi) if lo == hi => format!("/\\x{lo:02x}/"),
                            Symbol::Bytes(lo, hi) => format!("/[\\x{lo:02x}-\\x{hi:02x}]/"),
                        })
                        .collect();
                    symbols.join(" ")
                })
                .collect();
            out.push_str(&format!("r{rule}: {}\n", alternatives.join(" | ")));
        }
        out
    }

    /// Whether any text matches (`root` derives some text).
    pub fn matches_something(&self) -> bool {
        !self.of_rule[self.root as usize].is_empty()
    }

    /// The chart of the empty output.
    pub fn start(&self) -> Arc<Chart> {
        let seeds: Vec<Item> = self.of_rule[self.root as usize].iter().map(|&p| Item { production: p, dot: 0, origin: 0 }).collect();
        let empty = Chart { items: Vec::new(), position: 0, parent: None, id: u64::MAX, jump: None };
        Arc::new(Chart { items: self.closure(seeds, &empty, 0), position: 0, parent: None, id: chart_id(), jump: None })
    }

    /// The chart after `byte` from `chart`, `None` where no match extends it.
    pub fn step(&self, chart: &Arc<Chart>, byte: u8) -> Option<Arc<Chart>> {
        let scanned: Vec<Item> = chart.items.iter().filter(|it| matches!(self.next(it), Some(Symbol::Bytes(lo, hi)) if (lo..=hi).contains(&byte))).map(|it| Item { dot: it.dot + 1, ..*it }).collect();
        if scanned.is_empty() {
            return None;
        }
        let position = chart.position + 1;
        let items = self.closure(scanned, chart, position);
        let jump = Some(Chart::next_jump(chart));
        Some(Arc::new(Chart { items, position, parent: Some(Arc::clone(chart)), id: chart_id(), jump }))
    }

    /// Whether the output that led to `chart` is a match.
    pub fn accepts(&self, chart: &Chart) -> bool {
        chart.items.iter().any(|it| it.origin == 0 && self.productions[it.production as usize].lhs == self.root && self.next(it).is_none())
    }

    /// What decides every walk from `chart` on: its last set's items that
    /// still expect a symbol, each with the set its origin names (by id:
    /// the same set of the same output, never one of another output that
    /// reached the same position) or "here". A walk scans those, completes
    /// against the sets their origins name (or this one), and predicts from
    /// the grammar alone; so two charts with one key allow the same byte
    /// strings, and a mask computed for one is the other's (inside a JSON
    /// string, every position after the first). Items completed here have
    /// done their work already.
    pub fn future_key(&self, chart: &Chart) -> FutureKey {
        let mut key: FutureKey =
            chart.items.iter().filter(|it| self.next(it).is_some()).map(|it| (it.production, it.dot, if it.origin == chart.position { u64::MAX } else { chart.chart_at(it.origin).id })).collect();
        key.sort_unstable();
        key
    }

    fn next(&self, it: &Item) -> Option<Symbol> {
        self.productions[it.production as usize].rhs.get(it.dot as usize).copied()
    }

    /// The Earley set at `position` from its first items: every completion
    /// (against the sets before it, `before` the last of them) and
    /// prediction they lead to. A set holds tens of items, so a list
    /// searched in order keeps them (hashing each cost more than the walk).
    fn closure(&self, seeds: Vec<Item>, before: &Chart, position: u32) -> Vec<Item> {
        let mut items: Vec<Item> = Vec::with_capacity(seeds.len() * 4);
        let mut agenda = Vec::with_capacity(seeds.len() * 4);
        for it in seeds {
            if !items.contains(&it) {
                items.push(it);
                agenda.push(it);
            }
        }
        while let Some(it) = agenda.pop() {
            let mut add = |new: Item| {
                if !items.contains(&new) {
                    items.push(new);
                    agenda.push(new);
                }
            };
            match self.next(&it) {
                // Completed: step every item of its origin's set waiting for its rule. An
                // item completed where it was predicted (origin == position) derived
                // nothing, and the prediction of a nullable rule stepped over it already.
                None if it.origin < position => {
                    let lhs = self.productions[it.production as usize].lhs;
                    for waiting in before.set_at(it.origin) {
                        if self.next(waiting) == Some(Symbol::Rule(lhs)) {
                            add(Item { dot: waiting.dot + 1, ..*waiting });
                        }
                    }
                }
                None | Some(Symbol::Bytes(..)) => {}
                Some(Symbol::Rule(r)) => {
                    for &p in &self.of_rule[r as usize] {
                        add(Item { production: p, dot: 0, origin: position });
                    }
                    if self.nullable[r as usize] {
                        add(Item { dot: it.dot + 1, ..it });
                    }
                }
            }
        }
        items
    }
}

impl Chart {
    /// The set at `position` (at most this one's).
    fn set_at(&self, position: u32) -> &[Item] {
        &self.chart_at(position).items
    }

    /// The chart at `position` (at most this one's).
    fn chart_at(&self, position: u32) -> &Chart {
        let mut at = self;
        while at.position > position {
            at = at.back(position);
        }
        at
    }

    /// One step back toward `position` (below this one's): the jump where it
    /// does not pass it, else the parent.
    fn back(&self, position: u32) -> &Chart {
        match &self.jump {
            Some(j) if j.position >= position => j,
            _ => self.parent.as_deref().expect("a chart holds every set before it"),
        }
    }

    /// The jump of a new chart whose parent is `parent`: the parent's
    /// jump's jump where the two jumps span as much, else the parent.
    fn next_jump(parent: &Arc<Chart>) -> Arc<Chart> {
        let jump_of = |c: &Arc<Chart>| c.jump.clone().unwrap_or_else(|| Arc::clone(c));
        let b = jump_of(parent);
        let c = jump_of(&b);
        if parent.position - b.position == b.position - c.position { c } else { Arc::clone(parent) }
    }
}

/// Writes GBNF rules as byte-level productions.
struct Builder<'a> {
    names: HashMap<&'a str, u32>,
    productions: Vec<Production>,
    rules: u32,
    symbols: usize,
}

impl<'a> Builder<'a> {
    fn named(&mut self, name: &'a str) -> u32 {
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        let id = self.fresh();
        self.names.insert(name, id);
        id
    }

    fn fresh(&mut self) -> u32 {
        self.rules += 1;
        self.rules - 1
    }

    fn push(&mut self, lhs: u32, rhs: Vec<Symbol>) -> Result<(), String> {
        self.symbols += rhs.len() + 1;
        if self.symbols > MAX_GRAMMAR_SYMBOLS {
            return Err(format!("the grammar takes more than {MAX_GRAMMAR_SYMBOLS} symbols as bytes (repetitions of large rules)"));
        }
        self.productions.push(Production { lhs, rhs });
        Ok(())
    }

    fn alternatives(&mut self, lhs: u32, alts: &'a Alternatives) -> Result<(), String> {
        for seq in alts {
            let mut rhs = Vec::new();
            for item in seq {
                self.item(item, &mut rhs)?;
            }
            self.push(lhs, rhs)?;
        }
        Ok(())
    }

    /// Appends `item` (an atom and its repetition) to a production's symbols.
    fn item(&mut self, item: &'a GbnfItem, rhs: &mut Vec<Symbol>) -> Result<(), String> {
        let (lo, hi) = item.repeat;
        if (lo, hi) == (1, Some(1)) {
            return self.atom(&item.atom, rhs);
        }
        // The atom as one symbol, repeated.
        let mut one = Vec::new();
        self.atom(&item.atom, &mut one)?;
        let x = match one.as_slice() {
            [s] => *s,
            _ => {
                let r = self.fresh();
                self.push(r, one)?;
                Symbol::Rule(r)
            }
        };
        rhs.extend(std::iter::repeat_n(x, lo as usize));
        match hi {
            None => {
                // Left-recursive: Earley keeps one item per set for a left
                // recursion, where a right one adds one per repetition.
                let star = self.fresh();
                self.push(star, vec![])?;
                self.push(star, vec![Symbol::Rule(star), x])?;
                rhs.push(Symbol::Rule(star));
            }
            Some(hi) if hi > lo => {
                // opt_1 -> "" | x; opt_k -> "" | x opt_(k-1).
                let mut tail: Option<u32> = None;
                for _ in lo..hi {
                    let opt = self.fresh();
                    self.push(opt, vec![])?;
                    self.push(opt, std::iter::once(x).chain(tail.map(Symbol::Rule)).collect())?;
                    tail = Some(opt);
                }
                rhs.extend(tail.map(Symbol::Rule));
            }
            Some(_) => {}
        }
        Ok(())
    }

    fn atom(&mut self, atom: &'a Atom, rhs: &mut Vec<Symbol>) -> Result<(), String> {
        match atom {
            Atom::Text(t) => rhs.extend(t.bytes().map(|b| Symbol::Bytes(b, b))),
            Atom::Rule(name) => rhs.push(Symbol::Rule(self.named(name))),
            Atom::Group(alts) => {
                let r = self.fresh();
                self.alternatives(r, alts)?;
                rhs.push(Symbol::Rule(r));
            }
            Atom::Class(ranges, negated) => {
                let mut class = ClassUnicode::new(ranges.iter().map(|&(lo, hi)| ClassUnicodeRange::new(lo, hi)));
                if *negated {
                    class.negate();
                }
                rhs.push(self.class(&class)?);
            }
            Atom::Any => rhs.push(self.class(&ClassUnicode::new([ClassUnicodeRange::new('\0', char::MAX)]))?),
        }
        Ok(())
    }

    /// A rule of the characters of `class` as UTF-8: one production per
    /// sequence of byte ranges.
    fn class(&mut self, class: &ClassUnicode) -> Result<Symbol, String> {
        let r = self.fresh();
        for range in class.ranges() {
            for seq in Utf8Sequences::new(range.start(), range.end()) {
                self.push(r, seq.as_slice().iter().map(|b| Symbol::Bytes(b.start, b.end)).collect())?;
            }
        }
        Ok(Symbol::Rule(r))
    }
}
