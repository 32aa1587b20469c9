//! What the server counts: requests and latency per route, and the store's day counters, as
//! Prometheus text; and the daily rollup lines.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::store::MemoryStore;
use crate::time::format_day;

/// Latency histogram bucket bounds, in seconds.
pub(super) const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

#[derive(Default)]
pub(super) struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
pub(super) struct Metrics {
    requests: BTreeMap<(String, u16), u64>,
    latency: BTreeMap<String, Histogram>,
}

impl Metrics {
    pub(super) fn observe(&mut self, route: &str, status: u16, seconds: f64) {
        *self.requests.entry((route.to_owned(), status)).or_default() += 1;
        let h = self.latency.entry(route.to_owned()).or_default();
        for (count, bound) in h.counts.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *count += 1;
            }
        }
        h.count += 1;
        h.sum += seconds;
    }
}

pub(super) async fn metrics_response(state: &Arc<AppState>) -> Response {
    let worker = Arc::clone(state);
    let days = state
        .lanes
        .call(super::lanes::Lane::Operator, move || {
            worker.store.stats(i64::MIN)
        })
        .await;
    let mut out = String::new();
    out.push_str("# HELP lessons_requests_total Requests by route and status.\n# TYPE lessons_requests_total counter\n");
    let (requests, latency) = {
        let m = state.metrics.lock();
        let requests: Vec<((String, u16), u64)> =
            m.requests.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let latency: Vec<(String, [u64; BUCKETS.len()], u64, f64)> = m
            .latency
            .iter()
            .map(|(k, h)| (k.clone(), h.counts, h.count, h.sum))
            .collect();
        (requests, latency)
    };
    for ((route, status), n) in requests {
        out.push_str(&format!(
            "lessons_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}\n"
        ));
    }
    out.push_str("# HELP lessons_request_seconds Request latency by route, to the answer's head (a streamed /export or /review goes on after it).\n# TYPE lessons_request_seconds histogram\n");
    for (route, counts, count, sum) in latency {
        for (bound, c) in BUCKETS.iter().zip(counts) {
            out.push_str(&format!(
                "lessons_request_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {c}\n"
            ));
        }
        out.push_str(&format!(
            "lessons_request_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {count}\n"
        ));
        out.push_str(&format!(
            "lessons_request_seconds_sum{{route=\"{route}\"}} {sum}\n"
        ));
        out.push_str(&format!(
            "lessons_request_seconds_count{{route=\"{route}\"}} {count}\n"
        ));
    }
    memory_gauges(&mut out, state.store.memory());
    upkeep_gauges(&mut out, state.store.upkeep());
    if let Some(Ok(days)) = days {
        let mut totals: BTreeMap<String, crate::store::DayCounters> = BTreeMap::new();
        for d in days {
            totals
                .entry(d.scope_key.as_str().to_owned())
                .or_default()
                .merge(&d.counters);
        }
        out.push_str("# HELP lessons_memory_total What the store did, per scope, since it was created.\n# TYPE lessons_memory_total counter\n");
        for (scope, c) in totals {
            let scope = scope.replace('\\', "\\\\").replace('"', "\\\"");
            for (name, n) in c.events() {
                out.push_str(&format!(
                    "lessons_memory_total{{scope=\"{scope}\",event=\"{name}\"}} {n}\n"
                ));
            }
            for (marker, n) in &c.rejected_by {
                out.push_str(&format!(
                    "lessons_memory_rejected_total{{scope=\"{scope}\",marker=\"{marker}\"}} {n}\n"
                ));
            }
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        out,
    )
        .into_response()
}

/// The process's resident memory and what the store accounts for of it, by part: the gap is
/// the allocator's free space, tantivy's merges and searchers, and request buffers.
fn memory_gauges(out: &mut String, held: Option<crate::store::MemoryUse>) {
    if let Some(bytes) = resident_bytes() {
        out.push_str("# HELP lessons_resident_bytes The process's resident memory.\n# TYPE lessons_resident_bytes gauge\n");
        out.push_str(&format!("lessons_resident_bytes {bytes}\n"));
    }
    // jemalloc's counts, when it is built in.
    #[cfg(feature = "jemalloc")]
    if let Some(heap) = crate::allocator::heap() {
        for (name, help, bytes) in [
            (
                "lessons_allocated_bytes",
                "The heap's live allocations (jemalloc's count).",
                heap.allocated,
            ),
            (
                "lessons_allocator_active_bytes",
                "The heap's pages holding a live allocation (jemalloc's count).",
                heap.active,
            ),
            (
                "lessons_allocator_metadata_bytes",
                "The allocator's own bookkeeping (jemalloc's count).",
                heap.metadata,
            ),
            (
                "lessons_allocator_resident_bytes",
                "The heap's resident pages, live or free (jemalloc's count).",
                heap.resident,
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {bytes}\n"
            ));
        }
    }
    let Some(m) = held else { return };
    out.push_str("# HELP lessons_held_bytes What the store holds in memory, by part.\n# TYPE lessons_held_bytes gauge\n");
    for (part, bytes) in [
        ("memtables", m.memtables),
        ("block_cache", m.block_cache),
        ("scope_map", m.scope_map),
        ("index_writer_heap", m.index_writer_heap),
    ] {
        out.push_str(&format!("lessons_held_bytes{{part=\"{part}\"}} {bytes}\n"));
    }
    out.push_str("# HELP lessons_held_budget_bytes The bound each held part is kept within.\n# TYPE lessons_held_budget_bytes gauge\n");
    for (part, bytes) in [
        ("block_cache", m.block_cache_capacity),
        ("scope_map", m.scope_map_budget),
        ("index_writer_heap", m.index_writer_heap),
    ] {
        out.push_str(&format!(
            "lessons_held_budget_bytes{{part=\"{part}\"}} {bytes}\n"
        ));
    }
    out.push_str("# HELP lessons_index_pending_changes Index changes waiting for the next commit.\n# TYPE lessons_index_pending_changes gauge\n");
    out.push_str(&format!(
        "lessons_index_pending_changes {}\n",
        m.index_pending_changes
    ));
}

