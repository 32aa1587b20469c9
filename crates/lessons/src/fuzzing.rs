//! Fuzz target bodies, shared by `fuzz/` (libFuzzer) and the stable test that replays the
//! committed corpus, so both check the same properties.

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use crate::gate::rejection_markers;

/// The gate on arbitrary bytes: total, deterministic, markers in report order without repeats,
/// and the same markers as the reference's patterns read plainly.
pub fn gate(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let markers = rejection_markers(&text);
    assert!(
        markers.is_sorted() && markers.windows(2).all(|w| w.first() != w.get(1)),
        "markers out of order: {markers:?}"
    );
    assert_eq!(
        markers,
        rejection_markers(&text),
        "gate is not deterministic"
    );
    assert_eq!(
        markers,
        crate::gate::model::markers(&text),
        "the scanners and the reference's patterns disagree on {text:?}"
    );
}

/// The extractor-reply parser on arbitrary bytes: never panics, and what it accepts obeys the
/// rules (at most five facts, none carrying a marker, pointers only into the shown set,
/// keywords lowercased and at most ten, counts that add up).
pub fn reflection(data: &[u8]) {
    use crate::reflect::{parse_reflection, Shown, MAX_FACTS, MAX_FACT_KEYWORDS};
    let reply = String::from_utf8_lossy(data);
    let shown = [
        Shown {
            handle: "1".into(),
            id: "mem:repo:acme/app:3".into(),
        },
        Shown {
            handle: "2".into(),
            id: "mem:org:acme:0".into(),
        },
    ];
    let r = parse_reflection(&reply, &shown);
    assert!(r.facts.len() <= MAX_FACTS);
    assert!(r.facts.len() as u64 + r.tally.rejected + r.dropped <= r.tally.offered);
    for f in &r.facts {
        assert!(
            rejection_markers(&f.text).is_empty(),
            "an accepted fact carries a marker"
        );
        assert!(!f.text.trim().is_empty());
        assert!(f.keywords.len() <= MAX_FACT_KEYWORDS);
        assert!(f.keywords.iter().all(|k| *k == k.to_lowercase()));
        for p in [&f.restates, &f.supersedes].into_iter().flatten() {
            assert!(
                shown.iter().any(|s| &s.id == p),
                "a pointer outside the shown set"
            );
        }
        assert!(f.confidence.is_none_or(|c| (0.6..=1.0).contains(&c)));
    }
    if r.error.is_some() {
        assert!(r.facts.is_empty() && r.summary.is_none());
    }
}

