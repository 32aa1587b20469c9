//! The command line as a user and a script see it: output, exit codes, errors.

use crate::util::{in_store, run, stderr, stdout};

#[test]
fn gate_prints_markers_or_lesson_per_text() {
    let out = run(
        &[
            "gate",
            "PR 12 was merged",
            "run npm ci before the license check",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "reference, delivery\nlesson\n");
}

#[test]
fn gate_check_exits_one_when_any_text_has_a_marker() {
    let status = run(&["gate", "--check", "lesson text", "all green"], "");
    assert_eq!(status.status.code(), Some(1));
    let clean = run(&["gate", "--check", "run npm ci first"], "");
    assert_eq!(clean.status.code(), Some(0));
}

#[test]
fn gate_reads_one_fact_per_stdin_line() {
    let out = run(
        &["gate"],
        "LGTM\r\nthe cache key includes the lockfile hash\n3f9a2c1",
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "delivery\nlesson\nsha\n");
}

#[test]
fn gate_json_lines_keeps_order_and_reports_bad_lines() {
    let input = "\"PR 1 is complete\"\n{\"text\":\"all green\",\"x\":1}\nnot json\n[]\n{\"text\":\"keep the allowlist\"}\n";
    let out = run(&["gate", "--json-lines"], input);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each output line is JSON"))
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(
        lines[0],
        serde_json::json!({"markers": ["reference", "delivery"]})
    );
    assert_eq!(lines[1], serde_json::json!({"markers": ["delivery"]}));
    assert!(lines[2]["error"]
        .as_str()
        .is_some_and(|e| e.contains("not valid JSON")));
    assert!(lines[3]["error"]
        .as_str()
        .is_some_and(|e| e.contains("JSON string")));
    assert_eq!(lines[4], serde_json::json!({"markers": []}));
}

#[test]
fn gate_json_flag_prints_json_for_arguments() {
    let out = run(&["--json", "gate", "spec row"], "");
    assert_eq!(stdout(&out), "{\"markers\":[\"spec-row\"]}\n");
}

#[test]
fn global_flags_parse_before_or_after_the_subcommand() {
    let before = run(
        &["--store", "d", "--config", "c.json", "--json", "gate", "x"],
        "",
    );
    let after = run(
        &["gate", "x", "--store", "d", "--json", "--config", "c.json"],
        "",
    );
    assert_eq!(before.status.code(), Some(0), "{}", stderr(&before));
    assert_eq!(after.status.code(), Some(0), "{}", stderr(&after));
    assert_eq!(stdout(&before), stdout(&after));
}

#[test]
fn usage_errors_are_one_line_and_exit_two() {
    let out = run(&["gate", "--no-such-flag"], "");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--no-such-flag"), "{err}");
    let none = run(&[], "");
    assert_eq!(none.status.code(), Some(2));
}

#[test]
fn invalid_utf8_on_stdin_is_an_error_with_the_line_number() {
    let mut gate = crate::util::lessons();
    gate.arg("gate");
    let out = crate::util::run_with(gate, b"fine\n\xff\xfe\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("line 2 is not valid UTF-8"));
}

#[test]
fn help_is_exit_zero_and_names_the_commands() {
    let out = run(&["--help"], "");
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("gate"));
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_str(stdout(out).trim()).expect("stdout is one JSON document")
}

#[test]
fn store_commands_answer_the_wire_json() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().join("store");
    let cands = r#"[{"kind":"fact","text":"run npm ci before the license check","sourceThreadKey":"t1"},
                    {"kind":"fact","text":"PR 12 was merged","sourceThreadKey":"t1"},
                    {"kind":"summary","text":"a run fixed the license check","sourceThreadKey":"t1"}]"#;
    let w = in_store(
        &d,
        &["write", "--scope", "repo", "--repo", "acme/app", "--json"],
        cands,
    );
    assert_eq!(w.status.code(), Some(0), "{}", stderr(&w));
    assert_eq!(
        json_of(&w),
        serde_json::json!({"ok": true, "inserted": 3, "deduped": 0, "restated": 0, "superseded": 0, "evicted": 0})
    );

    let l = in_store(
        &d,
        &[
            "list",
            "--scope",
            "repo:acme/app",
            "--kind",
            "fact",
            "--json",
        ],
        "",
    );
    let records = json_of(&l)["records"].as_array().expect("records").clone();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["id"], "mem:repo:acme/app:1");
    assert!(
        records[0].get("lastUsedAt").is_none(),
        "absent optional fields are omitted, never null"
    );
    assert!(!stdout(&l).contains("null"));

    let human = in_store(&d, &["list", "--scope", "repo:acme/app"], "");
    let first = stdout(&human).lines().next().unwrap_or_default().to_owned();
    assert!(
        first.starts_with("mem:repo:acme/app:2  summary  "),
        "{first}"
    );
    assert!(
        first.ends_with("a run fixed the license check  (source: t1)"),
        "{first}"
    );

    let r = in_store(
        &d,
        &[
            "retrieve",
            "--scope",
            "repo:acme/app",
            "--query",
            "license npm",
            "--json",
        ],
        "",
    );
    assert_eq!(json_of(&r)["records"][0]["useCount"], 1);

    let dry = in_store(&d, &["sweep", "--scope", "all", "--dry-run", "--json"], "");
    assert_eq!(
        json_of(&dry),
        serde_json::json!({"scopes": [{"scopeKey": "repo:acme/app", "swept": 1, "ids": ["mem:repo:acme/app:1"]}]})
    );
    let real = in_store(&d, &["sweep", "--scope", "repo:acme/app", "--json"], "");
    assert_eq!(
        json_of(&real),
        serde_json::json!({"scopes": [{"scopeKey": "repo:acme/app", "swept": 1}]})
    );

    let f = in_store(&d, &["forget", "mem:repo:acme/app:0", "--json"], "");
    assert_eq!(
        json_of(&f),
        serde_json::json!({"ok": true, "forgotten": true})
    );
    let again = in_store(&d, &["forget", "mem:repo:acme/app:0"], "");
    assert_eq!(
        again.status.code(),
        Some(1),
        "forgetting nothing is a finding"
    );

    let exported = in_store(&d, &["export"], "");
    let text = stdout(&exported);
    let journal_lines = text
        .lines()
        .filter(|l| l.starts_with("{\"decision\""))
        .count();
    assert_eq!(text.lines().count() - journal_lines, 3, "three records");
    assert!(journal_lines > 0, "and the decision journal");
    let other = dir.path().join("copy");
    let imp = in_store(&other, &["import", "--json"], &stdout(&exported));
    assert_eq!(
        json_of(&imp),
        serde_json::json!({"ok": true, "imported": 3, "skipped": 0, "decisions": journal_lines})
    );
    let copy = in_store(&other, &["export"], "");
    assert_eq!(
        stdout(&copy),
        stdout(&exported),
        "export → import → export is lossless"
    );

    let doc = in_store(&d, &["doctor"], "");
    assert_eq!(doc.status.code(), Some(0), "{}", stdout(&doc));
    let stats = in_store(&d, &["stats", "--json"], "");
    let day = &json_of(&stats)["days"][0];
    assert_eq!(day["scopeKey"], "repo:acme/app");
    assert_eq!(
        day["counters"]["inserted"], 2,
        "facts; the summary counts on its own"
    );
    assert_eq!(day["counters"]["summaries"], 1);
    assert_eq!(day["counters"]["swept"], 1);
    assert_eq!(day["counters"]["forgotten"], 1);
}

