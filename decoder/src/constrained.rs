//! Structured outputs (CONSTRAIN-1, CONSTRAIN-2): a request's constraint
//! and the fast token mask; the window rule that applies it is `masks.rs`.
//!
//! The mask of a regular constraint's state is computed once by walking a
//! byte trie of the vocabulary from the state (each shared prefix walked
//! once, a dead branch cut at its first byte, a step back over a byte undone
//! by the constraint's [`Cursor`](specdec_constraint::Cursor)) and cached per
//! DFA state. A recursive grammar's mask is llguidance's (`guide.rs`: its
//! parser moved along the state's token path; on SmolLM2's vocabulary a JSON
//! grammar's mask in about 2 ms, where a walk of Earley sets took 60 to 300),
//! the same walk where llguidance cannot follow. Either equals the plain definition,
//! [`specdec_constraint::allowed`], token for token (`tests/constrained.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use specdec_constraint::{Constraint, ConstraintError, ConstraintSpec, State, Vocabulary};

use crate::guide::{Guide, GuideEnv};

/// A model's vocabulary as text bytes, with the byte trie the fast mask
/// walks; built once per model and shared by its requests.
pub struct TokenTable {
    vocab: Vocabulary,
    /// Node 0 is the root; a node's tokens are those whose bytes end there.
    nodes: Vec<TrieNode>,
    /// llguidance's view of the vocabulary, built at the first recursive
    /// grammar (`None` where llguidance refuses it).
    guide_env: OnceLock<Option<GuideEnv>>,
}

impl std::fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenTable {{ tokens: {}, trie nodes: {} }}", self.vocab.len(), self.nodes.len())
    }
}

#[derive(Debug, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    tokens: Vec<u32>,
}

impl TokenTable {
    pub fn new(vocab: Vocabulary) -> Self {
        let mut nodes = vec![TrieNode::default()];
        for id in 0..vocab.len() as u32 {
            let Some(bytes) = vocab.bytes(id) else { continue };
            let mut at = 0usize;
            for &b in bytes {
                at = match nodes[at].children.iter().find(|(c, _)| *c == b) {
                    Some(&(_, next)) => next as usize,
                    None => {
                        nodes.push(TrieNode::default());
                        let next = nodes.len() - 1;
                        nodes[at].children.push((b, next as u32));
                        next
                    }
                };
            }
            nodes[at].tokens.push(id);
        }
        TokenTable { vocab, nodes, guide_env: OnceLock::new() }
    }

    fn guide_env(&self) -> Option<&GuideEnv> {
        self.guide_env.get_or_init(|| GuideEnv::new(&self.vocab).ok()).as_ref()
    }

    /// The tiny models' text (`Aa`, `Bb`, .., [`specdec_models::tiny::tiny_text`])
    /// for a vocabulary of `vocab` ids.
    pub fn tiny(vocab: usize) -> Arc<Self> {
        let tokens = (0..vocab as u32).map(|i| Some(specdec_models::tiny::tiny_text(&[i]).into_bytes())).collect();
        Arc::new(TokenTable::new(Vocabulary::new(tokens).expect("every tiny token is two letters")))
    }

    /// `tok`'s tokens as text for a model of `vocab` ids (ids past the
    /// tokenizer's are not text); an error where the tokenizer has no byte
    /// reading or more tokens than the model.
    pub fn of_tokenizer(tok: &specdec_models::Tokenizer, vocab: usize) -> Result<Arc<Self>, String> {
        let mut bytes = tok.token_bytes().map_err(|e| e.to_string())?;
        if bytes.len() > vocab {
            return Err(format!("the tokenizer has {} tokens, the model {vocab}", bytes.len()));
        }
        bytes.resize(vocab, None);
        Ok(Arc::new(TokenTable::new(Vocabulary::new(bytes).map_err(|e| e.to_string())?)))
    }

    pub fn vocabulary(&self) -> &Vocabulary {
        &self.vocab
    }

