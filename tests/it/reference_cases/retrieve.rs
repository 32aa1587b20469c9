//! The reference Worker's retrieval cases: whole-token matching inert to query syntax, BM25
//! ranking with recency, the candidate floor and token cap, and the bumps a retrieve makes.

use serde_json::{json, Value};

use super::{cand, cand_with, has, Worker, DAY, S};

#[test]
fn write_then_retrieve_ranks_by_keyword_and_recency() {
    let w = Worker::start();
    let v = w.ok(
        "/write",
        json!({"scopeKey": S, "records": [
            cand_with("the deploy command is npm run deploy", json!({"keywords": ["deploy", "npm"], "confidence": 0.9})),
            cand("vacation policy is 20 days"),
            {"kind": "summary", "text": "User asked how to deploy.", "sourceThreadKey": "slack:C1:1.0"},
        ]}),
    );
    has(
        &v,
        json!({"ok": true, "inserted": 3, "deduped": 0, "superseded": 0}),
    );
    let r = w.records(
        "/retrieve",
        json!({"scopeKey": S, "query": "how do we deploy", "limit": 8}),
    );
    let texts: Vec<&str> = r
        .iter()
        .map(|x| x["text"].as_str().expect("text"))
        .collect();
    assert_eq!(
        texts,
        [
            "User asked how to deploy.",
            "the deploy command is npm run deploy"
        ]
    );
    has(
        &r[1],
        json!({"id": format!("mem:{S}:0"), "scopeKey": S, "kind": "fact", "keywords": ["deploy", "npm"],
               "sourceThreadKey": "slack:C1:1.0", "sourceRunId": "run-1", "confidence": 0.9,
               "status": "active", "useCount": 1}),
    );
    assert!(r[1]["createdAt"].is_i64() && r[1]["lastUsedAt"].is_i64());
    assert!(r[0].get("sourceRunId").is_none() && r[0].get("confidence").is_none());
}

#[test]
fn retrieve_is_whole_token_and_inert_to_syntax() {
    let w = Worker::start();
    w.ok(
        "/write",
        json!({"scopeKey": S, "records": [cand("the deploy command is npm run deploy")]}),
    );
    let q = |q: &str| {
        w.records("/retrieve", json!({"scopeKey": S, "query": q, "limit": 8}))
            .len()
    };
    assert_eq!(q("a"), 0);
    assert_eq!(q("!!! ???"), 0);
    assert_eq!(q("COMMAND"), 1);
    for syntax in [
        "deploy\" OR \"x",
        "deploy AND NOT command",
        "deploy*",
        "(deploy)",
        "NEAR(deploy command)",
        "deploy:x",
    ] {
        assert!(q(syntax) > 0, "{syntax}");
    }
    // Another scope sees nothing.
    assert_eq!(
        w.records(
            "/retrieve",
            json!({"scopeKey": "org:other", "query": "deploy", "limit": 8})
        )
        .len(),
        0
    );
}

#[test]
fn retrieve_respects_the_limit_and_bumps_only_what_it_returns() {
    let w = Worker::start();
    w.ok(
        "/write",
        json!({"scopeKey": S, "records": [cand("deploy variant one"), cand("deploy variant two"), cand("deploy variant three")]}),
    );
    assert_eq!(
        w.records(
            "/retrieve",
            json!({"scopeKey": S, "query": "deploy", "limit": 2})
        )
        .len(),
        2
    );
    let mut counts: Vec<i64> = w
        .records(
            "/retrieve",
            json!({"scopeKey": S, "query": "deploy variant", "limit": 8}),
        )
        .iter()
        .map(|r| r["useCount"].as_i64().expect("count"))
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, [1, 2, 2]);
}

#[test]
fn non_ascii_text_is_found_by_its_ascii_tokens() {
    let w = Worker::start();
    let text = "le déploiement se fait avec npm run deploy — ça marche";
    w.ok("/write", json!({"scopeKey": S, "records": [cand(text)]}));
    assert_eq!(
        w.texts(
            "/retrieve",
            json!({"scopeKey": S, "query": "npm deploy", "limit": 8})
        ),
        [text]
    );
    for q in ["déploiement", "ça"] {
        assert_eq!(
            w.post("/retrieve", json!({"scopeKey": S, "query": q, "limit": 8}))
                .0,
            200
        );
    }
}