/// `v` with every string and key out of the decoder's carried form, as text is stored: each
/// lone surrogate as three U+FFFD, a literal U+FDD0 as itself. Walked on the value, not
/// through `restore_lone` on its text: serde_json's text round trip of a float can move its
/// last digit.
fn uncarried(v: &serde_json::Value) -> serde_json::Value {
    use crate::json::lone::as_stored_text;
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(as_stored_text(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(uncarried).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (as_stored_text(k).into_owned(), uncarried(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The server's request parsing on arbitrary bytes: the first byte picks the route, the rest is
/// the body. Never panics; a body it accepts obeys the wire limits.
pub fn wire(data: &[u8]) {
    use crate::contract::PostRoute;
    use crate::server::wire::{parse, Body};
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let Some(&route) = PostRoute::ALL.get(usize::from(pick) % PostRoute::ALL.len()) else {
        return;
    };
    // The server's own decoder: any bytes, any depth. Where serde_json reads the bytes as they
    // are (UTF-8, shallow enough, so no lone surrogate), the decoder must read the same value
    // once its strings leave the carried form (a literal U+FDD0 is carried doubled).
    let decoded = crate::json::decode(body);
    if let Ok(plain) = serde_json::from_slice::<serde_json::Value>(body) {
        assert_eq!(
            decoded.as_ref().map(uncarried),
            Some(plain),
            "the decoder disagrees with serde_json"
        );
    }
    let Some(value) = decoded else {
        return;
    };
    match parse(route, &value) {
        Ok(Body::Write { write, .. }) => {
            assert!(write.len() <= crate::limits::MAX_BATCH);
            assert!(write
                .cap()
                .is_none_or(|c| (1..=crate::limits::MAX_CAP).contains(&c)));
            let options = crate::store::WriteOptions {
                cap: write.cap(),
                ..Default::default()
            };
            let again =
                crate::store::CheckedWrite::check(write.scope(), write.candidates(), &options);
            assert_eq!(
                again.as_ref().ok(),
                Some(&write),
                "the library's check disagrees with the wire's"
            );
        }
        Ok(Body::Retrieve { query, limit, .. }) => {
            assert!((1..=crate::limits::MAX_LIMIT).contains(&limit));
            assert!(crate::text::utf16_len(&query) <= crate::limits::MAX_QUERY_UNITS);
        }
        Ok(Body::List { query, .. }) => {
            assert!((1..=crate::limits::MAX_LIMIT).contains(&query.limit))
        }
        Ok(_) => {}
        Err(reason) => assert!(!reason.is_empty()),
    }
}

/// Provenance checks and unions over arbitrary JSON (read as the server reads a body, lone
/// surrogates included): never a panic, the union of two valid dependency records is itself a
/// valid, bounded one, and it is version 2 exactly when an input is.
pub fn provenance(data: &[u8]) {
    use crate::provenance::{
        is_context_dependencies, is_memory_provenance, merge_context_dependencies, merge_provenance,
    };
    let Some(serde_json::Value::Array(items)) = crate::json::decode(data) else {
        return;
    };
    let (a, b) = (items.first(), items.get(1));
    for v in [a, b].into_iter().flatten() {
        let _ = is_memory_provenance(v);
    }
    let merged = merge_context_dependencies(&[a, b]);
    if a.is_some_and(is_context_dependencies) && b.is_some_and(is_context_dependencies) {
        assert!(
            is_context_dependencies(&merged),
            "the union of two valid dependency records is invalid: {merged}"
        );
        let two =
            |v: Option<&serde_json::Value>| v.is_some_and(|v| v.get("version") == Some(&2.into()));
        assert_eq!(
            two(Some(&merged)),
            two(a) || two(b),
            "the union is version 2 exactly when an input is: {merged}"
        );
    }
    let _ = merge_provenance("org:a", a, b);
}

/// A stored record's bytes (what the store and `doctor --salvage` read back from disk) and a
/// record's JSON (what `import` and `RemoteStore` read): never a panic. A record that decodes
/// encodes, and its bytes decode to a record with the same bytes (compared as bytes, so a
/// stored NaN compares equal); a record's keywords read back from their JSON as they were. Its
/// text alone (what a journal entry's read takes) is the whole record's text.
pub fn record(data: &[u8]) {
    use crate::store::codec::{decode_record, decode_record_text, encode_record};
    let text = decode_record_text(data);
    if let Ok(r) = decode_record(data, None) {
        assert_eq!(
            text.as_deref().ok(),
            Some(r.text.as_str()),
            "a record's text read alone differs from its text"
        );
        let seq = r.seq().unwrap_or(0);
        let once = encode_record(&r, seq).expect("a decoded record encodes");
        let again = decode_record(&once, None).expect("a record's own bytes decode");
        assert_eq!(
            encode_record(&again, seq).expect("it encodes again"),
            once,
            "decoding and encoding changed a record: {r:?}"
        );
        assert_eq!(again.keywords, r.keywords);
    }
    if let Ok(r) = serde_json::from_slice::<crate::model::Record>(data) {
        let k = &r.keywords;
        assert_eq!(k.iter().count(), k.len());
        assert_eq!(k.iter().map(str::len).sum::<usize>(), k.total_len());
        let json = serde_json::to_string(k).expect("keywords serialize");
        let back: crate::model::Keywords = serde_json::from_str(&json).expect("and parse back");
        assert_eq!(&back, k);
    }
}

/// A stored decision-journal entry's bytes (what every journal read, a format upgrade, `doctor`
/// and `doctor --salvage` decode from disk), and the same bytes read as a journal key: never a
/// panic. A value names a record's text only when it is marked and is an insertion or an
/// eviction without texts. An entry that decodes is stored again as it was: whole, it decodes
/// to itself and names no record's text; as a write stores it, it leaves its text out exactly
/// when it is marked, and its record's text makes it whole again.
pub fn journal_entry(data: &[u8]) {
    use crate::decisions::DecisionEvent;
    use crate::store::codec::{self, decode_decision, text_record};
    let _ = codec::decision_time(data);
    let _ = codec::scope_bytes(data);
    let Ok(d) = decode_decision(data) else {
        return;
    };
    if text_record(data, &d).is_some() {
        assert_eq!(data.first(), Some(&codec::DECISION_TEXT_IN_RECORD));
        assert!(d.texts.is_empty(), "a marked entry read with texts: {d:?}");
        assert!(
            matches!(d.event, DecisionEvent::Inserted | DecisionEvent::Evicted),
            "a marked {:?} names a record's text",
            d.event
        );
    }
    let _ = codec::format6_text_record(data, &d);
    let own = codec::decode_decision_of(data, &d.scope_key).expect("decodes in its own scope");
    assert_eq!(own, d);
    let whole = codec::encode_decision(&d).expect("a decoded entry encodes");
    assert_eq!(decode_decision(&whole).expect("its bytes decode"), d);
    assert_eq!(
        text_record(&whole, &d),
        None,
        "stored whole, it holds its texts"
    );
    let written = codec::encode_written_decision(&d).expect("a decoded entry encodes");
    let back = decode_decision(&written).expect("its bytes decode");
    if text_record(&written, &back).is_some() {
        assert_eq!(
            d.texts.len(),
            1,
            "a write leaves out only a single text: {d:?}"
        );
        let mut restored = back;
        restored.texts.clone_from(&d.texts);
        assert_eq!(restored, d);
    } else {
        assert_eq!(back, d);
    }
}