    /// The text tokens the constraint allows from `state` (eos aside): a
    /// depth-first walk of the trie, the cursor one byte deep per level.
    fn walk(&self, c: &Constraint, state: State) -> Vec<bool> {
        let mut allowed = vec![false; self.vocab.len()];
        let mut cursor = c.cursor(state);
        // (node, its next child to try); the cursor has walked the bytes to
        // every node on the stack but the root.
        let mut stack = vec![(0usize, 0usize)];
        while let Some((node, next)) = stack.last_mut() {
            let Some(&(b, child)) = self.nodes[*node].children.get(*next) else {
                stack.pop();
                if !stack.is_empty() {
                    cursor.pop();
                }
                continue;
            };
            *next += 1;
            if cursor.push(b) {
                for &t in &self.nodes[child as usize].tokens {
                    allowed[t as usize] = true;
                }
                stack.push((child as usize, 0));
            }
        }
        allowed
    }
}

/// Masks one compiled constraint keeps at most (SmolLM2: 48 MB), emptied when full.
pub const MASKS_KEPT: usize = 1024;

/// A request's compiled constraint over a model's [`TokenTable`].
#[derive(Clone)]
pub struct Constrained(Arc<Inner>);

struct Inner {
    spec: ConstraintSpec,
    constraint: Constraint,
    table: Arc<TokenTable>,
    /// The text-token mask of each state met so far (of each chart's
    /// future, for a recursive grammar: every position inside one JSON
    /// string shares it).
    masks: Mutex<HashMap<MaskKey, Arc<[bool]>>>,
    /// A recursive grammar's llguidance parser (`None` for a DFA, or where
    /// llguidance refuses the grammar).
    guide: Option<Mutex<Guide>>,
    /// For the guide: each state [`Constrained::advance`] made, with the
    /// state and token it came from (its token path, read back to the start).
    parents: Mutex<HashMap<State, (State, u32)>>,
    /// Masks the guide gave ([`Constrained::guided_masks`]).
    guided: std::sync::atomic::AtomicUsize,
}

/// What a mask is kept by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum MaskKey {
    State(State),
    Chart(specdec_constraint::cfg::FutureKey),
}

impl Constrained {
    pub fn new(spec: ConstraintSpec, table: Arc<TokenTable>) -> Result<Self, ConstraintError> {
        let constraint = Constraint::new(&spec)?;
        let guide = constraint.lark().and_then(|lark| Guide::new(table.guide_env()?, lark).ok()).map(Mutex::new);
        Ok(Constrained(Arc::new(Inner { spec, constraint, table, masks: Mutex::new(HashMap::new()), guide, parents: Mutex::new(HashMap::new()), guided: Default::default() })))
    }

