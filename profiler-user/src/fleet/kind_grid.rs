//! The subsecond heatmap of a weighted kind (the CUDA probes' counts, off-CPU time) summed by
//! the server: per cell, the weights of the kind's rows, as the node's store of that kind gives
//! them (`query::subsecond_grid` adds each row's weight). A row sent twice is there twice until
//! a merge: one per (node, second, thread, stack), as every read of `cuda_samples` takes it.
//! A column is recorded where the kind has rows: the store of a kind writes a block only for
//! the seconds that counted something.

use std::collections::HashMap;

use super::{
    Fleet, FleetError, MISSING_STACK,
    pushdown::{Frames, check_cpus, column_filters, scope, stack_keeps, stacks, workloads},
    select::Selection,
};
use crate::{
    model::SampleKind,
    query::{Filter, Grid, Window},
    ship::clickhouse::schema::col::*,
};

const SEC: u64 = 1_000_000_000;

/// The heatmap of the chosen nodes' `kind` rows in `window` (several nodes: summed).
pub fn grid(
    fleet: &Fleet,
    sel: &Selection,
    kind: SampleKind,
    window: Window,
    rows: usize,
    filter: &Filter,
) -> Result<Grid, FleetError> {
    check_cpus(sel, filter)?;
    let mut grid = Grid::empty(window, rows);
    let (first, k, r) = (grid.first_second, grid.seconds_per_column, grid.rows);
    let (table, range) = scope(fleet, sel, kind, window);
    let ids = workloads(fleet, &table, &range, filter)?;
    // One row per key, its filter columns beside it.
    let one = format!(
        "(SELECT {TS} AS t, {STACK_ID} AS sid, any({CPU}) AS k, any({PID}) AS p, {COMM} AS c, \
         any({WORKLOAD}) AS w, max({VALUE}) AS v FROM {table} WHERE {range} GROUP BY {NODE}, {TS}, {TID}, {STACK_ID}, {COMM})"
    );
    let seconds = fleet.rows(&format!("SELECT DISTINCT toUInt64(intDiv(t, {SEC})) FROM {one}"), |r| r.u64())?;
    for second in seconds {
        grid.record(second * SEC, (second + 1) * SEC);
    }
    let Some(w) = column_filters(filter, ["k", "p", "c", "w"], ids.as_deref()) else { return Ok(grid) };
    let cell = format!(
        "toUInt64(intDiv(intDiv(t, {SEC}) - {first}, {k})) AS col, toUInt64(intDiv((t % {SEC}) * {r}, {SEC})) AS rw"
    );
    let cells = if filter.context.is_some() || filter.function.is_some() {
        // Filters of the stack itself: per stack, decided here once each.
        let stacks = stacks(fleet, &table, &range)?;
        let missing: Frames = (vec![MISSING_STACK.to_string()], vec![0u8]);
        let mut passes: HashMap<u64, bool> = HashMap::new();
        let rows = fleet.rows(
            &format!("SELECT {cell}, sid, toUInt64(sum(v)) FROM {one} WHERE 1{w} GROUP BY col, rw, sid"),
            |r| Ok((r.u64()?, r.u64()?, r.u64()?, r.u64()?)),
        )?;
        rows.into_iter()
            .filter(|&(_, _, id, _)| {
                *passes.entry(id).or_insert_with(|| stack_keeps(filter, stacks.get(&id).unwrap_or(&missing)))
            })
            .map(|(c, rw, _, n)| (c, rw, n))
            .collect::<Vec<_>>()
    } else {
        fleet.rows(&format!("SELECT {cell}, toUInt64(sum(v)) FROM {one} WHERE 1{w} GROUP BY col, rw"), |r| {
            Ok((r.u64()?, r.u64()?, r.u64()?))
        })?
    };
    for (col, row, n) in cells {
        grid.add(first + col * k, row as usize, n);
    }
    Ok(grid)
}
