//! `profiler fleet --event`: each kernel log event that matches, with the CPU that spent most
//! samples in the kernel in the seconds before it and what ran there.
//!
//! Every event is answered by the same two reads: the per-CPU counts of all events'
//! lookbacks, then the top stacks of each event's chosen CPU. Each sample row is given the
//! events whose lookback holds it ([`event_of`]: several where two events of a node are less
//! than [`EVENT_LOOKBACK_NS`] apart) and counted once per event. (Two reads per event, four
//! events at a time, took 4.2 s for 100 events at 1,000 nodes: each joined the kernel flags of
//! its own stacks, 18 MB of stack rows read a hundred times.)

use std::collections::HashMap;

use super::{EVENT_LOOKBACK_NS, EVENT_STACKS, EventAnswer, EventCause, MAX_EVENTS, Sql, Stacks, TopStack};
use crate::{
    fleet::{Fleet, FleetError, stack_text::Sources},
    ship::clickhouse::schema::{self, col::*},
    timespec,
};

/// `(event, cpu, kernel samples, samples)`.
type CpuCounts = (usize, u32, u64, u64);

/// The `arrayJoin` of the (0-based) events whose condition in `conds` a row meets: one row
/// per event that holds it. Each condition is 0 or 1, so `cond * (i + 1)` names the event or
/// is 0, and the zeros are filtered out.
fn event_of(conds: &[String]) -> String {
    let items: Vec<String> = conds.iter().enumerate().map(|(i, c)| format!("({c}) * {}", i + 1)).collect();
    format!("arrayJoin(arrayFilter(x -> x != 0, [{}])) - 1", items.join(", "))
}

/// Rows meeting any of `conds` (the primary key `(node, cpu, ts)` finds each).
fn any_of(conds: &[String]) -> String {
    let items: Vec<String> = conds.iter().map(|c| format!("({c})")).collect();
    items.join(" OR ")
}

/// `node = ... AND ts` in the lookback before `ts_ns`, and on `cpu` where given.
fn lookback(node: &str, ts_ns: u64, cpu: Option<u32>) -> String {
    let on = cpu.map(|c| format!(" AND {CPU} = {c}")).unwrap_or_default();
    format!("{}{on}", Fleet::node_range(node, ts_ns.saturating_sub(EVENT_LOOKBACK_NS), ts_ns))
}

impl Sql<'_> {
    /// Per event of `events` (`(node, ts)`) and CPU, the kernel-mode samples (a stack with
    /// kernel frames) and all samples in the lookback: `e, cpu, kn, n`. `GLOBAL`: on a cluster
    /// `samples` and `stacks` are `Distributed`, and a subquery over one inside a query over
    /// another is refused (`distributed_product_mode = 'deny'`); the initiator runs them once
    /// and sends the result (the events' few seconds). Plain tables read `GLOBAL` as the local
    /// form. The kernel flags from whichever tables hold stacks (`stack_text::Sources`).
    pub fn event_cpus(&self, events: &[(&str, u64)], sources: &Sources) -> String {
        let conds: Vec<String> = events.iter().map(|(node, ts)| lookback(node, *ts, None)).collect();
        let any = any_of(&conds);
        let samples = self.fleet.table(schema::SAMPLES);
        let kernel = sources
            .kernel_rows(self.fleet, &format!("{STACK_ID} GLOBAL IN (SELECT {STACK_ID} FROM {samples} WHERE {any})"));
        format!(
            "SELECT toUInt32({}) AS ev, toUInt32({CPU}), toUInt64(sumIf({COUNT}, k = 1)), toUInt64(sum({COUNT})) \
             FROM {samples} GLOBAL ANY LEFT JOIN (SELECT {STACK_ID}, has(any({KERNEL}), 1) AS k FROM {kernel} \
             GROUP BY {STACK_ID}) AS s USING {STACK_ID} WHERE {any} GROUP BY ev, {CPU} ORDER BY ev, {CPU}",
            event_of(&conds)
        )
    }

    /// Per event of `events` (`(node, ts, cpu)`), that CPU's top stacks in the lookback: `e,
    /// comm, stack, n`, at most [`EVENT_STACKS`] per event.
    pub fn event_stacks(&self, events: &[(&str, u64, u32)]) -> String {
        let conds: Vec<String> = events.iter().map(|(node, ts, cpu)| lookback(node, *ts, Some(*cpu))).collect();
        format!(
            "SELECT toUInt32({}) AS ev, {COMM}, {STACK_ID}, toUInt64(sum({COUNT})) AS n FROM {} WHERE {} \
             GROUP BY ev, {COMM}, {STACK_ID} ORDER BY ev, n DESC, {COMM}, {STACK_ID} LIMIT {EVENT_STACKS} BY ev",
            event_of(&conds),
            self.fleet.table(schema::SAMPLES),
            any_of(&conds)
        )
    }
}

