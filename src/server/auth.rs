//! Who may do what: the bearer tokens, compared in constant time.

use axum::http::{header, HeaderMap};

use super::Auth;

/// Compares without an early exit, so the time taken does not say how much of a guess matched.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

/// Which token a request presented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Token {
    ReadWrite,
    ReadOnly,
}

pub(super) fn authorize(auth: &Auth, headers: &HeaderMap) -> Option<Token> {
    if auth.open {
        return Some(Token::ReadWrite);
    }
    let presented = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .as_bytes();
    if auth
        .token
        .as_deref()
        .is_some_and(|t| constant_time_eq(presented, t.as_bytes()))
    {
        return Some(Token::ReadWrite);
    }
    if auth
        .read_token
        .as_deref()
        .is_some_and(|t| constant_time_eq(presented, t.as_bytes()))
    {
        return Some(Token::ReadOnly);
    }
    None
}
