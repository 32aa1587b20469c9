// The lessons page: every value from the store is put in the DOM as text (textContent), never
// as markup, so a record holding <script> or a fence line shows as what it is. The token is
// kept in sessionStorage (this tab only) and sent as a bearer header, never in a URL.
"use strict";

const EVENTS = ["offered", "rejected", "restated", "inserted", "deduped", "evicted", "swept"];
const DAY_MS = 86400000;
let token = sessionStorage.getItem("lessons-token");
let selected = null;
// Whether the token may change the store. Learned from the server at login: an empty /forget
// is refused before anything else (403) for a read-only token, and fails validation (400)
// without touching the store for a read-write one.
let canWrite = false;

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function say(text, isError) {
  const m = $("message");
  m.textContent = text;
  m.className = isError ? "error" : "";
}

async function api(path, body) {
  const resp = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer " + token },
    body: JSON.stringify(body || {}),
  });
  let json = null;
  try { json = await resp.json(); } catch (_) { json = null; }
  if (resp.status === 401) {
    sessionStorage.removeItem("lessons-token");
    token = null;
    showLogin("that token was refused");
    throw new Error("unauthorized");
  }
  if (!resp.ok) {
    const err = new Error((json && json.error) || ("HTTP " + resp.status));
    err.status = resp.status;
    throw err;
  }
  return json;
}

function showLogin(error) {
  // Nothing read with the previous token stays on the page.
  for (const id of ["review", "scopes", "charts", "sweep-result"]) $(id).replaceChildren();
  $("journal").querySelector("tbody").replaceChildren();
  $("window").textContent = "";
  $("message").textContent = "";
  $("token").value = "";
  $("scope-view").hidden = true;
  $("who").textContent = "";
  selected = null;
  canWrite = false;
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = error || "";
}

function dayString(day) {
  return new Date(day * DAY_MS).toISOString().slice(0, 10);
}

async function probeAccess() {
  try {
    await api("/forget", {});
    canWrite = true;
  } catch (e) {
    canWrite = e.status !== 403;
  }
  $("who").textContent = canWrite ? "read-write token" : "read-only token";
  $("sweep-run").hidden = !canWrite;
}

async function load() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  await probeAccess();
  const review = await api("/review", { days: 7 });
  $("review-period").textContent = "the last 7 days, since " + review.since;
  const list = $("review");
  list.replaceChildren();
  if (review.fired.length === 0) list.append(el("li", "no signal fired", "ok"));
  for (const s of review.scopes) {
    for (const sig of s.signals) {
      const value =
        sig.name === "inserted" ? sig.value.toFixed(1) + " inserted/day (threshold " + sig.threshold + ")"
        : sig.name === "rejected" ? Math.round(sig.value * 100) + "% of offered rejected (threshold " + Math.round(sig.threshold * 100) + "%)"
        : sig.value + " restated vs " + sig.threshold + " inserted";
      const li = el("li", s.scopeKey + ": " + value + (sig.fired ? " \u2014 fires" : ""), sig.fired ? "fired signal" : "ok signal");
      li.dataset.fired = String(sig.fired);
      list.append(li);
    }
  }
  const scopes = $("scopes");
  scopes.replaceChildren();
  for (const s of review.scopes) {
    const li = el("li");
    const b = el("button", s.scopeKey + " (" + s.active + " active)");
    b.dataset.scope = s.scopeKey;
    b.className = "scope-item";
    if (s.signals.some((x) => x.fired)) b.append(el("span", " fired", "fired"));
    b.addEventListener("click", () => select(s.scopeKey));
    li.append(b);
    scopes.append(li);
  }
  const first = review.scopes.find((s) => s.scopeKey.startsWith("repo:")) || review.scopes[0];
  if (first) await select(selected || first.scopeKey);
}

async function select(scope) {
  selected = scope;
  for (const b of document.querySelectorAll(".scope-item")) {
    b.classList.toggle("selected", b.dataset.scope === scope);
  }
  $("scope-view").hidden = false;
  $("scope-title").textContent = scope;
  await Promise.all([charts(scope), windowBlock(scope), journal(scope)]);
}

