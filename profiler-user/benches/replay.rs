//! The replay benchmark (issue 6, "cost must not grow with the node"): what the daemon's
//! per-sample path costs on one core for a node of N CPUs at F Hz.
//!
//! Raw ring-buffer records are built in memory exactly as the BPF program writes them (a
//! `SampleHeader`, then kernel and user addresses, leaf first) and fed to
//! `profiler::pipeline::Pipeline`, the code the daemon runs on every record: parsing,
//! symbolization with blazesym (kernel addresses from /proc/kallsyms, user addresses inside
//! the executable mappings of live child processes, so every lookup is a real one), the
//! detectors and the store writer. Records come half a second of simulated time at a time, each
//! batch followed by what the daemon does on its flush tick (NET_RX figures, detectors, store
//! flush), and only that work is timed, in thread CPU time and in wall time.
//!
//! Run through `cargo xtask bench replay`, or
//! `cargo bench -p profiler-user --bench replay -- --help`. Without `--cpus` it runs every
//! configuration of the table, each in a fresh process, so that warm-up and peak RSS are that
//! configuration's own.
//!
//! `--python` replays a Python training node instead (`replay/python.rs`): real CPython
//! processes whose code objects are read, as the daemon reads them, and records carrying
//! Python frames; without `--cpus` it runs 16 CPUs at 99 Hz under each CPython this machine has
//! (3.9 to 3.14: the machine's 3.11 and the Python test's roots), or those of `--versions`.
//! `--runs N` runs each configuration N times and reports the median and the range.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use profiler::{
    detect::{Engine, Machine, Thresholds},
    pipeline::Pipeline,
    store::{self, StoreWriter},
    symbolize::{Symbolizer, UNKNOWN, parse_module_offset},
};
use profiler_common::{FLAG_IDLE, FLAG_USER_MODE, HEADER_LEN, SampleHeader};
use serde_json::{Value, json};

#[path = "shared/synth.rs"]
#[allow(dead_code)] // each bench uses part of it
mod synth;
use synth::Rng;
#[path = "replay/python.rs"]
mod python;
#[path = "replay/workload.rs"]
mod workload;

use workload::*;

/// The table's rows: CPUs and frequency. 2 and 64 CPUs are there to compare with.
const CONFIGS: &[(u32, u64)] = &[(2, 99), (64, 99), (192, 99), (64, 999), (192, 999)];
/// The Python training node's: a 16-CPU node at the default frequency.
const PYTHON_CONFIGS: &[(u32, u64)] = &[(16, 99)];
const NS: u64 = 1_000_000_000;
/// The daemon's default flush interval: records are fed, then flushed, this much at a time.
const FLUSH_NS: u64 = 500_000_000;
/// The daemon's report interval, at which it also sweeps the symbolizer's caches.
const EXPIRE_EVERY_NS: u64 = 10 * NS;
/// Boot time of the first simulated sample (what `bpf_ktime_get_boot_ns` would say), and the
/// wall-clock time it maps to: a whole minute, as a segment starts.
const BOOT0_NS: u64 = 1_000 * NS;
const UNIX0_NS: u64 = 1_795_000_020 * NS;
/// Named kernel call chains (root first) that busy samples enter the kernel through; names the
/// running kernel does not have are skipped.
const KERNEL_CHAINS: &[&[&str]] = &[
    &["entry_SYSCALL_64_after_hwframe", "do_syscall_64", "x64_sys_call"],
    &["asm_sysvec_apic_timer_interrupt", "sysvec_apic_timer_interrupt", "__sysvec_apic_timer_interrupt"],
    &["asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault", "handle_mm_fault"],
    &["asm_common_interrupt", "common_interrupt", "__common_interrupt", "handle_edge_irq"],
];
/// What kernel threads run: softirq work.
const KTHREAD_CHAIN: &[&str] =
    &["ret_from_fork_asm", "ret_from_fork", "kthread", "smpboot_thread_fn", "run_ksoftirqd", "handle_softirqs"];

