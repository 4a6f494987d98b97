//! Tests of [`super`]: the pure logic of `fleet::rollup` (which table answers which part of a
//! window, the looks after its end).

use super::*;

fn sel(whole_fleet: bool) -> Selection {
    Selection { nodes: Vec::new(), whole_fleet }
}

const T0: u64 = 1_795_000_000 * 1_000_000_000 / HOUR_NS * HOUR_NS;

/// The node and fleet minutes, ten minutes and hours from `from`; nothing else.
fn covered(from: Option<u64>) -> Coverage {
    Coverage {
        minutes_from: from,
        hours_from: from,
        fleet_minutes_from: from,
        fleet_ten_minutes_from: from,
        ..Default::default()
    }
}

fn w(a: u64, b: u64) -> Window {
    Window { from_ns: a, to_ns: b }
}

#[test]
fn a_window_followed_by_no_row_reads_its_last_unit_whole() {
    let from = T0 + 59 * MINUTE_NS + 30_500_000_000;
    let to = T0 + 3 * HOUR_NS + MINUTE_NS + 10_000_000_000;
    let quiet = Coverage {
        minutes_from: Some(0),
        hours_from: Some(0),
        quiet_until: Some(T0 + 4 * HOUR_NS),
        ..Default::default()
    };
    let got = |c: Coverage, from, to| -> Vec<(Source, u64, u64)> {
        plan(w(from, to), &Filter::default(), &sel(true), c)
            .iter()
            .map(|p| (p.source, p.window.from_ns, p.window.to_ns))
            .collect()
    };
    // The last hour from the hours: no row after `to` in it.
    assert_eq!(
        got(quiet, from, to),
        vec![(Source::Raw, from, T0 + HOUR_NS), (Source::Hours, T0 + HOUR_NS, T0 + 4 * HOUR_NS)]
    );
    // Rows later in that hour, none in its minute: the minute.
    let minute = Coverage { quiet_until: Some(T0 + 3 * HOUR_NS + 2 * MINUTE_NS), ..quiet };
    let minutes = (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + 2 * MINUTE_NS);
    assert_eq!(got(minute, from, to).last(), Some(&minutes));
    // A unit starting before the window, or one the rollup does not hold whole: as asked.
    let inside = (T0 + 10 * SECOND_NS, T0 + 20 * SECOND_NS);
    assert_eq!(got(quiet, inside.0, inside.1), vec![(Source::Raw, inside.0, inside.1)]);
    let late = Coverage { hours_from: Some(T0 + 4 * HOUR_NS), ..quiet };
    assert_eq!(got(late, from, to).last(), Some(&(Source::Minutes, T0 + HOUR_NS, T0 + 3 * HOUR_NS + 2 * MINUTE_NS)));
    // `--cpu` reads raw rows: nothing widened.
    let cpu = Filter { cpus: vec![1], ..Filter::default() };
    assert_eq!(plan(w(from, to), &cpu, &sel(true), quiet)[0].window, w(from, to));
}

#[test]
fn the_rows_after_a_window_are_looked_for_where_none_can_arrive_meanwhile() {
    let to = T0 + 3 * HOUR_NS + 10 * SECOND_NS;
    let mut asked = Vec::new();
    let rows_after = |after: u64| {
        move |a: u64, b: u64| -> Result<bool, FleetError> {
            assert_eq!(a, to);
            Ok(b > to.saturating_add(after))
        }
    };
    let day_end = to.div_ceil(schema::DAY_NS) * schema::DAY_NS;
    // Ending now: the coarsest unit with no row after the end.
    assert_eq!(quiet_until(w(T0, to), to + 500_000_000, rows_after(u64::MAX)).unwrap(), Some(day_end));
    assert_eq!(quiet_until(w(T0, to), to, rows_after(120 * SECOND_NS)).unwrap(), Some(T0 + 3 * HOUR_NS + MINUTE_NS));
    assert_eq!(quiet_until(w(T0, to), to, rows_after(30 * SECOND_NS)).unwrap(), None, "rows in the minute");
    // Ended 10 s ago: every unit holding its end is still being filled; nothing is asked.
    let log = |a: u64, b: u64| -> Result<bool, FleetError> {
        asked.push((a, b));
        Ok(false)
    };
    assert_eq!(quiet_until(w(T0, to), to + 10 * SECOND_NS, log).unwrap(), None);
    assert!(asked.is_empty(), "{asked:?}");
    // Long settled (the fleet's data stops there): looked for.
    assert_eq!(quiet_until(w(T0, to), to + 2 * schema::DAY_NS, rows_after(u64::MAX)).unwrap(), Some(day_end));
    // On a unit's end: nothing to widen.
    let nothing = |_, _| -> Result<bool, FleetError> { panic!("nothing to look for") };
    assert_eq!(quiet_until(w(T0, day_end), T0, nothing).unwrap(), None);
}

