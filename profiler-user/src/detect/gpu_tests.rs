//! The GPU detectors on synthetic seconds: the processes the holders started as the poller
//! hands them over (`GpuSecond::descendants`), stacks as the symbolizer names them.

use std::sync::Arc;

use super::*;
use crate::{detect::iostall::Wait, model::OffState};
use crate::{
    detect::{CpuSecond, Second},
    gpu_readings::{GpuInfo, GpuSecond, Inventory, ThreadDemand},
    model::Stack,
};
use std::collections::{HashMap, HashSet};

const HZ: u64 = 99;
const M: Machine = Machine { cpus: 4, frequency_hz: HZ };

fn tick(pid: u32, comm: &str, frames: &[&str]) -> Tick {
    let frames: Vec<Arc<str>> = frames.iter().map(|f| Arc::from(*f)).collect();
    let n = frames.len();
    Tick { stack: Arc::new(Stack::new(frames, n)), pid, comm: Arc::from(comm), workload: Arc::from("") }
}

/// A second in which each `(cpu, pid, comm, frames)` kept its CPU busy (99 ticks).
fn second(s: u64, busy: &[(usize, u32, &str, &[&str])]) -> Second {
    let mut cpus = vec![CpuSecond::default(); M.cpus as usize];
    for (cpu, pid, comm, frames) in busy {
        cpus[*cpu].busy.extend((0..HZ).map(|_| tick(*pid, comm, frames)));
    }
    Second { start_ns: s * NS_PER_SEC, cpus }
}

fn gpu(util: f64, holders: &[u32], slowed: u32) -> GpuSecond {
    GpuSecond {
        index: 0,
        util: Some(util),
        polls: 10,
        slowed_polls: slowed,
        // Hardware thermal slowdown: one of `SLOWDOWN_REASONS` (the power cap is not).
        reasons: if slowed > 0 { 0x40 } else { 0 },
        holders: holders.to_vec(),
        sm_clock_mhz: Some(if slowed > 0 { 1375.0 } else { 1980.0 }),
        demand: Vec::new(),
        descendants: Vec::new(),
        gpm: None,
        holder_sm: Vec::new(),
    }
}

/// As [`gpu`], with GPM's SM activity and occupancy (Hopper and later).
fn with_gpm(util: f64, holders: &[u32], sm_active: f64) -> GpuSecond {
    let gpm = crate::gpu_readings::Gpm {
        sm_active: Some(sm_active),
        sm_occupancy: Some(sm_active / 2.0),
        tensor_active: Some(0.0),
        ..Default::default()
    };
    GpuSecond { gpm: Some(gpm), ..gpu(util, holders, 0) }
}

/// As [`gpu`], with the processes its holders started (read by the poller, `gpu::nvml::family`).
fn fed(util: f64, holders: &[u32], descendants: &[u32]) -> GpuSecond {
    GpuSecond { descendants: descendants.to_vec(), ..gpu(util, holders, 0) }
}

