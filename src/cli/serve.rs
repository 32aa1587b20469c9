//! `lessons serve`: the memory Worker's wire contract over this host's store.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use lessons::server::{serve, AppState, Auth, Limits, ServeEnd};

use super::run_cmds::context_config;
use super::store_cmds::{fail, open_store, store_dir};
use super::{Cli, Failure, Outcome};

/// Arguments of `lessons serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:7171")]
    pub addr: SocketAddr,
    /// Accept requests without a token (only on a loopback address; for local trials).
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Connections served at once; more are closed at once (keep it under the descriptor limit).
    #[arg(long, default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// Seconds a connection may stay silent (between requests or mid-body) before it is closed.
    #[arg(long, default_value_t = Limits::default().idle_timeout.as_secs())]
    pub idle_timeout: u64,
}

/// The shortest token accepted: a guessable token is no token.
const MIN_TOKEN_CHARS: usize = 16;

/// A token from the environment: unset is `None`; set but blank or short is an error.
fn env_token(name: &str) -> Result<Option<String>, Failure> {
    let Ok(t) = std::env::var(name) else {
        return Ok(None);
    };
    if t.trim().chars().count() < MIN_TOKEN_CHARS || t.trim() != t {
        return Err(Failure::Usage(format!(
            "{name} must be at least {MIN_TOKEN_CHARS} characters with no surrounding spaces (try `openssl rand -hex 32`); unset it to run without"
        )));
    }
    Ok(Some(t))
}

pub(crate) fn run(cli: &Cli, args: &ServeArgs) -> Result<Outcome, Failure> {
    if cli.server.is_some() {
        return Err(Failure::Usage(
            "serve owns a store directory; --server does not apply".into(),
        ));
    }
    let token = env_token("MEMORY_TOKEN")?;
    let read_token = env_token("MEMORY_READ_TOKEN")?;
    if args.max_connections == 0 || args.idle_timeout == 0 {
        return Err(Failure::Usage(
            "--max-connections and --idle-timeout must be at least 1".into(),
        ));
    }
    let limits = Limits {
        max_connections: args.max_connections,
        idle_timeout: std::time::Duration::from_secs(args.idle_timeout),
        ..Limits::default()
    };
    if token.is_none() {
        if !args.insecure_no_auth {
            return Err(Failure::Usage(
                "set MEMORY_TOKEN (the read-write bearer token), or pass --insecure-no-auth on a loopback address".into(),
            ));
        }
        if !args.addr.ip().is_loopback() {
            return Err(Failure::Usage(format!(
                "--insecure-no-auth only listens on a loopback address, not {}",
                args.addr
            )));
        }
    }
    let auth = Auth {
        open: token.is_none(),
        token,
        read_token,
    };
    let context = context_config(cli)?;
    let store = Arc::new(open_store(cli, true)?);
    let review = super::store_cmds::Config::load(cli.config.as_deref())?.review();
    let state = AppState::with_review(store.clone(), auth, context, review);
    let runtime = lessons::server::runtime()
        .map_err(|e| Failure::Usage(format!("starting the runtime: {e}")))?;
    let dir = store_dir(cli);
    let served = runtime.block_on(serve(state, args.addr, limits, |addr| {
        eprintln!(
            "[http] lessons serve listening on http://{addr} (store {})",
            dir.display()
        );
    }));
    // Every request has finished; the last reference to the store is ours.
    drop(runtime);
    let end = served.map_err(|e| Failure::Usage(format!("serving on {}: {e}", args.addr)))?;
    let closed = match Arc::try_unwrap(store) {
        Ok(store) => store.close(),
        Err(store) => store.flush(),
    };
    if let ServeEnd::StoreFailed(reason) = end {
        // Exit non-zero so a supervisor (systemd's Restart=on-failure) restarts the server:
        // a reopened store starts from what is on disk, which is every acknowledged write.
        return Err(Failure::Usage(format!(
            "stopped because the store failed at the disk ({reason}); every acknowledged write is on disk — free space or fix the disk, then start again"
        )));
    }
    closed.map_err(fail)?;
    eprintln!("[http] stopped; the store is flushed");
    Ok(Outcome::Ok)
}
