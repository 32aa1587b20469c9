//! `lessons serve`: the memory Worker's wire contract over this host's store.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use lessons::server::{serve, AppState, Auth};

use super::run_cmds::context_config;
use super::store_cmds::{fail, open_store, store_dir};
use super::{Cli, Failure, Outcome};

/// Arguments of `lessons serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:7171")]
    pub addr: SocketAddr,
    /// Accept requests without a token (only on a loopback address; for local trials).
    #[arg(long)]
    pub insecure_no_auth: bool,
}

fn env_token(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|t| !t.is_empty())
}

pub fn run(cli: &Cli, args: &ServeArgs) -> Result<Outcome, Failure> {
    if cli.server.is_some() {
        return Err(Failure(
            "serve owns a store directory; --server does not apply".into(),
        ));
    }
    let token = env_token("MEMORY_TOKEN");
    let read_token = env_token("MEMORY_READ_TOKEN");
    if token.is_none() {
        if !args.insecure_no_auth {
            return Err(Failure(
                "set MEMORY_TOKEN (the read-write bearer token), or pass --insecure-no-auth on a loopback address".into(),
            ));
        }
        if !args.addr.ip().is_loopback() {
            return Err(Failure(format!(
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
    let state = AppState::new(store.clone(), auth, context);
    let runtime =
        lessons::server::runtime().map_err(|e| Failure(format!("starting the runtime: {e}")))?;
    let dir = store_dir(cli);
    let served = runtime.block_on(serve(state, args.addr, |addr| {
        eprintln!(
            "[http] lessons serve listening on http://{addr} (store {})",
            dir.display()
        );
    }));
    // Every request has finished; the last reference to the store is ours.
    drop(runtime);
    served.map_err(|e| Failure(format!("serving on {}: {e}", args.addr)))?;
    match Arc::try_unwrap(store) {
        Ok(store) => store.close().map_err(fail)?,
        Err(store) => store.flush().map_err(fail)?,
    }
    eprintln!("[http] stopped; the store is flushed");
    Ok(Outcome::Ok)
}