#[test]
fn store_commands_fail_with_one_line_reasons() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().join("store");
    let cases: [(&[&str], &str, &str); 9] = [
        (&["list", "--scope", "org:acme"], "", "no store at"),
        (
            &["write", "--scope", "org:acme"],
            r#"[{"kind":"fact","text":"a","sourceThreadKey":"t"},{"kind":"lesson","text":"b","sourceThreadKey":"t"}]"#,
            "records[1].kind: unknown variant `lesson`, expected `fact` or `summary`",
        ),
        (
            &["write", "--scope", "org:acme"],
            r#"{"records":[{"kind":"fact","text":"a","sourceThreadKey":"t","confidence":"high"}]}"#,
            "records[0].confidence: invalid type: string",
        ),
        (
            &["write", "--scope", "org:acme"],
            r#"{"records":3}"#,
            "no \"records\" array",
        ),
        (
            &["write", "--scope", "org:acme"],
            "nope",
            "JSON array of candidates",
        ),
        (
            &["write", "--scope", "repo", "--repo", "app"],
            "[]",
            "OWNER/NAME",
        ),
        (
            &["write", "--scope", "user"],
            "[]",
            "--scope user needs --user",
        ),
        (
            &["write", "--scope", "org:acme"],
            r#"[{"kind":"fact","text":"  ","sourceThreadKey":"t"}]"#,
            "records[0].text must be a non-empty string",
        ),
        (&["forget", "not-an-id"], "", "is not a record id"),
    ];
    for (args, stdin, reason) in cases {
        let out = in_store(&d, args, stdin);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(reason), "{args:?}: {err}");
    }
    assert!(
        !d.join("records").exists() || in_store(&d, &["export"], "").stdout.is_empty(),
        "failed writes store nothing"
    );
}

