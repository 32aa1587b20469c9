//! A minimal W3C WebDriver client over `ureq` (already a dependency), driving Debian's
//! `chromedriver` and headless `chromium`. Chosen over fantoccini or headless_chrome because
//! the handful of commands a page test needs (navigate, find, type, click, read text, accept a
//! dialog, screenshot) are plain JSON over HTTP, and those crates would bring a second HTTP
//! stack or a websocket client into the build for them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session; both end when dropped.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

/// An element handle.
#[derive(Clone, Debug)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub fn start() -> Browser {
        let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect(
                "Debian's chromium is installed (.ci/run installs chromium and chromium-driver)",
            );
        let port = crate::fixtures::server::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts (Debian's chromium-driver)");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while agent.get(&format!("{base}/status")).call().is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().expect("profile dir");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,1600",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let mut b = Browser {
            driver,
            base,
            session: String::new(),
            agent,
            _profile: profile,
        };
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().expect("a session id").to_owned();
        b
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let mut resp = match method {
            "GET" => self.agent.get(&url).call(),
            "DELETE" => self.agent.delete(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.unwrap_or_else(|| json!({})).to_string().as_bytes()),
        }
        .expect("chromedriver answers");
        let text = resp.body_mut().read_to_string().expect("a body");
        let v: Value = serde_json::from_str(&text).expect("JSON from chromedriver");
        v.get("value").cloned().unwrap_or(Value::Null)
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Loads `url`.
    pub fn goto(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    /// Every element matching `css` now.
    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let v = self.session_call(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        v.as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(|s| Element(s.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (up to 15 s) until `css` matches at least `n` elements; returns them.
    pub fn wait_for(&self, css: &str, n: usize) -> Vec<Element> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let found = self.find_all(css);
            if found.len() >= n {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "waited for {n} of {css:?}, found {}",
                found.len()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (up to 15 s) until `check` holds.
    pub fn wait_until(&self, what: &str, mut check: impl FnMut(&Browser) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !check(self) {
            assert!(Instant::now() < deadline, "waited for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The first element matching `css`, waiting for it.
    pub fn one(&self, css: &str) -> Element {
        self.wait_for(css, 1).remove(0)
    }

    /// Types `text` into `e`.
    pub fn type_into(&self, e: &Element, text: &str) {
        self.session_call(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        );
    }

    /// Clicks `e`.
    pub fn click(&self, e: &Element) {
        self.session_call("POST", &format!("/element/{}/click", e.0), Some(json!({})));
    }

    /// The rendered text of `e`.
    pub fn text(&self, e: &Element) -> String {
        self.session_call("GET", &format!("/element/{}/text", e.0), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// An attribute of `e`.
    pub fn attr(&self, e: &Element, name: &str) -> Option<String> {
        self.session_call("GET", &format!("/element/{}/attribute/{name}", e.0), None)
            .as_str()
            .map(str::to_owned)
    }

    /// Runs `script` in the page (a returned promise is awaited) and returns its value.
    pub fn execute(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Whether `e` is displayed.
    pub fn displayed(&self, e: &Element) -> bool {
        self.session_call("GET", &format!("/element/{}/displayed", e.0), None)
            .as_bool()
            .unwrap_or(false)
    }

    /// The document's title.
    pub fn title(&self) -> String {
        self.session_call("GET", "/title", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The open dialog's text, if one is open.
    pub fn alert_text(&self) -> Option<String> {
        self.session_call("GET", "/alert/text", None)
            .as_str()
            .map(str::to_owned)
    }

    /// Accepts the open dialog (a `confirm`'s OK).
    pub fn accept_alert(&self) {
        self.session_call("POST", "/alert/accept", Some(json!({})));
    }

    /// The page as a PNG.
    pub fn screenshot(&self) -> Vec<u8> {
        let b64 = self.session_call("GET", "/screenshot", None);
        base64_decode(b64.as_str().expect("base64 PNG"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self
                .agent
                .delete(&format!("{}/session/{}", self.base, self.session))
                .call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
