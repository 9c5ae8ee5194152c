//! Structured-output constraints and the token mask they define
//! (CONSTRAIN-1 .. CONSTRAIN-4): the plain definition every fast mask is
//! checked against.
//!
//! A constraint is a language over the bytes of the output text. A regular
//! one (a regex, a JSON schema of the stated subset translated to one,
//! [`schema`], a GBNF grammar whose rules do not recurse) is compiled once
//! into a byte DFA (regex-automata's dense
//! DFA, anchored at the output's start, every match kept), and the states
//! from which a match is still reachable are found by a plain backward
//! search: those are *live*. A token is allowed in a state iff it has text
//! and walking its bytes one by one from the state ends in a live state; an
//! eos id is allowed iff the state accepts (the output so far is a match)
//! and is never walked (CONSTRAIN-2). That is the whole rule: no trie, no
//! cache, no cleverness, so that a fast mask (the decoder's) can be checked
//! against it token by token.
//!
//! A recursive GBNF grammar is context-free ([`cfg`]): its state is the
//! Earley chart of the output's bytes, live while its last set is not
//! empty, accepting with a finished `root` item; the same two questions,
//! answered by the plainest recognizer there is.
//!
//! Invariants: every input is validated (a pattern the DFA builder refuses,
//! a schema outside the subset, a language that matches nothing, a DFA past
//! its size limit: typed [`ConstraintError`]s, never a panic); a
//! [`State`] is only made by this crate, from a live DFA state.
//!
//! [`gbnf`] writes a regex as the grammar an engine that takes no regexes
//! (llama.cpp's server) is asked for instead, reads a GBNF grammar whose
//! rules do not recurse as the regex it is, and writes any grammar again
//! with an end token after it.

pub mod cfg;
pub mod gbnf;
pub mod schema;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use regex_automata::dfa::{Automaton, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The most memory a constraint's DFA may take (its build and its table):
/// a server compiles a client's pattern, so a hostile one must fail fast
/// (a tool-call schema takes a few hundred states).
pub const DFA_SIZE_LIMIT: usize = 8 << 20;

/// The most states a constraint may reach (the searches for its live
/// states and a fast mask cache are sized by it).
pub const MAX_STATES: usize = 1 << 16;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConstraintError {
    #[error("regex {}: {reason}", short(pattern))]
    Regex { pattern: String, reason: String },
    #[error("json schema at {path}: {reason}")]
    Schema { path: String, reason: String },
    #[error("grammar: {reason}")]
    Grammar { reason: String },
    #[error("regex {} matches no text at all", short(pattern))]
    MatchesNothing { pattern: String },
    #[error("regex {} has more than {MAX_STATES} states", short(pattern))]
    TooManyStates { pattern: String },
    #[error("vocabulary: {reason}")]
    Vocabulary { reason: String },
}

/// An error with its causes (regex-automata says "error building NFA" and
/// puts the exceeded limit in the cause).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// A pattern as an error quotes it: in full up to 200 characters (one
/// inlined from a grammar or a schema can be a megabyte).
fn short(pattern: &str) -> String {
    match pattern.char_indices().nth(200) {
        None => format!("{pattern:?}"),
        Some((at, _)) => format!("{:?} (and {} more bytes)", &pattern[..at], pattern.len() - at),
    }
}

/// What a request constrains its output to (CONSTRAIN-1), as a request
/// carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintSpec {
    /// The whole output text matches this regex (Rust `regex` syntax).
    Regex(String),
    /// The whole output text is a compact JSON value valid under this schema
    /// (the subset of [`schema`]).
    JsonSchema(serde_json::Value),
    /// The whole output text is in the language of this GBNF grammar (rule
    /// `root`), whose rules may recurse ([`gbnf`], [`cfg`]).
    Grammar(String),
}

impl ConstraintSpec {
    /// The family name checks and reports use: `regex` or `json_schema`.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::JsonSchema(_) => "json_schema",
            ConstraintSpec::Grammar(_) => "grammar",
        }
    }

    /// The constraint "the output is exactly one of `choices`" (vLLM's
    /// `choice`), as the regex of their alternation, each escaped.
    pub fn choice(choices: &[String]) -> Self {
        ConstraintSpec::Regex(choices.iter().map(|c| regex_syntax::escape(c)).collect::<Vec<_>>().join("|"))
    }

    /// The constraint of a GBNF grammar (rule `root` the whole output): the
    /// regex it is where no rule recurses ([`gbnf::to_regex`]), so that an
    /// engine taking regexes gets one; else the grammar, checked to compile.
    pub fn grammar(gbnf: &str) -> Result<Self, ConstraintError> {
        match gbnf::read(gbnf)? {
            gbnf::Read::Regular(regex) => Ok(ConstraintSpec::Regex(regex)),
            gbnf::Read::Recursive { .. } => Constraint::grammar(gbnf).map(|_| ConstraintSpec::Grammar(gbnf.to_string())),
        }
    }

    /// The regex this constraint is; a recursive grammar is none (a
    /// [`ConstraintError::Grammar`] saying why).
    pub fn pattern(&self) -> Result<String, ConstraintError> {
        match self {
            ConstraintSpec::Regex(r) => Ok(r.clone()),
            ConstraintSpec::JsonSchema(s) => schema::to_regex(s),
            ConstraintSpec::Grammar(g) => gbnf::to_regex(g),
        }
    }
}

