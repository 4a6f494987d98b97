//! One node's counter tracks (kernel counters, GPU tracks) read back from the `counters` table
//! the shipper fills (`ship::clickhouse::counters`): the tracks `store::counters::read` gives on
//! the node for the same window, in its order (name, then CPU, the machine-wide track first)
//! and with its points, so the node page's tracks are the node's own.
//!
//! A re-sent batch repeats its rows until the table's merge: one point per (track, tick).

use std::collections::BTreeMap;

use super::{Fleet, FleetError, Node};
use crate::{
    query::Window,
    ship::clickhouse::schema::{self, col::*, quote_str},
    store::counters::{Track, Tracks},
};

const MS: u64 = 1_000_000;

/// The node's rows of `window` on the ticks the store reads: whole milliseconds, from the
/// window's start (rounded down) to its end (rounded up), as `store::counters::read` takes them.
fn range(node: &Node, window: Window) -> String {
    let (from, to) = (window.from_ns / MS * MS, window.to_ns.div_ceil(MS) * MS);
    format!("{NODE} = {} AND {TS} >= {from} AND {TS} < {to}", quote_str(&node.name))
}

/// The points (one per track and tick) the node's tracks have in `window`: what a read of
/// them would carry, counted by the server first so that too many are refused unread.
pub fn points(fleet: &Fleet, node: &Node, window: Window) -> Result<u64, FleetError> {
    let sql = format!(
        "SELECT count() FROM (SELECT 1 FROM {} WHERE {} GROUP BY {NAME}, {CPU}, {TS})",
        fleet.table(schema::COUNTERS),
        range(node, window)
    );
    Ok(fleet.rows(&sql, |r| r.u64())?.first().copied().unwrap_or(0))
}

/// The node's tracks with points in `window`, ordered by name then CPU.
pub fn tracks(fleet: &Fleet, node: &Node, window: Window) -> Result<Tracks, FleetError> {
    let sql = format!(
        "SELECT {NAME}, {CPU}, any({UNIT}), {TS}, any({VALUE}) FROM {} WHERE {} GROUP BY {NAME}, {CPU}, {TS} \
         ORDER BY {NAME}, {CPU}, {TS}",
        fleet.table(schema::COUNTERS),
        range(node, window)
    );
    let mut tracks: BTreeMap<(String, Option<u32>), Track> = BTreeMap::new();
    let rows =
        fleet.rows(&sql, |r| Ok((r.string()?.to_string(), r.i32()?, r.string()?.to_string(), r.u64()?, r.f64()?)));
    // A server shipped to before counters were stored has no such table: no tracks.
    let rows = match rows {
        Err(FleetError::NoNodes(_)) => Vec::new(),
        other => other?,
    };
    for (name, cpu, unit, ts, value) in rows {
        // `-1`: a track of no one CPU (`ship::clickhouse::counters`).
        let cpu = u32::try_from(cpu).ok();
        tracks
            .entry((name.clone(), cpu))
            .or_insert_with(|| Track { name, cpu, unit, points: Vec::new() })
            .points
            .push((ts / MS, value));
    }
    Ok(Tracks { tracks: tracks.into_values().collect(), ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_read_on_the_stores_millisecond_ticks() {
        let node = Node { name: "a'b".into(), cpus: 2, hz: 99, online: "0-1".into(), host: "h".into() };
        let w = Window::new(1_500_000_001, 2_500_000_001).unwrap();
        assert_eq!(range(&node, w), "node = 'a\\'b' AND ts >= 1500000000 AND ts < 2501000000");
    }
}