fn inventory() -> Inventory {
    Inventory {
        gpus: vec![GpuInfo {
            index: 0,
            model: "NVIDIA H100".into(),
            local_cpus: vec![0, 1, 2, 3],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Runs `secs` seconds; returns what the last one reported.
fn run(secs: u64, gpus: &[GpuSecond], busy: &[(usize, u32, &str, &[&str])]) -> Vec<Active> {
    let mut d = GpuDetect::default();
    let inv = inventory();
    let mut last = Vec::new();
    for s in 0..secs {
        let input = Input { gpus, inventory: &inv, launches: &HashMap::new() };
        last = d.evaluate(&second(1000 + s, busy), &input, M, &Thresholds::default());
    }
    last
}

const AUGMENT: &[&str] = &["_start", "_PyEval_EvalFrameDefault", "augment (dataset.py:14)", "PyNumber_Multiply"];

#[test]
fn workers_saturating_cpus_while_the_gpu_idles_is_gpu_starved_after_10_s() {
    // 903 a worker of worker 901.
    let workers = [fed(20.0, &[812], &[901, 902, 903])];
    let busy: &[(usize, u32, &str, &[&str])] = &[
        (1, 901, "pt_data_worker", AUGMENT),
        (2, 902, "pt_data_worker", AUGMENT),
        (3, 903, "pt_data_worker", AUGMENT),
    ];
    assert!(run(9, &workers, busy).is_empty(), "not before 10 s");
    let a = run(10, &workers, busy);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuStarved);
    assert_eq!(a[0].subject.as_deref(), Some("gpu0"));
    assert!(a[0].summary.starts_with("GPU 0 (NVIDIA H100) 20 % busy for 10 s"), "{}", a[0].summary);
    assert!(a[0].summary.contains("kept 3 CPU(s) busy"), "{}", a[0].summary);
    assert!(a[0].summary.contains("100 % in augment (dataset.py:14)"), "{}", a[0].summary);
    assert_eq!(a[0].evidence["busy_cpus"], json!([1, 2, 3]));
    assert_eq!(a[0].evidence["processes"].as_array().unwrap().len(), 3);
}

#[test]
fn a_busy_gpu_an_unheld_gpu_or_strangers_saturating_cpus_raise_nothing() {
    let workers: &[(usize, u32, &str, &[&str])] = &[(1, 901, "pt_data_worker", AUGMENT)];
    assert!(run(15, &[fed(95.0, &[812], &[901])], workers).is_empty(), "GPU busy");
    assert!(run(15, &[fed(20.0, &[], &[])], workers).is_empty(), "nobody holds the GPU");
    let stranger: &[(usize, u32, &str, &[&str])] = &[(1, 777, "cc1", &["main"])];
    assert!(run(15, &[fed(20.0, &[812], &[901])], stranger).is_empty(), "not the GPU's feeders");
    let idle_gpu: &[GpuSecond] = &[GpuSecond { util: None, ..fed(0.0, &[812], &[901]) }];
    assert!(run(15, idle_gpu, workers).is_empty(), "no utilisation read");
}

#[test]
fn the_holder_itself_saturating_a_core_is_launch_bound() {
    let main: &[(usize, u32, &str, &[&str])] =
        &[(0, 812, "python3", &["_start", "train_step (train.py:40)", "cudaLaunchKernel"])];
    let a = run(10, &[gpu(30.0, &[812], 0)], main);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuLaunchBound);
    assert!(a[0].summary.contains("python3 (pid 812) kept a core busy itself"), "{}", a[0].summary);
    assert!(a[0].summary.contains("train_step (train.py:40)"), "{}", a[0].summary);
}

#[test]
fn a_holder_given_half_a_shared_core_is_launch_bound_when_it_waited_for_the_rest() {
    // Half of CPU 0's ticks: a build took the other half.
    let mut half = second(0, &[(0, 812, "python3", &["_start", "train_step (train.py:40)", "cudaLaunchKernel"])]);
    half.cpus[0].busy.truncate(HZ as usize / 2);
    let inv = inventory();
    let evaluate = |waited: f64| {
        let mut g = gpu(8.0, &[812], 0);
        g.demand = vec![ThreadDemand { pid: 812, tid: 815, ran: 0.5, waited }];
        let mut d = GpuDetect::default();
        let mut last = Vec::new();
        for s in 0..10 {
            let now = Second { start_ns: (1000 + s) * NS_PER_SEC, ..half.clone() };
            let input = Input { gpus: std::slice::from_ref(&g), inventory: &inv, launches: &HashMap::new() };
            last = d.evaluate(&now, &input, M, &Thresholds::default());
        }
        last
    };
    let a = evaluate(0.45);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuLaunchBound);
    let s = &a[0].summary;
    assert!(
        s.contains("python3 (pid 812) asked a core for itself (thread 815 ran 50 %, waited for a CPU 45 %)"),
        "{s}"
    );
    assert!(s.contains("its core is shared"), "{s}");
    assert_eq!(a[0].evidence["launcher_tid"], 815);
    assert!((a[0].evidence["launcher_waited_share"].as_f64().unwrap() - 0.45).abs() < 1e-9);
    // The same half core, but asleep the other half: it did not ask for more.
    assert!(evaluate(0.0).is_empty(), "a thread that sleeps half the time is not launch-bound");
}

#[test]
fn clocks_held_down_while_busy_is_gpu_throttled_and_a_gap_restarts_the_count() {
    let a = run(10, &[gpu(97.0, &[812], 8)], &[]);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuThrottled);
    assert!(a[0].summary.contains("hardware thermal slowdown"), "{}", a[0].summary);
    // The H100 of BENCHMARKS.md at its 700 W cap: 1375 MHz against 1980.
    let mut d = GpuDetect::default();
    let inv = inventory();
    let free = [gpu(50.0, &[812], 0)];
    d.evaluate(
        &second(0, &[]),
        &Input { gpus: &free, inventory: &inv, launches: &HashMap::new() },
        M,
        &Thresholds::default(),
    );
    let held = [gpu(97.0, &[812], 9)];
    let mut out = Vec::new();
    for s in 1..=10 {
        out = d.evaluate(
            &second(s, &[]),
            &Input { gpus: &held, inventory: &inv, launches: &HashMap::new() },
            M,
            &Thresholds::default(),
        );
    }
    assert!(out[0].summary.contains("SM clock 1375 MHz against 1980 MHz at best"), "{}", out[0].summary);
    assert!(run(10, &[gpu(97.0, &[812], 3)], &[]).is_empty(), "a few slowed polls are not throttling");
    let mut d = GpuDetect::default();
    let inv = inventory();
    for s in 0..12 {
        let g = [gpu(97.0, &[812], if s == 6 { 0 } else { 9 })];
        let out = d.evaluate(
            &second(s, &[]),
            &Input { gpus: &g, inventory: &inv, launches: &HashMap::new() },
            M,
            &Thresholds::default(),
        );
        assert!(out.is_empty(), "second {s}: the run restarted at 7");
    }
}

