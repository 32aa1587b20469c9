//! What changed our mind: `lessons journal` (the decisions, newest first) and `lessons review`
//! (the week's three signals with their evidence; exit 1 when one fires).

use std::io::Write;

use clap::Args;
use lessons::decisions::{DecisionEvent, DecisionQuery};
use lessons::internals::limits::MAX_JOURNAL_LIMIT;
use lessons::internals::time::system_clock;

use super::admin_cmds::parse_since;
use super::store_cmds::{fail, open_handle, out, Config, ScopeFlags};
use super::{emit, Cli, Failure, Outcome};

/// Arguments of `lessons journal`.
#[derive(Debug, Args)]
pub(crate) struct JournalArgs {
    #[command(flatten)]
    pub scope: ScopeFlags,
    /// How far back: `1d` is today (UTC), `7d` the last seven days.
    #[arg(long, default_value = "7d")]
    pub since: String,
    /// Only these events (repeatable): rejected, restated, deduped, superseded, inserted,
    /// evicted, swept, forgotten.
    #[arg(long = "event", value_name = "EVENT")]
    pub events: Vec<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Only evictions of records never used: lessons written for nothing.
    #[arg(long)]
    pub never_used: bool,
}

pub(crate) fn journal(cli: &Cli, args: &JournalArgs) -> Result<Outcome, Failure> {
    let scope = args.scope.one()?;
    let today = lessons::internals::time::day_of(system_clock()());
    let since = parse_since(&args.since, today)?.saturating_mul(lessons::internals::time::DAY_MS);
    let mut events = Vec::new();
    for e in &args.events {
        events.push(DecisionEvent::parse(e).ok_or_else(|| {
            Failure::Usage(format!(
                "--event {e:?} is not one of rejected, restated, deduped, superseded, inserted, evicted, swept, forgotten"
            ))
        })?);
    }
    if !(1..=MAX_JOURNAL_LIMIT).contains(&args.limit) {
        return Err(Failure::Usage(format!(
            "--limit must be between 1 and {MAX_JOURNAL_LIMIT}"
        )));
    }
    let handle = open_handle(cli, false)?;
    let decisions = handle
        .store()
        .decisions(
            &scope,
            &DecisionQuery {
                since,
                events,
                limit: args.limit,
                never_used: args.never_used,
            },
        )
        .map_err(fail)?;
    handle.close()?;
    let mut o = out();
    if cli.json {
        let answer = lessons::internals::contract::JournalAnswer { decisions };
        emit(&mut o, &super::to_json(&answer)?)?;
    } else {
        for d in &decisions {
            let mut line = format!(
                "{} {} {}",
                super::format_ms(d.time),
                d.event.as_str(),
                d.ids.join(" -> ")
            );
            if !d.markers.is_empty() {
                line.push_str(&format!(" [{}]", d.markers.join(", ")));
            }
            if let (Some(age), Some(uses)) = (d.age_ms, d.use_count) {
                line.push_str(&format!(
                    " (age {:.1}d, used {uses}x)",
                    age as f64 / lessons::internals::time::DAY_MS as f64
                ));
            }
            emit(&mut o, &super::printable(&line))?;
            for (i, t) in d.texts.iter().enumerate() {
                let label = match (d.event, i) {
                    (DecisionEvent::Restated, 1) => "  target: ",
                    (DecisionEvent::Superseded, 0) => "  old: ",
                    (DecisionEvent::Superseded, 1) => "  new: ",
                    _ => "  ",
                };
                let text = format!("{label}{}", t.replace('\n', " "));
                emit(&mut o, &super::printable(&text))?;
            }
        }
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

/// Arguments of `lessons review`.
#[derive(Debug, Args)]
pub(crate) struct ReviewArgs {
    /// How far back: `7d` is the last seven days (UTC, today included).
    #[arg(long, default_value = "7d")]
    pub since: String,
    /// One scope key, or `all` (the default).
    #[arg(long, default_value = "all")]
    pub scope: String,
}

pub(crate) fn review(cli: &Cli, args: &ReviewArgs) -> Result<Outcome, Failure> {
    let now = system_clock()();
    let today = lessons::internals::time::day_of(now);
    let days = (today - parse_since(&args.since, today)? + 1) as u32;
    let scope = match args.scope.as_str() {
        "all" => None,
        key => Some(
            lessons::model::ScopeKey::parse(key)
                .map_err(|e| Failure::Usage(format!("--scope: {e}")))?,
        ),
    };
    let thresholds = Config::load(cli.config.as_deref())?.review();
    let handle = open_handle(cli, false)?;
    let review = lessons::review::review(handle.store(), days, scope.as_ref(), now, &thresholds)
        .map_err(fail)?;
    handle.close()?;
    let mut o = out();
    if cli.json {
        emit(&mut o, &super::to_json(&review)?)?;
    } else {
        for line in lessons::review::render(&review).lines() {
            emit(&mut o, &super::printable(line))?;
        }
    }
    o.flush()?;
    Ok(if review.fired() {
        Outcome::Found
    } else {
        Outcome::Ok
    })
}
