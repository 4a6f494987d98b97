//! One 192-CPU node's hour at 99 Hz, half busy, made by a local ClickHouse itself from
//! `numbers()` (34.2 M sample rows: 3,000 stacks of 12 frames, 50 processes), for the
//! measurements of reads that must not grow with the window (`fleet.rs`'s commands,
//! `fleet_ui.rs`'s node page). With `tracks`, the node's counter tracks too (two per CPU and
//! eight GPU utilisations, once a second) and a finding an hour long.

use crate::clickhouse::ClickHouse;

const SEC: u64 = 1_000_000_000;

/// The node `big`'s `secs` seconds of `cpus` CPUs at `hz`, ending a minute ago on a whole
/// second, in `ch`'s database `profiler` (made first by the `schema` statements): the
/// window's start, ns.
pub fn make(ch: &ClickHouse, schema: &[String], cpus: u64, hz: u64, secs: u64, tracks: bool) -> u64 {
    for sql in schema {
        ch.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let t0 = (crate::now_secs() as u64 - 60 - secs) * SEC;
    let step = SEC / hz;
    // Half busy: every other tick of each CPU is a sample.
    let rows = cpus * secs * hz / 2;
    let t = std::time::Instant::now();
    let mut sql = vec![
        format!("INSERT INTO profiler.nodes VALUES ('big', {cpus}, {hz}, '0-{}', 'big', 1)", cpus - 1),
        "INSERT INTO profiler.stacks SELECT number, arrayMap(i -> concat('frame_', toString(i), '_', \
         toString(number % 97)), range(12)), arrayMap(i -> toUInt8(i >= 10), range(12)) FROM numbers(3000)"
            .to_string(),
        format!(
            "INSERT INTO profiler.cpu_seconds SELECT 'big', {t0} + intDiv(number, {cpus}) * {SEC}, {SEC}, \
             number % {cpus}, {}, 0, {}, 0, {hz} FROM numbers({})",
            hz / 2,
            hz - hz / 2,
            cpus * secs
        ),
    ];
    if tracks {
        // Per second: each CPU's softirq and run-queue tracks, and 8 GPUs' utilisation.
        let per_sec = cpus * 2 + 8;
        sql.push(format!(
            "INSERT INTO profiler.counters SELECT 'big', {t0} + intDiv(number, {per_sec}) * {SEC}, \
             multiIf(number % {per_sec} < {cpus}, 'softirq.net_rx', number % {per_sec} < {}, 'sched.runqueue', \
             concat('gpu.', toString(number % {per_sec} - {}), '.util')), \
             if(number % {per_sec} < {}, toInt32(number % {per_sec} % {cpus}), -1), \
             if(number % {per_sec} < {}, '/s', '%'), toFloat64(number % 97) FROM numbers({})",
            2 * cpus,
            2 * cpus,
            2 * cpus,
            2 * cpus,
            per_sec * secs
        ));
        sql.push(format!(
            "INSERT INTO profiler.findings VALUES ('big', 'saturated-core-cpu3-big', 'saturated-core', {t0}, {}, 3, \
             'warning', 'CPU 3 saturated for the hour', '{{}}', 1)",
            t0 + secs * SEC
        ));
    }
    // The samples a minute a statement (a statement of the whole hour outlasts a request).
    let per = cpus * 60 * hz / 2;
    let samples = (0..rows.div_ceil(per)).map(|i| {
        format!(
            "INSERT INTO profiler.samples SELECT 'big', {t0} + intDiv(number, {cpus}) * {} + (number % {cpus}) * 1000, \
             number % {cpus}, 1000 + number % 50, 1000 + number % 50, concat('python', toString(number % 50)), \
             intHash64(number) % 3000, '', 1 FROM (SELECT number + {} AS number FROM numbers({}))",
            2 * step,
            i * per,
            per.min(rows - i * per)
        )
    });
    for s in sql.into_iter().chain(samples) {
        ch.query(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    eprintln!("{rows} sample rows of a {cpus}-CPU node's {secs} s made in {:.1} s", t.elapsed().as_secs_f64());
    t0
}
