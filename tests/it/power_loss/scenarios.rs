//! Where the power is cut: during the first write of a fresh store, mid CLI write on a store
//! holding acknowledged batches, during an index commit, and under `lessons serve` with four
//! HTTP writers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::cutfs::Trigger;
use super::{candidates, texts, Acked, Knobs, Rig, Tally, GRACE, SCOPES};
use crate::fixtures::rng::Rng;
use crate::fixtures::server::{Serve, TOKEN};

/// Mutations a dry run of `write` makes (after `before` ran), counted as `trigger` counts them
/// (with `n` never reached).
fn dry_run(knobs: &Knobs, before: usize, prefix: Option<&str>) -> u64 {
    let rig = Rig::new(knobs);
    for i in 0..before {
        rig.write_ok(&format!("dry{i}"), SCOPES[i % SCOPES.len()]);
    }
    rig.fs.arm(Trigger::AfterOps {
        n: u64::MAX,
        prefix: prefix.map(str::to_owned),
    });
    rig.write_ok("dry", SCOPES[0]);
    let n = rig.fs.counted();
    assert!(n > 0, "a dry run counted no mutations");
    n
}

#[test]
#[ignore = "needs root and /dev/fuse: mounts a FUSE file system"]
fn power_loss_during_the_first_write_of_a_fresh_store() {
    let knobs = Knobs::read("first write of a fresh store", 10);
    let mut rng = Rng::new(knobs.seed);
    let total = dry_run(&knobs, 0, None);
    println!("  the first write makes {total} mutations (dry run)");
    let mut tally = Tally::new("first write of a fresh store", &knobs);
    for round in 0..knobs.rounds {
        // The CLI acknowledges at its very end, after its close: one round in three cuts right
        // after that, the others anywhere in the write.
        let after_ack = rng.below(3) == 0;
        let n = if after_ack {
            u64::MAX
        } else {
            rng.between(1, total)
        };
        let rig = Rig::new(&knobs);
        rig.fs.arm(Trigger::AfterOps { n, prefix: None });
        let scope = SCOPES[round % SCOPES.len()];
        let acked: Vec<Acked> = rig.write(&format!("f{round}"), scope).into_iter().collect();
        rig.fs.cut();
        let cut = if after_ack {
            format!("after the write ended ({} mutations)", rig.fs.counted())
        } else {
            format!("after mutation {n} of about {total}")
        };
        tally.round(round, &cut, &rig, &acked);
    }
    tally.finish();
}

#[test]
#[ignore = "needs root and /dev/fuse: mounts a FUSE file system"]
fn power_loss_mid_cli_write_after_acknowledged_batches() {
    let knobs = Knobs::read("mid CLI write", 8);
    let mut rng = Rng::new(knobs.seed ^ 0x2);
    let total = dry_run(&knobs, 2, None);
    println!("  a write to a store holding two batches makes {total} mutations (dry run)");
    let mut tally = Tally::new("mid CLI write", &knobs);
    for round in 0..knobs.rounds {
        let before = rng.between(1, 3) as usize;
        let n = rng.between(1, total + total / 10);
        let rig = Rig::new(&knobs);
        let mut acked: Vec<Acked> = (0..before)
            .map(|i| rig.write_ok(&format!("m{round}b{i}"), SCOPES[(round + i) % SCOPES.len()]))
            .collect();
        rig.fs.arm(Trigger::AfterOps { n, prefix: None });
        let scope = SCOPES[(round + before) % SCOPES.len()];
        acked.extend(rig.write(&format!("m{round}"), scope));
        rig.fs.cut();
        tally.round(
            round,
            &format!(
                "after {before} acknowledged writes, at mutation {n} of about {total} of the next"
            ),
            &rig,
            &acked,
        );
    }
    tally.finish();
}

#[test]
#[ignore = "needs root and /dev/fuse: mounts a FUSE file system"]
fn power_loss_during_an_index_commit() {
    let knobs = Knobs::read("index commit", 8);
    let mut rng = Rng::new(knobs.seed ^ 0x4);
    const INDEX: &str = "store/index/";
    let total = dry_run(&knobs, 1, Some(INDEX));
    println!("  a write's close makes {total} mutations under {INDEX} (dry run)");
    let mut tally = Tally::new("index commit", &knobs);
    for round in 0..knobs.rounds {
        let n = rng.between(1, total);
        let rig = Rig::new(&knobs);
        let mut acked = vec![rig.write_ok(&format!("i{round}b"), SCOPES[round % SCOPES.len()])];
        rig.fs.arm(Trigger::AfterOps {
            n,
            prefix: Some(INDEX.to_owned()),
        });
        acked.extend(rig.write(&format!("i{round}"), SCOPES[(round + 1) % SCOPES.len()]));
        rig.fs.cut();
        tally.round(
            round,
            &format!("at mutation {n} of about {total} under {INDEX} of the second write"),
            &rig,
            &acked,
        );
    }
    tally.finish();
}

