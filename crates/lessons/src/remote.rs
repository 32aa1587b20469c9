//! `RemoteStore`: the store contract over the memory Worker's wire, for a `lessons serve` on
//! another host or the original Worker.
//!
//! Reads degrade the way the bot's do: a failed `retrieve` answers no records and logs one
//! `[memory]` warning (through the `log` facade). Writes, lists, forgets and sweeps fail with an error naming the status and
//! the server's message. Routes an older server lacks answer 404, reported as unsupported.

use std::time::Duration;

use serde_json::Value;

use crate::contract::{
    CountRequest, Endpoint, ExportRequest, ForgetRequest, GetRequest, ImportRequest,
    JournalRequest, ListRequest, PostRoute, RetrieveRequest, ScopesRequest, StatsRequest,
    SweepRequest, WriteRequest,
};

use crate::decisions::{Decision, DecisionQuery};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Record, Retrieved, ScopeKey, WriteCounts};
use crate::store::{
    CheckedWrite, DayStats, ImportReport, ListQuery, MemoryStore, SweepReceipt, WriteOptions,
};

/// A store behind an HTTP server that speaks the memory Worker's contract.
pub struct RemoteStore {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
    /// Whether a failed `retrieve` answers no records (the bot's run path) or an error.
    degrade_retrieve: bool,
}

impl RemoteStore {
    /// A client for the server at `base_url` (`http://host:port` or `https://…`), sending
    /// `token` as a bearer token. Every request times out after `timeout`.
    pub fn new(base_url: &str, token: Option<String>, timeout: Duration) -> Result<RemoteStore> {
        let base = base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::invalid(format!(
                "server URL must start with http:// or https://, not {base_url:?}"
            )));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build();
        Ok(RemoteStore {
            base,
            token,
            agent: config.into(),
            degrade_retrieve: true,
        })
    }

    /// A client whose `retrieve` reports a failure instead of answering no records: what a
    /// person who asked needs (the bot's run path degrades to no memory; a person must see why).
    pub fn strict(mut self) -> RemoteStore {
        self.degrade_retrieve = false;
        self
    }

    fn send(&self, route: PostRoute, body: &Value) -> Result<ureq::http::Response<ureq::Body>> {
        let route = route.path();
        let url = format!("{}{route}", self.base);
        let mut req = self.agent.post(&url);
        if route == PostRoute::Export.path() {
            // An export's body takes as long as the store is large: no overall deadline, but a
            // generous one for the body so a dead host cannot hold the caller forever.
            req = req
                .config()
                .timeout_global(None)
                .timeout_recv_body(Some(Duration::from_secs(3600)))
                .build();
        }
        let mut req = req.header("content-type", "application/json");
        if let Some(t) = &self.token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        req.send(crate::json::restore_lone(body.to_string()).as_bytes())
            .map_err(|e| Error::new(ErrorKind::Remote, format!("POST {route}: {e}")))
    }

    /// Reads `/export`'s streamed answer, handing each element of the array `field` to `sink`
    /// as it is parsed.
    fn stream_export(
        &self,
        field: &'static str,
        sink: &mut dyn FnMut(Value) -> Result<()>,
    ) -> Result<()> {
        let request = serde_json::to_value(ExportRequest {})
            .map_err(|e| Error::format(format!("encoding /export: {e}")))?;
        let mut resp = self.send(PostRoute::Export, &request)?;
        if resp.status().as_u16() != 200 {
            // Error answers are small: read and report them as every route does.
            let status = resp.status().as_u16();
            let text = resp
                .body_mut()
                .with_config()
                .limit(1 << 20)
                .read_to_string()
                .unwrap_or_default();
            return Err(Error::new(
                ErrorKind::Remote,
                format!(
                    "POST /export answered {status}: {}",
                    text.chars().take(200).collect::<String>()
                ),
            ));
        }
        let reader = resp.into_body().into_reader();
        let mut failed: Option<Error> = None;
        // Keywords and provenance may hold lone surrogates, which serde alone refuses.
        let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::new(
            crate::json::JsReader::new(reader),
        ));
        let parsed = serde::de::DeserializeSeed::deserialize(
            ExportSeed {
                field,
                sink,
                failed: &mut failed,
            },
            &mut de,
        );
        if let Some(e) = failed {
            return Err(e);
        }
        parsed.map_err(|e| {
            Error::new(
                ErrorKind::Remote,
                format!("the server's export does not parse (cut short?): {e}"),
            )
        })
    }

    fn post(&self, route: PostRoute, body: &Value) -> Result<Value> {
        let mut resp = self.send(route, body)?;
        let route = route.path();
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| {
                Error::new(
                    ErrorKind::Remote,
                    format!("POST {route}: reading the answer: {e}"),
                )
            })?;
        let value: Value = crate::json::parse(&text).unwrap_or(Value::Null);
        if status == 200 {
            return Ok(value);
        }
        let message = value
            .get("error")
            .and_then(Value::as_str)
            .map_or_else(|| text.chars().take(200).collect(), str::to_owned);
        if status == 404 {
            return Err(Error::new(
                ErrorKind::Remote,
                format!("POST {route} is not supported by this server (404: {message}); it may be an older memory Worker"),
            ));
        }
        let kind = if status == 400 {
            ErrorKind::Invalid
        } else {
            ErrorKind::Remote
        };
        Err(Error::new(
            kind,
            format!("POST {route} answered {status}: {message}"),
        ))
    }

    /// One route of the contract: a typed request, its route's typed answer.
    fn call<E: Endpoint>(&self, request: &E) -> Result<E::Answer>
    where
        E::Answer: serde::de::DeserializeOwned,
    {
        let route = E::ROUTE.path();
        let body = serde_json::to_value(request)
            .map_err(|e| Error::format(format!("encoding {route}: {e}")))?;
        let answer = self.post(E::ROUTE, &body)?;
        serde_json::from_value(answer).map_err(|e| {
            Error::new(
                ErrorKind::Remote,
                format!("the answer of POST {route} does not parse: {e}"),
            )
        })
    }
}