#[test]
fn a_window_is_read_from_hours_then_minutes_then_raw_rows_at_its_edges() {
    let cover = Coverage { minutes_from: Some(0), hours_from: Some(0), ..Default::default() };
    // 00:59:30.5 to 03:01:10: raw, a minute, two hours, a minute, raw.
    let from = T0 + 59 * MINUTE_NS + 30_500_000_000;
    let to = T0 + 3 * HOUR_NS + MINUTE_NS + 10_000_000_000;
    let p = plan(w(from, to), &Filter::default(), &sel(true), cover);
    let got: Vec<(Source, u64, u64)> = p.iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect();
    assert_eq!(
        got,
        vec![
            (Source::Raw, from, T0 + HOUR_NS),
            (Source::Hours, T0 + HOUR_NS, T0 + 3 * HOUR_NS),
            (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + MINUTE_NS),
            (Source::Raw, T0 + 3 * HOUR_NS + MINUTE_NS, to),
        ]
    );
    // The parts cover the window once.
    assert!(p.windows(2).all(|x| x[0].window.to_ns == x[1].window.from_ns));
    assert_eq!(describe(&p), "samples 39.500s, samples_1h 2h 0m, samples_1m 1m 0s");
}

#[test]
fn no_raw_rows_are_read_before_the_data_begins() {
    // The data begins at 02:10:20 (its first minute and hour are the rollups' first): the
    // raw rows before it are not read; those at the end are.
    let begins = T0 + 2 * HOUR_NS + 10 * MINUTE_NS + 20 * SECOND_NS;
    let cover = Coverage {
        minutes_from: Some(begins / MINUTE_NS * MINUTE_NS),
        node_hours_from: Some(begins / HOUR_NS * HOUR_NS),
        raw_empty_until: Some(begins),
        ..Default::default()
    };
    let (from, to) = (T0 + 30 * SECOND_NS, T0 + 3 * HOUR_NS + 10 * SECOND_NS);
    let got = |p: Vec<Piece>| -> Vec<(Source, u64, u64)> {
        p.iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect()
    };
    let minutes = (Source::Minutes, T0 + 2 * HOUR_NS + 10 * MINUTE_NS, T0 + 3 * HOUR_NS);
    assert_eq!(
        got(plan(w(from, to), &Filter::default(), &sel(false), cover)),
        vec![minutes, (Source::Raw, T0 + 3 * HOUR_NS, to)]
    );
    // `--cpu`: raw rows only, from where the data begins.
    let cpu = Filter { cpus: vec![1], ..Filter::default() };
    assert_eq!(got(plan(w(from, to), &cpu, &sel(false), cover)), vec![(Source::Raw, begins, to)]);
    // The nodes of a stack: the hour the data began in from the node hours.
    assert_eq!(
        got(plan_nodes(w(from, to), cover)),
        vec![
            (Source::NodeHours, T0 + 2 * HOUR_NS, T0 + 3 * HOUR_NS),
            (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + MINUTE_NS)
        ]
    );
    // No row after the window in its hour: that hour whole from the node hours.
    let quiet = Coverage { quiet_until: Some(T0 + 4 * HOUR_NS), ..cover };
    assert_eq!(got(plan_nodes(w(from, to), quiet)), vec![(Source::NodeHours, T0 + 2 * HOUR_NS, T0 + 4 * HOUR_NS)]);
    // Without it, as before: raw rows from the window's start.
    let unknown = Coverage { raw_empty_until: None, ..cover };
    assert_eq!(got(plan(w(from, to), &cpu, &sel(false), unknown)), vec![(Source::Raw, from, to)]);
}

#[test]
fn the_nodes_of_a_stack_are_counted_from_node_hours_then_node_minutes_then_raw_rows() {
    let from = T0 + 59 * MINUTE_NS + 30_500_000_000;
    let to = T0 + 3 * HOUR_NS + MINUTE_NS + 10_000_000_000;
    // No fleet-wide table, whatever the coverage: they have no node.
    let all = Some(0);
    let cover = Coverage {
        minutes_from: all,
        hours_from: all,
        fleet_minutes_from: all,
        node_hours_from: all,
        ..Default::default()
    };
    let got: Vec<(Source, u64, u64)> =
        plan_nodes(w(from, to), cover).iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect();
    // Widened to the minutes around its edges: no raw row.
    assert_eq!(
        got,
        vec![
            (Source::Minutes, T0 + 59 * MINUTE_NS, T0 + HOUR_NS),
            (Source::NodeHours, T0 + HOUR_NS, T0 + 3 * HOUR_NS),
            (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + 2 * MINUTE_NS),
        ]
    );
    // Minutes begun after the window's start: raw rows there, to the nanosecond.
    let cover_late = Coverage { minutes_from: Some(T0 + HOUR_NS), ..cover };
    let got: Vec<(Source, u64, u64)> =
        plan_nodes(w(from, to), cover_late).iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect();
    assert_eq!(got[0], (Source::Raw, from, T0 + HOUR_NS));
    assert_eq!(got.last().unwrap().2, T0 + 3 * HOUR_NS + 2 * MINUTE_NS);
    // Node hours begun later (a database from before them): minutes until then.
    let late = Coverage { node_hours_from: Some(T0 + 2 * HOUR_NS), ..cover };
    let got: Vec<Source> = plan_nodes(w(T0, T0 + 3 * HOUR_NS), late).iter().map(|p| p.source).collect();
    assert_eq!(got, [Source::Minutes, Source::NodeHours]);
    // Neither: raw rows.
    assert_eq!(plan_nodes(w(from, to), Coverage::default()), vec![Piece { source: Source::Raw, window: w(from, to) }]);
}

