//! The CPU priority of the store's background work: fjall's flushes and compactions, the
//! keyword index's writer and merges, the indexer, the use committer, and the server's
//! exports (minutes of CPU on a large store).
//!
//! On few cores a write's thread wakes from its fsync to find every core taken by a merge,
//! and waits for one: in an open loop at half the closed-loop rate on 2 cores (`cargo bench
//! --bench writes`), that wait is most of the slowest writes' time. Background threads run at
//! a nice value `BACKGROUND_NICE` above the process's, so a waking writer or reader takes a
//! core first; the background work still has the cores whenever no request wants them.
//!
//! **Invariants:** a thread's nice value is inherited by the threads it starts, and an
//! unprivileged process cannot lower it again. So the engines, which start their threads as
//! they open, are opened on a helper thread that raises its own nice value first, never on
//! the caller's thread. Only Linux sets a single thread's nice value (elsewhere
//! `setpriority` would lower the whole process): on other systems this does nothing.

use crate::error::{Error, Result};

/// How much lower than the process's the background threads' priority is: nice +10 weighs
/// about a tenth of nice 0 in the kernel's fair scheduler.
const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to the background's. Best effort: a system that
/// refuses keeps the thread as it was and says so in the log.
pub(crate) fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        // A thread id names that thread alone (nice is per thread under NPTL).
        let me = Some(rustix::thread::gettid());
        let lowered = getpriority_process(me)
            .and_then(|now| setpriority_process(me, (now + BACKGROUND_NICE).min(19)));
        if let Err(e) = lowered {
            log::debug!("background threads keep the process's priority: {e}");
        }
    }
}

/// Runs `open` on a helper thread at the background's priority, so every thread it starts
/// (fjall's workers, tantivy's writer and merge threads) inherits that priority; answers what
/// `open` answers.
pub(crate) fn open<T: Send>(what: &str, open: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        let helper = std::thread::Builder::new()
            .name("lessons-open".into())
            .spawn_scoped(s, || {
                lower_this_thread();
                open()
            })
            .map_err(|e| Error::io(format!("starting a thread to open {what}"), e))?;
        helper.join().unwrap_or_else(|_| {
            Err(Error::io(
                format!("opening {what}"),
                std::io::Error::other("the opening thread panicked"),
            ))
        })
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn threads_started_by_an_open_inherit_the_lowered_priority() {
        let nice =
            || rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("nice");
        let before = nice();
        let (opener, child) = open("a test", || {
            let child = std::thread::spawn(nice).join().expect("child");
            Ok((nice(), child))
        })
        .expect("opened");
        assert_eq!(opener, (before + BACKGROUND_NICE).min(19));
        assert_eq!(child, opener);
        // The caller's own thread keeps its priority.
        assert_eq!(nice(), before);
    }

    #[test]
    fn an_error_of_the_open_is_answered() {
        let answer: Result<()> = open("a test", || {
            Err(Error::io("reading", std::io::Error::other("boom")))
        });
        assert!(answer.is_err());
    }
}