/// A GPU-bound run as the H100 of BENCHMARKS.md showed it: 90-100 % busy, at its power cap the
/// whole time (the software power cap bit in every poll, the SM clock at 1375 of 1980 MHz), the
/// holder's main thread spinning in its synchronisation and its DataLoader workers busy too.
/// Through the poller's own fold (`gpu_readings::Seconds`): a minute of it raises nothing.
#[test]
fn a_gpu_bound_run_at_its_power_cap_raises_no_finding() {
    use crate::gpu_readings::{Holder, Reading, Seconds};
    let busy: &[(usize, u32, &str, &[&str])] = &[
        (0, 812, "python3", &["_start", "synchronize (train.py:52)", "cuStreamSynchronize"]),
        (1, 901, "pt_data_worker", AUGMENT),
        (2, 902, "pt_data_worker", AUGMENT),
    ];
    let inv = inventory();
    let (mut fold, mut d) = (Seconds::default(), GpuDetect::default());
    let mut seconds = 0;
    for poll in 0..600u64 {
        let r = Reading {
            index: 0,
            util: Some(90.0 + (poll % 11) as f64),
            sm_clock_mhz: Some(if poll < 10 { 1980.0 } else { 1375.0 }),
            clock_events: Some(0x4),
            holders: Some(vec![Holder {
                pid: 812,
                mem_mib: Some(70_000.0),
                sm_util: Some(98.0),
                comm: None,
                identity: None,
            }]),
            ..Default::default()
        };
        let Some((start, mut gpus)) = fold.add(1_795_000_000 * NS_PER_SEC + poll * 100_000_000, &[r]) else {
            continue;
        };
        assert_eq!((gpus[0].slowed_polls, gpus[0].reasons), (0, 0x4), "the power cap is not a slowdown");
        // As the poller would hand them over: its DataLoader workers.
        gpus[0].descendants = vec![901, 902];
        let input = Input { gpus: &gpus, inventory: &inv, launches: &HashMap::new() };
        let out = d.evaluate(&second(start / NS_PER_SEC, busy), &input, M, &Thresholds::default());
        assert!(out.is_empty(), "second {seconds} of a GPU-bound run: {out:?}");
        seconds += 1;
    }
    assert_eq!(seconds, 59);
}

