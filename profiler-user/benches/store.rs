//! The store's benchmark (issue 3): ingest rate, bytes per sample, window query latency and
//! peak memory, on synthetic GPU-node samples. Run through `cargo xtask bench store`, or
//! `cargo bench -p profiler-user --bench store -- --help`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use profiler::{
    export::flamegraph,
    query::{self, Filter, Window},
    store::{self, Store, StoreWriter},
};

#[path = "shared/synth.rs"]
#[allow(dead_code)] // each bench uses part of it
mod synth;
use synth::{Rng, StackPool, Tick};

struct Args {
    cpus: u32,
    hz: u64,
    minutes: u64,
    stacks: usize,
    rss_only: bool,
    /// Build (or reuse) a store in this directory and time `status` on it, with and without
    /// its index.
    status: Option<std::path::PathBuf>,
}

fn args() -> Args {
    let mut a = Args { cpus: 64, hz: 99, minutes: 60, stacks: 50_000, rss_only: false, status: None };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(k) = it.next() {
        let mut val = || it.next().and_then(|v| v.parse::<u64>().ok()).expect("a number after the flag");
        match k.as_str() {
            "--cpus" => a.cpus = val() as u32,
            "--hz" => a.hz = val(),
            "--minutes" => a.minutes = val(),
            "--stacks" => a.stacks = val() as usize,
            "--rss-only" => a.rss_only = true,
            "--status" => a.status = Some(it.next().expect("a directory after --status").into()),
            "--bench" => {}
            "--help" => {
                println!(
                    "store bench [--cpus 64] [--hz 99] [--minutes 60] [--stacks 50000] [--rss-only] [--status DIR]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix(key))?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect(),
    )
}

/// `status` on a big store: the summary read from every segment, the index built (what the
/// daemon does once at its first start on such a store), and the summary read with the index.
fn status_bench(a: &Args, dir: &std::path::Path) {
    let t0 = 1_795_000_000 * 1_000_000_000u64;
    if store::reader::list_segments(dir).map(|s| s.is_empty()).unwrap_or(true) {
        let mut rng = Rng::new(0x5eed);
        let pool = StackPool::new(a.stacks, &mut rng);
        store::create_and_lock(dir).expect("store");
        let mut writer = StoreWriter::new(&store::segments_dir(dir));
        let mut ticks: Vec<Tick> = Vec::new();
        let t = Instant::now();
        for sec in 0..a.minutes * 60 {
            let start = t0 + sec * 1_000_000_000;
            ticks.clear();
            synth::second(&pool, &mut rng, start, a.cpus, a.hz, |t| ticks.push(t));
            for tick in &ticks {
                match tick {
                    Tick::Busy(s) => writer.push(s),
                    Tick::Idle { ts_ns, cpu } => writer.push_idle(*ts_ns, *cpu),
                }
            }
            writer.flush(start).expect("flush");
        }
        eprintln!("store of {} minutes written in {:.0} s", a.minutes, t.elapsed().as_secs_f64());
    }
    // Generating is slow (about 3 s per minute of 64 CPUs): reach 1 GiB by copying the minutes
    // written as later minutes. Status reads summaries only, so copies cost it what distinct
    // minutes would.
    let segments = store::reader::list_segments(dir).unwrap();
    let distinct = segments.len();
    let mut bytes: u64 = segments.iter().map(|(_, p)| std::fs::metadata(p).unwrap().len()).sum();
    let mut next = segments.last().map_or(t0, |(s, _)| s + 60_000_000_000);
    for (_, p) in segments.iter().cycle() {
        if bytes >= 1 << 30 {
            break;
        }
        let to = store::segment_path(&store::segments_dir(dir), next);
        bytes += std::fs::copy(p, to).unwrap();
        next += 60_000_000_000;
    }
    eprintln!("{distinct} distinct minutes, copied up to {bytes} bytes");
    let index = store::index::index_dir(dir);
    let _ = std::fs::remove_dir_all(&index);
    let mut s = Store::open(dir).unwrap();
    let mut truth = None;
    let scan_ms = time_ms(3, || truth = Some(s.summary().unwrap()));
    let truth = truth.unwrap();
    let t = Instant::now();
    let done = store::index::Indexer::new(dir).refresh(u64::MAX / 2).unwrap();
    assert_eq!(done.added, truth.segments, "every segment indexed");
    let refresh_ms = t.elapsed().as_secs_f64() * 1000.0;
    let mut with = None;
    let index_ms = time_ms(5, || with = Some(s.summary().unwrap()));
    assert_eq!(with.unwrap(), truth, "the index answers as the segments do");
    let index_bytes: u64 = std::fs::read_dir(&index).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum();
    println!(
        "| store | {} CPUs x {} Hz, {distinct} distinct minutes copied to {:.2} GiB in {} segments, {} blocks; index {} files, {} bytes |",
        a.cpus,
        a.hz,
        truth.bytes as f64 / (1u64 << 30) as f64,
        truth.segments,
        truth.blocks,
        std::fs::read_dir(&index).unwrap().count(),
        index_bytes
    );
    println!("| summary from every segment (no index) | {scan_ms:.0} ms |");
    println!("| index built from scratch (daemon, once) | {refresh_ms:.0} ms |");
    println!("| summary with the index | {index_ms:.1} ms |");
}

fn main() {
    let a = args();
    if let Some(dir) = &a.status {
        status_bench(&a, dir);
        return;
    }
    let mut rng = Rng::new(0x5eed);
    let t = Instant::now();
    let pool = StackPool::new(a.stacks, &mut rng);
    eprintln!("{} distinct stacks built in {:.1} s", a.stacks, t.elapsed().as_secs_f64());
    let dir = tempfile::tempdir().expect("tempdir");
    store::create_and_lock(dir.path()).expect("store");
    let mut writer = StoreWriter::new(&store::segments_dir(dir.path()));
    let t0 = 1_795_000_000 * 1_000_000_000u64;
    let rss_before = status_kib("VmRSS:");

    // Ingest: generate a second, then hand it to the writer in two halves with a flush after
    // each, as the daemon does with its 500 ms flush. Only the writer's time is counted.
    let (mut busy, mut idle) = (0u64, 0u64);
    let mut writer_time = Duration::ZERO;
    let mut ticks: Vec<Tick> = Vec::new();
    for sec in 0..a.minutes * 60 {
        let start = t0 + sec * 1_000_000_000;
        ticks.clear();
        synth::second(&pool, &mut rng, start, a.cpus, a.hz, |t| ticks.push(t));
        ticks.sort_by_key(|t| match t {
            Tick::Busy(s) => s.ts_ns,
            Tick::Idle { ts_ns, .. } => *ts_ns,
        });
        let half = ticks.len() / 2;
        for part in [&ticks[..half], &ticks[half..]] {
            let t = Instant::now();
            for tick in part {
                match tick {
                    Tick::Busy(s) => {
                        writer.push(s);
                        busy += 1;
                    }
                    Tick::Idle { ts_ns, cpu } => {
                        writer.push_idle(*ts_ns, *cpu);
                        idle += 1;
                    }
                }
            }
            writer.flush(start).expect("flush");
            writer_time += t.elapsed();
        }
    }
    let total = busy + idle;
    let hwm = status_kib("VmHWM:");
    if a.rss_only {
        println!(
            "| peak RSS, store path, {} CPUs x {} Hz for {} min | {:.1} MiB peak ({:.1} MiB before ingest; {:.0} samples/s) |",
            a.cpus,
            a.hz,
            a.minutes,
            hwm as f64 / 1024.0,
            rss_before as f64 / 1024.0,
            total as f64 / writer_time.as_secs_f64()
        );
        return;
    }
    let bytes: u64 = store::reader::list_segments(dir.path())
        .unwrap()
        .iter()
        .map(|(_, p)| std::fs::metadata(p).unwrap().len())
        .sum();

    // Where the bytes go, per section.
    let (mut dict_b, mut summary_b, mut samples_b, mut headers_b) = (0u64, 0u64, 0u64, 0u64);
    for (_, p) in store::reader::list_segments(dir.path()).unwrap() {
        let data = std::fs::read(p).unwrap();
        for (h, sec) in store::format::Blocks::new(&data) {
            if std::env::var("BENCH_DEBUG").is_ok() {
                let d: store::format::DictDelta = store::format::unpack(sec.dict).unwrap();
                if h.flags & store::format::FLAG_RESET_DICT != 0 || d.frame.len() > 20000 {
                    eprintln!(
                        "block {} flags {} strings {} nodes {} bytes {}",
                        h.start_ns / 1_000_000_000 % 100000,
                        h.flags,
                        d.strings.len(),
                        d.frame.len(),
                        sec.dict.len()
                    );
                }
            }
            dict_b += sec.dict.len() as u64;
            summary_b += sec.summary.len() as u64;
            samples_b += sec.samples.len() as u64;
            headers_b += store::format::BLOCK_HEADER_LEN as u64;
        }
    }
    let mut s = Store::open(dir.path()).unwrap();
    let mid = t0 + a.minutes * 30 * 1_000_000_000;
    let w60 = Window::new(mid, mid + 60 * 1_000_000_000).unwrap();
    let all = Filter::default();
    let folded = query::fold(&mut s, w60, &all).unwrap();
    let svg_ms = time_ms(5, || {
        let f = query::fold(&mut s, w60, &all).unwrap();
        let mut out = Vec::with_capacity(1 << 20);
        flamegraph::write_svg(&f, "bench", "60 s", &mut out).unwrap();
    });
    let fold_ms = time_ms(5, || {
        let f = query::fold(&mut s, w60, &all).unwrap();
        let mut out = Vec::with_capacity(1 << 20);
        flamegraph::write_folded(&f, &mut out).unwrap();
    });
    let whole = Window::new(t0, t0 + a.minutes * 60 * 1_000_000_000).unwrap();
    let mut grid = None;
    let grid_ms = time_ms(5, || grid = Some(query::subsecond_grid(&mut s, whole, 50, &all).unwrap()));
    let grid = grid.unwrap();
    let grid_total: u64 = grid.counts.iter().map(|&v| u64::from(v)).sum();
    assert_eq!(grid_total, busy, "the grid counts every busy sample");
    let heatmap_json_ms = time_ms(5, || {
        let g = query::subsecond_grid(&mut s, whole, 50, &all).unwrap();
        let mut out = Vec::with_capacity(1 << 20);
        profiler::export::heatmap::write_json(&g, &mut out).unwrap();
    });
    let cputime_ms = time_ms(5, || {
        let g = query::cpu_time(&mut s, whole, 1_000_000_000, a.cpus, a.hz).unwrap();
        let mut out = Vec::with_capacity(1 << 20);
        profiler::export::cputime::write_json(&g, &[], &mut out).unwrap();
    });
    // The whole span in one flamegraph, within the API's budget and the CLI's default (issue
    // 28: the rarest leaves fold into their parents, no sample leaves its process and upper
    // frames, and nothing sits in a root-level `[truncated]`).
    let mut whole_fold = |max_stacks: usize| {
        let budget = query::FoldBudget {
            max_stacks,
            max_bytes: profiler::budget::MAX_FOLDED_BYTES * max_stacks / profiler::budget::MAX_STACKS,
        };
        let t = Instant::now();
        let f = query::fold_within(&mut s, whole, &all, budget).unwrap();
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let total: u64 = f.stacks.values().sum();
        assert_eq!(total, busy, "the fold keeps every busy sample");
        let root_truncated: u64 = f.stacks.iter().filter(|(l, _)| l.starts_with('[')).map(|(_, n)| n).sum();
        let in_more: u64 = f.stacks.iter().filter(|(l, _)| l.ends_with(" more]")).map(|(_, n)| n).sum();
        (f.stacks.len(), f.truncated_stacks, in_more, root_truncated, ms)
    };
    let folds =
        [(profiler::budget::MAX_STACKS, "the API's"), (200_000, "the CLI's")].map(|(m, who)| (who, m, whole_fold(m)));
    let cpu_ms = time_ms(3, || {
        query::fold(&mut s, w60, &Filter { cpus: vec![3], ..Default::default() }).unwrap();
    });

    let n_lines = folded.stacks.len();
    println!("| figure | value | goal |");
    println!("|---|---|---|");
    println!(
        "| data | {} CPUs x {} Hz x {} min = {total} samples ({busy} busy, {idle} idle), {} distinct stacks | |",
        a.cpus, a.hz, a.minutes, a.stacks
    );
    println!(
        "| ingest, one core | {:.2} M samples/s ({:.2} M busy samples/s) | >= 1 M/s |",
        total as f64 / writer_time.as_secs_f64() / 1e6,
        busy as f64 / writer_time.as_secs_f64() / 1e6
    );
    println!(
        "| bytes on disk | {bytes} = {:.2} bytes/sample ({:.2} per busy sample) | <= 4 |",
        bytes as f64 / total as f64,
        bytes as f64 / busy as f64
    );
    println!(
        "| bytes by section | dictionaries {:.2}, summaries {:.2}, sample columns {:.2}, block headers {:.2} bytes/sample | |",
        dict_b as f64 / total as f64,
        summary_b as f64 / total as f64,
        samples_b as f64 / total as f64,
        headers_b as f64 / total as f64
    );
    println!("| flamegraph SVG, 60 s window ({n_lines} distinct stacks) | {svg_ms:.0} ms | <= 150 ms |");
    println!("| folded, same window | {fold_ms:.0} ms | |");
    println!("| folded, same window, --cpu 3 | {cpu_ms:.0} ms | |");
    for (who, max, (lines, folded_stacks, in_more, root_truncated, ms)) in folds {
        println!(
            "| flamegraph of the whole span within {who} budget ({max} stacks) | {lines} lines; {folded_stacks} stacks folded into `[… N more]` leaves holding {in_more} samples ({:.2} %); {root_truncated} samples in a root-level `[truncated]`; {ms:.0} ms | 0 at the root |",
            in_more as f64 * 100.0 / busy as f64
        );
    }
    println!("| subsecond grid, whole span, 50 rows ({} columns) | {grid_ms:.1} ms | <= 100 ms |", grid.columns);
    println!("| heatmap JSON (FlameScope schema), whole span, 50 rows | {heatmap_json_ms:.1} ms | <= 100 ms |");
    println!("| CPU x time JSON, whole span, {} CPUs x 1 s buckets | {cputime_ms:.1} ms | <= 100 ms |", a.cpus);
    println!("| peak RSS of this process (generator + store) | {:.1} MiB | |", hwm as f64 / 1024.0);
    let _ = Arc::strong_count(&Arc::new(()));
}
