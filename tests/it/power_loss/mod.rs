//! Power loss, modelled: the `lessons` binary runs on a [`CutFs`] mount, which keeps beside the
//! live tree only what fsync made durable (names under strict POSIX rules), and the power is cut
//! at seeded points: during the first write of a fresh store, mid CLI write on a store holding
//! acknowledged batches, under `lessons serve` with four HTTP writers (across journal rotations,
//! memtable flushes and compactions), and during an index commit. After each cut the child is
//! killed with SIGKILL, the durable tree is written to an ordinary directory, and the binary
//! checks it: every acknowledged write is there with its text, `doctor` finds the store
//! consistent, and the store accepts a new write.
//!
//! They mount a FUSE file system, so they need root and `/dev/fuse` and are opt-in
//! (`cargo test --test it power_loss -- --include-ignored`). Knobs:
//! `LESSONS_POWER_SEED=S` replays a run (each test prints its seed), `LESSONS_POWER_ROUNDS=N`
//! runs N rounds of each scenario, `LESSONS_POWER_SERVE_SECS=T` cuts the server up to T s in,
//! `LESSONS_POWER_DURABILITY=buffered` runs the store with `"durability": "buffered"` (the
//! server's acknowledged writes are then expected to be lost: the test must fail, naming them),
//! `LESSONS_POWER_NAMES=lenient` keeps names as ext4 and XFS do in practice (a sync also commits
//! the synced inode's names) instead of strict POSIX, `LESSONS_POWER_KEEP=1` keeps each round's
//! directory.

mod cutfs;
mod scenarios;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cutfs::{CutFs, Names};
use serde_json::{json, Value};

use crate::util::lessons;

/// How long a child may run on after the power is cut before it is killed anyway: what it does
/// then cannot matter (every request fails), so this only bounds the wait.
const GRACE: Duration = Duration::from_secs(3);
/// The scopes the writers spread over.
const SCOPES: [&str; 4] = [
    "repo:acme/app",
    "repo:acme/api",
    "org:acme",
    "channel:slack:C07",
];

/// The environment's knobs, read once per test.
struct Knobs {
    seed: u64,
    rounds: usize,
    durability: String,
    names: Names,
    keep: bool,
}

impl Knobs {
    fn read(scenario: &str, default_rounds: usize) -> Knobs {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let seed = crate::fixtures::rng::seed_from("LESSONS_POWER_SEED");
        let rounds = var("LESSONS_POWER_ROUNDS")
            .map(|s| s.parse().expect("LESSONS_POWER_ROUNDS is a number"))
            .unwrap_or(default_rounds);
        let durability = var("LESSONS_POWER_DURABILITY").unwrap_or_else(|| "sync".into());
        assert!(
            durability == "sync" || durability == "buffered",
            "LESSONS_POWER_DURABILITY is sync or buffered, not {durability:?}"
        );
        let names = match var("LESSONS_POWER_NAMES").as_deref() {
            None | Some("strict") => Names::Strict,
            Some("lenient") => Names::Lenient,
            Some(other) => panic!("LESSONS_POWER_NAMES is strict or lenient, not {other:?}"),
        };
        println!(
            "power loss, {scenario}: seed {seed} (LESSONS_POWER_SEED={seed} replays it), \
             {rounds} rounds, durability {durability}, names {names:?}"
        );
        Knobs {
            seed,
            rounds,
            durability,
            names,
            keep: var("LESSONS_POWER_KEEP").is_some(),
        }
    }
}

/// A write the store acknowledged: the CLI exited 0 and printed its answer, or `/write`
/// answered 200.
#[derive(Clone, Debug)]
struct Acked {
    tag: String,
    scope: String,
    texts: Vec<String>,
}

/// The four candidate texts of the write tagged `tag`: about 300 characters each, distinct
/// (the tag is a token of its own), lessons the gate lets through.
fn texts(tag: &str) -> Vec<String> {
    const BODIES: [&str; 4] = [
        "before the integration suite runs, warm the build cache and start the database \
         container, then seed the fixtures from the checked-in snapshot so the tests see the same \
         rows every time; keep the seed script idempotent and pin the image by its digest",
        "the release script reads the changelog from the top section only, so write each entry \
         under the unreleased heading and let the script move it; editing an older section by \
         hand makes the generated notes skip it and the tag message disagree with the file",
        "run the schema migrations with the service account, never with a personal login: the \
         migration tool records who applied each step and later steps refuse to run over one \
         applied by another role, which then needs a manual fix in the tracking table",
        "when the flaky upload test times out, look at the proxy settings of the runner first: \
         the test talks to the local object store through the proxy unless no_proxy lists the \
         loopback names, and the proxy drops large bodies after thirty seconds without a word",
    ];
    BODIES
        .iter()
        .enumerate()
        .map(|(k, body)| format!("lesson {tag}c{k}: {body} ({tag}c{k})"))
        .collect()
}

