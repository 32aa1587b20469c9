//! The per-run commands a bot or a person scripts: context, prompt, reflect.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use clap::Args;
use lessons::context::{ContextConfig, RunScopes};
use lessons::internals::contract::ContextAnswer;
use lessons::memory::{build_context, reflect, shown_set};
use lessons::reflect::{reflection_prompt, Origin, Shown};

use super::store_cmds::{fail, open_handle, Config, ScopeIds};
use super::{emit, to_json, Cli, Failure, Outcome};

/// The scopes of a run: ids without their prefixes; `--org` is required.
#[derive(Debug, Args, Clone)]
pub(crate) struct RunFlags {
    #[command(flatten)]
    pub ids: ScopeIds,
}

impl RunFlags {
    pub fn scopes(&self) -> Result<RunScopes, Failure> {
        let ids = &self.ids;
        let org = ids.org.as_deref().ok_or_else(|| {
            Failure::Usage("--org is required: a run always has an organization".into())
        })?;
        RunScopes::new(
            org,
            ids.repo.as_deref(),
            ids.channel.as_deref(),
            ids.user.as_deref(),
        )
        .map_err(Failure::Store)
    }
}

pub(crate) fn context_config(cli: &Cli) -> Result<ContextConfig, Failure> {
    let c = Config::load(cli.config.as_deref())?;
    let d = ContextConfig::default();
    let config = ContextConfig {
        enabled: c.enabled.unwrap_or(d.enabled),
        limit: c.limit.unwrap_or(d.limit),
        max_tokens: c.max_tokens.unwrap_or(d.max_tokens),
        repo_window: c.repo_window.unwrap_or(d.repo_window),
    };
    config
        .validate()
        .map_err(|e| Failure::Usage(format!("config: {e}")))?;
    Ok(config)
}

/// Arguments of `lessons context`.
#[derive(Debug, Args)]
pub(crate) struct ContextArgs {
    #[command(flatten)]
    pub run: RunFlags,
    /// The run's brief (its request).
    #[arg(long)]
    pub brief: String,
}

pub(crate) fn context(cli: &Cli, args: &ContextArgs) -> Result<Outcome, Failure> {
    let run = args.run.scopes()?;
    let config = context_config(cli)?;
    let mut o = io::stdout().lock();
    if !config.enabled {
        // Memory off: no block and no store opened.
        if cli.json {
            let answer = ContextAnswer {
                kept: 0,
                from_window: 0,
                block: None,
            };
            emit(&mut o, &to_json(&answer)?)?;
        }
        return Ok(Outcome::Ok);
    }
    let handle = open_handle(cli, false)?;
    let store = handle.store();
    let ctx = build_context(store, &run, &args.brief, &config, store.now());
    handle.close()?;
    for w in &ctx.warnings {
        eprintln!("{w}");
    }
    if cli.json {
        let answer = ContextAnswer {
            kept: ctx.records.len(),
            from_window: ctx.from_window,
            block: ctx.block,
        };
        emit(&mut o, &to_json(&answer)?)?;
    } else if let Some(block) = &ctx.block {
        emit(&mut o, block)?;
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

/// Arguments of `lessons prompt`.
#[derive(Debug, Args)]
pub(crate) struct PromptArgs {
    #[command(flatten)]
    pub run: RunFlags,
    /// The run's request.
    #[arg(long)]
    pub request: String,
    /// The run's answer.
    #[arg(long)]
    pub answer: String,
    /// The run's transcript (its last 24,000 characters are used); default: request and answer.
    #[arg(long, value_name = "FILE")]
    pub transcript: Option<PathBuf>,
}

pub(crate) fn prompt(cli: &Cli, args: &PromptArgs) -> Result<Outcome, Failure> {
    let run = args.run.scopes()?;
    let config = context_config(cli)?;
    let transcript = match &args.transcript {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| Failure::Usage(format!("reading {}: {e}", p.display())))?,
        None => format!("{}\n\n{}", args.request, args.answer),
    };
    let handle = open_handle(cli, true)?;
    let store = handle.store();
    let shown = shown_set(store, &run, &args.request, &args.answer, &config).map_err(fail)?;
    handle.close()?;
    let p = reflection_prompt(&shown, &transcript);
    let mut o = io::stdout().lock();
    if cli.json {
        let answer = lessons::internals::contract::PromptAnswer {
            system: p.system,
            input: p.input,
            shown: p.shown,
        };
        emit(&mut o, &to_json(&answer)?)?;
    } else {
        emit(&mut o, "=== system ===")?;
        emit(&mut o, &p.system)?;
        emit(&mut o, "=== input ===")?;
        emit(&mut o, &p.input)?;
        emit(&mut o, "=== shown ===")?;
        for s in &p.shown {
            emit(&mut o, &format!("[{}] {}", s.handle, s.id))?;
        }
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

/// Arguments of `lessons reflect`.
#[derive(Debug, Args)]
pub(crate) struct ReflectArgs {
    #[command(flatten)]
    pub run: RunFlags,
    /// Where the run's content came from: public, private, dm or machine (private and dm
    /// never write to the organization).
    #[arg(long, default_value = "public", value_parser = ["public", "private", "dm", "machine"])]
    pub origin: String,
    /// The JSON `lessons prompt --json` printed (its "shown" handles resolve the reply's pointers).
    #[arg(long, value_name = "FILE")]
    pub shown: PathBuf,
    /// The thread the run belongs to (each record's sourceThreadKey).
    #[arg(long, default_value = "cli")]
    pub thread: String,
    /// The run's id (each record's sourceRunId).
    #[arg(long)]
    pub run_id: Option<String>,
}

/// The shown handles from `prompt --json` output, or a bare array of `{handle, id}`.
fn read_shown(path: &PathBuf) -> Result<Vec<Shown>, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Usage(format!("reading {}: {e}", path.display())))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Usage(format!("{}: not JSON: {e}", path.display())))?;
    let list = match value {
        serde_json::Value::Object(mut o) => o.remove("shown").unwrap_or(serde_json::Value::Null),
        other => other,
    };
    serde_json::from_value(list).map_err(|e| {
        Failure::Usage(format!(
            "{}: needs \"shown\": [{{\"handle\", \"id\"}}] as `lessons prompt --json` prints: {e}",
            path.display()
        ))
    })
}

pub(crate) fn reflect_cmd(cli: &Cli, args: &ReflectArgs) -> Result<Outcome, Failure> {
    let run = args.run.scopes()?;
    let origin = Origin::parse(&args.origin)
        .ok_or_else(|| Failure::Usage(format!("unknown origin {:?}", args.origin)))?;
    let shown = read_shown(&args.shown)?;
    let mut reply = String::new();
    io::stdin()
        .read_to_string(&mut reply)
        .map_err(|e| Failure::Usage(format!("reading the reply on stdin: {e}")))?;
    let handle = open_handle(cli, true)?;
    let store = handle.store();
    let outcome = reflect(
        store,
        &run,
        &reply,
        &shown,
        origin,
        &args.thread,
        args.run_id.as_deref(),
    )
    .map_err(fail)?;
    handle.close()?;
    let mut o = io::stdout().lock();
    if cli.json {
        let line = serde_json::to_string(&outcome).map_err(|e| Failure::Usage(e.to_string()))?;
        emit(&mut o, &line)?;
    } else {
        emit(&mut o, &outcome.line())?;
    }
    o.flush()?;
    Ok(if outcome.error.is_some() {
        Outcome::Found
    } else {
        Outcome::Ok
    })
}
