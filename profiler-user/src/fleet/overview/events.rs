//! `profiler fleet --event`: each kernel log event that matches, with the CPU that spent most
//! samples in the kernel in the seconds before it and what ran there.

use super::{EventAnswer, EventCause, MAX_EVENTS, Sql, Stacks, TopStack};
use crate::{
    fleet::{FleetError, stack_text::Sources},
    timespec,
};

/// Events explained at once.
const EVENT_READERS: usize = 4;

pub(super) fn explain_events(sql: &Sql<'_>, pattern: &str, stacks: &mut Stacks) -> Result<EventAnswer, FleetError> {
    let fleet = sql.fleet;
    let all = fleet.rows(&sql.matching_events(pattern), |r| {
        Ok((r.string()?.to_string(), r.u64()?, r.string()?.to_string(), r.string()?.to_string()))
    })?;
    let matched = match all.len() {
        MAX_EVENTS => fleet.rows(&sql.matching_count(pattern), |r| r.u64())?.first().copied().unwrap_or(0),
        n => n as u64,
    };
    let sources = Sources::of(fleet)?;
    // Per event, the busiest CPU around it and that CPU's top stacks: two small reads each,
    // a few events at a time; then the text of every stack named, in one read. (A hundred
    // events one after another, each with its own text read, took 7.2 s at 1,000 nodes; 20 of
    // 200 nodes 1.8-2.1 s, and 1.7-1.8 s so.)
    type Found = Option<((u32, u64, u64), Vec<(String, u64, u64)>)>;
    let explain = |node: &str, ts_ns: u64| -> Result<Found, FleetError> {
        let cpu = fleet.rows(&sql.event_cpu(node, ts_ns, &sources), |r| Ok((r.u32()?, r.u64()?, r.u64()?)))?;
        let Some(&(cpu, kernel, n)) = cpu.first() else { return Ok(None) };
        let top =
            fleet.rows(&sql.event_stacks(node, ts_ns, cpu), |r| Ok((r.string()?.to_string(), r.u64()?, r.u64()?)))?;
        Ok(Some(((cpu, kernel, n), top)))
    };
    let mut found: Vec<Option<Result<Found, FleetError>>> = (0..all.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..EVENT_READERS)
            .map(|k| {
                let (all, explain) = (&all, &explain);
                s.spawn(move || {
                    (k..all.len()).step_by(EVENT_READERS).map(|i| (i, explain(&all[i].0, all[i].1))).collect::<Vec<_>>()
                })
            })
            .collect();
        for w in workers {
            for (i, r) in w.join().expect("an event's read panicked") {
                found[i] = Some(r);
            }
        }
    });
    let found: Vec<Found> = found.into_iter().map(|f| f.expect("every event read")).collect::<Result<_, _>>()?;
    stacks.fetch(sql, found.iter().flatten().flat_map(|(_, top)| top.iter().map(|t| t.1)))?;
    let mut events = Vec::new();
    for ((node, ts_ns, id, message), found) in all.into_iter().zip(found) {
        let mut cause = EventCause {
            time: timespec::format(ts_ns),
            node,
            ts_ns,
            id,
            message,
            cpu: None,
            cpu_kernel_samples: 0,
            cpu_samples: 0,
            stacks: Vec::new(),
        };
        if let Some(((cpu, kernel, n), top)) = found {
            cause.stacks = top
                .iter()
                .map(|(comm, id, n)| TopStack { stack: stacks.line(comm, *id), samples: *n, nodes: 1 })
                .collect();
            (cause.cpu, cause.cpu_kernel_samples, cause.cpu_samples) = (Some(cpu), kernel, n);
        }
        events.push(cause);
    }
    Ok(EventAnswer { pattern: pattern.to_string(), matched, events })
}