#[test]
fn a_second_process_on_the_store_is_told_to_use_the_server() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().join("store");
    let _held = lessons::EmbeddedStore::open(&d).expect("this process holds the store");
    let out = in_store(&d, &["list", "--scope", "org:acme"], "");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("--server URL") && err.contains("held by another process"),
        "{err}"
    );
}

#[test]
fn a_run_scripted_through_context_prompt_and_reflect() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().join("store");
    let seed = r#"[{"kind":"fact","text":"the license check fails when nested node_modules were dropped; npm ci fixes it","sourceThreadKey":"slack:C1:1"}]"#;
    let w = in_store(&d, &["write", "--scope", "repo:acme/app"], seed);
    assert_eq!(w.status.code(), Some(0), "{}", stderr(&w));

    let ctx = in_store(
        &d,
        &[
            "context",
            "--org",
            "acme",
            "--repo",
            "acme/app",
            "--brief",
            "add a drift check",
        ],
        "",
    );
    assert_eq!(ctx.status.code(), Some(0), "{}", stderr(&ctx));
    assert_eq!(
        stdout(&ctx),
        "Background memory for org:acme + repo:acme/app (may be outdated \u{2014} verify before acting):\n<background_memory>\n- the license check fails when nested node_modules were dropped; npm ci fixes it (source: slack:C1:1)\n</background_memory>\n"
    );
    let none = in_store(
        &d,
        &["context", "--org", "other", "--brief", "anything"],
        "",
    );
    assert_eq!(stdout(&none), "", "no block, nothing printed");

    let p = in_store(
        &d,
        &[
            "prompt",
            "--org",
            "acme",
            "--repo",
            "acme/app",
            "--request",
            "add a drift check",
            "--answer",
            "license check failed; npm ci fixed it",
            "--json",
        ],
        "",
    );
    assert_eq!(p.status.code(), Some(0), "{}", stderr(&p));
    let prompt = json_of(&p);
    assert_eq!(
        prompt["shown"],
        serde_json::json!([{"handle": "1", "id": "mem:repo:acme/app:0"}])
    );
    assert!(prompt["input"]
        .as_str()
        .is_some_and(|i| i.contains("[1] (fact) the license check fails")));
    let shown_file = dir.path().join("shown.json");
    std::fs::write(&shown_file, stdout(&p)).expect("write shown");

    let reply = r#"Sure:
