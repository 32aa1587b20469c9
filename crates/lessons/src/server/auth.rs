//! Who may do what: the bearer tokens, compared in constant time; and on a server without a
//! token, who may call at all ([`local_caller`]): local clients and the server's own page,
//! never another web page.

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::http::{header, HeaderMap, HeaderValue};

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

/// Why a server without a token refused a request: what the client reads, and what the log
/// line says (the header as sent, quoted and cut short; never a token or a body).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Foreign {
    pub(super) reason: &'static str,
    pub(super) log: String,
}

/// Whether a request may reach a server without a token, whatever its route and method. The
/// one place this is decided: the handler asks it for every route, `/mcp` included, before it
/// looks at the method, a token or the body.
///
/// Such a server (`--insecure-no-auth`, loopback only) holds no secret a web page lacks, and
/// the developer's browser can reach it: any page can send a "simple" request (a POST of
/// `text/plain`, no preflight), and a page under a name it rebinds to 127.0.0.1 (DNS
/// rebinding) can send anything and read the answers. A browser cannot hide either: it names
/// the page's origin in `Origin` on every POST and every cross-origin fetch, and the name the
/// page used in `Host`. So the server answers only a request whose one `Host` (and target, if
/// absolute) is a loopback name (`localhost`, `127.x.y.z`, `[::1]`) with `port`, the port it
/// listens on, and whose `Origin`, if any, is that same `http://` origin: its own page's
/// fetches. A local client (the bot, curl, the CLI's `--server`) sends no `Origin`.
///
/// With a token nothing is checked here: a page cannot add `Authorization` to a cross-origin
/// request without a CORS preflight, and this server answers none. `port` is `None` when the
/// router is served outside `conn::serve_on`; a server without a token then refuses everything.
pub(super) fn local_caller(
    auth: &Auth,
    port: Option<u16>,
    headers: &HeaderMap,
    target: Option<&str>,
) -> Result<(), Foreign> {
    if !auth.open {
        return Ok(());
    }
    let Some(port) = port else {
        return Err(Foreign {
            reason: "this server has no token and cannot tell its own port, so it answers nothing",
            log: "refused: no token, and the port this server listens on is unknown".to_owned(),
        });
    };
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(host), None) => host,
        (None, _) => return Err(foreign_host("(none)", port)),
        (Some(_), Some(_)) => return Err(foreign_host("(more than one)", port)),
    };
    let host = match host.to_str() {
        Ok(h) if loopback_authority(h, port) => h,
        _ => return Err(foreign_host(&shown(host), port)),
    };
    if let Some(target) = target.filter(|t| !loopback_authority(t, port)) {
        return Err(foreign_host(&shown_text(target), port));
    }
    for origin in headers.get_all(header::ORIGIN) {
        if !own_origin(origin, host) {
            return Err(Foreign {
                reason: "this server has no token: it answers no web page but its own, and this request comes from another (Origin)",
                log: format!(
                    "refused: no token, and Origin {} is not this server's own (a web page's request)",
                    shown(origin)
                ),
            });
        }
    }
    Ok(())
}

/// The refusal of a request addressed to another name or port than this server's.
fn foreign_host(shown: &str, port: u16) -> Foreign {
    Foreign {
        reason: "this server has no token: it answers only requests addressed to localhost, 127.0.0.1 or [::1] at its own port",
        log: format!(
            "refused: no token, and Host {shown} is not a loopback name with port {port} (a page under a rebound name?)"
        ),
    }
}

/// `authority` (a `Host` value) names a loopback address with `port`: `localhost`, an IPv4
/// address in 127.0.0.0/8 or `[::1]`, and the port (80 when it is left out, as HTTP's
/// default). Nothing else: no other name resolves to this host for sure, and one that resolves
/// there now may be a page's rebound name.
fn loopback_authority(authority: &str, port: u16) -> bool {
    let (name, given) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) => {
                if !v6.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback()) {
                    return false;
                }
                match after {
                    "" => (None, None),
                    _ => match after.strip_prefix(':') {
                        Some(p) => (None, Some(p)),
                        None => return false,
                    },
                }
            }
            None => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((name, p)) => (Some(name), Some(p)),
            None => (Some(authority), None),
        },
    };
    let loopback_name = name.is_none_or(|n| {
        n.eq_ignore_ascii_case("localhost") || n.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback())
    });
    let named_port = match given {
        None => Some(80),
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok(),
        Some(_) => None,
    };
    loopback_name && named_port == Some(port)
}

/// `origin` is `http://` and the request's own `Host`: a fetch of the page this server served
/// under that name. `null` (a sandboxed frame, a file, a redirect) and every other origin are not.
fn own_origin(origin: &HeaderValue, host: &str) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    scheme.eq_ignore_ascii_case("http") && authority.eq_ignore_ascii_case(host)
}

