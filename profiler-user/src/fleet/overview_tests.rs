//! Tests of [`super`]: the pure logic of `fleet::overview` (SQL text, cuts of windows, shares).

use super::*;

fn w(secs: u64) -> Window {
    Window::new(1000 * SEC, (1000 + secs) * SEC).unwrap()
}

#[test]
fn buckets_are_round_and_columns_stay_within_the_limit() {
    assert_eq!(choose_bucket(w(600)), (1, 600));
    assert_eq!(choose_bucket(w(601)), (2, 301));
    assert_eq!(choose_bucket(w(3600)), (10, 360));
    assert_eq!(choose_bucket(w(86_400)), (300, 288));
    assert_eq!(choose_bucket(Window::new(0, 1).unwrap()), (1, 1));
    // Beyond the list: whole days.
    let (b, c) = choose_bucket(w(2000 * 86_400));
    assert!(b % 86_400 == 0 && c <= MAX_COLUMNS, "{b} {c}");
    for secs in [1, 59, 599, 600, 601, 7_777, 604_800, 31_536_000] {
        let (b, c) = choose_bucket(w(secs));
        assert!(c <= MAX_COLUMNS && b * c >= secs && b * (c - 1) < secs, "{secs}: {b} x {c}");
    }
}

#[test]
fn sql_quotes_what_users_type() {
    assert_eq!(node_filter(&[]), "");
    assert_eq!(node_filter(&["a".into(), "b'c\\".into()]), " AND node IN ('a', 'b\\'c\\\\')");
    let fleet = Fleet::new("http://h:1", "p`x").unwrap();
    let sql = Sql {
        fleet: &fleet,
        window: w(10),
        nodes: node_filter(&["n'1".into()]),
        pieces: Vec::new(),
        fleet_pieces: Vec::new(),
        node_pieces: Vec::new(),
        cpu: Split::raw(w(10)),
        cpu_minutes: NodeMinutes::PerNode,
    };
    let cells = sql.cells(1);
    assert!(
        cells.contains(
            "FROM `p\\`x`.`cpu_seconds` WHERE ts >= 1000000000000 AND ts < 1010000000000 AND node IN ('n\\'1')"
        ),
        "{cells}"
    );
    let ev = sql.matching_events("ena.*reset'; DROP TABLE x");
    assert!(ev.contains("match(message, 'ena.*reset\\'; DROP TABLE x')"), "{ev}");
    // One branch per event, each on its node's whole seconds before the event's second.
    let cpu = sql.event_cpus(&[("n'1", 20 * SEC + 300), ("n2", 30 * SEC)]);
    assert!(cpu.contains("SELECT toUInt32(0) AS ev, cpu, ts, max(kernel) AS kn, max(busy) AS bs FROM `p\\`x`.`cpu_seconds` WHERE node = 'n\\'1' AND ts >= 15000000000 AND ts < 20000000000 GROUP BY cpu, ts UNION ALL SELECT toUInt32(1) AS ev"), "{cpu}");
    assert!(cpu.contains("node = 'n2' AND ts >= 25000000000 AND ts < 30000000000"), "{cpu}");
    let stacks = sql.event_stacks(&[("n'1", 20 * SEC, 3)]);
    assert!(stacks.contains("AND cpu = 3") && stacks.ends_with("LIMIT 3 BY ev"), "{stacks}");
    assert!(sql.cells(10).contains("intDiv(ts - 1000000000000, 10000000000)"));
    assert!(sql.top(7).ends_with("LIMIT 7"));
    // Parts of the window from the minute rollup and from raw rows, summed together.
    let minute = 60 * SEC;
    let pieces = vec![
        Piece { source: Source::Raw, window: Window { from_ns: 1000 * SEC, to_ns: 1020 * SEC } },
        Piece { source: Source::Minutes, window: Window { from_ns: 1020 * SEC, to_ns: 1020 * SEC + minute } },
    ];
    let sql = Sql { pieces, ..sql };
    let top = sql.top(3);
    assert!(
        top.contains("FROM `p\\`x`.`samples` WHERE ts >= 1000000000000 AND ts < 1020000000000 AND node IN ('n\\'1') UNION ALL SELECT")
            && top.contains("FROM `p\\`x`.`samples_1m` WHERE ts >= 1020000000000 AND ts < 1080000000000"),
        "{top}"
    );
    // The whole fleet: totals from its tables, the nodes of the stacks listed from theirs.
    let seconds = Piece { source: Source::FleetSeconds, window: Window { from_ns: 1000 * SEC, to_ns: 1020 * SEC } };
    let sql = Sql { fleet_pieces: vec![seconds], nodes: String::new(), ..sql };
    let top = sql.top(3);
    assert!(
        top.contains("FROM `p\\`x`.`samples_fleet_1s` WHERE ts >= 1000000000000 AND ts < 1020000000000")
            && !top.contains("uniqExact")
            && top.ends_with("LIMIT 3"),
        "{top}"
    );
    let on = sql.top_nodes(&[7, 9]);
    assert!(
        on.contains("`samples` WHERE ts >= 1000000000000 AND ts < 1020000000000 AND stack_id IN (7, 9) UNION ALL")
            && on.ends_with("AND stack_id IN (7, 9)) GROUP BY cm, sid"),
        "{on}"
    );
    // From the nodes' hours where the plan has them, the stacks asked in each part.
    let hour = Piece { source: Source::NodeHours, window: Window { from_ns: 3600 * SEC, to_ns: 7200 * SEC } };
    let on = Sql { node_pieces: vec![hour], ..sql }.top_nodes(&[7]);
    assert_eq!(
        on,
        "SELECT cm, sid, toUInt64(uniqExact(nd)) FROM (SELECT node AS nd, comm AS cm, stack_id AS sid, \
         toUInt64(count) AS n FROM `p\\`x`.`stack_nodes_1h` WHERE ts >= 3600000000000 AND ts < 7200000000000 \
         AND stack_id IN (7)) GROUP BY cm, sid"
    );
}

