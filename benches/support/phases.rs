//! What a write bench records of each write: how its thread spent it (the kernel's
//! `schedstat`), lessons' phases of it, and for an open loop its wait for a worker; and the
//! open loop's driver.

use std::sync::Arc;
use std::time::Duration;

use lessons::internals::WritePhases;

use super::{Arrivals, Rng};

/// A call on scope `s` (an index into the scopes), answering `T`.
pub type Call<T> = Arc<dyn Fn(&mut Rng, usize) -> T + Send + Sync>;

/// A write to scope `s`, answering lessons' phases of it.
pub type Op = Call<Option<WritePhases>>;

/// The rows of a table of how threads spent calls, in the order `sched_table` and the closed
/// loop's table fill them.
pub const SCHED_ROWS: [&str; 3] = [
    "on a CPU",
    "runnable, waiting for a CPU",
    "asleep (the disk, a lock, a condition variable)",
];

/// How a thread spent one call, by the kernel's count (`/proc/thread-self/schedstat`): on a
/// CPU, and runnable but waiting for one. The rest of the call it slept.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sched {
    pub on_cpu: Duration,
    pub waiting: Duration,
}

/// The calling thread's `schedstat`, opened once and read again in place (a `pread`, a few
/// microseconds, the same for both engines). `None` where the kernel has none.
pub struct ThreadClock(Option<std::fs::File>);

impl ThreadClock {
    pub fn open() -> ThreadClock {
        ThreadClock(std::fs::File::open("/proc/thread-self/schedstat").ok())
    }

    /// Nanoseconds on a CPU and waiting for one, so far.
    pub fn read(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.0.as_ref()?.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        Some((fields.next()??, fields.next()??))
    }

    pub fn since(&self, before: Option<(u64, u64)>) -> Option<Sched> {
        let (on0, wait0) = before?;
        let (on1, wait1) = self.read()?;
        Some(Sched {
            on_cpu: Duration::from_nanos(on1.saturating_sub(on0)),
            waiting: Duration::from_nanos(wait1.saturating_sub(wait0)),
        })
    }
}

/// One write of an open loop: its latency from when it was due, how long it waited for a
/// worker to start it, lessons' phases of it, and how its worker spent it.
pub type Arrival = (Duration, Duration, Option<WritePhases>, Option<Sched>);

/// Runs `op` on random scopes of `scopes` as `arrivals` come due, on `workers` threads:
/// the achieved rate and each write.
pub fn drive_open(
    workers: usize,
    arrivals: Arrivals,
    scopes: usize,
    op: Op,
) -> (f64, Vec<Arrival>) {
    let arrivals = Arc::new(arrivals);
    let workers: Vec<_> = (0..workers)
        .map(|k| {
            let (arrivals, op) = (Arc::clone(&arrivals), Arc::clone(&op));
            std::thread::spawn(move || {
                let mut rng = Rng(5_000 + k as u64);
                let mut out = Vec::new();
                let clock = ThreadClock::open();
                while let Some(due) = arrivals.next() {
                    let late = due.elapsed();
                    let s = rng.below(scopes);
                    let before = clock.read();
                    let phases = op(&mut rng, s);
                    out.push((due.elapsed(), late, phases, clock.since(before)));
                }
                out
            })
        })
        .collect();
    let writes: Vec<Arrival> = workers
        .into_iter()
        .flat_map(|h| h.join().expect("worker"))
        .collect();
    let rate = writes.len() as f64 / arrivals.start().elapsed().as_secs_f64();
    (rate, writes)
}

/// The phases' shares of the summed time of `samples`.
pub fn shares(samples: &[&WritePhases]) -> Vec<(&'static str, f64)> {
    let total: f64 = samples.iter().map(|p| p.total.as_secs_f64()).sum();
    let mut out: Vec<(&'static str, f64)> = WritePhases::default()
        .named()
        .iter()
        .map(|(name, _)| (*name, 0.0))
        .collect();
    for p in samples {
        for (slot, (_, d)) in out.iter_mut().zip(p.named()) {
            slot.1 += d.as_secs_f64();
        }
    }
    let named: f64 = out.iter().map(|(_, v)| v).sum();
    out.push(("(unnamed)", (total - named).max(0.0)));
    for slot in &mut out {
        slot.1 = if total > 0.0 { slot.1 / total } else { 0.0 };
    }
    out
}

/// The shares of each engine phase (and of the wait for a worker) in the time of each set of
/// open-loop writes, a column per offered load.
pub fn phase_table(title: &str, sets: &[(f64, Vec<Arrival>)]) {
    println!("\n{title}\n");
    let header: Vec<String> = sets
        .iter()
        .map(|(offered, w)| format!("{offered:.0}/s ({} writes)", w.len()))
        .collect();
    println!("| phase | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(sets.len()));
    let tables: Vec<(f64, Vec<(&'static str, f64)>)> = sets
        .iter()
        .map(|(_, writes)| {
            let total: f64 = writes.iter().map(|w| w.0.as_secs_f64()).sum();
            let late: f64 = writes.iter().map(|w| w.1.as_secs_f64()).sum();
            let phases: Vec<&WritePhases> = writes.iter().filter_map(|w| w.2.as_ref()).collect();
            let written: f64 = phases.iter().map(|p| p.total.as_secs_f64()).sum();
            // The phases' shares of the writes' own time, scaled to their share of the whole.
            let scale = if total > 0.0 { written / total } else { 0.0 };
            let shares = shares(&phases)
                .into_iter()
                .map(|(name, v)| (name, v * scale))
                .collect();
            (if total > 0.0 { late / total } else { 0.0 }, shares)
        })
        .collect();
    let cells: Vec<String> = tables
        .iter()
        .map(|(late, _)| format!("{:.1}%", 100.0 * late))
        .collect();
    println!("| waiting for a worker (late) | {} |", cells.join(" | "));
    for (i, (name, _)) in WritePhases::default().named().iter().enumerate() {
        let cells: Vec<String> = tables
            .iter()
            .map(|(_, shares)| format!("{:.1}%", 100.0 * shares[i].1))
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
}

/// How the workers spent each set of open-loop writes from when they started them: on a CPU,
/// runnable but waiting for one, asleep (the disk, a lock, a condition variable); a column per
/// offered load. `None` where the kernel keeps no `schedstat`.
pub fn sched_table(title: &str, sets: &[(f64, Vec<Arrival>)]) {
    let mut columns = Vec::new();
    for (offered, writes) in sets {
        let own: f64 = writes
            .iter()
            .map(|w| w.0.saturating_sub(w.1).as_secs_f64())
            .sum();
        let (mut on, mut waiting) = (0.0, 0.0);
        for w in writes {
            let Some(s) = w.3 else { return };
            on += s.on_cpu.as_secs_f64();
            waiting += s.waiting.as_secs_f64();
        }
        let own = own.max(f64::MIN_POSITIVE);
        columns.push((
            format!("{offered:.0}/s ({} writes)", writes.len()),
            [
                on / own,
                waiting / own,
                (1.0 - (on + waiting) / own).max(0.0),
            ],
        ));
    }
    println!("\n{title}\n");
    let header: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    println!("| the worker was | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(columns.len()));
    for (i, name) in SCHED_ROWS.iter().enumerate() {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| format!("{:.1}%", 100.0 * c.1[i]))
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
}
