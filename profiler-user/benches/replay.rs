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

use std::{
    collections::{HashMap, HashSet},
    ops::ControlFlow,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use blazesym::{
    SymType,
    inspect::{
        Inspector,
        source::{Elf, Source},
    },
};
use profiler::{
    collect::NetRxCpu,
    detect::{Engine, Machine, Thresholds},
    pipeline::Pipeline,
    store::{self, StoreWriter},
    symbolize::{
        Symbolizer, UNKNOWN,
        maps::{self, Mapping},
    },
    synth::{self, Rng},
};
use profiler_common::{COMM_LEN, FLAG_IDLE, FLAG_USER_MODE, HEADER_LEN, LATENCY_BUCKETS, SampleHeader};
use serde_json::{Value, json};

/// The table's rows: CPUs and frequency. 2 and 64 CPUs are there to compare with.
const CONFIGS: &[(u32, u64)] = &[(2, 99), (64, 99), (192, 99), (64, 999), (192, 999)];
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
}

fn args() -> Args {
    let quick = std::env::var_os("REPLAY_QUICK").is_some_and(|v| v != "0");
    let mut a = Args { cpus: None, hz: 99, seconds: 60, warmup: 3, stacks: 3000, processes: 16 };
    if quick {
        (a.seconds, a.warmup) = (5, 2);
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
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
            "--bench" => {}
            "--help" => {
                println!(
                    "replay bench [--cpus N --hz F] [--seconds 60] [--warmup 3] [--stacks 3000] [--processes 16] \
                     [--quick]\n(REPLAY_QUICK=1 is --quick; without --cpus every configuration runs)"
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
    let rows: Vec<Value> = CONFIGS
        .iter()
        .map(|&(cpus, hz)| {
            eprintln!("replay: {cpus} CPUs x {hz} Hz, {} s warm-up + {} s measured", a.warmup, a.seconds);
            let out = Command::new(&me)
                .args(["--cpus", &cpus.to_string(), "--hz", &hz.to_string()])
                .args(["--seconds", &a.seconds.to_string(), "--warmup", &a.warmup.to_string()])
                .args(["--stacks", &a.stacks.to_string(), "--processes", &a.processes.to_string()])
                .stderr(Stdio::inherit())
                .output()
                .expect("run one configuration");
            assert!(out.status.success(), "the {cpus} x {hz} run failed ({})", out.status);
            serde_json::from_slice(&out.stdout).expect("a JSON line")
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
    let helpers = spawn_helpers(a.processes);
    let procs = processes(&helpers);
    let kernel = KernelText::read();
    let pool = Pool::new(a.stacks, &procs, &kernel, &mut Rng::new(0x5eed));
    drop(kernel);
    // One core: the daemon is one thread, and a pinned run is not disturbed by the other CPU.
    pin_to_last_cpu();

    let dir = tempfile::tempdir().expect("tempdir");
    store::create_and_lock(dir.path()).expect("store");
    let mut rng = Rng::new(0xfeed);
    let mut batch = Batch::default();
    let mut generator = Generator { cpus, hz, pool: &pool, procs: &procs, kernel_share: (0, 0) };
    // The first batch before the baseline, so the reused record buffer counts as the harness's.
    generator.fill(&mut batch, &mut rng, 0);
    reset_peak_rss();
    let base_rss = status_kib("VmRSS:");

    let mut pipeline = Pipeline::new(
        StoreWriter::new(&store::segments_dir(dir.path())),
        Engine::new(Machine { cpus, frequency_hz: hz }, Thresholds::default()),
        UNIX0_NS as i128 - BOOT0_NS as i128,
    );
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
        let now = UNIX0_NS + (half + 1) * FLUSH_NS;
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        for r in batch.records() {
            pipeline.handle(r);
        }
        let cpu1 = thread_cpu();
        // What the daemon does on its flush tick that belongs to the sample path.
        pipeline.engine.on_netrx(now, netrx.next());
        let _findings = pipeline.tick(now);
        let cpu2 = thread_cpu();
        let flushed = pipeline.flush(now).expect("flush");
        if (now - UNIX0_NS).is_multiple_of(EXPIRE_EVERY_NS) {
            pipeline.symbolizer.expire();
        }
        let (cpu3, wall) = (thread_cpu(), wall0.elapsed());
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
    let st = pipeline.symbolizer.stats();
    let peak_rss = status_kib("VmHWM:");
    assert_eq!(pipeline.bad_records, 0, "every record built here is well formed");
    assert_eq!(pipeline.samples + pipeline.idle, fed, "every record is a sample");
    let named = named_share(&pool, &procs);
    drop(helpers);

    let cpu = (m.handle + m.tick + m.flush).as_secs_f64();
    let secs = a.seconds as f64;
    let total = pipeline.samples + pipeline.idle;
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
    })
}

/// Share of the pool's frames that symbolize to a name (not `[unknown]`), checked apart from
/// the timed run; the most popular stack goes to stderr for the eye.
fn named_share(pool: &Pool, procs: &[Proc]) -> f64 {
    let mut symbolizer = Symbolizer::new();
    let (mut named, mut all) = (0usize, 0usize);
    for (i, s) in pool.stacks.iter().enumerate() {
        let p = &procs[s.proc];
        let comm = String::from_utf8_lossy(&p.comm).trim_end_matches('\0').to_string();
        let stack = symbolizer.stack(p.pid, &comm, &s.kernel, &s.user);
        named += stack.frames.iter().filter(|f| !f.starts_with(UNKNOWN)).count();
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
                if rng.unit() < synth::busy_share(cpu, self.cpus) {
                    let s = self.pool.pick(rng);
                    let p = &self.procs[s.proc];
                    h.pid = p.pid;
                    h.tid = if p.kthread { p.pid } else { p.pid + rng.below(20) as u32 };
                    h.cgroup_id = p.cgroup_id;
                    h.comm = p.comm;
                    h.flags = if s.kernel.is_empty() { FLAG_USER_MODE } else { 0 };
                    h.kernel_frames = s.kernel.len() as u16;
                    h.user_frames = s.user.len() as u16;
                    push_header(&mut batch.bytes, &h);
                    for &addr in s.kernel.iter().chain(&s.user) {
                        batch.bytes.extend_from_slice(&addr.to_ne_bytes());
                    }
                    batch.busy += 1;
                    self.kernel_share.0 += u64::from(!s.kernel.is_empty());
                    self.kernel_share.1 += 1;
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

/// A process samples are attributed to, and the functions its samples can be in.
struct Proc {
    pid: u32,
    comm: [u8; COMM_LEN],
    cgroup_id: u64,
    kthread: bool,
    /// Functions of its main executable, and of every executable mapping: (start, size).
    main: Vec<(u64, u64)>,
    all: Vec<(u64, u64)>,
}

/// Long-lived children whose address spaces user addresses point into; killed on drop (and by
/// the kernel if this process dies first).
struct Helpers(Vec<Child>);

impl Drop for Helpers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` children: sleep, python3 and perl (when installed), so that the samples cover a stripped
/// C binary, a large exporting interpreter and libc, libm, ld.so and friends.
fn spawn_helpers(n: usize) -> Helpers {
    let python = Path::new("/usr/bin/python3").exists();
    let perl = Path::new("/usr/bin/perl").exists();
    let children = (0..n)
        .map(|i| {
            let mut cmd = match i % 4 {
                1 if python => {
                    let mut c = Command::new("/usr/bin/python3");
                    c.args(["-c", "import time; time.sleep(600)"]);
                    c
                }
                3 if perl => {
                    let mut c = Command::new("/usr/bin/perl");
                    c.args(["-e", "sleep 600"]);
                    c
                }
                _ => {
                    let mut c = Command::new("sleep");
                    c.arg("600");
                    c
                }
            };
            // SAFETY: prctl is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                })
            };
            cmd.stdin(Stdio::null()).spawn().expect("spawn a helper process")
        })
        .collect();
    Helpers(children)
}

/// The helpers once they have exec'd and loaded their libraries, plus a few kernel threads.
fn processes(helpers: &Helpers) -> Vec<Proc> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for c in &helpers.0 {
        while !read_maps(c.id()).iter().any(|m| m.path.contains("/libc.so")) {
            assert!(Instant::now() < deadline, "helper {} never mapped libc", c.id());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Interpreters load a few more modules after libc.
    std::thread::sleep(Duration::from_millis(300));
    let inspector = Inspector::new();
    let mut by_file: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    let mut procs: Vec<Proc> = helpers
        .0
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let pid = c.id();
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe").to_string_lossy().into_owned();
            let (mut main, mut all) = (Vec::new(), Vec::new());
            for m in read_maps(pid).iter().filter(|m| m.is_file()) {
                let syms = by_file.entry(m.path.to_string()).or_insert_with(|| elf_functions(&inspector, &m.path));
                let f = functions_in(m, syms);
                if *m.path == *exe {
                    main.extend_from_slice(&f);
                }
                all.extend(f);
            }
            assert!(!all.is_empty(), "helper {pid} has no executable file mapping");
            Proc { pid, comm: comm(pid), cgroup_id: 5000 + i as u64, kthread: false, main, all }
        })
        .collect();
    procs.extend(kthreads().into_iter().map(|pid| Proc {
        pid,
        comm: comm(pid),
        cgroup_id: 1,
        kthread: true,
        main: Vec::new(),
        all: Vec::new(),
    }));
    procs
}

fn read_maps(pid: u32) -> Vec<Mapping> {
    maps::parse(&std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default())
}

fn comm(pid: u32) -> [u8; COMM_LEN] {
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let mut c = [0u8; COMM_LEN];
    for (d, s) in c.iter_mut().zip(name.trim_end().bytes().take(COMM_LEN - 1)) {
        *d = s;
    }
    c
}

/// Function symbols of an ELF file as (file offset, size): what its dynsym (and symtab, when
/// not stripped) names.
fn elf_functions(inspector: &Inspector, path: &str) -> Vec<(u64, u64)> {
    let src = Source::Elf(Elf { debug_syms: false, ..Elf::new(PathBuf::from(path)) });
    let mut out = Vec::new();
    let _ = inspector.for_each(&src, |s| {
        if let (SymType::Function, Some(off), Some(size)) = (s.sym_type, s.file_offset, s.size)
            && size > 1
        {
            out.push((off, size as u64));
        }
        ControlFlow::Continue(())
    });
    out.sort_unstable();
    out.dedup_by_key(|f| f.0);
    out
}

/// The functions inside one mapping, at their addresses there. A stripped binary names none:
/// its text is cut into pseudo-functions instead (they show as `[unknown] (name)`, as such
/// binaries do in real profiles).
fn functions_in(m: &Mapping, syms: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let len = m.end - m.start;
    let f: Vec<(u64, u64)> = syms
        .iter()
        .filter(|&&(off, size)| off >= m.offset && off + size <= m.offset + len)
        .map(|&(off, size)| (m.start + off - m.offset, size))
        .collect();
    if !f.is_empty() {
        return f;
    }
    let step = (len / 64).max(2);
    (0..len / step).map(|k| (m.start + k * step, step.min(512))).collect()
}

/// A few kernel threads that stay (ksoftirqd, rcu): kernel-only samples, as softirq work gives.
fn kthreads() -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some((name, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") ")) else {
                return false;
            };
            let ppid = rest.split_whitespace().nth(1);
            ppid == Some("2") && (name.starts_with("ksoftirqd/") || name.starts_with("rcu_preempt"))
        })
        .collect();
    out.sort_unstable();
    out.truncate(3);
    out
}

/// Kernel text symbols from /proc/kallsyms: the named chains, and a vocabulary for the rest.
struct KernelText {
    chains: Vec<Vec<(u64, u64)>>,
    kthread_chain: Vec<(u64, u64)>,
    vocabulary: Vec<(u64, u64)>,
}

impl KernelText {
    fn read() -> Self {
        let text = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms");
        // Core kernel text only (modules come with a `[name]` column), addresses visible (root).
        let mut syms: Vec<(u64, &str)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (f.next().is_none() && addr != 0 && (kind == "T" || kind == "t")).then_some((addr, name))
            })
            .collect();
        assert!(syms.len() > 1000, "/proc/kallsyms shows no kernel text addresses (run as root)");
        syms.sort_unstable_by_key(|s| s.0);
        // A function's size: up to the next symbol.
        let sized: Vec<(u64, u64, &str)> = syms
            .windows(2)
            .filter(|w| w[1].0 - w[0].0 > 1)
            .map(|w| (w[0].0, (w[1].0 - w[0].0).min(4096), w[0].1))
            .collect();
        let by_name: HashMap<&str, (u64, u64)> = sized.iter().map(|&(a, s, n)| (n, (a, s))).collect();
        let named = |names: &[&str]| names.iter().filter_map(|n| by_name.get(n).copied()).collect::<Vec<_>>();
        let chains = KERNEL_CHAINS.iter().map(|c| named(c)).filter(|c| !c.is_empty()).collect();
        // Samples concentrate on a few thousand kernel functions, not on all of them.
        let mut rng = Rng::new(0xca11);
        let vocabulary =
            (0..4000).map(|_| sized[rng.below(sized.len() as u64) as usize]).map(|(a, s, _)| (a, s)).collect();
        Self { chains, kthread_chain: named(KTHREAD_CHAIN), vocabulary }
    }
}

/// One distinct raw stack: its process and its addresses, leaf first as the kernel gives them.
struct RawStack {
    proc: usize,
    kernel: Vec<u64>,
    user: Vec<u64>,
}

/// Distinct raw stacks with Zipf-like popularity (∝ 1/rank^1.1, as `synth` draws them).
struct Pool {
    stacks: Vec<RawStack>,
    cdf: Vec<f64>,
}

impl Pool {
    fn new(distinct: usize, procs: &[Proc], kernel: &KernelText, rng: &mut Rng) -> Self {
        let users: Vec<usize> = (0..procs.len()).filter(|&i| !procs[i].kthread).collect();
        let kthreads: Vec<usize> = (0..procs.len()).filter(|&i| procs[i].kthread).collect();
        let mut stacks = Vec::with_capacity(distinct);
        let mut seen = HashSet::new();
        while stacks.len() < distinct {
            let rank = stacks.len();
            let depth = 5 + rng.below(36) as usize;
            // One rank in three enters the kernel: about a third of busy samples have kernel
            // frames (measured and printed); one in twenty is a kernel thread's.
            let (proc, user_depth) = if rank % 20 == 19 && !kthreads.is_empty() {
                (kthreads[rng.below(kthreads.len() as u64) as usize], 0)
            } else if rank % 3 == 1 {
                (users[rng.below(users.len() as u64) as usize], (depth / 2).max(2))
            } else {
                (users[rng.below(users.len() as u64) as usize], depth)
            };
            let user = if user_depth > 0 { user_walk(&procs[proc], proc, user_depth, rng) } else { Vec::new() };
            let kernel = if depth > user_depth {
                let chain = if procs[proc].kthread {
                    &kernel.kthread_chain
                } else {
                    kernel.chains.get(rng.below(kernel.chains.len() as u64) as usize).map_or(&[][..], |c| c)
                };
                kernel_walk(chain, &kernel.vocabulary, depth - user_depth, rng)
            } else {
                Vec::new()
            };
            if seen.insert((procs[proc].pid, kernel.clone(), user.clone())) {
                stacks.push(RawStack { proc, kernel, user });
            }
        }
        let mut cdf = Vec::with_capacity(distinct);
        let mut acc = 0.0;
        for rank in 1..=distinct {
            acc += 1.0 / (rank as f64).powf(1.1);
            cdf.push(acc);
        }
        Self { stacks, cdf }
    }

    fn pick(&self, rng: &mut Rng) -> &RawStack {
        let x = rng.unit() * self.cdf.last().copied().unwrap_or(0.0);
        &self.stacks[self.cdf.partition_point(|&c| c < x).min(self.stacks.len() - 1)]
    }
}

/// An address inside `f` derived from `node`: the same call site for the same path, so stacks
/// that share a prefix share its addresses. Never the first byte, so that `addr - 1` (how
/// return addresses are looked up) stays inside the function.
fn call_site(f: (u64, u64), node: u64) -> u64 {
    f.0 + 1 + (node >> 17) % (f.1 - 1).max(1)
}

fn mix(node: u64, choice: u64) -> u64 {
    let mut n = (node ^ choice.wrapping_add(0x9e3779b97f4a7c15)).wrapping_mul(0xbf58476d1ce4e5b9);
    n ^= n >> 29;
    n
}

/// User frames, leaf first: two roots in the main executable, then a walk through every
/// executable mapping whose early steps have few choices (shared prefixes, diverse leaves).
/// `index` seeds the walk (not the pid), so that runs build the same stacks.
fn user_walk(p: &Proc, index: usize, depth: usize, rng: &mut Rng) -> Vec<u64> {
    let main = if p.main.is_empty() { &p.all } else { &p.main };
    let mut node = index as u64 + 1;
    let mut frames = Vec::with_capacity(depth);
    for level in 0..depth {
        let choice = if level < 2 || rng.unit() < 0.75 { 0 } else { 1 + rng.below(3) };
        node = mix(node, choice);
        let funcs = if level < 2 { main } else { &p.all };
        frames.push(call_site(funcs[(node % funcs.len() as u64) as usize], node));
    }
    frames.reverse();
    frames
}

/// Kernel frames, leaf first: a named entry chain, then a walk through the vocabulary.
fn kernel_walk(chain: &[(u64, u64)], vocabulary: &[(u64, u64)], depth: usize, rng: &mut Rng) -> Vec<u64> {
    let mut frames: Vec<u64> = chain.iter().take(depth.saturating_sub(1)).map(|&f| call_site(f, 0x10000)).collect();
    let mut node = frames.first().copied().unwrap_or(1);
    while frames.len() < depth {
        node = mix(node, if rng.unit() < 0.6 { 0 } else { 1 + rng.below(4) });
        frames.push(call_site(vocabulary[(node % vocabulary.len() as u64) as usize], node));
    }
    frames.reverse();
    frames
}

/// Cumulative NET_RX figures as the daemon reads them on every flush: steady traffic, short
/// waits (the detector evaluates them; it finds nothing).
struct NetRx {
    now: Vec<NetRxCpu>,
}

impl NetRx {
    fn new(cpus: u32) -> Self {
        Self {
            now: vec![NetRxCpu { histogram: vec![0; LATENCY_BUCKETS as usize], ..NetRxCpu::default() }; cpus as usize],
        }
    }

    fn next(&mut self) -> Vec<NetRxCpu> {
        for (cpu, n) in self.now.iter_mut().enumerate() {
            let runs = if cpu < 8 { 500 } else { 5 };
            n.raises += runs;
            n.entries += runs;
            n.polls += runs;
            n.histogram[14] += runs; // 16–32 µs
            n.latency_max_ns = 30_000;
            n.poll_gap_max_ns = 20_000;
        }
        self.now.clone()
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid clock id and pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
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
