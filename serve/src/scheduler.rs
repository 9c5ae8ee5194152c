//! The engine thread: one decoder [`Session`] for the server's lifetime,
//! with continuous batching.
//!
//! Between two steps it takes the requests that arrived, drops those whose
//! client has gone (a closed event channel: a disconnect frees the slot at
//! the next step boundary), admits waiting requests into free slots, feeds
//! at most one prefill chunk of their prompts (chunked prefill: a long
//! prompt is fed over several iterations, so it cannot hold up the
//! requests already generating; `--prefill-chunk 0` feeds each prompt
//! whole at admission), then runs one step of the generating batch and
//! sends each request its new tokens. A request's noise is its own
//! seed's, and its rows its own cache slot's, so its output is the same
//! alone and under load (DECODE-3).
//!
//! The backend lives on this thread only (a backend need not be `Send`);
//! the HTTP side talks to it through channels.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use specdec_backend::model::{LlamaWeights, ModelBackend};
use specdec_decoder::{Acceptance, DecodeError, Detokenize, Engine, EngineConfig, FinishReason, ProposerChoice, Request, Session, TokenLogprob};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;
use crate::text::Codec;

/// A request for the engine thread, with where its events go.
pub struct Job {
    pub request: Request,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
}

/// What the engine tells a request's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request's next tokens, in order, with their logprob entries
    /// where it asked for them.
    Tokens(Vec<u32>, Vec<TokenLogprob>),
    /// It finished; its draft counts.
    Done { finish: FinishReason, acceptance: Acceptance },
    /// It could not run (a typed reason), or was cancelled by a shutdown.
    Failed { status: u16, message: String },
}

/// Messages to the engine thread.
pub enum Msg {
    Job(Box<Job>),
    /// Fail every running and waiting request (a shutdown's drain ran out).
    CancelAll(String),
}

/// What the engine thread says of itself once the model is loaded.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The smallest top-2 logit margin the backend's greedy argmax is exact above.
    pub greedy_epsilon: f64,
    pub backend: String,
    pub proposer: String,
}

/// The engine thread's settings.
pub struct EngineSetup {
    pub weights: Arc<LlamaWeights>,
    pub codec: Arc<Codec>,
    pub proposer: ProposerChoice,
    pub k: usize,
    pub max_batch: usize,
    /// Session capacity: the served context plus one step's drafts.
    pub capacity: usize,
    /// Prompt tokens fed per iteration between steps; `None` feeds each
    /// prompt whole when it is admitted.
    pub prefill_chunk: Option<usize>,
    pub metrics: Arc<Metrics>,
}

/// Runs the engine on `backend` until every sender of `rx` is gone;
/// `ready` is called once the model is loaded, before any request.
pub fn run<B: ModelBackend>(backend: &B, name: &str, setup: &EngineSetup, rx: Receiver<Msg>, ready: &mut dyn FnMut(Result<Ready, String>)) {
    let w = &setup.weights;
    let loaded = (|| -> Result<_, String> {
        let model = backend.load_model(w).map_err(|e| e.to_string())?;
        let proposer = setup.proposer.build(backend, w, setup.k).map_err(|e| e.to_string())?;
        Ok((model, proposer))
    })();
    let (model, mut proposer) = match loaded {
        Ok(x) => x,
        Err(e) => return ready(Err(e)),
    };
    let k = if setup.proposer == ProposerChoice::None { 0 } else { setup.k };
    let engine = match Engine::new(backend, &model, &w.config, EngineConfig { k, ..EngineConfig::default() }) {
        Ok(e) => e,
        Err(e) => return ready(Err(e.to_string())),
    };
    let session = match engine.session(setup.max_batch, setup.capacity, proposer.as_mut()) {
        Ok(s) => s,
        Err(e) => return ready(Err(e.to_string())),
    };
    ready(Ok(Ready { greedy_epsilon: backend.model_precision().argmax_margin_epsilon, backend: name.to_string(), proposer: format!("{} k={k}", setup.proposer) }));
    let codec = Arc::clone(&setup.codec);
    let detok = move |ids: &[u32]| codec.decode(ids);
    Loop { session, clients: (0..setup.max_batch).map(|_| None).collect(), waiting: VecDeque::new(), metrics: &setup.metrics, prefill_chunk: setup.prefill_chunk }.run(rx, &detok);
}

/// A running request's handler, and its clock.
struct Client {
    events: UnboundedSender<Event>,
    arrived: Instant,
    last: Option<Instant>,
    emitted: usize,
}

struct Loop<'s, 'm, B: ModelBackend> {
    session: Session<'s, B>,
    clients: Vec<Option<Client>>,
    waiting: VecDeque<Job>,
    metrics: &'m Metrics,
    prefill_chunk: Option<usize>,
}