struct Args {
    /// One configuration (a child run); `None`: all of `CONFIGS`.
    cpus: Option<u32>,
    hz: u64,
    /// Simulated seconds measured, after `warmup` simulated seconds reported apart.
    seconds: u64,
    warmup: u64,
    stacks: usize,
    processes: usize,
    /// A Python training node's records (see `replay/python.rs`).
    python: bool,
    /// CPython minor versions to replay (`--python`; a child run: one).
    versions: Vec<u8>,
    /// Runs of each configuration (without `--cpus`): the median and the range are reported.
    runs: usize,
}

fn args() -> Args {
    let quick = std::env::var_os("REPLAY_QUICK").is_some_and(|v| v != "0");
    let mut a = Args {
        cpus: None,
        hz: 99,
        seconds: 60,
        warmup: 3,
        stacks: 3000,
        processes: 16,
        python: false,
        versions: python::VERSIONS.iter().map(|v| v.0).collect(),
        runs: 1,
    };
    if quick {
        (a.seconds, a.warmup) = (5, 2);
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // A training node: the main process and six DataLoader workers.
    if argv.iter().any(|k| k == "--python") {
        a.processes = 7;
    }
    let mut it = argv.iter();
    while let Some(k) = it.next() {
        let mut val = || it.next().and_then(|v| v.parse::<u64>().ok()).expect("a number after the flag");
        match k.as_str() {
            "--cpus" => a.cpus = Some(val() as u32),
            "--hz" => a.hz = val(),
            "--seconds" => a.seconds = val(),
            "--warmup" => a.warmup = val(),
            "--stacks" => a.stacks = val() as usize,
            "--processes" => a.processes = val().max(1) as usize,
            "--quick" => (a.seconds, a.warmup) = (5, 2),
            "--python" => a.python = true,
            "--versions" => {
                let list = it.next().expect("versions after --versions (3.9,3.13)");
                a.versions = list
                    .split(',')
                    .map(|v| v.trim().strip_prefix("3.").and_then(|m| m.parse().ok()).expect("a version like 3.13"))
                    .collect();
            }
            "--runs" => a.runs = val().max(1) as usize,
            "--bench" => {}
            "--help" => {
                println!(
                    "replay bench [--cpus N --hz F] [--seconds 60] [--warmup 3] [--stacks 3000] [--processes 16] \
                     [--quick] [--python [--versions 3.9,3.10,3.11,3.12,3.13,3.14]] [--runs 1]\n(REPLAY_QUICK=1 is --quick; REPLAY_MARK=1 prints when the measured phase starts and ends, for perf; without --cpus every configuration runs)"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    let a = args();
    match a.cpus {
        Some(cpus) => println!("{}", run(&a, cpus)),
        None => all(&a),
    }
}

/// Every configuration, each in a child process of this binary; then the tables.
fn all(a: &Args) {
    let me = std::env::current_exe().expect("own path");
    // (CPUs, Hz, CPython minor version or 0 for native records).
    let configs: Vec<(u32, u64, u8)> = if a.python {
        let mut v = Vec::new();
        for &minor in &a.versions {
            match python::interpreter(minor) {
                Some(_) => v.extend(PYTHON_CONFIGS.iter().map(|&(c, h)| (c, h, minor))),
                None => eprintln!("replay: no CPython 3.{minor} here (the Python test's roots: cargo xtask setup)"),
            }
        }
        v
    } else {
        CONFIGS.iter().map(|&(c, h)| (c, h, 0)).collect()
    };
    let rows: Vec<Value> = configs
        .iter()
        .map(|&(cpus, hz, minor)| {
            let version = if minor > 0 { format!(", CPython 3.{minor}") } else { String::new() };
            let mut runs: Vec<Value> = (0..a.runs)
                .map(|run| {
                    eprintln!(
                        "replay: {cpus} CPUs x {hz} Hz{version}, {} s warm-up + {} s measured (run {} of {}; {})",
                        a.warmup,
                        a.seconds,
                        run + 1,
                        a.runs,
                        loadavg()
                    );
                    let out = Command::new(&me)
                        .args(["--cpus", &cpus.to_string(), "--hz", &hz.to_string()])
                        .args(["--seconds", &a.seconds.to_string(), "--warmup", &a.warmup.to_string()])
                        .args(["--stacks", &a.stacks.to_string(), "--processes", &a.processes.to_string()])
                        .args(a.python.then_some("--python"))
                        .args(if minor > 0 { vec!["--versions".to_string(), format!("3.{minor}")] } else { vec![] })
                        .stderr(Stdio::inherit())
                        .output()
                        .expect("run one configuration");
                    assert!(out.status.success(), "the {cpus} x {hz}{version} run failed ({})", out.status);
                    serde_json::from_slice(&out.stdout).expect("a JSON line")
                })
                .collect();
            // The median run stands for the configuration; the range beside it.
            runs.sort_by(|x, y| x["ns_per_busy"].as_f64().partial_cmp(&y["ns_per_busy"].as_f64()).expect("a figure"));
            let (low, high) = (runs[0]["ns_per_busy"].clone(), runs[runs.len() - 1]["ns_per_busy"].clone());
            let mut row = runs.swap_remove(runs.len() / 2);
            row["ns_per_busy_low"] = low;
            row["ns_per_busy_high"] = high;
            row
        })
        .collect();
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    println!();
    println!(
        "| CPUs x Hz | samples/s (busy) | CPU ns/sample | CPU ns/busy sample | share of one core | wall/CPU | \
         pipeline memory (peak RSS of the run) | store bytes/sample |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} x {} | {} ({}) | {:.0} | {:.0} | {:.2} % | {:.2} | {:.1} MiB ({:.1} MiB) | {:.2} |",
            r["cpus"],
            r["hz"],
            thousands(f(r, "samples_per_s")),
            thousands(f(r, "busy_per_s")),
            f(r, "ns_per_sample"),
            f(r, "ns_per_busy"),
            f(r, "core_share") * 100.0,
            f(r, "wall_over_cpu"),
            f(r, "peak_rss_mib") - f(r, "base_rss_mib"),
            f(r, "peak_rss_mib"),
            f(r, "store_bytes_per_sample"),
        );
    }
    println!();
    println!(
        "| CPUs x Hz | handle (parse, symbolize, detect, push) | flush tick: detectors | flush tick: store | \
         stack cache hits (whole run) | frames named | warm-up: first {} s | samples measured (busy, kernel share) |",
        a.warmup
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} x {} | {:.0} % | {:.0} % | {:.0} % | {:.2} % | {:.1} % | {:.0} ms CPU = {:.1} % of a core | {} ({}, {:.0} %) |",
            r["cpus"],
            r["hz"],
            f(r, "handle_share") * 100.0,
            f(r, "tick_share") * 100.0,
            f(r, "flush_share") * 100.0,
            f(r, "stack_hit_rate") * 100.0,
            f(r, "named_share") * 100.0,
            f(r, "warmup_cpu_ms"),
            f(r, "warmup_cpu_ms") / 10.0 / a.warmup.max(1) as f64,
            thousands(f(r, "samples")),
            thousands(f(r, "busy")),
            f(r, "kernel_share") * 100.0,
        );
    }
    if a.python {
        println!();
        println!(
            "| CPython | CPUs x Hz | CPU ns/busy sample, median of {} (range) | stack cache hits | Python frames per busy sample | frames named |",
            a.runs
        );
        println!("|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| 3.{} | {} x {} | {:.0} ({:.0}-{:.0}) | {:.1} % | {:.1} ({:.0} % of samples) | {:.1} % |",
                r["python_minor"],
                r["cpus"],
                r["hz"],
                f(r, "ns_per_busy"),
                f(r, "ns_per_busy_low"),
                f(r, "ns_per_busy_high"),
                f(r, "stack_hit_rate") * 100.0,
                f(r, "python_frames_per_sample"),
                f(r, "python_share") * 100.0,
                f(r, "named_share") * 100.0,
            );
        }
        println!("({})", loadavg());
    }
}

/// The machine's load average, to print beside timings taken on a shared machine.
fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!("load average {}", l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One configuration: returns its figures as a JSON line.
fn run(a: &Args, cpus: u32) -> Value {
    let hz = a.hz;
    let (helpers, pys) = if a.python {
        let minor = a.versions[0];
        python::spawn(a.processes, minor)
            .unwrap_or_else(|| panic!("CPython 3.{minor} runs here and its layout is read (cargo xtask setup)"))
    } else {
        (spawn_helpers(a.processes), Vec::new())
    };
    let procs = processes(&helpers);
    let kernel = KernelText::read();
    let pool = if a.python {
        python::pool(a.stacks, &procs, &pys, &kernel, &mut Rng::new(0x5eed))
    } else {
        Pool::new(a.stacks, &procs, &kernel, &mut Rng::new(0x5eed))
    };
    drop(kernel);
    // One core: the daemon is one thread, and a pinned run is not disturbed by the other CPU.
    pin_to_last_cpu();

    let dir = tempfile::tempdir().expect("tempdir");
    store::create_and_lock(dir.path()).expect("store");
    let mut rng = Rng::new(0xfeed);
    let mut batch = Batch::default();
    let mut generator = Generator {
        cpus,
        hz,
        pool: &pool,
        procs: &procs,
        kernel_share: (0, 0),
        python: (0, 0, 0),
        busy_share: if a.python { python::busy_share } else { synth::busy_share },
    };
    // The first batch before the baseline, so the reused record buffer counts as the harness's.
    generator.fill(&mut batch, &mut rng, 0);
    reset_peak_rss();
    let base_rss = status_kib("VmRSS:");

    let mut pipeline = Pipeline::new(
        StoreWriter::new(&store::segments_dir(dir.path())),
        Engine::new(Machine { cpus, frequency_hz: hz }, Thresholds::default()),
        UNIX0_NS as i128 - BOOT0_NS as i128,
    );
    // The daemon's unwind stage knows which processes run CPython, and which version; what the
    // pipeline tells it is taken off the queue between batches, as that stage's thread would.
    let (notifier, told) =
        profiler::unwind::Notifier::detached(pys.iter().map(|p| (p.pid, p.layout.clone())).collect());
    pipeline.set_unwind(Some(notifier));
    let mut netrx = NetRx::new(cpus);
    let halves = (a.warmup + a.seconds) * NS / FLUSH_NS;
    let warmup_halves = a.warmup * NS / FLUSH_NS;
    let mut m = Measured::default();
    let mut warmup = Duration::ZERO;
    let (mut store_bytes, mut fed) = (0u64, 0u64);
    for half in 0..halves {
        if half > 0 {
            generator.fill(&mut batch, &mut rng, half);
        }
        if half == warmup_halves && std::env::var_os("REPLAY_MARK").is_some() {
            // For `perf record -k CLOCK_MONOTONIC`: the measured phase starts here.
            eprintln!("replay: measured from {} s (CLOCK_MONOTONIC)", clock_secs(libc::CLOCK_MONOTONIC));
        }
        let now = UNIX0_NS + (half + 1) * FLUSH_NS;
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        for r in batch.records() {
            pipeline.handle(r, Instant::now());
        }
        let cpu1 = thread_cpu();
        // What the daemon does on its flush tick that belongs to the sample path.
        pipeline.on_netrx(now, netrx.next());
        let _findings = pipeline.tick(now, now);
        let cpu2 = thread_cpu();
        let flushed = pipeline.flush(now, u64::MAX).expect("flush");
        if (now - UNIX0_NS).is_multiple_of(EXPIRE_EVERY_NS) {
            pipeline.symbolizer_mut().expire();
        }
        let (cpu3, wall) = (thread_cpu(), wall0.elapsed());
        told.drain();
        store_bytes += flushed.bytes;
        fed += batch.offsets.len() as u64;
        if half < warmup_halves {
            warmup += cpu3 - cpu0;
            continue;
        }
        m.handle += cpu1 - cpu0;
        m.tick += cpu2 - cpu1;
        m.flush += cpu3 - cpu2;
        m.wall += wall;
        m.samples += batch.offsets.len() as u64;
        m.busy += batch.busy;
    }
    if std::env::var_os("REPLAY_MARK").is_some() {
        eprintln!("replay: measured until {} s (CLOCK_MONOTONIC)", clock_secs(libc::CLOCK_MONOTONIC));
    }
    let st = pipeline.symbolizer().stats();
    let peak_rss = status_kib("VmHWM:");
    assert_eq!(pipeline.bad_records(), 0, "every record built here is well formed");
    assert_eq!(pipeline.samples() + pipeline.idle(), fed, "every record is a sample");
    let named = named_share(&pool, &procs, &pys);
    drop(helpers);

    let cpu = (m.handle + m.tick + m.flush).as_secs_f64();
    let secs = a.seconds as f64;
    let total = pipeline.samples() + pipeline.idle();
    json!({
        "cpus": cpus,
        "hz": hz,
        "samples": m.samples,
        "busy": m.busy,
        "samples_per_s": m.samples as f64 / secs,
        "busy_per_s": m.busy as f64 / secs,
        "ns_per_sample": cpu * 1e9 / m.samples as f64,
        "ns_per_busy": cpu * 1e9 / m.busy.max(1) as f64,
        "core_share": cpu / secs,
        "wall_over_cpu": m.wall.as_secs_f64() / cpu,
        "handle_share": m.handle.as_secs_f64() / cpu,
        "tick_share": m.tick.as_secs_f64() / cpu,
        "flush_share": m.flush.as_secs_f64() / cpu,
        "warmup_cpu_ms": warmup.as_secs_f64() * 1e3,
        "stack_hit_rate": st.stack_hits as f64 / (st.stack_hits + st.stack_misses).max(1) as f64,
        "kernel_share": generator.kernel_share.0 as f64 / generator.kernel_share.1.max(1) as f64,
        "peak_rss_mib": peak_rss as f64 / 1024.0,
        "base_rss_mib": base_rss as f64 / 1024.0,
        "store_bytes_per_sample": store_bytes as f64 / total as f64,
        "named_share": named,
        "python_share": generator.python.0 as f64 / generator.python.1.max(1) as f64,
        "python_frames_per_sample": generator.python.2 as f64 / generator.python.0.max(1) as f64,
        "python_minor": pys.first().map_or(0, |p| p.layout.minor),
    })
}

/// Share of the pool's frames that symbolize to a name (not `[unknown]`, not an unread Python
/// frame), checked apart from the timed run; the most popular stack goes to stderr for the eye.
fn named_share(pool: &Pool, procs: &[Proc], pys: &[python::PyProc]) -> f64 {
    let mut symbolizer = Symbolizer::new();
    let (mut named, mut all) = (0usize, 0usize);
    for (i, s) in pool.stacks.iter().enumerate() {
        let p = &procs[s.proc];
        let comm = String::from_utf8_lossy(&p.comm).trim_end_matches('\0').to_string();
        let layout = pys.iter().find(|py| py.pid == p.pid).map(|py| (&*py.layout, &s.python[..]));
        let stack = symbolizer.stack_with_python(p.pid, &comm, &s.kernel, &s.user, layout, Instant::now());
        let unread = |f: &str| f.starts_with(UNKNOWN) || f == "[python]" || parse_module_offset(f).is_some();
        named += stack.frames.iter().filter(|f| !unread(f)).count();
        all += stack.frames.len();
        if i == 0 {
            let frames: Vec<&str> = stack.frames.iter().map(|f| &**f).collect();
            eprintln!("replay: most popular stack ({comm}): {}", frames.join(";"));
        }
    }
    named as f64 / all.max(1) as f64
}

#[derive(Default)]
struct Measured {
    handle: Duration,
    tick: Duration,
    flush: Duration,
    wall: Duration,
    samples: u64,
    busy: u64,
}

/// The records of one flush interval, back to back as the ring buffer hands them over.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    offsets: Vec<(u32, u32)>,
    busy: u64,
}

impl Batch {
    fn records(&self) -> impl Iterator<Item = &[u8]> {
        self.offsets.iter().map(|&(at, len)| &self.bytes[at as usize..(at + len) as usize])
    }
}

struct Generator<'a> {
    cpus: u32,
    hz: u64,
    pool: &'a Pool,
    procs: &'a [Proc],
    /// Busy samples with kernel frames, busy samples.
    kernel_share: (u64, u64),
    /// Busy samples with Python frames, busy samples, Python frames.
    python: (u64, u64, u64),
    /// A CPU's share of busy ticks.
    busy_share: fn(u32, u32) -> f64,
}