#[test]
fn a_busy_gpu_whose_sms_mostly_idle_is_underused_naming_the_launches() {
    let train: &[&str] = &["_start", "_PyEval_EvalFrameDefault", "train_step (train.py:93)", "cuLaunchKernel"];
    let launches = HashMap::from([(
        812,
        LaunchFigures {
            per_sec: 21_400.0,
            top_line: Some((Arc::from("train_step (train.py:93)"), 0.92)),
            top_kernels: vec![(Arc::from("[gpu] void at::native::vectorized_elementwise_kernel<4>"), 0.6)],
        },
    )]);
    let evaluate = |secs: u64, g: GpuSecond| {
        let mut d = GpuDetect::default();
        let (inv, gpus) = (inventory(), [g]);
        let mut last = Vec::new();
        for s in 0..secs {
            let input = Input { gpus: &gpus, inventory: &inv, launches: &launches };
            last = d.evaluate(&second(1000 + s, &[(1, 812, "python3", train)]), &input, M, &Thresholds::default());
        }
        last
    };
    // NVML says 98 % busy; GPM says the SMs had work 12 % of the time: ten seconds of it.
    assert!(evaluate(9, with_gpm(98.0, &[812], 12.0)).is_empty(), "not before gpu_secs");
    let a = evaluate(10, with_gpm(98.0, &[812], 12.0));
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuUnderused);
    let s = &a[0].summary;
    assert!(s.contains("98 % busy for 10 s but its SMs were active only 12 % of the time (occupancy 6 %"), "{s}");
    assert!(s.contains("python3 (pid 812)"), "{s}");
    assert!(s.contains("21400 launches/s"), "{s}");
    assert!(s.contains("92 % of them from train_step (train.py:93)"), "{s}");
    assert!(s.contains("; top kernels: [gpu] void at::native::vectorized_elementwise_kernel<4> 60 %"), "{s}");
    assert_eq!(a[0].evidence["top_kernels"][0]["share"], 0.6);
    assert!(s.contains("CUDA graphs"), "{s}");
    assert_eq!(a[0].evidence["gpm"]["sm_active_percent"], 12.0);
    // SMs busy enough, a GPU not busy enough, or no GPM (before Hopper): nothing.
    assert!(evaluate(12, with_gpm(98.0, &[812], 45.0)).is_empty());
    assert!(evaluate(12, with_gpm(70.0, &[812], 12.0)).is_empty());
    assert!(evaluate(12, gpu(98.0, &[812], 0)).is_empty(), "no GPM, no finding");
}

#[test]
fn on_a_shared_gpu_the_finding_says_which_process_used_it() {
    // Two trainers on one GPU at 40 %: 900 has its SMs 38 % of the time, 812 2 % while its
    // workers saturate three CPUs: 812 starves, and the finding says who used the GPU.
    let shared = [GpuSecond { holder_sm: vec![(812, 2.0), (900, 38.0)], ..fed(40.0, &[812, 900], &[901, 902, 903]) }];
    let busy: &[(usize, u32, &str, &[&str])] = &[
        (0, 900, "python3", &["_start", "step (other.py:7)"]),
        (1, 901, "pt_data_worker", AUGMENT),
        (2, 902, "pt_data_worker", AUGMENT),
        (3, 903, "pt_data_worker", AUGMENT),
    ];
    let a = run(10, &shared, busy);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuStarved);
    let s = &a[0].summary;
    assert!(
        s.ends_with("the GPU is shared by 2 processes, by their share of its SMs: python3 (pid 900) 38 %, pid 812 2 %"),
        "{s}"
    );
    assert_eq!(
        a[0].evidence["holders_sm_percent"],
        json!([{"pid": 900, "sm_percent": 38.0}, {"pid": 812, "sm_percent": 2.0}])
    );
    // One holder: nothing about sharing.
    let alone = [GpuSecond { holder_sm: vec![(812, 2.0)], ..fed(20.0, &[812], &[901, 902, 903]) }];
    let a = run(10, &alone, &busy[1..]);
    assert!(!a[0].summary.contains("shared"), "{}", a[0].summary);
}