/// A header's value for the log: quoted, escaped, at most 100 characters.
fn shown(value: &HeaderValue) -> String {
    match value.to_str() {
        Ok(text) => shown_text(text),
        Err(_) => "(not visible ASCII)".to_owned(),
    }
}

fn shown_text(text: &str) -> String {
    const MAX: usize = 100;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}…", text.get(..end).unwrap_or_default()),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> Auth {
        Auth {
            open: true,
            ..Auth::default()
        }
    }

    fn headers(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(host) = host {
            h.insert(
                header::HOST,
                HeaderValue::from_str(host).expect("a header value"),
            );
        }
        if let Some(origin) = origin {
            h.insert(
                header::ORIGIN,
                HeaderValue::from_str(origin).expect("a header value"),
            );
        }
        h
    }

    fn admits(host: Option<&str>, origin: Option<&str>) -> bool {
        local_caller(&open(), Some(7171), &headers(host, origin), None).is_ok()
    }

    #[test]
    fn a_local_client_and_the_servers_own_page_are_answered() {
        for host in [
            "127.0.0.1:7171",
            "localhost:7171",
            "LocalHost:7171",
            "127.1.2.3:7171",
            "[::1]:7171",
        ] {
            assert!(admits(Some(host), None), "{host}");
            assert!(
                admits(Some(host), Some(&format!("http://{host}"))),
                "{host}"
            );
        }
        assert!(admits(
            Some("localhost:7171"),
            Some("HTTP://LOCALHOST:7171")
        ));
    }

    #[test]
    fn a_foreign_or_missing_host_is_refused() {
        for host in [
            "evil.example:7171",
            "evil.example",
            "127.0.0.1",
            "127.0.0.1:7172",
            "127.0.0.1:07171x",
            "127.0.0.1:",
            "localhost.:7171",
            "sub.localhost:7171",
            "0.0.0.0:7171",
            "10.0.0.1:7171",
            "[::2]:7171",
            "[::1]7171",
            "[::1",
            "::1:7171",
            "[::ffff:127.0.0.1]:7171",
            "127.0.0.1:7171@evil.example",
        ] {
            let refused = local_caller(&open(), Some(7171), &headers(Some(host), None), None)
                .expect_err(host);
            assert!(refused.log.contains("Host"), "{host}: {}", refused.log);
        }
        assert!(!admits(None, None));
        let mut two = headers(Some("127.0.0.1:7171"), None);
        two.append(header::HOST, HeaderValue::from_static("evil.example:7171"));
        assert!(local_caller(&open(), Some(7171), &two, None).is_err());
        // A port left out is HTTP's 80.
        assert!(local_caller(&open(), Some(80), &headers(Some("localhost"), None), None).is_ok());
    }

    #[test]
    fn an_absolute_target_must_name_this_server_too() {
        let local = headers(Some("127.0.0.1:7171"), None);
        assert!(local_caller(&open(), Some(7171), &local, Some("127.0.0.1:7171")).is_ok());
        assert!(local_caller(&open(), Some(7171), &local, Some("evil.example:7171")).is_err());
    }

    #[test]
    fn another_origin_or_null_is_refused() {
        for origin in [
            "http://evil.example",
            "null",
            "https://127.0.0.1:7171",
            "http://127.0.0.1:7172",
            "http://localhost:7171",
            "http://127.0.0.1:7171/",
            "http://127.0.0.1",
            "",
        ] {
            let refused = local_caller(
                &open(),
                Some(7171),
                &headers(Some("127.0.0.1:7171"), Some(origin)),
                None,
            )
            .expect_err(origin);
            assert!(refused.log.contains("Origin"), "{origin}: {}", refused.log);
        }
        let mut two = headers(Some("127.0.0.1:7171"), Some("http://127.0.0.1:7171"));
        two.append(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(local_caller(&open(), Some(7171), &two, None).is_err());
    }

    #[test]
    fn with_a_token_nothing_is_checked_here() {
        let auth = Auth {
            token: Some("rw-secret-0123456789".to_owned()),
            ..Auth::default()
        };
        let page = headers(Some("evil.example:80"), Some("http://evil.example"));
        assert_eq!(local_caller(&auth, None, &page, None), Ok(()));
    }

    #[test]
    fn without_its_port_a_server_without_a_token_refuses() {
        let local = headers(Some("127.0.0.1:7171"), None);
        assert!(local_caller(&open(), None, &local, None).is_err());
    }

    #[test]
    fn the_log_shows_a_header_quoted_and_cut_short() {
        let long = format!("http://{}", "a".repeat(200));
        let refused = local_caller(
            &open(),
            Some(7171),
            &headers(Some("127.0.0.1:7171"), Some(&long)),
            None,
        )
        .expect_err("another origin");
        assert!(refused.log.contains("\"http://aaa"), "{}", refused.log);
        assert!(refused.log.len() < 250, "{}", refused.log);
    }
}
