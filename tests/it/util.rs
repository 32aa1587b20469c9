//! Shared helpers: a settable clock, scope keys and candidates, a store's records, test data
//! files and the built binary.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use lessons::{Candidate, Clock, Kind, MemoryStore, Record, ScopeKey, Status};

/// 2026-11-30T00:00:00Z.
pub const T0: i64 = 1_795_996_800_000;

/// A fact record of `scope` at `seq`, created at `T0 + seq`, as an import carries it.
pub fn fact_record(scope: &ScopeKey, seq: u64, text: &str, status: Status) -> Record {
    Record {
        id: scope.record_id(seq),
        scope_key: scope.clone(),
        kind: Kind::Fact,
        text: text.to_owned(),
        keywords: Default::default(),
        source_thread_key: "t".to_owned(),
        source_run_id: None,
        provenance: None,
        created_at: T0 + seq as i64,
        last_used_at: None,
        use_count: 0,
        confidence: Some(1.0),
        supersedes: None,
        status,
        dedup_key: true,
    }
}

/// A clock the test moves by hand.
#[derive(Clone)]
pub struct FakeClock(pub Arc<AtomicI64>);

impl FakeClock {
    pub fn new(start: i64) -> FakeClock {
        FakeClock(Arc::new(AtomicI64::new(start)))
    }
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }
    pub fn clock(&self) -> Clock {
        let t = Arc::clone(&self.0);
        Arc::new(move || t.load(Ordering::SeqCst))
    }
}

/// A scope key the test knows is valid.
pub fn scope(s: &str) -> ScopeKey {
    ScopeKey::parse(s).expect("valid scope key")
}

/// A fact from thread `slack:C1:1`.
pub fn fact(text: &str) -> Candidate {
    Candidate {
        kind: Some(Kind::Fact),
        text: text.to_owned(),
        source_thread_key: "slack:C1:1".to_owned(),
        ..Candidate::default()
    }
}

/// Every record of `store`, in export order.
pub fn exported(store: &dyn MemoryStore) -> Vec<Record> {
    let mut out = Vec::new();
    store
        .export(&mut |r| {
            out.push(r);
            Ok(())
        })
        .expect("export");
    out
}

/// Every decision-journal entry `store` exports, oldest first within each scope.
pub fn exported_decisions(store: &dyn MemoryStore) -> Vec<lessons::Decision> {
    let mut out = Vec::new();
    store
        .export_decisions(&mut |d| {
            out.push(d);
            Ok(())
        })
        .expect("export");
    out
}

/// A file under `tests/data`.
pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Every line of a JSON Lines file under `tests/data`, parsed.
pub fn jsonl(name: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(data(name)).expect("test data file is readable");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{name} line {}: {e}", i + 1))
        })
        .collect()
}

/// The `lessons` binary under test.
pub fn lessons() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lessons"))
}

/// Runs `lessons ARGS` with `stdin` and returns its output.
pub fn run(args: &[&str], stdin: &str) -> Output {
    let mut command = lessons();
    command.args(args).env_remove("LESSONS_STORE");
    run_with(command, stdin.as_bytes())
}

/// Runs `command` (the binary, its arguments and environment set) with `stdin` and returns
/// its output.
pub fn run_with(mut command: Command, stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the lessons binary starts");
    let mut input = child.stdin.take().expect("stdin is piped");
    // A command that fails before reading stdin closes it: that is its answer, not a test error.
    if let Err(e) = input.write_all(stdin) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "writing stdin: {e}"
        );
    }
    drop(input);
    child.wait_with_output().expect("the lessons binary exits")
}

/// Runs `lessons --store <dir> ARGS` with `stdin`.
pub fn in_store(dir: &std::path::Path, args: &[&str], stdin: &str) -> Output {
    let mut full = vec!["--store", dir.to_str().expect("utf-8 path")];
    full.extend_from_slice(args);
    run(&full, stdin)
}

