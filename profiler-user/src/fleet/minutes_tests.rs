//! Tests of [`super`]: the pure logic of `fleet::minutes` (SQL text, cuts of windows, shares).

use super::*;

const T0: u64 = 1_795_000_000 * SEC / MINUTE_NS * MINUTE_NS;

fn w(a: u64, b: u64) -> Window {
    Window { from_ns: a, to_ns: b }
}

#[test]
fn whole_minutes_from_the_rollup_the_edges_raw() {
    let day = w(T0 + 30 * SEC, T0 + 86_400 * SEC + 10 * SEC);
    let s = Split::new(day, Some(0));
    assert_eq!(s.minutes, Some(w(T0 + MINUTE_NS, T0 + 86_400 * SEC)));
    assert_eq!(s.raw, [w(T0 + 30 * SEC, T0 + MINUTE_NS), w(T0 + 86_400 * SEC, T0 + 86_410 * SEC)]);
    assert_eq!(s.describe("cpu_1m", "cpu_seconds"), "cpu_1m 23h 59m, cpu_seconds 40.000s");
    // Nothing before the rollup began; nothing when it holds no whole minute of the window.
    let late = Split::new(w(T0, T0 + 10 * MINUTE_NS), Some(T0 + 4 * MINUTE_NS));
    assert_eq!(late.minutes, Some(w(T0 + 4 * MINUTE_NS, T0 + 10 * MINUTE_NS)));
    assert_eq!(late.raw, [w(T0, T0 + 4 * MINUTE_NS)]);
    assert_eq!(Split::new(w(T0 + SEC, T0 + 50 * SEC), Some(0)), Split::raw(w(T0 + SEC, T0 + 50 * SEC)));
    assert_eq!(Split::new(day, None), Split::raw(day));
}

#[test]
fn a_page_of_whole_minute_columns_reads_whole_columns() {
    let five = 5 * MINUTE_NS;
    let t0 = T0 / five * five;
    let day = w(t0 + 90 * SEC, t0 + 86_400 * SEC + 70 * SEC);
    let wide = whole_columns(day, five);
    assert_eq!(wide, w(t0, t0 + 86_400 * SEC + five));
    // Every column keeps its place, and all of them are `cpu_5m`'s, no minute nor raw row.
    assert_eq!(aligned_start(wide, five), aligned_start(day, five));
    let t = Tiers::cut(wide, None, Some(0), Some(0));
    assert_eq!((t.fives, t.minutes, t.raw), (vec![wide], vec![], vec![]));
    // Columns of seconds, and windows of whole columns already, are as asked.
    assert_eq!(whole_columns(day, 10 * SEC), day);
    assert_eq!(whole_columns(w(t0, t0 + MINUTE_NS), MINUTE_NS), w(t0, t0 + MINUTE_NS));
}

#[test]
fn the_ranking_reads_hours_then_minutes_then_raw_rows() {
    const H: u64 = HOUR_NS;
    let w = w(T0 + 30 * SEC, T0 + 3 * H + 2 * MINUTE_NS + SEC);
    let h0 = T0.div_ceil(H) * H;
    let t = Tiers::new(w, Some(0), Some(0));
    assert_eq!(t.hours, Some(Window { from_ns: h0, to_ns: (T0 + 3 * H + 2 * MINUTE_NS + SEC) / H * H }));
    assert!(!t.minutes.is_empty() && !t.raw.is_empty(), "{t:?}");
    let covered: u64 =
        t.minutes.iter().chain(&t.raw).chain(t.hours.iter()).chain(&t.fives).map(|x| x.to_ns - x.from_ns).sum();
    assert_eq!(covered, w.to_ns - w.from_ns, "{t:?}");
    assert_eq!(Tiers::new(w, None, None), Tiers::raw(w));
    let fleet = Fleet::new("http://h:1", "p").unwrap();
    let p = Parts { fleet: &fleet, start_ns: T0, bucket_ns: 300 * SEC, nodes: String::new() };
    let q = p.cpu_ranking(&t);
    assert!(q.contains("FROM `p`.`cpu_1h` WHERE hour >=") && q.contains("FROM `p`.`cpu_1m` WHERE minute >="), "{q}");
    assert!(q.contains("GROUP BY nd, hr, cp) UNION ALL") && q.contains("GROUP BY nd, hr) GROUP BY nd"), "{q}");
}

