//! The counter tracks (kernel counters, GPU tracks: `store::counters`) as rows of the `counters`
//! table, so that a fleet's ClickHouse has what `profiler counters` prints on the node: one row
//! per track and tick, `RowBinary` like the stacks.
//!
//! They ride with the samples' batches, read for the same seconds: the cursor covers both. A
//! re-sent batch repeats its rows, which the table's `ReplacingMergeTree` key (node, name, cpu,
//! ts) collapses; a file the store cannot read is said once and its points are not shipped
//! (samples are not held back for it).

use std::path::Path;

use super::binary::put_str;
use crate::store::counters::{self, Select};

/// A batch's counter rows.
#[derive(Debug, Default)]
pub struct CounterRows {
    pub bytes: Vec<u8>,
    pub rows: usize,
    /// The last failure said, so that a broken file is logged once, not every batch.
    said: Option<String>,
}

impl CounterRows {
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Adds the points of `[from_ns, to_ns)` as rows of `node`.
    pub fn read(&mut self, data_dir: &Path, node: &str, from_ns: u64, to_ns: u64) {
        let tracks = match counters::read(data_dir, from_ns, to_ns, &Select::default()) {
            Ok(t) => t,
            Err(e) => {
                self.say(e.to_string());
                return;
            }
        };
        if let Some(why) = tracks.skipped_files.first() {
            self.say(why.clone());
        }
        for t in &tracks.tracks {
            for &(ms, value) in &t.points {
                self.push(node, ms.saturating_mul(1_000_000), &t.name, t.cpu, &t.unit, value);
            }
        }
    }

    fn say(&mut self, why: String) {
        if self.said.as_ref() != Some(&why) {
            tracing::warn!(error = %why, "counter tracks left out of ClickHouse");
            self.said = Some(why);
        }
    }

    /// One row: `node String, ts UInt64, name String, cpu Int32, unit String, value Float64`
    /// (`cpu` -1 for a track of no one CPU, as in `findings`).
    pub fn push(&mut self, node: &str, ts_ns: u64, name: &str, cpu: Option<u32>, unit: &str, value: f64) {
        put_str(&mut self.bytes, node);
        self.bytes.extend_from_slice(&ts_ns.to_le_bytes());
        put_str(&mut self.bytes, name);
        let cpu = cpu.and_then(|c| i32::try_from(c).ok()).unwrap_or(-1);
        self.bytes.extend_from_slice(&cpu.to_le_bytes());
        put_str(&mut self.bytes, unit);
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self.rows += 1;
    }

    /// Empties the batch, keeping what was said.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.rows = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{collect::counters::Point, store::counters::CountersWriter};

    #[test]
    fn rows_are_row_binary_in_the_tables_column_order() {
        let mut r = CounterRows::default();
        r.push("n1", 7, "gpu.0.util", None, "%", 37.5);
        let mut want = vec![2, b'n', b'1'];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.push(10);
        want.extend_from_slice(b"gpu.0.util");
        want.extend_from_slice(&(-1i32).to_le_bytes());
        want.extend_from_slice(&[1, b'%']);
        want.extend_from_slice(&37.5f64.to_le_bytes());
        assert_eq!(r.bytes, want);
        assert_eq!(r.rows, 1);
    }

    #[test]
    fn a_window_reads_the_stores_points_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CountersWriter::stream(dir.path(), "gpu").unwrap();
        let t0 = 1_795_000_020_000_000_000u64;
        let point = |name: &str, cpu, value| Point { name: name.into(), cpu, unit: "%".into(), value };
        for i in 0..20u64 {
            w.append(t0 + i * 100_000_000, &[point("gpu.0.util", None, i as f64), point("x", Some(1), 1.0)]).unwrap();
        }
        let mut r = CounterRows::default();
        // Two steps that meet at 1 s: 10 ticks each, two tracks a tick.
        r.read(dir.path(), "n", t0, t0 + 1_000_000_000);
        assert_eq!(r.rows, 20);
        r.read(dir.path(), "n", t0 + 1_000_000_000, t0 + 2_000_000_000);
        assert_eq!(r.rows, 40);
        r.clear();
        assert!(r.is_empty() && r.bytes.is_empty());
    }
}
