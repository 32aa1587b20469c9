//! Connections: accept, limit, time out, and drain on shutdown.
//!
//! A server that keeps every connection a client opens, for as long as the client likes, is
//! one idle client away from running out of file descriptors. So:
//! - at most `max_connections` connections are served at once; past that, a new connection
//!   displaces the connection that has been quiet longest (nothing read from it and nothing
//!   written to it), so sockets held open and silent cannot starve clients that have requests
//!   to send; a connection whose answer is still being written is never displaced, and when
//!   every connection is busy the new one is closed at once;
//! - a request's header must arrive within `header_timeout` (hyper's timer);
//! - a connection the server waits on to send something (between keep-alive requests, or in
//!   the middle of a body) is closed after `idle_timeout` of silence; a client that reads an
//!   answer slowly is never cut off (an export of any size reaches a slow reader whole: at most
//!   two exports run at once);
//! - on shutdown, keep-alive is switched off on every connection, in-flight requests finish,
//!   and the listener is closed.
//!
//! What bites is logged at most once per ten seconds per kind, with a count, so a flood of slow
//! clients cannot flood the log. Every request carries the port it was accepted on
//! ([`Listening`]), which a server without a token checks its `Host` against.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connection limits and timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time for a request's header to arrive.
    pub header_timeout: Duration,
    /// Time a connection may neither read nor write.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    /// 512 connections (half the usual 1,024 descriptors, leaving room for the store's files),
    /// 10 s for a header, 30 s of silence.
    fn default() -> Limits {
        Limits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// Counts events and logs them at most once per interval.
pub(crate) struct RateLog {
    what: &'static str,
    count: AtomicU64,
    last: Mutex<Option<Instant>>,
}

impl RateLog {
    pub(crate) const fn new(what: &'static str) -> RateLog {
        RateLog {
            what,
            count: AtomicU64::new(0),
            last: Mutex::new(None),
        }
    }

    pub(crate) fn hit(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut last = self.last.lock();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(10)) {
            return;
        }
        *last = Some(now);
        let n = self.count.swap(0, Ordering::Relaxed);
        log::warn!("[http] {} ({n} since the last such line)", self.what);
    }
}

impl RateLog {
    /// Logs what was counted since the last line, if the interval has passed: run on a timer,
    /// so the count of a burst that ended is not left unsaid until the next one.
    pub(crate) fn flush(&self) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let now = Instant::now();
        let mut last = self.last.lock();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(10)) {
            return;
        }
        *last = Some(now);
        let n = self.count.swap(0, Ordering::Relaxed);
        if n > 0 {
            log::warn!("[http] {} ({n} since the last such line)", self.what);
        }
    }
}

static AT_CAPACITY: RateLog = RateLog::new(
    "connection limit reached with every connection busy: closed new connections at once",
);
static DISPLACED: RateLog = RateLog::new(
    "connection limit reached: closed the connections that had been quiet longest for new ones",
);
static IDLE_CLOSED: RateLog = RateLog::new("closed connections that stayed silent too long");
static HEADER_TIMEOUT: RateLog =
    RateLog::new("closed connections whose request header did not arrive in time");
static ACCEPT_FAILED: RateLog = RateLog::new("accepting a connection failed (out of descriptors?)");

/// What the accept loop knows of a live connection: when it last read or wrote, whether an
/// answer is being written, and how to close it.
struct Activity {
    /// Milliseconds since `epoch` of the last read or write.
    last: AtomicU64,
    /// A write is waiting for the client to read.
    writing: std::sync::atomic::AtomicBool,
    close: tokio::sync::Notify,
    epoch: Instant,
}

impl Activity {
    fn new(epoch: Instant) -> Activity {
        let a = Activity {
            last: AtomicU64::new(0),
            writing: std::sync::atomic::AtomicBool::new(false),
            close: tokio::sync::Notify::new(),
            epoch,
        };
        a.touch();
        a
    }

