//! Records as the BPF side sends them, through the pipeline into a store and back out: the
//! softirq context of a sample on the idle task makes it busy, with its marker, everywhere.

use profiler_common::{FLAG_IDLE, FLAG_SOFTIRQ_SHIFT, HEADER_LEN, SampleHeader};

use super::*;
use crate::{
    detect::{Machine, Thresholds},
    exec_context::ContextFilter,
    query::{Filter, Window, cpu_time, fold},
    store::{Store, format::NS_PER_SEC, segments_dir},
};

const T0: u64 = 1_795_000_020 * NS_PER_SEC;

fn record(ts_ns: u64, cpu: u32, pid: u32, comm: &str, flags: u32, kernel: &[u64]) -> Vec<u8> {
    let mut c = [0u8; COMM_LEN];
    c[..comm.len()].copy_from_slice(comm.as_bytes());
    let h = SampleHeader {
        ts_ns,
        cpu,
        pid,
        tid: pid,
        flags,
        kernel_frames: kernel.len() as u16,
        comm: c,
        ..Default::default()
    };
    let mut b = vec![0u8; HEADER_LEN];
    // SAFETY: the buffer holds a header.
    unsafe { std::ptr::write_unaligned(b.as_mut_ptr().cast(), h) };
    for a in kernel {
        b.extend(a.to_ne_bytes());
    }
    b
}

#[test]
fn softirq_on_the_idle_task_is_busy_with_its_marker() {
    let dir = tempfile::tempdir().unwrap();
    crate::store::create_and_lock(dir.path()).unwrap();
    let engine = Engine::new(Machine { cpus: 2, frequency_hz: 100 }, Thresholds::default());
    let mut p = Pipeline::new(StoreWriter::new(&segments_dir(dir.path())), engine, 0);
    let net_rx = 4 << FLAG_SOFTIRQ_SHIFT;
    let timer = 2 << FLAG_SOFTIRQ_SHIFT;
    // Kernel addresses no kallsyms names: the symbolizer still gives one frame per address.
    let kernel = [0xffff_ffff_ff00_0010u64, 0xffff_ffff_ff00_0020];
    // One tick per 10 ms per CPU: softirq ticks in even buckets, the others in odd ones.
    for i in 0..10u64 {
        let (even, odd) = (T0 + i * 20_000_000, T0 + i * 20_000_000 + 10_000_000);
        p.handle(&record(even, 1, 0, "swapper/1", net_rx, &kernel), std::time::Instant::now());
        p.handle(&record(odd, 1, 0, "", FLAG_IDLE, &[]), std::time::Instant::now());
        p.handle(&record(even, 0, 42, "app", timer, &kernel), std::time::Instant::now());
        p.handle(&record(odd, 0, 42, "app", 0, &kernel), std::time::Instant::now());
    }
    assert_eq!((p.samples, p.idle), (30, 10), "softirq samples of pid 0 are busy");
    p.flush(T0 + 2 * NS_PER_SEC, u64::MAX).unwrap();

    let mut store = Store::open(dir.path()).unwrap();
    let w = Window::new(T0, T0 + NS_PER_SEC).unwrap();
    let only = |c: &str| Filter { context: Some(c.parse().unwrap()), ..Default::default() };
    let lines = |f: &Filter, store: &mut Store| {
        let mut v: Vec<(String, u64)> = fold(store, w, f).unwrap().stacks.into_iter().collect();
        v.sort();
        v
    };
    let net = lines(&only("softirq:NET_RX"), &mut store);
    assert_eq!(net.len(), 1, "{net:?}");
    assert!(net[0].0.starts_with("swapper/1;[softirq:NET_RX]_[k];"), "{net:?}");
    assert_eq!(net[0].1, 10);
    let soft = lines(&only("softirq"), &mut store);
    assert_eq!(soft.iter().map(|l| l.1).sum::<u64>(), 20);
    assert!(soft.iter().any(|(l, _)| l.starts_with("app;[softirq:TIMER]_[k];")), "{soft:?}");
    let task = lines(&only("task"), &mut store);
    assert_eq!(task.len(), 1);
    assert!(task[0].0.starts_with("app;") && !task[0].0.contains("[softirq:"), "{task:?}");
    assert_eq!(ContextFilter::Task.to_string(), "task");

    // CPU x time from summaries (1 s) and from samples (10 ms): the same shares.
    for bucket in [NS_PER_SEC, 10_000_000] {
        let ct = cpu_time(&mut store, w, bucket, 2, 100).unwrap();
        let sum = |v: &[Vec<f64>], cpu: usize| v[cpu].iter().sum::<f64>() * bucket as f64 / NS_PER_SEC as f64;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // CPU 1: 10 NET_RX samples of 100 ticks; CPU 0: 10 TIMER of 20 busy.
        assert!(close(sum(&ct.softirq, 1), 0.1) && close(sum(&ct.busy, 1), 0.1), "{bucket}: {ct:?}");
        assert!(close(sum(&ct.softirq, 0), 0.1) && close(sum(&ct.busy, 0), 0.2), "{bucket}: {ct:?}");
    }

    // A rollup keeps the softirq counts of its seconds.
    drop(store);
    let segment = std::fs::read_dir(segments_dir(dir.path())).unwrap().flatten().next().unwrap().path();
    crate::store::rollup::rollup_segment(&segment).unwrap().expect("rolled up");
    let mut store = Store::open(dir.path()).unwrap();
    let wide = Window::new(T0 - 20 * NS_PER_SEC, T0 + 40 * NS_PER_SEC).unwrap();
    let ct = cpu_time(&mut store, wide, 10 * NS_PER_SEC, 2, 100).unwrap();
    let soft: f64 = ct.softirq[1].iter().sum::<f64>() * 10.0;
    assert!((soft - 0.1).abs() < 1e-9, "{ct:?}");
}