/// Copies the directory tree `from` to `to` (created), files and directories only.
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// The stdout of an output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// The stderr of an output as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// Delegates the named `MemoryStore` methods of a test double to its field `self.0` (or, as
/// `delegate_store!(all but write_checked)`, every method but one), so a double writes out only the
/// methods it changes (and a new trait method is added here once).
#[macro_export]
macro_rules! delegate_store {
    ($($method:ident),* $(,)?) => { $( $crate::delegate_store!(@one $method); )* };
    // Every method but the one the double writes itself. Listed once here, so a new trait
    // method reaches every double.
    (all but $skip:ident) => {
        $crate::delegate_store!(@but $skip write_checked);
        $crate::delegate_store!(@but $skip list);
        $crate::delegate_store!(@but $skip retrieve);
        $crate::delegate_store!(@but $skip retrieve_marked);
        $crate::delegate_store!(@but $skip forget);
        $crate::delegate_store!(@but $skip sweep);
        $crate::delegate_store!(@but $skip get);
        $crate::delegate_store!(@but $skip scopes);
        $crate::delegate_store!(@but $skip export);
        $crate::delegate_store!(@but $skip import);
        $crate::delegate_store!(@but $skip stats);
        $crate::delegate_store!(@but $skip decisions);
        $crate::delegate_store!(@but $skip export_decisions);
        $crate::delegate_store!(@but $skip import_decisions);
        $crate::delegate_store!(@but $skip visit_decisions);
        $crate::delegate_store!(@but $skip now);
        $crate::delegate_store!(@but $skip active_count);
    };
    (@but write_checked write_checked) => {};
    (@but list list) => {};
    (@but retrieve retrieve) => {};
    (@but retrieve_marked retrieve_marked) => {};
    (@but forget forget) => {};
    (@but sweep sweep) => {};
    (@but get get) => {};
    (@but scopes scopes) => {};
    (@but export export) => {};
    (@but import import) => {};
    (@but stats stats) => {};
    (@but decisions decisions) => {};
    (@but export_decisions export_decisions) => {};
    (@but import_decisions import_decisions) => {};
    (@but visit_decisions visit_decisions) => {};
    (@but now now) => {};
    (@but active_count active_count) => {};
    (@but $skip:ident $method:ident) => { $crate::delegate_store!(@one $method); };
    (@one write_checked) => {
        fn write_checked(&self, w: &lessons::store::CheckedWrite<'_>, o: &lessons::WriteOptions)
            -> lessons::Result<lessons::WriteCounts> { self.0.write_checked(w, o) }
    };
    (@one list) => {
        fn list(&self, s: &lessons::ScopeKey, q: &lessons::ListQuery)
            -> lessons::Result<Vec<lessons::Record>> { self.0.list(s, q) }
    };
    (@one retrieve) => {
        fn retrieve(&self, s: &lessons::ScopeKey, q: &str, l: usize)
            -> lessons::Result<Vec<lessons::Record>> { self.0.retrieve(s, q, l) }
    };
    (@one retrieve_marked) => {
        fn retrieve_marked(&self, s: &lessons::ScopeKey, q: &str, l: usize)
            -> lessons::Result<Vec<lessons::model::Retrieved>> { self.0.retrieve_marked(s, q, l) }
    };
    (@one forget) => {
        fn forget(&self, s: &lessons::ScopeKey, i: &str) -> lessons::Result<bool> {
            self.0.forget(s, i)
        }
    };
    (@one sweep) => {
        fn sweep(&self, s: &lessons::ScopeKey, d: bool) -> lessons::Result<lessons::SweepReceipt> {
            self.0.sweep(s, d)
        }
    };
    (@one get) => {
        fn get(&self, i: &str) -> lessons::Result<Option<lessons::Record>> { self.0.get(i) }
    };
    (@one scopes) => {
        fn scopes(&self) -> lessons::Result<Vec<lessons::ScopeKey>> { self.0.scopes() }
    };
    (@one export) => {
        fn export(&self, sink: &mut dyn FnMut(lessons::Record) -> lessons::Result<()>)
            -> lessons::Result<()> { self.0.export(sink) }
    };
    (@one import) => {
        fn import(&self, r: &[lessons::Record]) -> lessons::Result<lessons::store::ImportReport> {
            self.0.import(r)
        }
    };
    (@one stats) => {
        fn stats(&self, d: i64) -> lessons::Result<Vec<lessons::store::DayStats>> {
            self.0.stats(d)
        }
    };
    (@one decisions) => {
        fn decisions(&self, s: &lessons::ScopeKey, q: &lessons::DecisionQuery)
            -> lessons::Result<Vec<lessons::Decision>> { self.0.decisions(s, q) }
    };
    (@one export_decisions) => {
        fn export_decisions(&self, sink: &mut dyn FnMut(lessons::Decision) -> lessons::Result<()>)
            -> lessons::Result<()> { self.0.export_decisions(sink) }
    };
    (@one import_decisions) => {
        fn import_decisions(&self, e: &[lessons::Decision]) -> lessons::Result<u64> {
            self.0.import_decisions(e)
        }
    };
    (@one visit_decisions) => {
        fn visit_decisions(&self, s: &lessons::ScopeKey, q: &lessons::DecisionQuery, p: usize,
            v: &mut dyn FnMut(lessons::Decision) -> bool) -> lessons::Result<()> {
            self.0.visit_decisions(s, q, p, v)
        }
    };
    (@one now) => {
        fn now(&self) -> lessons::Millis { self.0.now() }
    };
    (@one active_count) => {
        fn active_count(&self, s: &lessons::ScopeKey) -> lessons::Result<u64> {
            self.0.active_count(s)
        }
    };
}