impl MemoryStore for RemoteStore {
    /// Sends the candidates as they were sent: the server checks them where they enter it.
    fn write_checked(
        &self,
        write: &CheckedWrite<'_>,
        options: &WriteOptions,
    ) -> Result<WriteCounts> {
        let request = WriteRequest {
            scope_key: write.scope().clone(),
            records: write.candidates().to_vec(),
            cap: write.cap(),
            tally: options.tally.clone(),
            rejected: options.rejected.clone(),
        };
        let answer = self.call(&request)?;
        Ok(answer.counts)
    }

    fn list(&self, scope: &ScopeKey, query: &ListQuery) -> Result<Vec<Record>> {
        let request = ListRequest {
            scope_key: scope.clone(),
            limit: query.limit,
            query: query.query.clone(),
            kind: query.kind,
        };
        let answer = self.call(&request)?;
        Ok(answer.records)
    }

    /// Marks no record as a first use: the answer's JSON does not say.
    fn retrieve_marked(
        &self,
        scope: &ScopeKey,
        query: &str,
        limit: usize,
    ) -> Result<Vec<Retrieved>> {
        let request = RetrieveRequest {
            scope_key: scope.clone(),
            query: query.to_owned(),
            limit,
        };
        match self.call(&request) {
            Ok(answer) => Ok(answer.records),
            Err(e) if e.is_invalid() || !self.degrade_retrieve => Err(e),
            Err(e) => {
                log::warn!("[memory] retrieve failed for {scope} ({e}); continuing without memory");
                Ok(Vec::new())
            }
        }
    }

    fn forget(&self, scope: &ScopeKey, id: &str) -> Result<bool> {
        crate::store::validate_forget_id(id)?;
        let request = ForgetRequest {
            scope_key: scope.clone(),
            id: id.to_owned(),
        };
        let answer = self.call(&request)?;
        Ok(answer.forgotten)
    }

    fn sweep(&self, scope: &ScopeKey, dry_run: bool) -> Result<SweepReceipt> {
        let request = SweepRequest {
            scope_key: scope.clone(),
            dry_run,
        };
        let answer = self.call(&request)?;
        Ok(SweepReceipt {
            swept: answer.swept,
            ids: answer.ids.unwrap_or_default(),
        })
    }

    fn get(&self, id: &str) -> Result<Option<Record>> {
        let answer = self.call(&GetRequest { id: id.to_owned() })?;
        Ok(answer.record)
    }

    fn scopes(&self) -> Result<Vec<ScopeKey>> {
        let answer = self.call(&ScopesRequest {})?;
        Ok(answer.scopes)
    }

    /// Streams: each record goes to `sink` as it is parsed from the answer, so an export of
    /// any size needs memory for one record.
    fn export(&self, sink: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        self.stream_export("records", &mut |v| {
            let r: Record = serde_json::from_value(v).map_err(|e| {
                Error::new(
                    ErrorKind::Remote,
                    format!("an exported record does not parse: {e}"),
                )
            })?;
            sink(r)
        })
    }