/// A state of a constraint from which a match is still reachable: of its
/// DFA, or (context-free) the Earley chart of the output that led to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State(usize);

impl State {
    /// A number naming this state (stable for one compiled constraint).
    pub fn id(self) -> usize {
        self.0
    }
}

/// A compiled constraint: the whole output text is a match of a regex (a
/// byte DFA) or of a recursive grammar (Earley, [`cfg`]).
#[derive(Debug, Clone)]
pub struct Constraint {
    /// The regex, or the grammar's text.
    pattern: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Regular {
        dfa: Box<dense::DFA<Vec<u32>>>,
        start: StateID,
        live: HashSet<StateID>,
    },
    /// Each [`State`] names a chart met so far (the first, the empty output's);
    /// kept for the constraint's life, one set per byte past its parent.
    ContextFree {
        grammar: Arc<cfg::Grammar>,
        charts: Arc<Mutex<Vec<Arc<cfg::Chart>>>>,
    },
}

/// One step of a walk that can step back ([`Cursor`]).
enum Step {
    Dfa(StateID),
    Chart(Arc<cfg::Chart>),
}

/// A walk from one state a byte at a time that steps back as well (a fast
/// mask's walk of a vocabulary trie): nothing is kept once it is dropped.
pub struct Cursor<'a> {
    constraint: &'a Constraint,
    steps: Vec<Step>,
}

impl Cursor<'_> {
    /// Walks `byte`: `false` (and no step) where no match extends the text.
    pub fn push(&mut self, byte: u8) -> bool {
        let next = match (&self.constraint.kind, self.steps.last().expect("a cursor holds its first state")) {
            (Kind::Regular { dfa, live, .. }, Step::Dfa(s)) => Some(dfa.next_state(*s, byte)).filter(|t| live.contains(t)).map(Step::Dfa),
            (Kind::ContextFree { grammar, .. }, Step::Chart(c)) => grammar.step(c, byte).map(Step::Chart),
            _ => unreachable!("a cursor's steps are of its constraint's kind"),
        };
        next.map(|n| self.steps.push(n)).is_some()
    }

    /// Steps back over the last byte walked (never past the first state).
    pub fn pop(&mut self) {
        if self.steps.len() > 1 {
            self.steps.pop();
        }
    }
}

impl Constraint {
    pub fn new(spec: &ConstraintSpec) -> Result<Self, ConstraintError> {
        match spec {
            ConstraintSpec::Grammar(g) => Constraint::grammar(g),
            other => Constraint::regex(&other.pattern()?),
        }
    }

