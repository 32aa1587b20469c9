//! Secret redaction: which spans of a text are credentials that must never be stored?
//!
//! The reflection path runs every transcript, fact text and keyword through [`redact_secrets`]
//! before anything reaches the extractor or the store. A redacted span becomes `[redacted]`; the
//! words around it (a `Bearer` scheme, a `password=` name, a URL's scheme and host) stay so the
//! lesson still reads.
//!
//! **Invariant:** [`redact_secrets`] is pure and total, and idempotent: redacting a redacted text
//! changes nothing.

use std::sync::LazyLock;

use regex::{Captures, Regex};

/// What a redacted span is replaced with.
pub const REDACTED: &str = "[redacted]";

/// A pattern whose optional `pre` and `post` groups (a scheme, a field name, the `@` of a URL)
/// stay around the replacement; the rest of the match is the secret.
struct Rule {
    pattern: Regex,
    /// The secret must hold an ASCII digit, which keeps ordinary words ("bearer responsibility")
    /// out of the rules that follow a generic prefix.
    needs_digit: bool,
}

// Constant patterns, compiled by every test that redacts.
#[allow(clippy::expect_used)]
static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    let rule = |p: &str, needs_digit| Rule {
        pattern: Regex::new(p).expect("redaction pattern compiles"),
        needs_digit,
    };
    vec![
        // PEM private keys, including a block the transcript tail cut before its END line.
        rule(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
            false,
        ),
        // JSON Web Tokens: three base64url parts, the first two JSON objects.
        rule(
            r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
            false,
        ),
        // GitHub tokens: classic (ghp_, gho_, ghu_, ghs_, ghr_) and fine-grained.
        rule(r"\bgh[pousr]_[A-Za-z0-9]{30,}", false),
        rule(r"\bgithub_pat_[A-Za-z0-9_]{30,}", false),
        // Slack tokens: xoxb-, xoxp-, xoxa-, xoxo-, xoxr-, xoxs- and app-level xapp-.
        rule(r"\bxox[abposr]-[A-Za-z0-9-]{10,}", false),
        rule(r"\bxapp-[0-9]-[A-Za-z0-9-]{10,}", false),
        // AWS access key ids.
        rule(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b", false),
        // Model-provider keys: sk-…, sk-proj-…, sk-ant-….
        rule(r"\bsk-[A-Za-z0-9_-]{20,}", true),
        // Bearer credentials: keep the scheme, drop the credential.
        rule(r"(?i)(?P<pre>\bbearer[ \t]+)[A-Za-z0-9._~+/=-]{16,}", true),
        // user:password@ in a URL: keep the scheme, drop the userinfo.
        rule(
            r"(?i)(?P<pre>\b[a-z][a-z0-9+.-]*://)[^\s/@:]+:[^\s/@]+(?P<post>@)",
            false,
        ),
        // password=…, api_key: "…" and similar assignments: keep the name, drop the value.
        rule(
            r#"(?i)(?P<pre>\b(?:password|passwd|pwd|secret|client[_-]?secret|api[_-]?key|access[_-]?token|auth[_-]?token)["']?[ \t]*[:=][ \t]*["']?)[^\s"'\[]{8,}"#,
            true,
        ),
    ]
});