#[test]
fn bm25_rescues_a_relevant_old_record_from_recent_weak_matches() {
    let w = Worker::start();
    let strong = "vibranium deploy pipeline uses vibranium keys";
    w.ok(
        "/write",
        json!({"scopeKey": S, "records": [cand(strong)], "cap": 10000}),
    );
    w.clock.advance(30 * DAY);
    for chunk in (0..505).collect::<Vec<_>>().chunks(50) {
        let records: Vec<Value> = chunk
            .iter()
            .map(|i| {
                cand(&format!(
                    "deploy filler note {i} about pipelines rollouts and other routine chatter"
                ))
            })
            .collect();
        w.ok(
            "/write",
            json!({"scopeKey": S, "records": records, "cap": 10000}),
        );
    }
    let texts = w.texts(
        "/retrieve",
        json!({"scopeKey": S, "query": "vibranium deploy", "limit": 8}),
    );
    assert_eq!(texts.first().map(String::as_str), Some(strong));
}

#[test]
fn the_50_candidate_floor_hands_the_ranker_every_match_of_a_small_scope() {
    let w = Worker::start();
    let records: Vec<Value> = (0..39)
        .map(|i| cand(&format!("gamma gamma gamma gamma {i}")))
        .collect();
    w.ok("/write", json!({"scopeKey": S, "records": records}));
    w.clock.advance(20 * DAY);
    let pads: Vec<String> = (0..40).map(|i| format!("pad{i}")).collect();
    let target = format!("gamma {}", pads.join(" "));
    w.ok("/write", json!({"scopeKey": S, "records": [cand(&target)]}));
    assert_eq!(
        w.texts(
            "/retrieve",
            json!({"scopeKey": S, "query": "gamma", "limit": 1})
        ),
        [target]
    );
}

#[test]
fn the_match_keeps_the_24_longest_distinct_tokens() {
    let w = Worker::start();
    w.ok(
        "/write",
        json!({"scopeKey": S, "records": [cand("zzqx protocol notes")]}),
    );
    let junk = |len: usize| -> Vec<String> {
        (0..29)
            .map(|i| format!("j{:x>width$}", i, width = len - 1))
            .collect()
    };
    let kept = format!("{} zzqxzzqx protocol", junk(3).join(" "));
    assert_eq!(
        w.records(
            "/retrieve",
            json!({"scopeKey": S, "query": kept, "limit": 8})
        )
        .len(),
        1
    );
    let dropped = format!("{} zzqx", junk(6).join(" "));
    assert_eq!(
        w.records(
            "/retrieve",
            json!({"scopeKey": S, "query": dropped, "limit": 8})
        )
        .len(),
        0
    );
}

#[test]
fn every_returned_record_is_bumped_even_at_the_limit() {
    let w = Worker::start();
    let records: Vec<Value> = (0..50).map(|i| cand(&format!("deploy fact {i}"))).collect();
    w.ok("/write", json!({"scopeKey": S, "records": records}));
    let more: Vec<Value> = (50..55)
        .map(|i| cand(&format!("deploy fact {i}")))
        .collect();
    w.ok("/write", json!({"scopeKey": S, "records": more}));
    let r = w.records(
        "/retrieve",
        json!({"scopeKey": S, "query": "deploy fact", "limit": 50}),
    );
    assert_eq!(r.len(), 50);
    assert!(r
        .iter()
        .all(|x| x["useCount"] == 1 && x["lastUsedAt"].is_i64()));
}

#[test]
fn retired_records_stop_matching_at_once() {
    let w = Worker::start();
    // Forget, supersede and eviction each take the record out of retrieve's reach.
    w.ok(
        "/write",
        json!({"scopeKey": S, "records": [cand("keep this fact"), cand("drop this fact")]}),
    );
    w.ok(
        "/forget",
        json!({"scopeKey": S, "id": format!("mem:{S}:1")}),
    );
    assert_eq!(
        w.texts(
            "/retrieve",
            json!({"scopeKey": S, "query": "fact", "limit": 8})
        ),
        ["keep this fact"]
    );
    let s = "org:evict";
    w.ok("/write", json!({"scopeKey": s, "records": [cand("alpha note"), cand("beta note"), cand("gamma note")], "cap": 3}));
    has(
        &w.ok(
            "/write",
            json!({"scopeKey": s, "records": [cand("delta note"), cand("epsilon note")], "cap": 3}),
        ),
        json!({"inserted": 2, "evicted": 2}),
    );
    assert_eq!(
        w.records(
            "/retrieve",
            json!({"scopeKey": s, "query": "note", "limit": 8})
        )
        .len(),
        3
    );
}