    /// The constraint "the whole output text matches `pattern`".
    pub fn regex(pattern: &str) -> Result<Self, ConstraintError> {
        let bad = |reason: String| ConstraintError::Regex { pattern: pattern.to_string(), reason };
        let config =
            dense::Config::new().match_kind(MatchKind::All).start_kind(regex_automata::dfa::StartKind::Anchored).dfa_size_limit(Some(DFA_SIZE_LIMIT)).determinize_size_limit(Some(DFA_SIZE_LIMIT));
        // The NFA the DFA is built from is bounded too: a counted repetition
        // is written out in full there, so `((a{256}){256}){256}` is small text.
        let nfa = regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(DFA_SIZE_LIMIT));
        let dfa = dense::Builder::new().configure(config).thompson(nfa).build(pattern).map_err(|e| bad(with_causes(&e)))?;
        let start = dfa.start_state(&start::Config::new().anchored(Anchored::Yes)).map_err(|e| bad(e.to_string()))?;
        let live = live_states(&dfa, start).ok_or_else(|| ConstraintError::TooManyStates { pattern: pattern.to_string() })?;
        if !live.contains(&start) {
            return Err(ConstraintError::MatchesNothing { pattern: pattern.to_string() });
        }
        Ok(Constraint { pattern: pattern.to_string(), kind: Kind::Regular { dfa: Box::new(dfa), start, live } })
    }

    /// The constraint "the whole output text is in the language of the GBNF
    /// `grammar`" (rule `root`): its regex's DFA where no rule recurses,
    /// else the context-free constraint of [`cfg`].
    pub fn grammar(grammar: &str) -> Result<Self, ConstraintError> {
        match gbnf::read(grammar)? {
            gbnf::Read::Regular(regex) => Constraint::regex(&regex),
            gbnf::Read::Recursive { rules, .. } => {
                let g = cfg::Grammar::new(&rules)?;
                if !g.matches_something() {
                    return Err(ConstraintError::Grammar { reason: "no text matches rule `root` (each of its alternatives recurses without end)".into() });
                }
                let charts = Arc::new(Mutex::new(vec![g.start()]));
                Ok(Constraint { pattern: grammar.to_string(), kind: Kind::ContextFree { grammar: Arc::new(g), charts } })
            }
        }
    }

    /// The regex, or a recursive grammar's text.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether this is a recursive grammar's constraint (its states are
    /// charts, one per output met, not a DFA's finite set).
    pub fn is_context_free(&self) -> bool {
        matches!(self.kind, Kind::ContextFree { .. })
    }

    /// A recursive grammar in llguidance's Lark dialect
    /// ([`cfg::Grammar::to_lark`]); `None` for a DFA's constraint.
    pub fn lark(&self) -> Option<String> {
        match &self.kind {
            Kind::Regular { .. } => None,
            Kind::ContextFree { grammar, .. } => Some(grammar.to_lark()),
        }
    }

    /// The state of the empty output.
    pub fn start(&self) -> State {
        match &self.kind {
            Kind::Regular { start, .. } => State(start.as_usize()),
            Kind::ContextFree { .. } => State(0),
        }
    }

    fn chart(&self, state: State) -> Arc<cfg::Chart> {
        match &self.kind {
            Kind::ContextFree { charts, .. } => Arc::clone(&charts.lock().unwrap_or_else(|e| e.into_inner())[state.0]),
            Kind::Regular { .. } => unreachable!("a chart of a context-free constraint only"),
        }
    }

    /// A walk from `state` that steps back ([`Cursor`]).
    pub fn cursor(&self, state: State) -> Cursor<'_> {
        let first = match &self.kind {
            Kind::Regular { .. } => Step::Dfa(StateID::new(state.0).expect("a state of this DFA")),
            Kind::ContextFree { .. } => Step::Chart(self.chart(state)),
        };
        Cursor { constraint: self, steps: vec![first] }
    }

    /// Whether walking `bytes` from `state` meets only live states
    /// (CONSTRAIN-2), without keeping the state it ends in.
    pub fn extends(&self, state: State, bytes: &[u8]) -> bool {
        let mut cursor = self.cursor(state);
        bytes.iter().all(|&b| cursor.push(b))
    }

    /// The state after `bytes` from `state`, or `None` once no match is
    /// reachable (CONSTRAIN-2: one byte at a time, nothing skipped).
    pub fn walk(&self, state: State, bytes: &[u8]) -> Option<State> {
        let mut cursor = self.cursor(state);
        if !bytes.iter().all(|&b| cursor.push(b)) {
            return None;
        }
        match (cursor.steps.pop().expect("a cursor holds its first state"), &self.kind) {
            (Step::Dfa(s), _) => Some(State(s.as_usize())),
            (Step::Chart(_), _) if bytes.is_empty() => Some(state),
            (Step::Chart(c), Kind::ContextFree { charts, .. }) => {
                let mut charts = charts.lock().unwrap_or_else(|e| e.into_inner());
                charts.push(c);
                Some(State(charts.len() - 1))
            }
            (Step::Chart(_), Kind::Regular { .. }) => unreachable!("a cursor's steps are of its constraint's kind"),
        }
    }

    /// What decides every walk from `state` on, for a mask cache: `None`
    /// for a DFA (the state itself does), else the chart's
    /// [`cfg::Grammar::future_key`].
    pub fn future_key(&self, state: State) -> Option<cfg::FutureKey> {
        match &self.kind {
            Kind::Regular { .. } => None,
            Kind::ContextFree { grammar, .. } => Some(grammar.future_key(&self.chart(state))),
        }
    }

    /// Whether the output that led to `state` is a match (eos may end it).
    pub fn accepts(&self, state: State) -> bool {
        match &self.kind {
            Kind::Regular { dfa, .. } => dfa.is_match_state(dfa.next_eoi_state(StateID::new(state.0).expect("a state of this DFA"))),
            Kind::ContextFree { grammar, .. } => grammar.accepts(&self.chart(state)),
        }
    }

    /// Whether the whole of `text` matches.
    pub fn matches(&self, text: &[u8]) -> bool {
        self.walk(self.start(), text).is_some_and(|s| self.accepts(s))
    }
}