```json
{"facts":[{"text":"PR 9 was merged","audience":"repo"},{"text":"npm ci fixes the license false positive","audience":"repo","restates":"[1]","confidence":0.9}],"summary":"A run added a drift check."}
```"#;
    let shown_arg = shown_file.to_str().expect("utf-8");
    let r = in_store(
        &d,
        &[
            "reflect",
            "--org",
            "acme",
            "--repo",
            "acme/app",
            "--shown",
            shown_arg,
            "--thread",
            "slack:C1:2",
        ],
        reply,
    );
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert_eq!(
        stdout(&r),
        "[memory] offered 2, rejected 1, restated 1, inserted 0, deduped 0, summary 1\n"
    );
    let rj = in_store(
        &d,
        &[
            "reflect", "--org", "acme", "--repo", "acme/app", "--shown", shown_arg, "--json",
        ],
        r#"{"facts":[{"text":"sha 3f9a2c1 broke it"}]}"#,
    );
    assert_eq!(
        json_of(&rj),
        serde_json::json!({"offered": 1, "rejected": 1, "rejectedBy": {"sha": 1}, "restated": 0, "inserted": 0, "deduped": 0, "summary": 0})
    );
    let bad = in_store(
        &d,
        &["reflect", "--org", "acme", "--shown", shown_arg],
        "no json at all",
    );
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(
        stdout(&bad),
        "[memory] reflection output rejected (the reply holds no JSON object); nothing written\n"
    );
    let stats = in_store(&d, &["stats"], "");
    let line = stdout(&stats);
    assert!(
        line.contains(
            "repo:acme/app: offered 3, rejected 2 (delivery 1, reference 1, sha 1), restated 1"
        ),
        "{line}"
    );
}

#[test]
fn export_into_a_pipe_closed_after_one_line_exits_zero() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().to_str().expect("utf-8");
    // Enough records that the export is still writing when the reader goes away (more than a
    // pipe buffer holds), so the write meets a real EPIPE.
    let records: Vec<String> = (0..3000)
        .map(|i| {
            serde_json::json!({
                "id": format!("mem:org:acme:{i}"), "scopeKey": "org:acme", "kind": "fact",
                "text": format!("lesson {i}: {}", "pipe ".repeat(40)), "keywords": ["pipe"],
                "sourceThreadKey": "t", "createdAt": 1_700_000_000_000i64 + i,
                "useCount": 0, "status": "active"
            })
            .to_string()
        })
        .collect();
    let imported = run(&["--store", store, "import"], &records.join("\n"));
    assert_eq!(imported.status.code(), Some(0), "{}", stderr(&imported));
    let mut child = crate::util::lessons()
        .args(["--store", store, "export"])
        .env_remove("LESSONS_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("export starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut first)
        .expect("one line");
    // The reader (like `head -1`) is dropped here: the pipe closes.
    assert!(first.contains("mem:org:acme:0"), "{first}");
    let out = child.wait_with_output().expect("exits");
    assert_eq!(
        out.status.code(),
        Some(0),
        "a closed pipe is not an error: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn terminal_escapes_in_stored_text_never_reach_the_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let store = store.to_str().expect("utf-8");
    // Record texts and sources come from chat: one holding ESC, BEL, CR and a bidi override.
    let hostile = r#"[{"kind":"fact","text":"clear the screen \u001b[2J\u0007 then\r lie \u202e drawkcab","sourceThreadKey":"slack:C1:\u001b]0;pwned\u0007"},
                      {"kind":"fact","text":"PR 12 was merged \u001b[31m","sourceThreadKey":"t"}]"#;
    let w = run(
        &["--store", store, "write", "--scope", "repo:acme/app"],
        hostile,
    );
    assert_eq!(w.status.code(), Some(0), "{}", stderr(&w));
    for args in [
        vec!["list", "--scope", "repo:acme/app"],
        vec![
            "retrieve",
            "--scope",
            "repo:acme/app",
            "--query",
            "screen lie merged",
        ],
        vec!["journal", "--scope", "repo:acme/app"],
    ] {
        let mut all = vec!["--store", store];
        all.extend(args.iter().copied());
        let out = run(&all, "");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{args:?} printed a control character: {text:?}"
        );
        assert!(text.contains("drawkcab"), "{args:?}: {text}");
    }
    // The extractor sees each shown record on one line of its own.
    let prompt = run(
        &[
            "--store",
            store,
            "prompt",
            "--org",
            "acme",
            "--repo",
            "acme/app",
            "--request",
            "clear the screen",
            "--answer",
            "ok",
        ],
        "",
    );
    assert_eq!(prompt.status.code(), Some(0), "{}", stderr(&prompt));
    let text = stdout(&prompt);
    let shown_line = text
        .lines()
        .find(|l| l.contains("clear the screen") && l.starts_with('['))
        .expect("the record is shown");
    assert!(shown_line.contains("drawkcab"), "{text}");
}