fn candidates(texts: &[String], thread: &str) -> Value {
    Value::Array(
        texts
            .iter()
            .map(|t| json!({"kind": "fact", "text": t, "sourceThreadKey": thread}))
            .collect(),
    )
}

/// Kills a child with SIGKILL when dropped, before the mount it runs on is unmounted.
struct Killed(Child);

impl Killed {
    /// Waits for the child to exit on its own; once the power is off it has `GRACE` more, then
    /// it is killed. Returns its status and whether it was killed.
    fn wait_or_kill(&mut self, fs: &CutFs, limit: Duration) -> (ExitStatus, bool) {
        let start = Instant::now();
        let mut cut_at: Option<Instant> = None;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return (status, false);
            }
            if cut_at.is_none() && fs.is_cut() {
                cut_at = Some(Instant::now());
            }
            let overdue = cut_at.is_some_and(|t| t.elapsed() > GRACE) || start.elapsed() > limit;
            if overdue {
                let _ = self.0.kill();
                return (self.0.wait().expect("reaped"), true);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    fn stdout(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut out) = self.0.stdout.take() {
            let _ = out.read_to_string(&mut s);
        }
        s
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut err) = self.0.stderr.take() {
            let _ = err.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One round's scratch directory and mount. Fields drop in order: the mount before the
/// directory that holds its backing files.
struct Rig {
    fs: CutFs,
    config: PathBuf,
    tmp: tempfile::TempDir,
}

impl Rig {
    fn new(knobs: &Knobs) -> Rig {
        let mut tmp = tempfile::tempdir().expect("scratch dir");
        if knobs.keep {
            tmp.disable_cleanup(true);
            println!("  keeping {}", tmp.path().display());
        }
        let config = tmp.path().join("config.json");
        std::fs::write(
            &config,
            json!({"durability": knobs.durability, "cap": 10000}).to_string(),
        )
        .expect("config");
        let fs = CutFs::mount(
            &tmp.path().join("mnt"),
            &tmp.path().join("backing"),
            knobs.names,
        )
        .expect("mounting the FUSE file system needs root and /dev/fuse (CI runs as root)");
        Rig { fs, config, tmp }
    }

    fn store(&self) -> PathBuf {
        self.tmp.path().join("mnt").join("store")
    }

    /// Starts `lessons write` of `texts` to `scope` on the mount.
    fn spawn_write(&self, scope: &str, texts: &[String]) -> Killed {
        let mut child = lessons()
            .arg("--store")
            .arg(self.store())
            .arg("--config")
            .arg(&self.config)
            .args(["write", "--scope", scope, "--json"])
            .env_remove("LESSONS_STORE")
            .current_dir(self.tmp.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lessons write starts");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // A child that fails before reading its input closes the pipe: its exit says why.
        let _ = stdin.write_all(candidates(texts, "slack:C07:1").to_string().as_bytes());
        drop(stdin);
        Killed(child)
    }

    /// Runs one `lessons write` to its end (or to the cut and `GRACE` after it): the write is
    /// acknowledged when the CLI exited 0 and printed its answer.
    fn write(&self, tag: &str, scope: &str) -> Result<Acked, String> {
        let texts = texts(tag);
        let mut child = self.spawn_write(scope, &texts);
        let (status, killed) = child.wait_or_kill(&self.fs, Duration::from_secs(120));
        let out = child.stdout();
        if status.success() && out.contains(r#""ok":true"#) {
            let inserted = serde_json::from_str::<Value>(out.trim())
                .ok()
                .and_then(|v| v["inserted"].as_u64());
            assert_eq!(
                inserted,
                Some(texts.len() as u64),
                "write {tag}: every candidate is a new lesson: {out}"
            );
            return Ok(Acked {
                tag: tag.to_owned(),
                scope: scope.to_owned(),
                texts,
            });
        }
        let err = child.stderr();
        Err(if killed {
            "killed after the cut".to_owned()
        } else {
            format!("{status}: {}", err.trim())
        })
    }

    /// A write that must be acknowledged: the power is on.
    fn write_ok(&self, tag: &str, scope: &str) -> Acked {
        self.write(tag, scope)
            .unwrap_or_else(|e| panic!("write {tag} before any cut failed: {e}"))
    }

    /// Writes the durable tree out (to `durable/`, kept as the cut left it) and checks a copy
    /// of it (`checked/`) with the binary.
    fn verdict(&self, acked: &[Acked], probe: &str) -> Verdict {
        let root = self.tmp.path().join("durable");
        self.fs
            .materialize(&root)
            .expect("materializing the durable tree");
        let checked = self.tmp.path().join("checked");
        crate::util::copy_tree(&root, &checked);
        check(
            &checked.join("store"),
            &self.config,
            self.tmp.path(),
            acked,
            probe,
        )
    }
}

/// Runs the binary on an ordinary directory (the durable tree) and returns its exit code,
/// stdout and stderr.
fn run(cwd: &Path, args: &[&std::ffi::OsStr], stdin: &str) -> (i32, String, String) {
    let mut command = lessons();
    command
        .args(args)
        .env_remove("LESSONS_STORE")
        .current_dir(cwd);
    let out = crate::util::run_with(command, stdin.as_bytes());
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What the durable tree held after a cut.
struct Verdict {
    store_survived: bool,
    /// Acknowledged writes with records missing: "tag (scope): k of n records missing".
    lost: Vec<String>,
    lost_writes: usize,
    /// `doctor`'s exit code and output (`None`: no store to check).
    doctor: Option<(i32, String)>,
    /// The records `export` read.
    records: usize,
    new_write: Result<(), String>,
}

impl Verdict {
    /// `doctor`'s verdict in a few words, for the tally.
    fn doctor_word(&self) -> String {
        match &self.doctor {
            None => "no store".to_owned(),
            Some((0, _)) => "consistent".to_owned(),
            Some((code, out)) => {
                // Its first line, without the counts before the verdict or the advice after it.
                let line = out
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .unwrap_or("");
                let verdict = line.split_once(": ").map_or(line, |(_, v)| v);
                let verdict = verdict.split(" (").next().unwrap_or(verdict);
                let short: String = verdict.chars().take(60).collect();
                format!("exit {code}: {short}")
            }
        }
    }

    fn problems(&self, acked: &[Acked]) -> Vec<String> {
        let mut out = Vec::new();
        if !self.store_survived && !acked.is_empty() {
            out.push(format!(
                "the store's directory did not survive, and {} writes had been acknowledged in it",
                acked.len()
            ));
        }
        if !self.lost.is_empty() {
            let shown = self.lost.len().min(10);
            let more = if self.lost.len() > shown {
                format!("; and {} more", self.lost.len() - shown)
            } else {
                String::new()
            };
            out.push(format!(
                "{} of {} acknowledged writes lost: {}{more}",
                self.lost_writes,
                acked.len(),
                self.lost[..shown].join("; ")
            ));
        }
        if let Some((code, text)) = &self.doctor {
            if *code != 0 {
                out.push(format!("doctor exited {code}:\n{}", indent(text)));
            }
        }
        if let Err(e) = &self.new_write {
            out.push(format!("a new write was refused: {e}"));
        }
        out
    }
}

fn indent(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let shown = lines.len().min(12);
    let mut out: Vec<String> = lines[..shown].iter().map(|l| format!("    {l}")).collect();
    if lines.len() > shown {
        out.push(format!("    … {} more lines", lines.len() - shown));
    }
    out.join("\n")
}

/// Checks a durable store with the binary: `doctor` first (before any other open can rewrite
/// what it reads), then every acknowledged text in `export`, then a new write.
fn check(store: &Path, config: &Path, cwd: &Path, acked: &[Acked], probe: &str) -> Verdict {
    let store_survived = store.join("records").exists();
    let s = store.as_os_str();
    let c = config.as_os_str();
    let doctor = store_survived.then(|| {
        let (code, out, err) = run(
            cwd,
            &[
                "--store".as_ref(),
                s,
                "--config".as_ref(),
                c,
                "doctor".as_ref(),
            ],
            "",
        );
        (code, format!("{out}{err}").trim().to_owned())
    });
    let mut present: BTreeSet<String> = BTreeSet::new();
    let mut records = 0;
    if store_survived {
        let (code, out, err) = run(cwd, &["--store".as_ref(), s, "export".as_ref()], "");
        assert_eq!(code, 0, "export of the durable store failed: {err}");
        for line in out.lines() {
            let v: Value = serde_json::from_str(line).expect("export writes JSON lines");
            if let Some(text) = v.get("text").and_then(Value::as_str) {
                records += 1;
                present.insert(text.to_owned());
            }
        }
    }
    let mut lost = Vec::new();
    for a in acked {
        let missing = a.texts.iter().filter(|t| !present.contains(*t)).count();
        if missing > 0 {
            lost.push(format!(
                "{} ({}): {missing} of {} records missing",
                a.tag,
                a.scope,
                a.texts.len()
            ));
        }
    }
    let probe = candidates(&texts(probe), "slack:C07:9").to_string();
    let (code, out, err) = run(
        cwd,
        &[
            "--store".as_ref(),
            s,
            "--config".as_ref(),
            c,
            "write".as_ref(),
            "--scope".as_ref(),
            "repo:acme/after".as_ref(),
            "--json".as_ref(),
        ],
        &probe,
    );
    let new_write = if code == 0 && out.contains(r#""inserted":4"#) {
        Ok(())
    } else {
        Err(format!("exit {code}: {}{}", out.trim(), err.trim()))
    };
    Verdict {
        store_survived,
        lost_writes: lost.len(),
        lost,
        doctor,
        records,
        new_write,
    }
}

/// Every round's result, and the failures to report at the end.
struct Tally {
    scenario: &'static str,
    seed: u64,
    rounds: usize,
    acked: usize,
    lost: usize,
    rounds_losing: usize,
    stores_missing: usize,
    doctor: BTreeMap<String, usize>,
    new_writes: usize,
    failures: Vec<String>,
}

impl Tally {
    fn new(scenario: &'static str, knobs: &Knobs) -> Tally {
        Tally {
            scenario,
            seed: knobs.seed,
            rounds: 0,
            acked: 0,
            lost: 0,
            rounds_losing: 0,
            stores_missing: 0,
            doctor: BTreeMap::new(),
            new_writes: 0,
            failures: Vec::new(),
        }
    }

    /// Checks the durable tree of `rig` after a cut described by `cut`.
    fn round(&mut self, round: usize, cut: &str, rig: &Rig, acked: &[Acked]) {
        let started = Instant::now();
        let v = rig.verdict(acked, &format!("probe{round}"));
        let took = started.elapsed();
        self.rounds += 1;
        self.acked += acked.len();
        self.lost += v.lost_writes;
        self.rounds_losing += usize::from(v.lost_writes > 0);
        self.stores_missing += usize::from(!v.store_survived);
        *self.doctor.entry(v.doctor_word()).or_default() += 1;
        self.new_writes += usize::from(v.new_write.is_ok());
        let problems = v.problems(acked);
        println!(
            "  round {round}: cut {cut}; {} acknowledged, {} lost; {} records; doctor: {}; new write {} (checked in {:.1} s)",
            acked.len(),
            v.lost_writes,
            v.records,
            v.doctor_word(),
            if v.new_write.is_ok() { "accepted" } else { "refused" },
            took.as_secs_f64()
        );
        if !problems.is_empty() {
            self.failures.push(format!(
                "round {round} (seed {}), cut {cut}:\n  {}",
                self.seed,
                problems.join("\n  ")
            ));
        }
    }

    /// Prints the totals and fails with every failing round.
    fn finish(self) {
        let doctor: Vec<String> = self
            .doctor
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        let summary = format!(
            "power loss, {}: {} rounds, {} acknowledged writes, {} lost (in {} rounds); store \
             directory missing {}; doctor: {}; new write accepted {}/{}",
            self.scenario,
            self.rounds,
            self.acked,
            self.lost,
            self.rounds_losing,
            self.stores_missing,
            doctor.join(", "),
            self.new_writes,
            self.rounds
        );
        println!("{summary}");
        assert!(
            self.failures.is_empty(),
            "{} of {} rounds failed (LESSONS_POWER_SEED={} replays them)\n{summary}\n{}",
            self.failures.len(),
            self.rounds,
            self.seed,
            self.failures.join("\n")
        );
    }
}
