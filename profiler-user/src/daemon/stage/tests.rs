//! The pipeline stage fed by a test instead of the ring reader, with a symbolizer that stalls:
//! nothing is lost while the queue has room, and what does not fit is counted exactly, in the
//! second and on the CPU it belongs to.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::AtomicBool, mpsc},
    time::Duration,
};

use super::{Links, Stage, StageConfig, Summary};
use crate::{
    daemon::{
        clock,
        drops::{Drops, sample_record},
        queue::{self, Batch, Intake, Source},
        reader::queue_or_count,
    },
    detect::{Engine, Machine, Thresholds},
    pipeline::Pipeline,
    store::{
        StoreWriter,
        reader::{Need, Store},
        writer::WriterLimits,
    },
};

const NS: u64 = 1_000_000_000;

struct Rig {
    dir: tempfile::TempDir,
    intake: Intake,
    drops: Arc<Mutex<Drops>>,
    queue: Arc<queue::QueueStats>,
    stage: std::thread::JoinHandle<Summary>,
}

/// A stage on its own thread whose symbolizer runs `hook` before each stack.
fn rig(queue_bytes: u64, hook: impl FnMut() + Send + 'static) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let (intake, outlet, queue) = queue::bounded(queue_bytes);
    let drops = Arc::new(Mutex::new(Drops::default()));
    let (_control, control) = mpsc::channel();
    let config = StageConfig {
        data_dir: dir.path().to_path_buf(),
        machine: Machine { cpus: 2, frequency_hz: 99 },
        thresholds: Thresholds::default(),
        limits: WriterLimits::default(),
        flush_interval: Duration::from_millis(50),
        report_interval: Duration::from_secs(3600),
        symbolize_delay: None,
        kubelet_logs: dir.path().join("no-kubelet"),
        flight: Default::default(),
        node: "test".into(),
        cuda: false,
        cuda_max_calls: Some(10_000.0),
        offcpu_threshold_ns: 0,
    };
    let links = Links {
        outlet,
        queue: queue.clone(),
        drops: drops.clone(),
        control,
        live: Default::default(),
        write_failing: Arc::new(AtomicBool::new(false)),
        unwind: None,
        runq_latest: Default::default(),
        reclaim_latest: Default::default(),
        gpu: None,
    };
    let segments = crate::store::segments_dir(dir.path());
    std::fs::create_dir_all(&segments).unwrap();
    // The hook is Send; the pipeline (not Send) is built on the stage's thread, as the daemon does.
    let hook: Box<dyn FnMut() + Send> = Box::new(hook);
    let stage = std::thread::spawn(move || {
        let mut pipeline = Pipeline::new(
            StoreWriter::with_limits(&segments, config.limits),
            Engine::new(config.machine, config.thresholds.clone()),
            clock::boot_to_unix_offset(),
        );
        pipeline.set_before_symbolize(hook);
        Stage::new(config, links, None, pipeline).run()
    });
    Rig { dir, intake, drops, queue, stage }
}

/// Boot-time ns of `unix_second` + 0.5 s.
fn boot_ns(unix_second: u64) -> u64 {
    ((unix_second * NS + NS / 2) as i128 - clock::boot_to_unix_offset()) as u64
}

fn batch(unix_second: u64, cpu: u32, n: usize) -> Batch {
    let mut b = Batch::new(Source::Samples);
    for _ in 0..n {
        b.push(&sample_record(boot_ns(unix_second), cpu, 4_000_000));
    }
    b
}

/// Per (second, CPU): busy samples and lost samples in the store.
fn stored(dir: &std::path::Path) -> BTreeMap<(u64, u32), (u64, u64)> {
    let mut out = BTreeMap::new();
    Store::open(dir)
        .unwrap()
        .scan(0, u64::MAX, Need::Summary, &mut |b: crate::store::reader::BlockView<'_>| {
            for c in &b.summary.expect("summary").cpus {
                let e: &mut (u64, u64) = out.entry((b.header.start_ns / NS, c.cpu)).or_default();
                e.0 += c.busy;
                e.1 += c.lost;
            }
        })
        .unwrap();
    out
}

fn now_second() -> u64 {
    crate::timespec::now_ns() / NS
}

#[test]
fn a_stalled_stage_loses_nothing_while_the_queue_has_room() {
    let r = rig(1 << 20, || std::thread::sleep(Duration::from_millis(2)));
    let s = now_second() - 2;
    for _ in 0..200 {
        assert!(queue_or_count(&r.intake, &r.drops, batch(s, 1, 1)));
    }
    // The stage was slower than the feed: the queue held the difference.
    assert!(r.queue.depth().max_records > 50, "{:?}", r.queue.depth());
    drop(r.intake);
    let summary = r.stage.join().unwrap();
    assert_eq!(summary, Summary { samples: 200, idle: 0, queue_full: 0 });
    assert!(r.drops.lock().unwrap().is_empty());
    assert_eq!(stored(r.dir.path()), BTreeMap::from([((s, 1), (200, 0))]));
}

#[test]
fn a_full_queue_counts_exactly_what_it_drops_in_its_second_and_cpu() {
    // The symbolizer stalls on the first sample until released, so the queue fills for sure.
    let (entered_tx, entered) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let mut first = true;
    let record_bytes = sample_record(0, 0, 0).len() as u64;
    let room = 10;
    // Room for the sample the stage holds (it counts until handled) and `room` more.
    let r = rig((room + 1) * record_bytes, move || {
        if std::mem::take(&mut first) {
            entered_tx.send(()).unwrap();
            released.recv().unwrap();
        }
    });
    let (s, later) = (now_second() - 3, now_second() - 1);
    assert!(queue_or_count(&r.intake, &r.drops, batch(s, 0, 1)));
    entered.recv_timeout(Duration::from_secs(10)).expect("the stage takes the first sample");
    // The stage holds one sample; the queue takes `room` more, then refuses.
    for _ in 0..room {
        assert!(queue_or_count(&r.intake, &r.drops, batch(s, 0, 1)));
    }
    assert!(queue_or_count(&r.intake, &r.drops, batch(later, 1, 7)));
    assert!(queue_or_count(&r.intake, &r.drops, batch(s, 0, 2)));
    assert_eq!(r.queue.depth().records, room + 1);
    assert_eq!(r.drops.lock().unwrap().samples, BTreeMap::from([((s, 0), 2), ((later, 1), 7)]));
    release.send(()).unwrap();
    drop(r.intake);
    let summary = r.stage.join().unwrap();
    assert_eq!(summary, Summary { samples: 1 + room, idle: 0, queue_full: 9 });
    // Lost where and when it happened, not when it was noticed.
    let got = stored(r.dir.path());
    assert_eq!(got[&(s, 0)], (1 + room, 2));
    assert_eq!(got[&(later, 1)], (0, 7));
    assert_eq!(got.values().map(|v| v.1).sum::<u64>(), 9);
}