/// Per event, the CPU with the most kernel-mode samples (ties: most samples, then the lowest
/// number) and its counts.
fn busiest(rows: &[CpuCounts]) -> HashMap<usize, (u32, u64, u64)> {
    let mut best: HashMap<usize, (u32, u64, u64)> = HashMap::new();
    for &(e, cpu, kn, n) in rows {
        let b = best.entry(e).or_insert((cpu, kn, n));
        if (kn, n, std::cmp::Reverse(cpu)) > (b.1, b.2, std::cmp::Reverse(b.0)) {
            *b = (cpu, kn, n);
        }
    }
    best
}

pub(super) fn explain_events(sql: &Sql<'_>, pattern: &str, stacks: &mut Stacks) -> Result<EventAnswer, FleetError> {
    let fleet = sql.fleet;
    let all = fleet.rows(&sql.matching_events(pattern), |r| {
        Ok((r.string()?.to_string(), r.u64()?, r.string()?.to_string(), r.string()?.to_string()))
    })?;
    let matched = match all.len() {
        MAX_EVENTS => fleet.rows(&sql.matching_count(pattern), |r| r.u64())?.first().copied().unwrap_or(0),
        n => n as u64,
    };
    let mut cpus = HashMap::new();
    let mut tops: HashMap<usize, Vec<(String, u64, u64)>> = HashMap::new();
    if !all.is_empty() {
        let sources = Sources::of(fleet)?;
        let events: Vec<(&str, u64)> = all.iter().map(|(node, ts, ..)| (node.as_str(), *ts)).collect();
        let rows = fleet
            .rows(&sql.event_cpus(&events, &sources), |r| Ok((r.u32()? as usize, r.u32()?, r.u64()?, r.u64()?)))?;
        cpus = busiest(&rows);
        let chosen: Vec<(usize, (&str, u64, u32))> =
            events.iter().enumerate().filter_map(|(e, (node, ts))| Some((e, (*node, *ts, cpus.get(&e)?.0)))).collect();
        if !chosen.is_empty() {
            let asked: Vec<(&str, u64, u32)> = chosen.iter().map(|c| c.1).collect();
            for (k, comm, id, n) in fleet.rows(&sql.event_stacks(&asked), |r| {
                Ok((r.u32()? as usize, r.string()?.to_string(), r.u64()?, r.u64()?))
            })? {
                if let Some((e, _)) = chosen.get(k) {
                    tops.entry(*e).or_default().push((comm, id, n));
                }
            }
        }
    }
    stacks.fetch(sql, tops.values().flatten().map(|t| t.1))?;
    let mut events = Vec::new();
    for (e, (node, ts_ns, id, message)) in all.into_iter().enumerate() {
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
        if let Some(&(cpu, kernel, n)) = cpus.get(&e) {
            cause.stacks = tops
                .get(&e)
                .into_iter()
                .flatten()
                .map(|(comm, id, n)| TopStack { stack: stacks.line(comm, *id), samples: *n, nodes: 1 })
                .collect();
            (cause.cpu, cause.cpu_kernel_samples, cause.cpu_samples) = (Some(cpu), kernel, n);
        }
        events.push(cause);
    }
    Ok(EventAnswer { pattern: pattern.to_string(), matched, events })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_takes_its_busiest_kernel_cpu() {
        // Event 0: CPU 3 has the most kernel samples. Event 1: a tie on kernel samples, broken
        // by samples, then a tie on both, broken by the lower CPU. Event 2: no rows.
        let rows = [(0, 1, 5, 50), (0, 3, 9, 10), (1, 4, 2, 7), (1, 2, 2, 9), (1, 0, 2, 9)];
        let b = busiest(&rows);
        assert_eq!(b[&0], (3, 9, 10));
        assert_eq!(b[&1], (0, 2, 9));
        assert!(!b.contains_key(&2));
    }

    #[test]
    fn rows_are_given_the_events_whose_lookback_holds_them() {
        let conds = vec![lookback("a'b", 20_000_000_000, None), lookback("c", 30_000_000_000, Some(7))];
        assert_eq!(conds[0], "node = 'a\\'b' AND ts >= 15000000000 AND ts < 20000000000");
        assert_eq!(conds[1], "node = 'c' AND ts >= 25000000000 AND ts < 30000000000 AND cpu = 7");
        assert_eq!(
            event_of(&conds),
            format!("arrayJoin(arrayFilter(x -> x != 0, [({}) * 1, ({}) * 2])) - 1", conds[0], conds[1])
        );
        assert_eq!(any_of(&conds), format!("({}) OR ({})", conds[0], conds[1]));
    }
}
