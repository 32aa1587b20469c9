//! Connections: accept, limit, time out, and drain on shutdown.
//!
//! A server that keeps every connection a client opens, for as long as the client likes, is
//! one idle client away from running out of file descriptors. So:
//! - at most `max_connections` connections are served at once; past that a new connection is
//!   closed at once (the client sees a reset, not a hang), and a log line says so;
//! - a request's header must arrive within `header_timeout` (hyper's timer);
//! - a connection that neither reads nor writes for `idle_timeout` is closed, whether it is
//!   between keep-alive requests or stalled in the middle of a body;
//! - on shutdown, keep-alive is switched off on every connection, in-flight requests finish,
//!   and the listener is closed.
//!
//! What bites is logged at most once per ten seconds per kind, with a count, so a flood of slow
//! clients cannot flood the log.

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

static AT_CAPACITY: RateLog =
    RateLog::new("connection limit reached: closing new connections at once");
static IDLE_CLOSED: RateLog = RateLog::new("closed connections that stayed silent too long");
static ACCEPT_FAILED: RateLog = RateLog::new("accepting a connection failed (out of descriptors?)");

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
pub async fn serve_on(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
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
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            AT_CAPACITY.hit();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(IdleIo::new(stream, limits.idle_timeout));
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
                _ = conn.as_mut() => {}
                () = stopping => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.as_mut().await;
                }
            }
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

/// A stream that fails with `TimedOut` once it has neither read nor written for `timeout`.
struct IdleIo<T> {
    inner: T,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<T> IdleIo<T> {
    fn new(inner: T, timeout: Duration) -> IdleIo<T> {
        IdleIo {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn touch(&mut self) {
        let next = Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
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
                this.touch();
                Poll::Ready(r)
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
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
                this.touch();
                Poll::Ready(r)
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