/// `text` with every recognised credential replaced by `[redacted]`.
///
/// ```
/// use lessons::redact_secrets;
/// assert_eq!(
///     redact_secrets("curl -H 'Authorization: Bearer abcdef0123456789xyz' https://u:hunter2@host/x"),
///     "curl -H 'Authorization: Bearer [redacted]' https://[redacted]@host/x",
/// );
/// ```
pub fn redact_secrets(text: &str) -> String {
    let mut out = text.to_owned();
    for rule in RULES.iter() {
        if !rule.pattern.is_match(&out) {
            continue;
        }
        let replaced = rule.pattern.replace_all(&out, |caps: &Captures<'_>| {
            let whole = caps.get(0).map_or("", |m| m.as_str());
            let pre = caps.name("pre").map_or("", |m| m.as_str());
            let post = caps.name("post").map_or("", |m| m.as_str());
            let secret = &whole[pre.len()..whole.len() - post.len()];
            if rule.needs_digit && !secret.bytes().any(|b| b.is_ascii_digit()) {
                whole.to_owned()
            } else {
                format!("{pre}{REDACTED}{post}")
            }
        });
        out = replaced.into_owned();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> String {
        redact_secrets(text)
    }

    #[test]
    fn github_tokens() {
        let classic = format!("token ghp_{} here", "a1B2c3D4e5".repeat(4));
        assert_eq!(r(&classic), "token [redacted] here");
        let oauth = format!("gho_{}", "Z9".repeat(18));
        assert_eq!(r(&oauth), "[redacted]");
        let pat = format!("github_pat_{}", "11ABCDEFG0_abc".repeat(4));
        assert_eq!(r(&pat), "[redacted]");
        // Near misses: too short, or not the prefix as a word.
        assert_eq!(r("ghp_short"), "ghp_short");
        assert_eq!(r("the github_pat_ prefix"), "the github_pat_ prefix");
    }

    #[test]
    fn slack_tokens() {
        assert_eq!(r("xoxb-1234567890-abcdefghij"), "[redacted]");
        assert_eq!(
            r("use xoxp-12-34-56-abcdef please"),
            "use [redacted] please"
        );
        assert_eq!(r("xapp-1-A0123456-abcdef"), "[redacted]");
        assert_eq!(r("xoxb-short"), "xoxb-short");
    }

    #[test]
    fn aws_access_keys() {
        assert_eq!(r("key AKIAIOSFODNN7EXAMPLE set"), "key [redacted] set");
        // Lowercase or a word that merely starts with AKIA stays.
        assert_eq!(r("akiaiosfodnn7example"), "akiaiosfodnn7example");
        assert_eq!(r("AKIAIOSFODNN7EXAMPLEXX"), "AKIAIOSFODNN7EXAMPLEXX");
    }

    #[test]
    fn model_keys() {
        assert_eq!(
            r("OPENAI=sk-proj-abc123def456ghi789jkl0"),
            "OPENAI=[redacted]"
        );
        assert_eq!(r("sk-ant-api03-AbCdEf0123456789xyz"), "[redacted]");
        // Near misses: sk-learn, and a long hyphenated word with no digit.
        assert_eq!(r("pip install sk-learn"), "pip install sk-learn");
        assert_eq!(
            r("the sk-long-hyphenated-word-chain"),
            "the sk-long-hyphenated-word-chain"
        );
    }

    #[test]
    fn jwts() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        assert_eq!(r(&format!("cookie={jwt};")), "cookie=[redacted];");
        assert_eq!(
            r("eyJhbGciOiJIUzI1NiJ9 alone"),
            "eyJhbGciOiJIUzI1NiJ9 alone"
        );
    }

    #[test]
    fn pem_private_keys() {
        let pem = "before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----\nafter";
        assert_eq!(r(pem), "before\n[redacted]\nafter");
        let cut = "tail -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA";
        assert_eq!(r(cut), "tail [redacted]");
        let public = "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----";
        assert_eq!(r(public), public);
    }

    #[test]
    fn bearer_credentials() {
        assert_eq!(
            r("Authorization: Bearer 0123456789abcdefXYZ"),
            "Authorization: Bearer [redacted]"
        );
        assert_eq!(
            r("the bearer responsibility stays"),
            "the bearer responsibility stays"
        );
    }

    #[test]
    fn url_userinfo() {
        assert_eq!(
            r("git clone https://bot:s3cret@github.com/acme/app"),
            "git clone https://[redacted]@github.com/acme/app"
        );
        assert_eq!(
            r("postgres://app:pw@db:5432/x"),
            "postgres://[redacted]@db:5432/x"
        );
        // No password, no redaction: a user name alone is not a secret.
        assert_eq!(r("ssh://git@github.com/acme"), "ssh://git@github.com/acme");
        assert_eq!(
            r("https://github.com/acme/app"),
            "https://github.com/acme/app"
        );
    }

    #[test]
    fn assignments() {
        assert_eq!(r("password=hunter2hunter2"), "password=[redacted]");
        assert_eq!(r(r#"api_key: "abcd1234efgh""#), r#"api_key: "[redacted]""#);
        assert_eq!(
            r("the password must be rotated"),
            "the password must be rotated"
        );
    }

    #[test]
    fn idempotent_and_lesson_text_untouched() {
        let lesson = "the license check fails on a resident tree whose nested node_modules were dropped; run npm ci";
        assert_eq!(r(lesson), lesson);
        let once = r("Bearer 0123456789abcdefXYZ and xoxb-1234567890-abcdefghij");
        assert_eq!(r(&once), once);
    }
}