/// One drain's worth of off-CPU time: `ns` of thread `tid` of `pid` in second `sec`.
fn wait(pid: u32, tid: u32, sec: u64, ns: u64, state: OffState, call: (&str, Option<&'static str>, &str)) -> Wait {
    let line: Arc<str> = Arc::from(call.2);
    Wait {
        pid,
        tid,
        ts_ns: sec * NS_PER_SEC,
        ns,
        state,
        comm: Arc::from(if pid == 812 { "python3" } else { "pt_data_worker" }),
        waits_in: Some(Arc::from(call.0)),
        fs: call.1,
        queue: waiting::on_queue(std::slice::from_ref(&line)),
        line: Some(line),
    }
}

const NFS_READ: (&str, Option<&str>, &str) = ("nfs_wait_bit_killable_[k]", Some("nfs"), "load_sample (dataset.py:31)");
const INDEX_QUEUE: (&str, Option<&str>, &str) =
    ("do_sys_poll_[k]", None, "get (/usr/lib/python3.11/multiprocessing/queues.py:113)");
const DATA_QUEUE: (&str, Option<&str>, &str) =
    ("futex_wait_queue_[k]", None, "get (/usr/lib/python3.11/multiprocessing/queues.py:122)");

/// Runs `secs` seconds of an idle GPU held by 812 whose children are 901-903, with no CPU
/// busy; `waits(s)` are drained before second `s` is judged. Returns what the last one said.
fn run_waiting(secs: u64, waits: impl Fn(u64) -> Vec<Wait>) -> Vec<Active> {
    let mut d = GpuDetect::default();
    let inv = inventory();
    let gpus = [fed(20.0, &[812], &[901, 902, 903])];
    let feeders: HashSet<u32> = [812, 901, 902, 903].into();
    let mut last = Vec::new();
    for s in 1000..1000 + secs {
        d.on_waits(&waits(s), &feeders);
        let input = Input { gpus: &gpus, inventory: &inv, launches: &HashMap::new() };
        last = d.evaluate(&second(s, &[]), &input, M, &Thresholds::default());
    }
    last
}

/// Two workers blocked in an NFS read most of each second, a third idle on its index queue,
/// the training loop waiting on the data queue (and a helper thread of the holder in poll).
fn nfs_bound(s: u64) -> Vec<Wait> {
    vec![
        wait(901, 901, s, 900_000_000, OffState::Io, NFS_READ),
        wait(902, 902, s, 800_000_000, OffState::Io, NFS_READ),
        wait(902, 902, s, 100_000_000, OffState::Sleep, ("pipe_read_[k]", None, "send (dataset.py:40)")),
        wait(903, 903, s, 1_000_000_000, OffState::Sleep, INDEX_QUEUE),
        wait(812, 812, s, 950_000_000, OffState::Sleep, DATA_QUEUE),
        wait(812, 815, s, 1_000_000_000, OffState::Sleep, ("do_sys_poll_[k]", None, "run (threading.py:975)")),
    ]
}

#[test]
fn workers_blocked_in_a_read_while_the_gpu_idles_is_gpu_starved_naming_the_read_and_the_loops_wait() {
    assert!(run_waiting(9, nfs_bound).is_empty(), "not before 10 s");
    let a = run_waiting(10, nfs_bound);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuStarved);
    let s = &a[0].summary;
    assert!(s.starts_with("GPU 0 (NVIDIA H100) 20 % busy for 10 s while its input pipeline waits"), "{s}");
    assert!(s.contains("pt_data_worker (pid 901) and 1 other worker(s) were blocked 1.80 s of each second"), "{s}");
    assert!(s.contains("0.00 cores busy"), "{s}");
    // 1.7 of the 1.8 s in the NFS read.
    assert!(s.contains("94 % of it in nfs_wait_bit_killable (io) on nfs at load_sample (dataset.py:31)"), "{s}");
    assert!(
        s.contains(
            "the training loop (thread 812 of python3, pid 812) waited 0.95 s of each second in futex_wait_queue at \
             get (/usr/lib/python3.11/multiprocessing/queues.py:122), on the workers' queue"
        ),
        "{s}"
    );
    assert!(s.contains("look next: the storage or network"), "{s}");
    let b = &a[0].evidence["blocked"];
    assert_eq!(b["state"], "io");
    assert_eq!(b["file_system"], "nfs");
    assert_eq!(b["workers"].as_array().unwrap().len(), 2, "the worker idle on its queue is not blocked: {b}");
    assert_eq!(b["loop"]["tid"], 812);
    assert_eq!(b["seconds"], 10);
}

