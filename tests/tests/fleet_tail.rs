//! A window followed by no row (one ending now, or where the fleet's data stops) reads its last
//! unit whole from the rollups (`fleet::rollup::quiet_until`): the current hour from the hours,
//! not the fleet's seconds of a minute still being merged; and the answer is still the store's,
//! sample for sample, for the whole fleet and for one node (ClickHouse 18.16).

#[path = "shared/ch_store.rs"]
mod ch_store;

use ch_store::{ship_with, synthetic_store_with};
use integration_tests::{
    clickhouse::{ClickHouse, wait_shipped},
    now_secs, profiler,
};
use profiler::{
    fleet::{
        Fleet,
        rollup::{self, Coverage, Source},
        select::Selection,
    },
    query::{Filter, Window},
    ship::clickhouse::FileConfig,
};

const SEC: u64 = 1_000_000_000;
const NODE: &str = "tail-node";

#[test]
fn a_window_ending_now_reads_its_last_hour_from_the_hours_and_answers_as_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    // Two and a half hours of 2 CPUs at 5 Hz, 40 stacks in turn, ending 30 s ago.
    let (start, end) = synthetic_store_with(&data, 2, 9000, (now_secs() as u64 - 30) * SEC, 5, 40);
    let file = FileConfig { batch_rows: Some(20_000), ..Default::default() };
    ship_with(&ch.url(), NODE, &data, &file, 86_400, || wait_shipped(&data, end));

    // The planner, as a read of the whole fleet to now sees it: the last piece is the hour that
    // holds now, from the hourly rollup (nothing follows now in it); or, where the window holds
    // the midnight before now (a read between 00:00 and 02:30 UTC), today from the daily one.
    let fleet = Fleet::new(&ch.url(), "profiler").unwrap();
    let now = now_secs() as u64 * SEC;
    let window = Window::new(start + 61 * SEC + SEC / 2, now).unwrap();
    let cover = Coverage::read(&fleet, window).unwrap();
    assert!(cover.quiet_until.is_some_and(|q| q > now), "{cover:?}");
    let whole = Selection { nodes: Vec::new(), whole_fleet: true };
    let plan = rollup::plan(window, &Filter::default(), &whole, cover);
    let last = plan.last().unwrap();
    let (hour, day) = (rollup::HOUR_NS, 86_400 * SEC);
    let midnight = now / day * day;
    let today = midnight >= window.from_ns;
    let want = if today { (Source::Days, midnight + day) } else { (Source::Hours, now.div_ceil(hour) * hour) };
    assert_eq!((last.source, last.window.to_ns), want, "{plan:?}");
    // A window that ends 20 s before the data does: rows follow it, nothing is widened.
    let before = Window::new(window.from_ns, end - 20 * SEC - SEC / 4).unwrap();
    let cover = Coverage::read(&fleet, before).unwrap();
    assert_eq!(cover.quiet_until, None, "rows follow the window");
    assert_eq!(rollup::plan(before, &Filter::default(), &whole, cover).last().unwrap().window.to_ns, before.to_ns);

    // The CLI: the store's answer and ClickHouse's, for the fleet and for the node.
    let from = profiler::timespec::format(window.from_ns);
    let dir = data.to_str().unwrap();
    let read = |source: &[&str]| {
        let out =
            profiler(&[&["flamegraph", "--format", "folded", "--from", &from, "--to", "now"][..], source].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (store, _) = read(&["--data-dir", dir]);
    let total: u64 =
        String::from_utf8_lossy(&store).lines().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert!(total > 80_000, "{total} samples in the window");
    for node in [&[][..], &["--node", NODE][..]] {
        let (answer, note) = read(&[&["--clickhouse", &ch.url()][..], node].concat());
        // The last hour's part from the hours, or today's from the days (the only node is the
        // whole fleet, so `--node` reads the fleet's tables too).
        let last = if today { midnight / hour } else { (now_secs() as u64 * SEC).div_ceil(hour) };
        let hours = last - window.from_ns.div_ceil(hour);
        if hours > 0 {
            assert!(note.contains(&format!("samples_1h {hours}h 0m")), "{hours} hours: {note}");
        }
        assert!(!today || note.contains("samples_1d 24h 0m"), "today from the days: {note}");
        assert!(
            store == answer,
            "{node:?}: the rollups' answer differs from the store's:\n--- store\n{}\n--- ClickHouse\n{}",
            String::from_utf8_lossy(&store),
            String::from_utf8_lossy(&answer)
        );
        eprintln!("{total} samples from {from} to now, {node:?}: {}", note.trim());
    }
}