impl Generator<'_> {
    /// The records of flush interval `half`: every CPU's ticks, in time order as the ring
    /// receives them (ticks of different CPUs interleave), idle or busy as `synth` models a
    /// GPU node.
    fn fill(&mut self, batch: &mut Batch, rng: &mut Rng, half: u64) {
        batch.bytes.clear();
        batch.offsets.clear();
        batch.busy = 0;
        let period = NS / self.hz;
        let (from, to) = (half * FLUSH_NS, (half + 1) * FLUSH_NS);
        // Tick k of every CPU falls at k * period (plus jitter and a per-CPU skew).
        for k in from.div_ceil(period)..to.div_ceil(period) {
            for cpu in 0..self.cpus {
                let ts = BOOT0_NS + k * period + rng.below(period / 20) + u64::from(cpu) * 997;
                let mut h = SampleHeader { ts_ns: ts, cpu, ..SampleHeader::default() };
                let at = batch.bytes.len() as u32;
                if rng.unit() < (self.busy_share)(cpu, self.cpus) {
                    let s = self.pool.pick(rng);
                    let p = &self.procs[s.proc];
                    h.pid = p.pid;
                    h.tid = if p.kthread { p.pid } else { p.pid + rng.below(20) as u32 };
                    h.cgroup_id = p.cgroup_id;
                    h.comm = p.comm;
                    h.flags = if s.kernel.is_empty() { FLAG_USER_MODE } else { 0 };
                    h.kernel_frames = s.kernel.len() as u16;
                    h.user_frames = s.user.len() as u16;
                    h.python_frames = (s.python.len() / 2) as u16;
                    push_header(&mut batch.bytes, &h);
                    for &addr in s.kernel.iter().chain(&s.user).chain(&s.python) {
                        batch.bytes.extend_from_slice(&addr.to_ne_bytes());
                    }
                    batch.busy += 1;
                    self.kernel_share.0 += u64::from(!s.kernel.is_empty());
                    self.kernel_share.1 += 1;
                    self.python.0 += u64::from(!s.python.is_empty());
                    self.python.1 += 1;
                    // Shim pairs (3.12+) mark evaluations; they are not frames.
                    self.python.2 += s.python.chunks_exact(2).filter(|w| w[0] != 0).count() as u64;
                } else {
                    h.flags = FLAG_IDLE;
                    push_header(&mut batch.bytes, &h);
                }
                batch.offsets.push((at, batch.bytes.len() as u32 - at));
            }
        }
    }
}

fn push_header(out: &mut Vec<u8>, h: &SampleHeader) {
    // SAFETY: SampleHeader is `#[repr(C)]` plain old data of HEADER_LEN bytes, no padding holes
    // left uninitialised (`_pad` is a field).
    let bytes = unsafe { std::slice::from_raw_parts((h as *const SampleHeader).cast::<u8>(), HEADER_LEN) };
    out.extend_from_slice(bytes);
}

fn thread_cpu() -> Duration {
    Duration::from_secs_f64(clock_secs(libc::CLOCK_THREAD_CPUTIME_ID))
}

fn clock_secs(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid clock id and pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn pin_to_last_cpu() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls only read it.
    unsafe {
        let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(n - 1, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Resets VmHWM to the current RSS (Linux ≥ 4.0), so the peak is the pipeline's, not setup's.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix(key))?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
