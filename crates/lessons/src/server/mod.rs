//! The HTTP server: the memory Worker's wire contract over one store.
//!
//! One catch-all handler decides every answer in the contract's order: unknown path 404 (before
//! auth); on a server started without auth, a `Host` or `Origin` that is not its own 403 (a web
//! page or a rebound name: `auth::local_caller`); wrong method 405, missing or wrong bearer 401
//! (constant-time comparison; no token configured refuses everything unless the server was
//! started without auth), read-only token on a mutating route 403, missing length 411, body
//! over 512 KiB 413, bad JSON 400
//! `{"error":"body must be valid JSON"}`, failed validation 400 with the reason. Store calls run
//! on blocking threads, never on the async workers.
//!
//! **Invariant:** only this module knows HTTP.
//! **Invariant:** no log line carries record text, a query or a token.

mod answer;
mod auth;
mod conn;
mod handler;
mod lanes;
#[cfg(feature = "mcp")]
pub(crate) mod mcp;
pub(crate) mod metrics;
mod routes;
pub(crate) mod wire;

pub use conn::Limits;
/// The Model Context Protocol over this process's stdin and stdout (what `lessons mcp` runs).
#[cfg(feature = "mcp")]
pub use mcp::serve_mcp_stdio;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::Router;
use parking_lot::Mutex;

use crate::context::ContextConfig;
use crate::store::MemoryStore;
use crate::time::day_of;

use handler::handle;
use metrics::{rollup_lines, Metrics};

/// Who may do what.
#[derive(Clone, Debug, Default)]
pub struct Auth {
    /// The read-write bearer token (`MEMORY_TOKEN`).
    pub token: Option<String>,
    /// An optional read-only bearer token (`MEMORY_READ_TOKEN`).
    pub read_token: Option<String>,
    /// No token is required (only ever on a loopback address). Then only a request addressed to
    /// a loopback name at the server's port, from no web page but the server's own, is answered.
    pub open: bool,
}

/// What the server shares between requests.
pub struct AppState {
    store: Arc<dyn MemoryStore>,
    auth: Auth,
    context: ContextConfig,
    /// The review's thresholds (`/review`).
    pub(crate) review: crate::review::Thresholds,
    commit: String,
    metrics: Mutex<Metrics>,
    /// Set when the store failed at the disk: `/healthz` answers 503 from then on and the
    /// server shuts down, so its supervisor restarts it on a store that reopens cleanly.
    failure: Mutex<Option<String>>,
    failed: tokio::sync::Notify,
    /// Exports streaming now (each holds a thread and a snapshot).
    exports: std::sync::atomic::AtomicUsize,
    /// The threads store calls run on, by lane.
    lanes: lanes::Lanes,
}

/// Exports that may stream at once; each runs on its own thread, off the store threads.
pub(crate) const MAX_EXPORTS: usize = 2;

/// Time a request body may take to arrive.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why `serve` returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServeEnd {
    /// SIGTERM or SIGINT.
    Signal,
    /// The store failed at the disk (the reason); the caller should exit non-zero.
    StoreFailed(String),
}

impl AppState {
    /// A server over `store`.
    pub fn new(store: Arc<dyn MemoryStore>, auth: Auth, context: ContextConfig) -> Arc<AppState> {
        AppState::with_review(store, auth, context, crate::review::Thresholds::default())
    }

    /// A server over `store` whose `/review` holds the signals against `review`.
    pub fn with_review(
        store: Arc<dyn MemoryStore>,
        auth: Auth,
        context: ContextConfig,
        review: crate::review::Thresholds,
    ) -> Arc<AppState> {
        Arc::new(AppState {
            store,
            auth,
            context,
            review,
            commit: option_env!("LESSONS_BUILD_COMMIT")
                .unwrap_or("unknown")
                .to_owned(),
            metrics: Mutex::new(Metrics::default()),
            failure: Mutex::new(None),
            failed: tokio::sync::Notify::new(),
            exports: std::sync::atomic::AtomicUsize::new(0),
            lanes: lanes::Lanes::new(),
        })
    }

    /// The store's disk failure, if one happened.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Records a disk failure once: logs the cause and starts the shutdown.
    fn fail(&self, reason: &str) {
        let mut f = self.failure.lock();
        if f.is_none() {
            log::error!(
                "[store] failed at the disk: {reason}; /healthz now answers 503 and the server shuts down so its supervisor can restart it"
            );
            *f = Some(reason.to_owned());
            self.failed.notify_one();
        }
    }
}

/// The router: one handler decides every answer (see the module docs). Served by [`serve`] or
/// [`Background`], each request carries the port it came in on; served otherwise, a server
/// without a token cannot check what a request is addressed to, and refuses every one.
pub fn router(state: Arc<AppState>) -> Router {
    #[cfg(feature = "mcp")]
    let mcp: handler::Mcp = Arc::new(mcp::http_service(&state));
    #[cfg(not(feature = "mcp"))]
    let mcp = handler::Mcp;
    Router::new().fallback(move |req: Request| {
        let state = Arc::clone(&state);
        let mcp = mcp.clone();
        async move { handle(state, mcp, req).await }
    })
}

/// Serves `state` on `addr` until SIGTERM or SIGINT, or until the store fails at the disk;
/// in-flight requests finish first. Logs the day's rollup per scope at each UTC day change.
/// Calls `ready` with the bound address.
pub async fn serve(
    state: Arc<AppState>,
    addr: SocketAddr,
    limits: Limits,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<ServeEnd> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    ready(listener.local_addr()?);
    let rollup_state = Arc::clone(&state);
    let rollup = tokio::spawn(async move {
        let mut today = day_of(rollup_state.store.now());
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await;
            let now = day_of(rollup_state.store.now());
            if now != today {
                let store = Arc::clone(&rollup_state.store);
                let finished = today;
                if let Some(Ok(lines)) = rollup_state
                    .lanes
                    .call(lanes::Lane::Operator, move || {
                        rollup_lines(store.as_ref(), finished)
                    })
                    .await
                {
                    for line in lines {
                        log::info!("{line}");
                    }
                }
                today = now;
            }
        }
    });
    let watcher = Arc::clone(&state);
    let stop = async move {
        tokio::select! {
            () = shutdown_signal() => {}
            () = watcher.failed.notified() => {
                log::warn!("[http] shutting down: the store failed; finishing in-flight requests");
            }
        }
    };
    conn::serve_on(listener, router(Arc::clone(&state)), limits, stop).await;
    rollup.abort();
    Ok(match state.failure() {
        Some(reason) => ServeEnd::StoreFailed(reason),
        None => ServeEnd::Signal,
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    log::warn!("[http] shutting down: finishing in-flight requests");
}

/// The runtime [`serve`] is built for: async workers per core, and a small pool for store calls
/// (its lanes'). An embedder that runs [`serve`] itself builds its runtime here.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(lanes::BLOCKING_THREADS)
        .build()
}

/// A server on a background thread, for tests and embedding: the address it listens on, and a
/// handle that stops it when dropped.
pub struct Background {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Starts serving `state` on 127.0.0.1 at a free port.
    pub fn start(state: Arc<AppState>) -> std::io::Result<Background> {
        let runtime = runtime()?;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lessons-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                        return;
                    };
                    conn::serve_on(listener, router(state), Limits::default(), async {
                        let _ = rx.await;
                    })
                    .await;
                });
            })?;
        Ok(Background {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
