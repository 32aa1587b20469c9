//! The disk's floor: a raw 4 KiB append and `fdatasync` of one file, the least a durable write
//! costs on the disk measured. Alone, beside threads that only keep the CPU busy, and at an
//! open loop's arrivals; and the machine's own floor at those arrivals, a worker's wake-up
//! with no work at all.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::phases::{drive_open, Op};
use super::{p50_p99, Arrivals, Rng, Tail};

/// A raw 4 KiB append and `fdatasync`, `n` times, in `dir`, while `busy` threads keep the CPU
/// busy without touching the disk. With none, this is the disk's floor. With some, the disk's
/// part is the same and what the wall clock adds is the wait for a CPU once the disk has
/// answered: the wait a write under 8 writers on few cores also pays.
pub fn floor_beside(dir: &Path, n: usize, busy: usize) -> (Duration, Duration) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..busy {
            s.spawn(|| {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            });
        }
        let timed = timed_appends(dir, n);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        timed
    })
}

/// The disk's floor at an open loop's load: each arrival a raw 4 KiB append and `fdatasync`
/// of one file, by the open loop's workers, timed from when it was due. An idle disk answers
/// a lone request more slowly than one kept busy (the closed loop's floor above), and this is
/// the part of a write's tail no store on this disk can remove.
pub fn floor_open(dir: &Path, arrivals: Arrivals, workers: usize) -> Tail {
    let path = dir.join("floor-open.bin");
    let file = std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("floor file"),
    );
    let file = Arc::new(file);
    let op: Op = Arc::new(move |_: &mut Rng, _: usize| {
        let mut f = file.lock().expect("floor file");
        f.write_all(&[0x5au8; 4096]).expect("append");
        f.sync_data().expect("fdatasync");
        None
    });
    let (_, writes) = drive_open(workers, arrivals, 1, op);
    std::fs::remove_file(path).expect("remove");
    Tail::of(writes.iter().map(|w| w.0).collect())
}

/// The machine's floor at an open loop's load: each arrival does nothing, so what is timed
/// from its due time is only how late a sleeping worker wakes (the timer, the scheduler, and
/// on a virtual machine a halted virtual CPU's wake-up). Every write of the open loop starts
/// with this wake-up, the floor's and both engines' alike: its tail is the part of theirs no
/// store and no disk removes.
pub fn wake_open(arrivals: Arrivals, workers: usize) -> Tail {
    let op: Op = Arc::new(|_: &mut Rng, _: usize| None);
    let (_, woken) = drive_open(workers, arrivals, 1, op);
    Tail::of(woken.iter().map(|w| w.0).collect())
}

fn timed_appends(dir: &Path, n: usize) -> (Duration, Duration) {
    let path = dir.join("floor.bin");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("floor file");
    let block = [0x5au8; 4096];
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        file.write_all(&block).expect("append");
        file.sync_data().expect("fdatasync");
        samples.push(t.elapsed());
    }
    drop(file);
    std::fs::remove_file(path).expect("remove");
    p50_p99(samples)
}
