//! `profiler fleet --event`: each kernel log event that matches, with the CPU that spent most
//! samples in the kernel in the seconds before it and what ran there.
//!
//! The seconds before an event are the [`EVENT_LOOKBACK_NS`] of whole seconds before the
//! second it happened in: the store's resolution, and that of `cpu_seconds`, whose per-CPU
//! kernel-mode counts (stacks with kernel frames, counted as each block was written) choose
//! the CPU. Every event is answered by the same two reads, one `UNION ALL` branch per event
//! (each finds its node by the primary key; 18.16 reads every row for a hundred `OR`ed
//! nodes): the per-CPU counts, then the top stacks of each event's chosen CPU. (Two reads per
//! event, each joining the kernel flags of its stacks from `samples`, took 4.2 s for 100
//! events at 1,000 nodes: 18 MB of stack rows read a hundred times, and every CPU's rows of
//! the node.)

use std::collections::HashMap;

use super::{EVENT_LOOKBACK_NS, EVENT_STACKS, EventAnswer, EventCause, MAX_EVENTS, Sql, Stacks, TopStack};
use crate::{
    fleet::{Fleet, FleetError},
    ship::clickhouse::schema::{self, col::*},
    timespec,
};

const SEC: u64 = 1_000_000_000;

/// `(event, cpu, kernel samples, samples)`.
type CpuCounts = (usize, u32, u64, u64);

/// `node = ... AND ts` in the whole seconds before `ts_ns`'s second.
fn lookback(node: &str, ts_ns: u64) -> String {
    let second = ts_ns / SEC * SEC;
    Fleet::node_range(node, second.saturating_sub(EVENT_LOOKBACK_NS), second)
}

/// One `SELECT` per event (`branch(i, event)`), each with its index as `ev`.
fn union<T>(events: &[T], branch: impl Fn(usize, &T) -> String) -> String {
    let parts: Vec<String> = events.iter().enumerate().map(|(i, e)| branch(i, e)).collect();
    format!("({})", parts.join(" UNION ALL "))
}

impl Sql<'_> {
    /// Per event of `events` (`(node, ts)`) and CPU, the kernel-mode and busy samples of the
    /// lookback, from `cpu_seconds` (a row sent twice counted once): `ev, cpu, kernel, busy`.
    pub fn event_cpus(&self, events: &[(&str, u64)]) -> String {
        let table = self.fleet.table(schema::CPU_SECONDS);
        let rows = union(events, |i, (node, ts)| {
            format!(
                "SELECT toUInt32({i}) AS ev, {CPU}, {TS}, max({KERNEL}) AS kn, max({BUSY}) AS bs FROM {table} \
                 WHERE {} GROUP BY {CPU}, {TS}",
                lookback(node, *ts)
            )
        });
        format!(
            "SELECT ev, toUInt32({CPU}), toUInt64(sum(kn)), toUInt64(sum(bs)) FROM {rows} GROUP BY ev, {CPU} \
             ORDER BY ev, {CPU}"
        )
    }

    /// Per event of `events` (`(node, ts, cpu)`), that CPU's top stacks in the lookback: `ev,
    /// comm, stack, n`, at most [`EVENT_STACKS`] per event.
    pub fn event_stacks(&self, events: &[(&str, u64, u32)]) -> String {
        let table = self.fleet.table(schema::SAMPLES);
        let rows = union(events, |i, (node, ts, cpu)| {
            format!(
                "SELECT toUInt32({i}) AS ev, {COMM}, {STACK_ID}, {COUNT} FROM {table} WHERE {} AND {CPU} = {cpu}",
                lookback(node, *ts)
            )
        });
        format!(
            "SELECT ev, {COMM}, {STACK_ID}, toUInt64(sum({COUNT})) AS n FROM {rows} GROUP BY ev, {COMM}, {STACK_ID} \
             ORDER BY ev, n DESC, {COMM}, {STACK_ID} LIMIT {EVENT_STACKS} BY ev"
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

pub(super) fn explain_events(sql: &Sql<'_>, pattern: &str) -> Result<EventAnswer, FleetError> {
    let mut stacks = Stacks::default();
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
        let events: Vec<(&str, u64)> = all.iter().map(|(node, ts, ..)| (node.as_str(), *ts)).collect();
        let rows = fleet.rows(&sql.event_cpus(&events), |r| Ok((r.u32()? as usize, r.u32()?, r.u64()?, r.u64()?)))?;
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
    fn each_event_is_a_branch_over_the_seconds_before_its_own() {
        assert_eq!(lookback("a'b", 20_700_000_000), "node = 'a\\'b' AND ts >= 15000000000 AND ts < 20000000000");
        let u = union(&[1, 2], |i, e| format!("SELECT {i} AS ev, {e}"));
        assert_eq!(u, "(SELECT 0 AS ev, 1 UNION ALL SELECT 1 AS ev, 2)");
    }
}
