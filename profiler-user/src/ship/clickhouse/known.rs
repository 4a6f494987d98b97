//! Which of a batch's new stacks the server already has. Every node of a shard uses mostly
//! the same stacks (the same binaries and jobs), so without asking, each node sends each of
//! them once and `stacks` holds a copy per node until merges collapse them: with a thousand
//! nodes, gigabytes of frames that every read by stack id goes through (BENCHMARKS.md, the
//! fleet at scale). Asking reads only the server's `stack_id` column, a few granules per id.
//! The same for the frames of the new stacks (`frames`, by `frame_id`).

use std::collections::HashSet;

use super::{error::ShipError, http::Client};

/// Ids asked per query: 20 bytes of SQL each, well under the server's 256 KiB `max_query_size`.
const ASK_BATCH: usize = 4_000;

/// The ids among `ids` that `table` (the node's shard's `stack_frames` or `frames`) holds in
/// `column`, its key.
pub fn known(
    client: &Client,
    table: &str,
    column: &str,
    ids: impl Iterator<Item = u64>,
) -> Result<HashSet<u64>, ShipError> {
    let mut ids: Vec<u64> = ids.collect();
    // Sorted, each query reads one range of the table's key.
    ids.sort_unstable();
    let mut out = HashSet::new();
    for chunk in ids.chunks(ASK_BATCH) {
        let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
        let answer = client.query(&format!(
            "SELECT DISTINCT {column} FROM {table} WHERE {column} IN ({}) FORMAT TSV",
            list.join(", ")
        ))?;
        for line in answer.lines() {
            let id = line.trim().parse().map_err(|_| ShipError::Answer(answer.clone()))?;
            out.insert(id);
        }
    }
    Ok(out)
}