#[test]
fn the_fleet_reads_its_class_tables_around_the_hours_and_some_nodes_do_not() {
    let all = Some(0);
    let cover = covered(all);
    // 00:42:10 to 02:13:30: raw, fleet minutes to 00:50, 10 minutes to 01:00, an hour,
    // 10 minutes to 02:10, fleet minutes to 02:13, raw.
    let from = T0 + 42 * MINUTE_NS + 10_000_000_000;
    let to = T0 + 2 * HOUR_NS + 13 * MINUTE_NS + 30_000_000_000;
    let got: Vec<(Source, u64, u64)> = plan(w(from, to), &Filter::default(), &sel(true), cover)
        .iter()
        .map(|p| (p.source, p.window.from_ns, p.window.to_ns))
        .collect();
    let m = |n: u64| T0 + n * MINUTE_NS;
    assert_eq!(
        got,
        vec![
            (Source::Raw, from, m(43)),
            (Source::FleetMinutes, m(43), m(50)),
            (Source::FleetTenMinutes, m(50), m(60)),
            (Source::Hours, m(60), m(120)),
            (Source::FleetTenMinutes, m(120), m(130)),
            (Source::FleetMinutes, m(130), m(133)),
            (Source::Raw, m(133), to),
        ]
    );
    // Days where a window holds whole ones.
    let cover = Coverage { days_from: all, ..cover };
    let day = schema::DAY_NS;
    let d0 = T0 / day * day;
    let p = plan(w(d0 + day - HOUR_NS, d0 + 3 * day + HOUR_NS), &Filter::default(), &sel(true), cover);
    let got: Vec<Source> = p.iter().map(|p| p.source).collect();
    assert_eq!(got, [Source::Hours, Source::Days, Source::Hours]);
    assert_eq!(p[1].window, w(d0 + day, d0 + 3 * day));
    // Some nodes, or a pod: the per-node minutes only.
    let p = plan(w(from, to), &Filter::default(), &sel(false), cover);
    assert!(p.iter().all(|p| matches!(p.source, Source::Raw | Source::Minutes)), "{p:?}");
    // Fleet minutes begun later than the node minutes: the node minutes before them.
    let late = Coverage { fleet_minutes_from: Some(m(46)), fleet_ten_minutes_from: None, days_from: None, ..cover };
    let p = plan(w(m(40), m(50)), &Filter::default(), &sel(true), late);
    assert_eq!(
        p,
        vec![
            Piece { source: Source::Minutes, window: w(m(40), m(46)) },
            Piece { source: Source::FleetMinutes, window: w(m(46), m(50)) },
        ]
    );
}