/// The storage engine's background work: a write's tail and a read's cost move with it.
fn upkeep_gauges(out: &mut String, upkeep: Option<crate::store::Upkeep>) {
    let Some(u) = upkeep else { return };
    for (name, kind, help, value) in [
        (
            "lessons_flushes_waiting",
            "gauge",
            "Sealed memtables waiting to be written out as tables.",
            u.flushes_waiting as f64,
        ),
        (
            "lessons_compactions_running",
            "gauge",
            "Compactions running now.",
            u.compactions_running as f64,
        ),
        (
            "lessons_compactions_total",
            "counter",
            "Compactions finished since the store opened.",
            u.compactions_done as f64,
        ),
        (
            "lessons_compaction_seconds_total",
            "counter",
            "Time spent compacting since the store opened.",
            u.compacting_micros as f64 / 1e6,
        ),
        (
            "lessons_uses_waiting",
            "gauge",
            "Retrieves' use bumps applied in memory and not yet committed to the records.",
            u.uses_waiting as f64,
        ),
        (
            "lessons_journal_fsyncs_total",
            "counter",
            "The journal's group fsyncs since the store opened (each makes every write appended before it durable; an index commit makes one too).",
            u.journal_syncs.count() as f64,
        ),
        (
            "lessons_journal_fsync_seconds_total",
            "counter",
            "Time spent in those fsyncs by the thread that ran each: the disk's answer and, on a busy machine, the wait for a CPU after it.",
            u.journal_syncs.total().as_secs_f64(),
        ),
    ] {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    }
}

/// Resident memory from `/proc/self/status` (its `VmRSS` line, in KiB); `None` where there is no
/// such file.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One `[memory] day …` line per scope for `day`: counts only.
pub fn rollup_lines(store: &dyn MemoryStore, day: i64) -> crate::error::Result<Vec<String>> {
    Ok(store
        .stats(day)?
        .into_iter()
        .filter(|d| d.day == format_day(day))
        .map(|d| {
            format!(
                "[memory] day {} {}: {}",
                d.day,
                d.scope_key,
                d.counters.line(false)
            )
        })
        .collect())
}