#[test]
fn workers_idle_on_their_queue_short_waits_strangers_or_a_busy_gpu_raise_nothing() {
    let idle = |s| vec![wait(901, 901, s, 1_000_000_000, OffState::Sleep, INDEX_QUEUE)];
    assert!(run_waiting(15, idle).is_empty(), "waiting for work is not starving");
    let short = |s| vec![wait(901, 901, s, 300_000_000, OffState::Io, NFS_READ)];
    assert!(run_waiting(15, short).is_empty(), "0.3 s a second is under gpu_blocked_share");
    let stranger = |s| vec![wait(777, 777, s, 1_000_000_000, OffState::Io, NFS_READ)];
    assert!(run_waiting(15, stranger).is_empty(), "not the GPU's feeders");
    let runnable = |s| vec![wait(901, 901, s, 1_000_000_000, OffState::Runnable, NFS_READ)];
    assert!(run_waiting(15, runnable).is_empty(), "waiting for a CPU is not blocking");
    // The same blocked workers beside a busy GPU.
    let mut d = GpuDetect::default();
    let inv = inventory();
    let gpus = [fed(95.0, &[812], &[901, 902, 903])];
    for s in 1000..1015 {
        d.on_waits(&nfs_bound(s), &[812, 901, 902, 903].into());
        let input = Input { gpus: &gpus, inventory: &inv, launches: &HashMap::new() };
        assert!(d.evaluate(&second(s, &[]), &input, M, &Thresholds::default()).is_empty());
    }
}

#[test]
fn workers_busier_on_cpu_than_blocked_are_the_cpu_side_not_the_waiting_one() {
    // Worker 901 keeps a CPU busy: the CPU-side starved finding, as before the off-CPU counts.
    let mut d = GpuDetect::default();
    let inv = inventory();
    let gpus = [fed(20.0, &[812], &[901, 902, 903])];
    let mut last = Vec::new();
    for s in 1000..1010 {
        d.on_waits(&nfs_bound(s), &[812, 901, 902, 903].into());
        let input = Input { gpus: &gpus, inventory: &inv, launches: &HashMap::new() };
        last = d.evaluate(&second(s, &[(1, 901, "pt_data_worker", AUGMENT)]), &input, M, &Thresholds::default());
    }
    assert_eq!(last.len(), 1, "{last:?}");
    assert!(last[0].summary.contains("kept 1 CPU(s) busy"), "{}", last[0].summary);
    assert!(last[0].evidence["blocked"].is_null());
}