#[test]
fn missing_stacks_and_kernel_frames_fold_like_the_rest() {
    let mut s = Stacks::default();
    s.frames.insert(1, (vec!["main".into(), "x;y".into(), "do_syscall_64".into()], vec![0, 0, 1]));
    assert_eq!(s.line("a 1", 1), "a_1;main;x:y;do_syscall_64_[k]");
    assert_eq!(s.line("c", 2), "c;[stack not in ClickHouse]");
}

#[test]
fn a_cpu_whose_idle_takes_no_ticks_is_not_read_busy() {
    let cell = |busy, idle, lost, span_ns| Cell { busy, idle, lost, span_ns, ..Default::default() };
    assert_eq!(cell(0, 0, 0, 0).busy_share(2, 100), None);
    assert_eq!(cell(9, 1, 0, 0).busy_share(1, 100), Some(0.9));
    // 2 CPUs at 100 Hz for 10 s: 2,000 ticks, whatever fewer the node counted.
    assert_eq!(cell(500, 500, 0, 10 * SEC).busy_share(2, 100), Some(0.25));
    assert_eq!(cell(1500, 450, 50, 10 * SEC).busy_share(2, 100), Some(0.75));
    // More ticks than Hz x seconds (a timer's jitter): the ticks.
    assert_eq!(cell(1010, 1010, 0, 10 * SEC).busy_share(2, 100), Some(0.5));
}

#[test]
fn bad_patterns_are_a_sentence() {
    let fleet = Fleet::new("http://127.0.0.1:1", "p").unwrap();
    let req = Request { window: w(10), nodes: vec![], top: 10, event: Some("ena(".into()) };
    let e = overview(&fleet, &req).unwrap_err().to_string();
    assert!(e.starts_with("--event 'ena(' is not a regular expression"), "{e}");
    let req = Request { event: None, ..req };
    let e = overview(&fleet, &req).unwrap_err().to_string();
    assert!(e.starts_with("ClickHouse at 127.0.0.1:1 does not answer"), "{e}");
}