/// The states reachable from `start` from which a match is reachable: a
/// forward search for the states, then a backward one from the accepting
/// states. `None` past [`MAX_STATES`].
fn live_states(dfa: &dense::DFA<Vec<u32>>, start: StateID) -> Option<HashSet<StateID>> {
    let mut seen = HashSet::from([start]);
    let mut queue = VecDeque::from([start]);
    let mut into: HashMap<StateID, Vec<StateID>> = HashMap::new();
    let mut accepting = Vec::new();
    // One byte per equivalence class: every byte of a class moves alike.
    let bytes: Vec<u8> = dfa.byte_classes().representatives(0..=255).filter_map(|u| u.as_u8()).collect();
    while let Some(s) = queue.pop_front() {
        if dfa.is_match_state(dfa.next_eoi_state(s)) {
            accepting.push(s);
        }
        for &b in &bytes {
            let t = dfa.next_state(s, b);
            if dfa.is_dead_state(t) {
                continue;
            }
            into.entry(t).or_default().push(s);
            if seen.insert(t) {
                if seen.len() > MAX_STATES {
                    return None;
                }
                queue.push_back(t);
            }
        }
    }
    let mut live: HashSet<StateID> = accepting.iter().copied().collect();
    let mut queue: VecDeque<StateID> = accepting.into();
    while let Some(t) = queue.pop_front() {
        for &s in into.get(&t).into_iter().flatten() {
            if live.insert(s) {
                queue.push_back(s);
            }
        }
    }
    Some(live)
}

/// Each token id's bytes as they appear in the output text; `None` for a
/// token that is not text (a special token), which a constraint never
/// allows but as an eos (CONSTRAIN-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    tokens: Vec<Option<Vec<u8>>>,
}

impl Vocabulary {
    pub fn new(tokens: Vec<Option<Vec<u8>>>) -> Result<Self, ConstraintError> {
        if tokens.is_empty() {
            return Err(ConstraintError::Vocabulary { reason: "it is empty".into() });
        }
        if let Some(i) = tokens.iter().position(|t| t.as_ref().is_some_and(Vec::is_empty)) {
            return Err(ConstraintError::Vocabulary { reason: format!("token {i} has text of no bytes (give `None` for a token that is not text)") });
        }
        Ok(Vocabulary { tokens })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The bytes of `id`, `None` for a token that is not text or an id out of range.
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        self.tokens.get(id as usize)?.as_deref()
    }

    /// The text of `ids` (tokens that are not text add nothing).
    pub fn text(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().filter_map(|&i| self.bytes(i)).flatten().copied().collect()
    }
}

/// CONSTRAIN-2: the tokens allowed after an output that left the constraint
/// in `state`: a text token whose bytes walk to a live state, and the eos
/// ids where the state accepts.
pub fn allowed(c: &Constraint, state: State, vocab: &Vocabulary, eos: &[u32]) -> Vec<bool> {
    let accepts = c.accepts(state);
    (0..vocab.len() as u32).map(|id| if eos.contains(&id) { accepts } else { vocab.bytes(id).is_some_and(|b| c.extends(state, b)) }).collect()
}

/// The state after `token` from `state` (CONSTRAIN-4): an eos leaves it
/// where it is (and ends the output) where the state accepts; `None` where
/// the token is not allowed.
pub fn advance(c: &Constraint, state: State, token: u32, vocab: &Vocabulary, eos: &[u32]) -> Option<State> {
    if eos.contains(&token) {
        return c.accepts(state).then_some(state);
    }
    c.walk(state, vocab.bytes(token)?)
}

/// The state after `tokens` from the start, `None` where one is not allowed.
pub fn state_after(c: &Constraint, tokens: &[u32], vocab: &Vocabulary, eos: &[u32]) -> Option<State> {
    tokens.iter().try_fold(c.start(), |s, &t| advance(c, s, t, vocab, eos))
}

/// Whether a finished output satisfies the constraint: every token allowed
/// in turn and the text a match (an eos, if any, last).
pub fn output_matches(c: &Constraint, tokens: &[u32], vocab: &Vocabulary, eos: &[u32]) -> bool {
    state_after(c, tokens, vocab, eos).is_some_and(|s| c.accepts(s))
}

/// CONSTRAIN-1: a row of scores with every token the constraint does not
/// allow set to `-inf`, the others untouched. `allowed` has the row's length.
pub fn mask_scores(scores: &[f64], allowed: &[bool]) -> Vec<f64> {
    scores.iter().zip(allowed).map(|(&s, &ok)| if ok { s } else { f64::NEG_INFINITY }).collect()
}