/// A day's per-CPU cells: whole five minutes from `cpu_5m`, a cell a row; the minutes
/// around them from `cpu_1m`; raw rows at the edges.
#[test]
fn cells_of_whole_five_minutes_read_the_five_minute_rollup() {
    const F: u64 = FIVE_MINUTES_NS;
    let w = w(T0 + 30 * SEC, T0 + 86_400 * SEC + 2 * MINUTE_NS + SEC);
    let t = Tiers::cut(w, None, Some(0), Some(0));
    assert_eq!(t.fives, vec![Window { from_ns: T0.div_ceil(F) * F, to_ns: w.to_ns / F * F }]);
    let covered: u64 = t.minutes.iter().chain(&t.raw).chain(&t.fives).map(|x| x.to_ns - x.from_ns).sum();
    assert_eq!(covered, w.to_ns - w.from_ns, "{t:?}");
    // The five-minute rollup started later: minutes before it.
    let f0 = T0.div_ceil(F) * F;
    let later = Tiers::cut(w, None, Some(f0 + 3 * F + SEC), Some(0));
    assert_eq!(later.fives.first().map(|c| c.from_ns), Some(f0 + 4 * F));
    assert_eq!(later.minutes.first().map(|m| (m.from_ns, m.to_ns)), Some((T0 + MINUTE_NS, f0 + 4 * F)));
    let fleet = Fleet::new("http://h:1", "p").unwrap();
    let p = Parts { fleet: &fleet, start_ns: T0, bucket_ns: F, nodes: String::new() };
    let cells = p.cpu_cells_from(&t, false, CPU_1M, false);
    assert!(
        cells.contains(&format!(
            "intDiv(minute - {T0}, 300000000000) AS col, finalizeAggregation(busy_cpus) AS ab, \
             finalizeAggregation(idle_cpus) AS ai FROM `p`.`cpu_5m` WHERE minute >= {} AND minute < {})",
            T0.div_ceil(F) * F,
            w.to_ns / F * F
        )),
        "{cells}"
    );
    assert!(cells.contains("FROM `p`.`cpu_1m` WHERE minute >=") && cells.contains("FROM `p`.`cpu_seconds`"));
    let said = describe_cpu_tiers(&t, CPU_1M);
    assert!(said.starts_with("cpu_5m 23h 55m, cpu_1m 6m 0s, cpu_seconds 31"), "{said}");
}

/// The ranking's day: whole hours, five minutes around them, minutes around those, raw rows.
#[test]
fn the_ranking_reads_five_minutes_around_its_hours() {
    const F: u64 = FIVE_MINUTES_NS;
    let w = w(T0 + 30 * SEC, T0 + 86_400 * SEC + 7 * MINUTE_NS + SEC);
    let t = Tiers::cut(w, Some(0), Some(0), Some(0));
    let (h0, h1) = (T0.div_ceil(HOUR_NS) * HOUR_NS, w.to_ns / HOUR_NS * HOUR_NS);
    assert_eq!(t.hours, Some(Window { from_ns: h0, to_ns: h1 }));
    assert_eq!(
        t.fives.iter().map(|f| (f.from_ns, f.to_ns)).collect::<Vec<_>>(),
        [(T0.div_ceil(F) * F, h0), (h1, w.to_ns / F * F)]
    );
    let covered: u64 =
        t.minutes.iter().chain(&t.raw).chain(&t.fives).chain(t.hours.iter()).map(|x| x.to_ns - x.from_ns).sum();
    assert_eq!(covered, w.to_ns - w.from_ns, "{t:?}");
    let fleet = Fleet::new("http://h:1", "p").unwrap();
    let p = Parts { fleet: &fleet, start_ns: T0, bucket_ns: F, nodes: String::new() };
    let q = p.cpu_ranking(&t);
    assert!(q.contains("finalizeAggregation(idle_cpus) AS ai FROM `p`.`cpu_5m` WHERE minute >="), "{q}");
    assert!(q.contains("GROUP BY nd, hr) GROUP BY nd"), "{q}");
    assert!(
        t.describe(CPU_1H, CPU_1M, "raw").starts_with("cpu_1h 23h 0m, cpu_5m 1h 0m, cpu_1m 6m 0s, raw 31"),
        "{}",
        t.describe(CPU_1H, CPU_1M, "raw")
    );
}

#[test]
fn columns_of_whole_minutes_start_on_their_bucket() {
    let day = w(T0 + 30 * SEC, T0 + 86_430 * SEC);
    assert_eq!(aligned_start(day, 300 * SEC), (T0 + 30 * SEC) / (300 * SEC) * 300 * SEC);
    assert_eq!(aligned_start(day, 10 * SEC), T0 + 30 * SEC);
}

#[test]
fn parts_read_the_rollup_for_minutes_and_raw_rows_at_the_edges() {
    let fleet = Fleet::new("http://h:1", "p").unwrap();
    let p = Parts { fleet: &fleet, start_ns: T0, bucket_ns: 300 * SEC, nodes: " AND node IN ('a')".into() };
    let s = Split::new(w(T0 + 30 * SEC, T0 + 600 * SEC), Some(0));
    let cells = p.cpu_cells(&s, true);
    assert!(
        cells.contains(&format!(
            "FROM `p`.`cpu_seconds` WHERE ts >= {} AND ts < {} AND node IN ('a') GROUP BY node, ts, cpu",
            T0 + 30 * SEC,
            T0 + MINUTE_NS
        )),
        "{cells}"
    );
    assert!(
        cells.contains(&format!(
            "intDiv(minute - {T0}, 300000000000) AS col, arrayPushBack(arrayResize(emptyArrayUInt64(), cpu), \
             toUInt64(finalizeAggregation(busy_ticks))) AS ab"
        )),
        "{cells}"
    );
    assert!(
        cells.contains(&format!(
            "FROM `p`.`cpu_1m` WHERE minute >= {} AND minute < {} AND node IN ('a')) GROUP BY nd, col",
            T0 + MINUTE_NS,
            T0 + 600 * SEC
        )),
        "{cells}"
    );
    let gpu = p.gpu_nodes(&Tiers::new(s.raw[0], None, None), 50.0);
    assert!(gpu.contains("FROM `p`.`counters` WHERE ts >="), "{gpu}");
    let gpu = p.gpu_cells(&s, 50.0);
    assert!(gpu.contains("FROM `p`.`gpu_util_1m` WHERE minute >=") && gpu.contains("countIf(value < 50)"), "{gpu}");
    // Another idle line than the rollup's: raw rows.
    assert_eq!(p.gpu_split(s.raw[0], 30.0).unwrap(), Split::raw(s.raw[0]));
}
