//! The connection layer: an accept loop over hyper's HTTP/1 connections, so
//! that no client can hold the service and a shutdown ends in bounded time.
//!
//! What a connection may cost ([`Limits`]):
//! - its request head (request line and headers) must arrive within the
//!   header timeout, counted from when the connection starts waiting for
//!   one: hyper's own `header_read_timeout`, which also ends a kept-alive
//!   connection that sends nothing (the idle timeout);
//! - its body must arrive within the body timeout once the head has (the
//!   handlers read it under that clock, `http.rs`), and a response that
//!   stops moving (a client that does not read) ends the connection after
//!   the same time;
//! - at most `max_connections` are open: a new one past the cap closes the
//!   oldest connection that has no request in flight (a client that only
//!   holds a socket; a response it was finishing gets a second to flush),
//!   or, when every one has, is answered 503 and closed.
//!   A slow client so costs one connection, never the service.
//!
//! Shutdown: the listener closes, every connection is told to finish its
//! request in flight and close; what is still open after the drain time is
//! cancelled in the engine (its clients get a 503), given a second to say
//! so, then dropped, whatever its client does.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// What one connection may cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// A request head must arrive within this (also a kept-alive
    /// connection's idle time).
    pub header_timeout: Duration,
    /// A request body must arrive within this once its head has; a
    /// response write may wait on the client this long.
    pub body_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { header_timeout: Duration::from_secs(10), body_timeout: Duration::from_secs(30), max_connections: 256 }
    }
}

impl Limits {
    /// Every limit usable: positive timeouts, at least one connection.
    pub fn validate(&self) -> Result<(), String> {
        if self.header_timeout.is_zero() || self.body_timeout.is_zero() {
            return Err("--header-timeout and --body-timeout must be positive".into());
        }
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        Ok(())
    }
}

/// An open connection, as the accept loop sees it.
struct Open {
    /// Requests in flight on it (a streamed response counts until its body ends).
    in_flight: Arc<AtomicUsize>,
    /// Closes it.
    close: oneshot::Sender<()>,
}

type Registry = Arc<Mutex<BTreeMap<u64, Open>>>;

fn lock(r: &Registry) -> std::sync::MutexGuard<'_, BTreeMap<u64, Open>> {
    r.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains:
/// `drain` for the requests in flight, then `cancel` (the engine fails what
/// is left) and a second for those answers, then every connection is dropped.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, shutdown: impl Future<Output = ()>, drain: Duration, cancel: impl FnOnce()) {
    let registry: Registry = Arc::default();
    let (finish_tx, finish_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // Out of file descriptors, or a connection reset before it was
            // taken: wait a little rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if !make_room(&registry, limits.max_connections) {
            connections.spawn(refuse(stream));
            continue;
        }
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (close, closed) = oneshot::channel();
        let id = next_id;
        next_id += 1;
        lock(&registry).insert(id, Open { in_flight: Arc::clone(&in_flight), close });
        connections.spawn(connection(stream, router.clone(), limits, in_flight, closed, finish_rx.clone(), (Arc::clone(&registry), id)));
    }
    drop(listener);
    let _ = finish_tx.send(true);
    let all_done = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(drain, all_done).await.is_err() {
        cancel();
        let answered = async { while connections.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(1), answered).await;
        connections.abort_all();
    }
}

/// Frees a place for one more connection: `true` when there is one, after
/// closing the oldest connection with no request in flight if the cap is
/// reached; `false` when every open connection has a request in flight.
fn make_room(registry: &Registry, max: usize) -> bool {
    let mut open = lock(registry);
    if open.len() < max {
        return true;
    }
    let Some(oldest_idle) = open.iter().find(|(_, c)| c.in_flight.load(Ordering::Acquire) == 0).map(|(&id, _)| id) else { return false };
    if let Some(c) = open.remove(&oldest_idle) {
        let _ = c.close.send(());
    }
    true
}

/// The answer to a connection past the cap when every place has a request
/// in flight: a 503, then the write side closed and what the client sent
/// read away for a moment, so that closing does not reset the connection
/// before the client has read the answer.
async fn refuse(mut stream: TcpStream) {
    let body = crate::api::ApiError::status(503, "the server has as many connections as it takes, each with a request in flight; try again").body().to_string();
    let reply = format!("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}", body.len());
    let answered = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answered).await;
}

/// One connection: hyper's HTTP/1 with the header timeout, until it ends,
/// is closed by [`make_room`], or is told to finish by a shutdown.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    in_flight: Arc<AtomicUsize>,
    mut closed: oneshot::Receiver<()>,
    mut finish: watch::Receiver<bool>,
    (registry, id): (Registry, u64),
) {
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let router = router.clone();
        let guard = InFlight::enter(&in_flight);
        async move {
            let response = router.oneshot(req.map(Body::new)).await.unwrap_or_else(|e: Infallible| match e {});
            Ok::<_, Infallible>(response.map(|body| Counted { body, _guard: guard }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let stream = Watched::new(stream);
    let stalled = stream.stalled();
    let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
    let (mut finishing, mut evicted) = (false, None::<tokio::time::Instant>);
    let mut watchdog = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            // Closed for a newcomer: what it was answering is flushed first
            // (a second at most); a connection with nothing in flight closes now.
            _ = &mut closed, if evicted.is_none() => {
                conn.as_mut().graceful_shutdown();
                evicted = Some(tokio::time::Instant::now() + Duration::from_secs(1));
            }
            changed = finish.changed(), if !finishing => {
                finishing = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = watchdog.tick() => {
                // A client that stops reading stalls our writes: after the body
                // timeout without progress its connection goes (a response, like
                // a request body, must move within that time).
                if stalled.longer_than(limits.body_timeout) || evicted.is_some_and(|at| tokio::time::Instant::now() >= at) {
                    break;
                }
            }
        }
    }
    lock(&registry).remove(&id);
}

/// A connection's socket that notes since when a write has been waiting on
/// the client (its receive window full): a client that never reads.
struct Watched {
    stream: TcpStream,
    stall: Stall,
}

/// When the socket's writes stopped progressing, if they have.
#[derive(Clone)]
struct Stall {
    /// Milliseconds after `base` at which a write first returned pending; 0: none pending.
    since_ms: Arc<std::sync::atomic::AtomicU64>,
    base: std::time::Instant,
}

impl Stall {
    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64 + 1
    }

    fn note<T>(&self, poll: &Poll<T>) {
        match poll {
            Poll::Pending => {
                let _ = self.since_ms.compare_exchange(0, self.now_ms(), Ordering::AcqRel, Ordering::Acquire);
            }
            Poll::Ready(_) => self.since_ms.store(0, Ordering::Release),
        }
    }

    fn longer_than(&self, limit: Duration) -> bool {
        let since = self.since_ms.load(Ordering::Acquire);
        since != 0 && self.now_ms().saturating_sub(since) > limit.as_millis() as u64
    }
}

impl Watched {
    fn new(stream: TcpStream) -> Watched {
        Watched { stream, stall: Stall { since_ms: Arc::default(), base: std::time::Instant::now() } }
    }

    fn stalled(&self) -> Stall {
        self.stall.clone()
    }
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.stall.note(&poll);
        poll
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.stall.note(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(cx);
        self.stall.note(&poll);
        poll
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Counts a request in flight on its connection until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(count: &Arc<AtomicUsize>) -> InFlight {
        count.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(count))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted in flight until it is
/// sent or dropped (a stream runs long after its handler returned).
struct Counted {
    body: Body,
    _guard: InFlight,
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