    fn touch(&self) {
        let ms = Instant::now().duration_since(self.epoch).as_millis();
        self.last
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// The live connections, for choosing which one a new connection displaces.
#[derive(Default)]
struct Registry {
    next: u64,
    live: std::collections::HashMap<u64, Arc<Activity>>,
}

impl Registry {
    /// Asks the connection quiet longest (and not writing an answer) to close.
    fn displace_quietest(&self) -> bool {
        let victim = self
            .live
            .values()
            .filter(|a| !a.writing.load(Ordering::Relaxed))
            .min_by_key(|a| a.last.load(Ordering::Relaxed));
        match victim {
            Some(a) => {
                a.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// The port the listener that accepted a request is bound to, in the request's extensions.
#[derive(Clone, Copy, Debug)]
pub(super) struct Listening(pub(super) u16);

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
pub async fn serve_on(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    // A listener whose address cannot be read leaves requests without the extension, which a
    // server without a token refuses: it cannot check what they are addressed to.
    let app = match listener.local_addr() {
        Ok(addr) => app.layer(axum::Extension(Listening(addr.port()))),
        Err(_) => app,
    };
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let registry = Arc::new(Mutex::new(Registry::default()));
    let epoch = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {
                for log in [&AT_CAPACITY, &DISPLACED, &IDLE_CLOSED, &HEADER_TIMEOUT, &ACCEPT_FAILED] {
                    log.flush();
                }
                continue;
            }
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                ACCEPT_FAILED.hit();
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // At the cap: the connection quiet longest makes room, if any is quiet.
                if !registry.lock().displace_quietest() {
                    AT_CAPACITY.hit();
                    drop(stream);
                    continue;
                }
                let freed = tokio::time::timeout(
                    Duration::from_millis(500),
                    Arc::clone(&permits).acquire_owned(),
                )
                .await;
                match freed {
                    Ok(Ok(p)) => {
                        DISPLACED.hit();
                        p
                    }
                    _ => {
                        AT_CAPACITY.hit();
                        drop(stream);
                        continue;
                    }
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        let activity = Arc::new(Activity::new(epoch));
        let id = {
            let mut r = registry.lock();
            r.next += 1;
            let id = r.next;
            r.live.insert(id, Arc::clone(&activity));
            id
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let io = TokioIo::new(IdleIo::new(
                stream,
                limits.idle_timeout,
                Arc::clone(&activity),
            ));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(io, service);
            let mut conn = std::pin::pin!(conn);
            let stopping = async move {
                // The borrowed value is dropped here, before any await of the caller.
                let _ = stop.wait_for(|s| *s).await.map(|_| ());
            };
            tokio::select! {
                done = conn.as_mut() => {
                    if done.is_err_and(|e| e.is_timeout()) {
                        HEADER_TIMEOUT.hit();
                    }
                }
                () = activity.close.notified() => {}
                () = stopping => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.as_mut().await;
                }
            }
            registry.lock().live.remove(&id);
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it is done: wait for them all.
    let _ = permits
        .acquire_many(u32::try_from(limits.max_connections).unwrap_or(u32::MAX))
        .await;
}

/// A stream that fails with `TimedOut` once the server has waited `timeout` for the client to
/// send something. A write waiting for the client to read never times out: the reader may be
/// slow, and what it asked for is on its way.
struct IdleIo<T> {
    inner: T,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    activity: Arc<Activity>,
}

impl<T> IdleIo<T> {
    fn new(inner: T, timeout: Duration, activity: Arc<Activity>) -> IdleIo<T> {
        IdleIo {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            activity,
        }
    }

    fn touch(&mut self) {
        let next = Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
        self.activity.touch();
    }

    fn writing(&self, pending: bool) {
        self.activity.writing.store(pending, Ordering::Relaxed);
    }

    /// Called when the inner stream is not ready: has the silence lasted too long?
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.deadline.as_mut().poll(cx).is_ready() {
            IDLE_CLOSED.hit();
            return true;
        }
        false
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the connection was idle too long")
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                this.touch();
                Poll::Ready(r)
            }
            // While an answer waits for the client to read it, the client owes nothing.
            Poll::Pending if this.activity.writing.load(Ordering::Relaxed) => Poll::Pending,
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                this.writing(false);
                this.touch();
                Poll::Ready(r)
            }
            Poll::Pending => {
                this.writing(true);
                Poll::Pending
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                this.writing(false);
                this.touch();
                Poll::Ready(r)
            }
            Poll::Pending => {
                this.writing(true);
                Poll::Pending
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