#[test]
fn the_fleet_reads_its_seconds_at_the_edges_and_raw_rows_only_within_a_second() {
    let all = Some(0);
    // Every rollup but the quiet end and the empty start.
    let cover = Coverage { days_from: all, fleet_seconds_from: all, node_hours_from: all, ..covered(all) };
    let m = |n: u64| T0 + n * MINUTE_NS;
    let s = |n: u64| T0 + n * SECOND_NS;
    // 00:42:10.25 to 00:51:03.5: raw to 00:42:11, seconds to 00:43, fleet minutes to
    // 00:51, seconds to 00:51:03, raw.
    let (from, to) = (s(42 * 60 + 10) + SECOND_NS / 4, s(51 * 60 + 3) + SECOND_NS / 2);
    let p = plan(w(from, to), &Filter::default(), &sel(true), cover);
    assert_eq!(
        p,
        vec![
            Piece { source: Source::Raw, window: w(from, s(42 * 60 + 11)) },
            Piece { source: Source::FleetSeconds, window: w(s(42 * 60 + 11), m(43)) },
            Piece { source: Source::FleetMinutes, window: w(m(43), m(51)) },
            Piece { source: Source::FleetSeconds, window: w(m(51), s(51 * 60 + 3)) },
            Piece { source: Source::Raw, window: w(s(51 * 60 + 3), to) },
        ]
    );
    assert_eq!(describe(&p), "samples 1.250s, samples_fleet_1s 52.000s, samples_fleet_1m 8m 0s");
    // Whole seconds (a window relative to now, taken to the second): no raw row.
    let p = plan(w(s(42 * 60 + 10), s(51 * 60 + 3)), &Filter::default(), &sel(true), cover);
    assert!(p.iter().all(|p| p.source != Source::Raw), "{p:?}");
    assert_eq!(p.iter().map(|p| p.window.to_ns - p.window.from_ns).sum::<u64>(), 533 * SECOND_NS);
    // An hour of whole seconds: an hour's edges, seconds within the minutes.
    let p = plan(w(s(59 * 60 + 30), s(2 * 3600 + 45)), &Filter::default(), &sel(true), cover);
    let got: Vec<Source> = p.iter().map(|p| p.source).collect();
    assert_eq!(got, [Source::FleetSeconds, Source::Hours, Source::FleetSeconds]);
    // Some nodes, a pod, or a CPU: no fleet seconds (they keep neither node, pod nor CPU).
    let pod = crate::identity::Filter { pod: Some("trainer-0".into()), ..Default::default() };
    for (f, whole) in [
        (Filter::default(), false),
        (Filter { workload: pod, ..Default::default() }, true),
        (Filter { cpus: vec![1], ..Default::default() }, true),
    ] {
        let p = plan(w(from, to), &f, &sel(whole), cover);
        assert!(p.iter().all(|p| p.source != Source::FleetSeconds), "{p:?}");
        assert_eq!(p.first().map(|p| p.source), Some(Source::Raw));
    }
    // Seconds begun at 00:42:30 (a view created then): raw rows before.
    let late = Coverage { fleet_seconds_from: Some(s(42 * 60 + 30)), ..cover };
    let p = plan(w(from, to), &Filter::default(), &sel(true), late);
    assert_eq!(p[0], Piece { source: Source::Raw, window: w(from, s(42 * 60 + 30)) });
    assert_eq!(p[1], Piece { source: Source::FleetSeconds, window: w(s(42 * 60 + 30), m(43)) });
}

#[test]
fn some_nodes_read_minutes_and_cpu_or_pid_filters_read_raw_rows() {
    let cover = Coverage { minutes_from: Some(0), hours_from: Some(0), ..Default::default() };
    let day = w(T0, T0 + 24 * HOUR_NS);
    let p = plan(day, &Filter::default(), &sel(false), cover);
    assert_eq!(p, vec![Piece { source: Source::Minutes, window: day }]);
    for f in [Filter { cpus: vec![3], ..Default::default() }, Filter { pid: Some(9), ..Default::default() }] {
        assert_eq!(plan(day, &f, &sel(true), cover), vec![Piece { source: Source::Raw, window: day }]);
    }
}

#[test]
fn a_pod_or_a_container_id_reads_minutes_a_namespace_or_a_container_name_hours() {
    let cover = Coverage { minutes_from: Some(0), hours_from: Some(0), ..Default::default() };
    let day = w(T0, T0 + 24 * HOUR_NS);
    let with = |workload: crate::identity::Filter| Filter { workload, ..Default::default() };
    type W = crate::identity::Filter;
    for f in [
        W { pod: Some("trainer-0".into()), ..Default::default() },
        W { container: Some("0123456789ab".into()), ..Default::default() },
    ] {
        assert_eq!(plan(day, &with(f), &sel(true), cover), vec![Piece { source: Source::Minutes, window: day }]);
    }
    for f in [
        W { namespace: Some("ml".into()), ..Default::default() },
        W { container: Some("trainer".into()), unit: Some("kubelet".into()), ..Default::default() },
    ] {
        assert_eq!(plan(day, &with(f), &sel(true), cover), vec![Piece { source: Source::Hours, window: day }]);
    }
}

#[test]
fn nothing_before_a_rollup_began_is_read_from_it() {
    // Minutes from 00:30, no hours yet: 00:00-00:30 raw, then minutes.
    let cover = Coverage { minutes_from: Some(T0 + 30 * MINUTE_NS), ..Default::default() };
    let p = plan(w(T0, T0 + HOUR_NS), &Filter::default(), &sel(true), cover);
    assert_eq!(
        p,
        vec![
            Piece { source: Source::Raw, window: w(T0, T0 + 30 * MINUTE_NS) },
            Piece { source: Source::Minutes, window: w(T0 + 30 * MINUTE_NS, T0 + HOUR_NS) },
        ]
    );
    let none = plan(w(T0, T0 + HOUR_NS), &Filter::default(), &sel(true), Coverage::default());
    assert_eq!(none, vec![Piece { source: Source::Raw, window: w(T0, T0 + HOUR_NS) }]);
}
