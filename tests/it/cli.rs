//! The command line as a user and a script see it: output, exit codes, errors.

use crate::util::{run, stderr, stdout};

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
    use std::io::Write;
    use std::process::Stdio;
    let mut child = crate::util::lessons()
        .arg("gate")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(b"fine\n\xff\xfe\n").expect("writes");
    drop(stdin);
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("line 2 is not valid UTF-8"));
}

#[test]
fn help_is_exit_zero_and_names_the_commands() {
    let out = run(&["--help"], "");
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("gate"));
}