#[test]
fn a_share_is_measured_over_the_seconds_the_drains_reached() {
    // Waits are credited when they end: the last two seconds of the window have none yet.
    let mut w = waiting::Waiting::default();
    let feeders: HashSet<u32> = [812, 901].into();
    for s in 1000..1008 {
        w.on_waits(&[wait(901, 901, s, 600_000_000, OffState::Io, NFS_READ)], &feeders);
    }
    let g = fed(20.0, &[812], &[901]);
    let b = w.blocked(&g, 1010 * NS_PER_SEC, 0.0, 0.5).expect("blocked");
    assert!((b.blocked - 0.6).abs() < 1e-9, "0.6 s a second over 1006-1007 reached, not 0.36 over 5: {b:?}");
    assert!(w.blocked(&g, 1010 * NS_PER_SEC, 0.7, 0.5).is_none(), "busier than blocked");
    assert!(w.blocked(&g, 1030 * NS_PER_SEC, 0.0, 0.5).is_none(), "nothing reached in the window");
    // Old seconds go: twice the window behind the newest.
    w.on_waits(&[wait(901, 901, 1030, 1, OffState::Io, NFS_READ)], &feeders);
    assert!(w.blocked(&g, 1007 * NS_PER_SEC, 0.0, 0.5).is_none(), "forgotten");
}

#[test]
fn queue_frames_are_the_multiprocessing_and_thread_queues() {
    let f = |s: &str| vec![Arc::<str>::from("_start"), Arc::from(s)];
    assert!(waiting::on_queue(&f("get (/usr/lib/python3.11/multiprocessing/queues.py:113)")));
    assert!(waiting::on_queue(&f("_poll (/usr/lib/python3.11/multiprocessing/connection.py:440)")));
    assert!(waiting::on_queue(&f("get (/usr/lib/python3.12/queue.py:171)")));
    assert!(!waiting::on_queue(&f("load_sample (dataset.py:31)")));
    assert!(!waiting::on_queue(&f("get (myqueue.py:3)")));
    assert!(!waiting::on_queue(&f("pipe_read_[k]")));
}

/// Issue 41, part 7: two workers competing for the CPUs (a build beside them), each given a
/// third of a core while asking for a whole one, the GPU at 20 %: their demand says they starve
/// it, which their samples alone (33 % of a core each) do not. The holder, busy a little
/// itself, is the GPU's, not one of the feeders named.
#[test]
fn workers_competing_for_cpus_starve_the_gpu_by_what_they_asked() {
    let inv = inventory();
    let mut g = fed(20.0, &[812], &[901, 902]);
    let asked = |waited: f64| {
        vec![
            ThreadDemand { pid: 812, tid: 812, ran: 0.1, waited: 0.0 },
            ThreadDemand { pid: 901, tid: 901, ran: 0.33, waited },
            ThreadDemand { pid: 902, tid: 902, ran: 0.36, waited },
        ]
    };
    let mut now = second(0, &[(1, 777, "cc1", &["main"]), (0, 777, "cc1", &["main"])]);
    // A third of a core each, on both CPUs; the holder a tenth of one.
    for (cpu, pid) in [(0, 901), (1, 902)] {
        now.cpus[cpu].busy.truncate(HZ as usize * 2 / 3);
        now.cpus[cpu].busy.extend((0..HZ / 3).map(|_| tick(pid, "pt_data_worker", AUGMENT)));
    }
    now.cpus[2].busy.extend((0..HZ / 10).map(|_| tick(812, "python3", &["_start", "train_step (train.py:40)"])));
    let evaluate = |g: &GpuSecond| {
        let mut d = GpuDetect::default();
        let mut last = Vec::new();
        for s in 0..10 {
            let now = Second { start_ns: (1000 + s) * NS_PER_SEC, ..now.clone() };
            let input = Input { gpus: std::slice::from_ref(g), inventory: &inv, launches: &HashMap::new() };
            last = d.evaluate(&now, &input, M, &Thresholds::default());
        }
        last
    };
    g.demand = asked(0.6);
    let a = evaluate(&g);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].kind, Kind::GpuStarved);
    let s = &a[0].summary;
    assert!(s.contains("while pt_data_worker (pid 901) and 1 other process(es) kept"), "{s}");
    assert!(s.contains("2 worker(s) asked for 1.9 cores and were given 0.7"), "{s}");
    assert_eq!(a[0].evidence["workers_demand"]["workers"], 2.0);
    // The same thirds of a core, the rest of the time asleep: nothing starves the GPU.
    g.demand = asked(0.0);
    assert!(evaluate(&g).is_empty(), "workers that sleep two thirds of the time do not starve it");
}