impl<B: ModelBackend> Loop<'_, '_, B> {
    fn run(&mut self, rx: Receiver<Msg>, detok: &dyn Detokenize) {
        loop {
            // Idle: wait for work (checking now and then that senders remain).
            if self.idle() {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(m) => self.take(m),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(m) => self.take(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if self.idle() => return,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.drop_gone();
            self.admit(detok);
            if let Some(chunk) = self.prefill_chunk
                && self.session.prefilling() > 0
            {
                self.prefill(chunk);
            }
            self.metrics.queue(self.session.active() + self.session.prefilling(), self.waiting.len());
            if self.session.active() > 0 {
                self.step(detok);
                self.metrics.queue(self.session.active() + self.session.prefilling(), self.waiting.len());
            }
        }
    }

    /// Nothing to do until a message comes.
    fn idle(&self) -> bool {
        self.session.active() == 0 && self.session.prefilling() == 0 && self.waiting.is_empty()
    }

    /// Feeds one chunk of the admitted prompts; a failed forward fails every
    /// request whose prompt is still being fed (the session does not say
    /// which of them the forward held), and the generating ones go on.
    fn prefill(&mut self, chunk: usize) {
        if let Err(e) = self.session.prefill_some(chunk) {
            for slot in 0..self.clients.len() {
                if self.session.is_prefilling(slot)
                    && let Some(c) = self.clients[slot].take()
                {
                    let _ = c.events.send(Event::Failed { status: 500, message: e.to_string() });
                    let _ = self.session.cancel(slot);
                }
            }
        }
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Job(j) => self.waiting.push_back(*j),
            Msg::CancelAll(why) => {
                for j in self.waiting.drain(..) {
                    let _ = j.events.send(Event::Failed { status: 503, message: why.clone() });
                }
                for slot in 0..self.clients.len() {
                    if let Some(c) = self.clients[slot].take() {
                        let _ = c.events.send(Event::Failed { status: 503, message: why.clone() });
                        let _ = self.session.cancel(slot);
                        self.metrics.cancelled();
                    }
                }
            }
        }
    }

    /// Frees the slot of every request whose client is gone.
    fn drop_gone(&mut self) {
        for slot in 0..self.clients.len() {
            if self.clients[slot].as_ref().is_some_and(|c| c.events.is_closed()) {
                self.clients[slot] = None;
                // A cancel's error (a backend failing a trim) leaves the slot
                // free in the session all the same; nothing to tell a gone client.
                let _ = self.session.cancel(slot);
                self.metrics.cancelled();
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.events.is_closed());
        for _ in self.waiting.len()..before {
            self.metrics.cancelled();
        }
    }

    /// Admits as many waiting requests as there are free slots, in arrival order.
    fn admit(&mut self, detok: &dyn Detokenize) {
        let mut jobs: Vec<Job> = self.waiting.drain(..self.session.free_slots().min(self.waiting.len())).collect();
        while !jobs.is_empty() {
            let requests: Vec<Request> = jobs.iter().map(|j| j.request.clone()).collect();
            let admitted = match self.prefill_chunk {
                Some(_) => self.session.admit_unfed(requests, Some(detok)),
                None => self.session.admit(requests, Some(detok)),
            };
            match admitted {
                Ok(slots) => {
                    for (slot, j) in slots.into_iter().zip(jobs) {
                        self.metrics.prompt(j.request.prompt.len());
                        self.clients[slot] = Some(Client { events: j.events, arrived: j.arrived, last: None, emitted: 0 });
                    }
                    return;
                }
                // One bad request: it alone fails, the others are admitted.
                Err(DecodeError::Request { index, reason }) if index < jobs.len() => {
                    let j = jobs.remove(index);
                    let _ = j.events.send(Event::Failed { status: 400, message: reason });
                }
                Err(e) => {
                    for j in jobs.drain(..) {
                        let _ = j.events.send(Event::Failed { status: 500, message: e.to_string() });
                    }
                }
            }
        }
    }

    fn step(&mut self, detok: &dyn Detokenize) {
        let mut emitted: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut sink = |slot: usize, ids: &[u32]| emitted.push((slot, ids.to_vec()));
        let result = self.session.step(Some(detok), &mut sink);
        self.metrics.batch_step();
        let now = Instant::now();
        for (slot, ids) in emitted {
            if let Some(c) = self.clients[slot].as_mut()
                && !ids.is_empty()
            {
                match c.last {
                    None => {
                        self.metrics.first_token(now.duration_since(c.arrived).as_secs_f64());
                        self.metrics.tokens(ids.len(), None);
                    }
                    Some(t) => self.metrics.tokens(ids.len(), Some(now.duration_since(t).as_secs_f64())),
                }
                c.last = Some(now);
                let logprobs = self.session.logprobs(slot).get(c.emitted..).unwrap_or_default().to_vec();
                c.emitted += ids.len();
                let _ = c.events.send(Event::Tokens(ids, logprobs));
            }
        }
        match result {
            Ok(finished) => {
                for slot in finished {
                    let (Some(out), Some(c)) = (self.session.take(slot), self.clients[slot].take()) else { continue };
                    self.metrics.finished(&out.acceptance, c.emitted);
                    // A request that failed alone (CONSTRAIN-2's dead end) is its client's 400.
                    let event = match out.finish {
                        FinishReason::Error => Event::Failed { status: 400, message: out.error.unwrap_or_default() },
                        finish => Event::Done { finish, acceptance: out.acceptance },
                    };
                    let _ = c.events.send(event);
                }
            }
            // A failed step fails the requests that ran in it; the server goes on.
            Err(e) => {
                for slot in 0..self.clients.len() {
                    if let Some(c) = self.clients[slot].take() {
                        let _ = c.events.send(Event::Failed { status: 500, message: e.to_string() });
                        let _ = self.session.cancel(slot);
                    }
                }
            }
        }
    }
}