/// One HTTP writer: `/write`s of four candidates, round robin over the scopes, until a write is
/// not answered 200 or `stop` is set; each 200 is an acknowledgement.
fn http_writer(
    url: String,
    w: usize,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            return format!("writer {w}: stopped after {n} writes");
        }
        let tag = format!("w{w}n{n}");
        let scope = SCOPES[(w + n) % SCOPES.len()];
        let texts = texts(&tag);
        let body =
            json!({"scopeKey": scope, "records": candidates(&texts, &format!("slack:C07:{w}"))});
        let answer = agent
            .post(format!("{url}/write"))
            .header("authorization", &format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes());
        let mut resp = match answer {
            Ok(resp) => resp,
            Err(e) => return format!("writer {w}: write {n}: {e}"),
        };
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if status != 200 {
            return format!("writer {w}: write {n}: {status} {text}");
        }
        let inserted = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["inserted"].as_u64());
        assert_eq!(
            inserted,
            Some(4),
            "write {tag}: every candidate is a new lesson: {text}"
        );
        acked.lock().expect("acks").push(Acked {
            tag,
            scope: scope.to_owned(),
            texts,
        });
    }
    unreachable!("the loop ends by returning")
}

/// The journals and tables the live tree holds: (journal files, the newest journal's number,
/// tables, tables created as the keyspaces' table ids tell).
fn engine_files(paths: &[String]) -> (usize, u64, usize, u64) {
    let mut journals = 0;
    let mut newest = 0;
    let mut tables = 0;
    let mut next_table: BTreeMap<&str, u64> = BTreeMap::new();
    for p in paths {
        if let Some(n) = p
            .strip_prefix("store/records/")
            .and_then(|f| f.strip_suffix(".jnl"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            journals += 1;
            newest = newest.max(n);
        }
        if let Some((ks, id)) = p.rsplit_once("/tables/") {
            if let Ok(id) = id.parse::<u64>() {
                tables += 1;
                let next = next_table.entry(ks).or_default();
                *next = (*next).max(id + 1);
            }
        }
    }
    (journals, newest, tables, next_table.values().sum())
}

#[test]
#[ignore = "needs root and /dev/fuse: mounts a FUSE file system"]
fn power_loss_under_serve_with_four_writers() {
    let knobs = Knobs::read("serve, four writers", 4);
    let mut rng = Rng::new(knobs.seed ^ 0x8);
    // fjall flushes a memtable after some 5,000 of these writes and rotates its journal at the
    // first flush past 64 MB of journal (some 10,000), about 14 and 26 s in on this mount with
    // a debug build: the default reaches neither, to keep `cargo test` short;
    // `LESSONS_POWER_SERVE_SECS=40` cuts up to 40 s in and reaches both.
    let longest: u64 = std::env::var("LESSONS_POWER_SERVE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    println!("  cuts between 0.4 and {longest} s after the server answers");
    let mut tally = Tally::new("serve, four writers", &knobs);
    let mut busiest = (0, 0, 0, 0);
    for round in 0..knobs.rounds {
        let at = Duration::from_millis(rng.between(400, longest * 1000));
        let rig = Rig::new(&knobs);
        let log = std::fs::File::create(rig.tmp.path().join("serve.log")).expect("log");
        let config = rig.config.to_str().expect("utf-8 path").to_owned();
        let mut server = Serve::command(&rig.store())
            .args(&["--config", &config])
            .stderr(log)
            .start();
        let url = server.url.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Vec::new()));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (url, stop, shared) = (url.clone(), Arc::clone(&stop), Arc::clone(&shared));
                std::thread::spawn(move || http_writer(url, w, stop, shared))
            })
            .collect();
        std::thread::sleep(at);
        rig.fs.cut();
        let (journals, newest, tables, created) = engine_files(&rig.fs.live_paths());
        // The writers see the power go out (500, then a server that drains and exits); what
        // they were answered until then is what the store acknowledged.
        let deadline = Instant::now() + GRACE;
        while writers.iter().any(|w| !w.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        server.kill();
        stop.store(true, Ordering::SeqCst);
        let ends: Vec<String> = writers
            .into_iter()
            .map(|w| w.join().expect("a writer thread"))
            .collect();
        let acked = shared.lock().expect("acks").clone();
        busiest = busiest.max((newest as usize, journals, created as usize, tables));
        let cut = format!(
            "at {:.2} s: {journals} journals live (newest {newest}.jnl), {tables} tables live, \
             {created} created",
            at.as_secs_f64()
        );
        println!("  round {round}: {}", ends.join("; "));
        tally.round(round, &cut, &rig, &acked);
    }
    println!(
        "  the busiest cut: newest journal {}.jnl ({} live), {} tables created ({} live)",
        busiest.0, busiest.1, busiest.2, busiest.3
    );
    tally.finish();
}