async function charts(scope) {
  const today = Math.floor(Date.now() / DAY_MS);
  const first = today - 29;
  const stats = await api("/stats", { since: first });
  const byDay = new Map();
  for (const d of stats.days) if (d.scopeKey === scope) byDay.set(d.day, d.counters);
  const box = $("charts");
  box.replaceChildren();
  box.className = "charts";
  for (const event of EVENTS) {
    const values = [];
    for (let day = first; day <= today; day++) {
      const c = byDay.get(dayString(day));
      values.push({ day: dayString(day), n: c ? c[event] || 0 : 0, c });
    }
    const max = Math.max(1, ...values.map((v) => v.n));
    const fig = el("figure", undefined, "chart");
    fig.dataset.event = event;
    const total = values.reduce((a, v) => a + v.n, 0);
    fig.append(el("figcaption", event + ": " + total));
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 300 60");
    svg.setAttribute("preserveAspectRatio", "none");
    values.forEach((v, i) => {
      const h = v.n === 0 ? 1 : Math.max(2, (v.n / max) * 58);
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", String(i * 10 + 1));
      r.setAttribute("y", String(60 - h));
      r.setAttribute("width", "8");
      r.setAttribute("height", String(h));
      r.setAttribute("class", v.n === 0 ? "bar zero" : "bar");
      r.dataset.day = v.day;
      r.dataset.value = String(v.n);
      const t = document.createElementNS(ns, "title");
      t.textContent = v.day + ": " + v.n;
      r.append(t);
      svg.append(r);
    });
    fig.append(svg);
    if (event === "rejected") {
      const markers = new Map();
      for (const v of values) {
        for (const [m, n] of Object.entries((v.c && v.c.rejectedBy) || {})) {
          markers.set(m, (markers.get(m) || 0) + n);
        }
      }
      const parts = [...markers.entries()].map(([m, n]) => m + " " + n);
      fig.append(el("div", parts.length ? "by marker: " + parts.join(", ") : "by marker: none"));
    }
    box.append(fig);
  }
}

async function windowBlock(scope) {
  const w = await api("/window", { scopeKey: scope });
  $("window").textContent = w.block || "(no records in the window)";
}

async function journal(scope) {
  const filter = $("journal-filter").value;
  const body = { scopeKey: scope, limit: 50 };
  if (filter) body.events = [filter];
  const j = await api("/journal", body);
  const tbody = $("journal").querySelector("tbody");
  tbody.replaceChildren();
  for (const d of j.decisions) {
    const tr = el("tr");
    tr.className = "decision";
    tr.dataset.event = d.event;
    tr.append(el("td", new Date(d.time).toISOString().replace("T", " ").slice(0, 19)));
    let what = d.event;
    if (d.markers && d.markers.length) what += " [" + d.markers.join(", ") + "]";
    if (d.useCount !== undefined) what += " (used " + d.useCount + "x)";
    tr.append(el("td", what));
    tr.append(el("td", (d.ids || []).join(" \u2192 ")));
    const texts = el("td", undefined, "texts");
    for (const t of d.texts || []) texts.append(el("div", t));
    tr.append(texts);
    const act = el("td");
    if (canWrite && d.event === "inserted" && d.ids && d.ids.length) {
      const b = el("button", "forget", "forget");
      b.dataset.id = d.ids[0];
      b.addEventListener("click", () => forget(scope, d.ids[0]));
      act.append(b);
    }
    tr.append(act);
    tbody.append(tr);
  }
}

async function forget(scope, id) {
  if (!window.confirm("Forget " + id + "? It is kept for audit but no run sees it again.")) return;
  try {
    const r = await api("/forget", { scopeKey: scope, id });
    say(r.forgotten ? "forgot " + id : id + " was not active");
    await select(scope);
  } catch (e) {
    if (e.status === 403) say("refused: this token is read-only", true);
    else say("forget failed: " + e.message, true);
  }
}

async function sweep(dryRun) {
  if (!selected) return;
  if (!dryRun && !window.confirm("Retire every status row of " + selected + "?")) return;
  try {
    const r = await api("/sweep", { scopeKey: selected, dryRun });
    const out = $("sweep-result");
    out.replaceChildren();
    if (dryRun) {
      out.append(el("li", "a sweep would retire " + r.swept));
      for (const id of r.ids || []) out.append(el("li", id));
    } else {
      say("swept " + r.swept);
      await select(selected);
    }
  } catch (e) {
    if (e.status === 403) say("refused: this token is read-only", true);
    else say("sweep failed: " + e.message, true);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("token").value.trim();
    $("token").value = "";
    sessionStorage.setItem("lessons-token", token);
    load().catch((e) => say(e.message, true));
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem("lessons-token");
    token = null;
    showLogin();
  });
  $("journal-filter").addEventListener("change", () => {
    if (selected) journal(selected).catch((e) => say(e.message, true));
  });
  $("sweep-dry").addEventListener("click", () => sweep(true));
  $("sweep-run").addEventListener("click", () => sweep(false));
  if (token) load().catch((e) => say(e.message, true));
  else showLogin();
});
