//! `lessons mcp`: the Model Context Protocol over stdio, on this host's store (or, with
//! `--server URL`, on a server's), for any coding agent that speaks it.

use std::sync::Arc;

use clap::Args;

use super::run_cmds::context_config;
use super::store_cmds::{fail, open_handle, Handle};
use super::{Cli, Failure, Outcome};
use lessons::server::{AppState, Auth};
use lessons::store::MemoryStore;

/// Arguments of `lessons mcp`.
#[derive(Debug, Args)]
pub(crate) struct McpArgs {}

pub(crate) fn run(cli: &Cli, _args: &McpArgs) -> Result<Outcome, Failure> {
    let context = context_config(cli)?;
    let handle = open_handle(cli, true)?;
    let (store, embedded): (Arc<dyn MemoryStore>, _) = match handle {
        Handle::Embedded(s) => {
            let s = Arc::new(s);
            (s.clone(), Some(s))
        }
        Handle::Remote(s) => (Arc::new(s), None),
    };
    let review = super::store_cmds::Config::load(cli.config.as_deref())?.review();
    // The process that started this one owns the store through it: every tool is open to it.
    let auth = Auth {
        open: true,
        ..Auth::default()
    };
    let state = AppState::with_review(store, auth, context, review);
    // One client, one thread: reading, the store call and writing run in turn, with no thread
    // to hand a request to and back (store calls run inline, see `server::mcp`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Usage(format!("starting the runtime: {e}")))?;
    let served = runtime.block_on(lessons::server::serve_mcp_stdio(state));
    // A read of stdin cannot be cancelled: once the session is over, the runtime is not waited
    // on for it (the client closed stdout, or will close stdin).
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    served.map_err(Failure::Io)?;
    if let Some(store) = embedded {
        match Arc::try_unwrap(store) {
            Ok(store) => store.close().map_err(fail)?,
            Err(store) => store.flush().map_err(fail)?,
        }
    }
    Ok(Outcome::Ok)
}