    /// Sends the records in requests that stay under the server's body limit (by bytes, not
    /// only by count: records differ a hundredfold in size).
    fn import(&self, records: &[Record]) -> Result<ImportReport> {
        const BUDGET: usize = crate::limits::MAX_BODY_BYTES - 16 * 1024;
        let mut report = ImportReport::default();
        let mut chunk: Vec<&Record> = Vec::new();
        let mut size = 0;
        let flush = |chunk: &mut Vec<&Record>, report: &mut ImportReport| -> Result<()> {
            if chunk.is_empty() {
                return Ok(());
            }
            let request: ImportRequest = ImportRequest {
                records: std::mem::take(chunk).into_iter().cloned().collect(),
                decisions: Vec::new(),
            };
            let answer = self.call(&request)?;
            report.imported += answer.imported;
            report.skipped += answer.skipped;
            chunk.clear();
            Ok(())
        };
        for r in records {
            let n = serde_json::to_vec(r)
                .map_err(|e| Error::format(e.to_string()))?
                .len()
                + 1;
            if n > BUDGET {
                return Err(Error::invalid(format!(
                    "record {} is {n} bytes of JSON, more than one request may carry",
                    r.id
                )));
            }
            if size + n > BUDGET || chunk.len() == crate::limits::MAX_IMPORT {
                flush(&mut chunk, &mut report)?;
                size = 0;
            }
            chunk.push(r);
            size += n;
        }
        flush(&mut chunk, &mut report)?;
        Ok(report)
    }

    fn active_count(&self, scope: &ScopeKey) -> Result<u64> {
        let request = CountRequest {
            scope_key: scope.clone(),
        };
        let answer = self.call(&request)?;
        Ok(answer.active)
    }

    fn decisions(&self, scope: &ScopeKey, query: &DecisionQuery) -> Result<Vec<Decision>> {
        let request = JournalRequest {
            scope_key: scope.clone(),
            limit: query.limit,
            since: (query.since != i64::MIN).then_some(query.since),
            events: query.events.clone(),
            never_used: query.never_used,
        };
        let answer = self.call(&request)?;
        Ok(answer.decisions)
    }

    fn export_decisions(&self, sink: &mut dyn FnMut(Decision) -> Result<()>) -> Result<()> {
        self.stream_export("decisions", &mut |v| {
            let d: Decision = serde_json::from_value(v).map_err(|e| {
                Error::new(
                    ErrorKind::Remote,
                    format!("an exported decision does not parse: {e}"),
                )
            })?;
            sink(d)
        })
    }

    fn import_decisions(&self, entries: &[Decision]) -> Result<u64> {
        const BUDGET: usize = crate::limits::MAX_BODY_BYTES - 16 * 1024;
        let mut added = 0;
        let mut chunk: Vec<&Decision> = Vec::new();
        let mut size = 0;
        let flush = |chunk: &mut Vec<&Decision>, added: &mut u64| -> Result<()> {
            if chunk.is_empty() {
                return Ok(());
            }
            let request: ImportRequest = ImportRequest {
                records: Vec::new(),
                decisions: std::mem::take(chunk).into_iter().cloned().collect(),
            };
            let answer = self.call(&request)?;
            *added += answer.decisions;
            chunk.clear();
            Ok(())
        };
        for d in entries {
            let n = serde_json::to_vec(d)
                .map_err(|e| Error::format(e.to_string()))?
                .len()
                + 1;
            if size + n > BUDGET || chunk.len() == crate::limits::MAX_IMPORT {
                flush(&mut chunk, &mut added)?;
                size = 0;
            }
            chunk.push(d);
            size += n;
        }
        flush(&mut chunk, &mut added)?;
        Ok(added)
    }

    fn stats(&self, since: i64) -> Result<Vec<DayStats>> {
        let answer = self.call(&StatsRequest { since })?;
        Ok(answer.days)
    }
}

/// Parses `{"records": [ … ]}` handing each record to the sink as it arrives.
struct ExportSeed<'a, 'b> {
    field: &'static str,
    sink: &'a mut dyn FnMut(Value) -> Result<()>,
    failed: &'b mut Option<Error>,
}

impl<'de> serde::de::DeserializeSeed<'de> for ExportSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ExportSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object with an array of records or decisions")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        let ExportSeed {
            field,
            sink,
            failed,
        } = self;
        while let Some(key) = map.next_key::<String>()? {
            if key == field {
                map.next_value_seed(RecordsSeed {
                    sink: &mut *sink,
                    failed: &mut *failed,
                })?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

struct RecordsSeed<'a, 'b> {
    sink: &'a mut dyn FnMut(Value) -> Result<()>,
    failed: &'b mut Option<Error>,
}

impl<'de> serde::de::DeserializeSeed<'de> for RecordsSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for RecordsSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        while let Some(r) = seq.next_element::<Value>()? {
            if let Err(e) = (self.sink)(r) {
                *self.failed = Some(e);
                return Err(serde::de::Error::custom("the export's consumer stopped"));
            }
        }
        Ok(())
    }
}