    /// How many masks llguidance has given so far (the rest came from the trie walk).
    pub fn guided_masks(&self) -> usize {
        self.0.guided.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The tokens that led [`Constrained::advance`] to `state` from the start,
    /// `None` for a state it did not make.
    fn path(&self, mut state: State) -> Option<Vec<u32>> {
        let start = self.0.constraint.start();
        let parents = self.0.parents.lock().unwrap_or_else(|e| e.into_inner());
        let mut path = Vec::new();
        while state != start {
            let &(parent, token) = parents.get(&state)?;
            path.push(token);
            state = parent;
        }
        path.reverse();
        Some(path)
    }

    /// llguidance's text tokens after `state`, where it has a parser that follows its path.
    fn guided(&self, state: State) -> Option<Vec<bool>> {
        let guide = self.0.guide.as_ref()?;
        let path = self.path(state)?;
        let mask = guide.lock().unwrap_or_else(|e| e.into_inner()).mask(&path)?;
        self.0.guided.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(mask)
    }

    pub fn spec(&self) -> &ConstraintSpec {
        &self.0.spec
    }

    pub fn constraint(&self) -> &Constraint {
        &self.0.constraint
    }

    pub fn table(&self) -> &TokenTable {
        &self.0.table
    }

    /// The tokens allowed after an output that left the constraint in
    /// `state`: the text tokens llguidance allows (a recursive grammar's state
    /// that [`Constrained::advance`] made) or the cached trie walk does, and
    /// `eos` where the state accepts (CONSTRAIN-2).
    pub fn allowed(&self, state: State, eos: &[u32]) -> Vec<bool> {
        let text: Arc<[bool]> = match self.guided(state) {
            Some(text) => text.into(),
            None => self.walked(state),
        };
        let mut allowed = text.to_vec();
        let accepts = self.0.constraint.accepts(state);
        for &e in eos {
            if let Some(slot) = allowed.get_mut(e as usize) {
                *slot = accepts;
            }
        }
        allowed
    }

    /// The text tokens after `state` by the trie walk, kept per state (per chart future).
    fn walked(&self, state: State) -> Arc<[bool]> {
        let key = self.0.constraint.future_key(state).map_or(MaskKey::State(state), MaskKey::Chart);
        {
            let mut cache = self.0.masks.lock().unwrap_or_else(|e| e.into_inner());
            // Bounded: a long-lived server keeps a constraint across requests,
            // and each mask is a vocabulary's worth of flags.
            if cache.len() >= MASKS_KEPT && !cache.contains_key(&key) {
                cache.clear();
            }
            cache.entry(key).or_insert_with(|| self.0.table.walk(&self.0.constraint, state).into()).clone()
        }
    }

    /// The state after `token` (CONSTRAIN-4), `None` where it is not allowed.
    pub fn advance(&self, state: State, token: u32, eos: &[u32]) -> Option<State> {
        let next = specdec_constraint::advance(&self.0.constraint, state, token, self.0.table.vocabulary(), eos)?;
        // A recursive grammar's every walk is a new state: remember its path for the guide.
        if self.0.guide.is_some() && next != state {
            self.0.parents.lock().unwrap_or_else(|e| e.into_inner()).insert(next, (state, token));
        }
        Some(next)
    }
}

/// Constraints compiled over one [`TokenTable`], kept by spec so that the
/// requests of an engine or a server that repeat a schema share its DFA and
/// its mask cache (a mask is a walk of the whole vocabulary per state:
/// recomputed per request, it would cost every repeat of a tool call again).
/// At most `capacity`, the least recently used dropped first.
pub struct ConstraintCache {
    table: Arc<TokenTable>,
    capacity: usize,
    compiled: Mutex<std::collections::VecDeque<Constrained>>,
}

impl ConstraintCache {
    pub fn new(table: Arc<TokenTable>, capacity: usize) -> Self {
        ConstraintCache { table, capacity: capacity.max(1), compiled: Mutex::new(std::collections::VecDeque::new()) }
    }

    pub fn table(&self) -> &Arc<TokenTable> {
        &self.table
    }

    /// `spec` compiled over the table: the kept one, or compiled now and kept.
    /// A recursive grammar's is compiled for each request and never kept:
    /// its states are the charts of the outputs it met, which would grow
    /// for the server's life.
    pub fn get(&self, spec: &ConstraintSpec) -> Result<Constrained, ConstraintError> {
        let lock = || self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut kept = lock();
            if let Some(at) = kept.iter().position(|c| c.spec() == spec) {
                let c = kept.remove(at).expect("found");
                kept.push_front(c.clone());
                return Ok(c);
            }
        }
        // Compiled outside the lock: a slow pattern holds no other request.
        let c = Constrained::new(spec.clone(), Arc::clone(&self.table))?;
        if c.constraint().is_context_free() {
            return Ok(c);
        }
        let mut kept = lock();
        kept.push_front(c.clone());
        kept.truncate(self.capacity);
        Ok(c)
    }
}

impl PartialEq for Constrained {
    fn eq(&self, other: &Self) -> bool {
        self.0.spec == other.0.spec && Arc::ptr_eq(&self.0.table, &other.0.table)
    }
}

impl std::fmt::Debug for Constrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constrained({:?})", self.0.spec)
    }
}
