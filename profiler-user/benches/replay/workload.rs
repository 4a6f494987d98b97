//! The replay bench's workload: real helper processes with their ELF functions, kernel text
//! from kallsyms, and a pool of raw stacks walked through them, so that the daemon's path
//! symbolizes what it would on a node.

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
    symbolize::maps::{self, Mapping},
};
use profiler_common::{COMM_LEN, LATENCY_BUCKETS};

use super::{KERNEL_CHAINS, KTHREAD_CHAIN, synth::Rng};

/// A process samples are attributed to, and the functions its samples can be in.
pub struct Proc {
    pub pid: u32,
    pub comm: [u8; COMM_LEN],
    pub cgroup_id: u64,
    pub kthread: bool,
    /// Functions of its main executable, and of every executable mapping: (start, size).
    pub main: Vec<(u64, u64)>,
    pub all: Vec<(u64, u64)>,
}

/// Long-lived children whose address spaces user addresses point into; killed on drop (and by
/// the kernel if this process dies first).
pub struct Helpers(Vec<Child>);

impl From<Vec<Child>> for Helpers {
    fn from(children: Vec<Child>) -> Self {
        Self(children)
    }
}

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
pub fn spawn_helpers(n: usize) -> Helpers {
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
pub fn processes(helpers: &Helpers) -> Vec<Proc> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for c in &helpers.0 {
        // glibc before 2.34 (bullseye's) maps `libc-2.31.so`.
        while !read_maps(c.id()).iter().any(|m| m.path.contains("/libc.so") || m.path.contains("/libc-2.")) {
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

pub fn read_maps(pid: u32) -> Vec<Mapping> {
    maps::parse(&std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default())
}

pub fn comm(pid: u32) -> [u8; COMM_LEN] {
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let mut c = [0u8; COMM_LEN];
    for (d, s) in c.iter_mut().zip(name.trim_end().bytes().take(COMM_LEN - 1)) {
        *d = s;
    }
    c
}

/// Function symbols of an ELF file as (file offset, size): what its dynsym (and symtab, when
/// not stripped) names.
pub fn elf_functions(inspector: &Inspector, path: &str) -> Vec<(u64, u64)> {
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
/// its text is cut into pseudo-functions instead (they show as `name+0xVADDR`, as such
/// binaries do in real profiles).
pub fn functions_in(m: &Mapping, syms: &[(u64, u64)]) -> Vec<(u64, u64)> {
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
pub fn kthreads() -> Vec<u32> {
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
pub struct KernelText {
    pub chains: Vec<Vec<(u64, u64)>>,
    pub kthread_chain: Vec<(u64, u64)>,
    pub vocabulary: Vec<(u64, u64)>,
}

impl KernelText {
    pub fn read() -> Self {
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

/// One distinct raw stack: its process and its addresses, leaf first as the kernel gives them,
/// and its Python frame words as the sampler sends them (`profiler_common::python`; empty for
/// native code).
pub struct RawStack {
    pub proc: usize,
    pub kernel: Vec<u64>,
    pub user: Vec<u64>,
    pub python: Vec<u64>,
}

/// Distinct raw stacks with Zipf-like popularity (∝ 1/rank^1.1, as `synth` draws them).
pub struct Pool {
    pub stacks: Vec<RawStack>,
    pub cdf: Vec<f64>,
}

impl Pool {
    pub fn new(distinct: usize, procs: &[Proc], kernel: &KernelText, rng: &mut Rng) -> Self {
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
                stacks.push(RawStack { proc, kernel, user, python: Vec::new() });
            }
        }
        Self::zipf(stacks)
    }

    /// The pool of `stacks`, the first the most popular.
    pub fn zipf(stacks: Vec<RawStack>) -> Self {
        let mut cdf = Vec::with_capacity(stacks.len());
        let mut acc = 0.0;
        for rank in 1..=stacks.len() {
            acc += 1.0 / (rank as f64).powf(1.1);
            cdf.push(acc);
        }
        Self { stacks, cdf }
    }

    pub fn pick(&self, rng: &mut Rng) -> &RawStack {
        let x = rng.unit() * self.cdf.last().copied().unwrap_or(0.0);
        &self.stacks[self.cdf.partition_point(|&c| c < x).min(self.stacks.len() - 1)]
    }
}

/// Return addresses an ordinary function's frames can have: a return address is the
/// instruction after a call, and a function makes a bounded number of calls, so a real node
/// sees a handful of return addresses per function (drawing them anywhere in the function
/// made thousands per function and missed the daemon's caches far more than a node does).
pub const CALL_SITES: u64 = 8;
/// An interpreter's evaluation loop calls out from a few dozen places (calls, attribute and
/// item lookups, arithmetic): its return addresses.
pub const EVAL_CALL_SITES: u64 = 32;

/// A return address inside `f`: one of its `sites` call sites, the same for the same `node`,
/// so stacks that share a prefix share its addresses. The sites are fixed per function and
/// the same in every run: derived from its size and its address's page offset (which
/// address-space randomization keeps). Never the first byte, so that `addr - 1` (how return
/// addresses are looked up) stays inside the function.
pub fn call_site(f: (u64, u64), node: u64, sites: u64) -> u64 {
    let function = ((f.1 << 12) | (f.0 & 0xfff)) ^ 0xca11_5173;
    anywhere(f, mix(function, (node >> 17) % sites.max(1)))
}

/// An address anywhere inside `f` derived from `node`: a leaf frame's (the sampled
/// instruction, not a return address). Never the first byte, as in `call_site`.
pub fn anywhere(f: (u64, u64), node: u64) -> u64 {
    f.0 + 1 + (node >> 17) % (f.1 - 1).max(1)
}

pub fn mix(node: u64, choice: u64) -> u64 {
    let mut n = (node ^ choice.wrapping_add(0x9e3779b97f4a7c15)).wrapping_mul(0xbf58476d1ce4e5b9);
    n ^= n >> 29;
    n
}

/// User frames, leaf first: two roots in the main executable, then a walk through every
/// executable mapping whose early steps have few choices (shared prefixes, diverse leaves).
/// `index` seeds the walk (not the pid), so that runs build the same stacks.
pub fn user_walk(p: &Proc, index: usize, depth: usize, rng: &mut Rng) -> Vec<u64> {
    let main = if p.main.is_empty() { &p.all } else { &p.main };
    let mut node = index as u64 + 1;
    let mut frames = Vec::with_capacity(depth);
    for level in 0..depth {
        let choice = if level < 2 || rng.unit() < 0.75 { 0 } else { 1 + rng.below(3) };
        node = mix(node, choice);
        let funcs = if level < 2 { main } else { &p.all };
        let f = funcs[(node % funcs.len() as u64) as usize];
        frames.push(if level + 1 == depth { anywhere(f, node) } else { call_site(f, node, CALL_SITES) });
    }
    frames.reverse();
    frames
}

/// Kernel frames, leaf first: a named entry chain, then a walk through the vocabulary.
pub fn kernel_walk(chain: &[(u64, u64)], vocabulary: &[(u64, u64)], depth: usize, rng: &mut Rng) -> Vec<u64> {
    let mut frames: Vec<u64> =
        chain.iter().take(depth.saturating_sub(1)).map(|&f| call_site(f, 0x10000, CALL_SITES)).collect();
    let mut node = frames.first().copied().unwrap_or(1);
    while frames.len() < depth {
        node = mix(node, if rng.unit() < 0.6 { 0 } else { 1 + rng.below(4) });
        let f = vocabulary[(node % vocabulary.len() as u64) as usize];
        frames.push(if frames.len() + 1 == depth { anywhere(f, node) } else { call_site(f, node, CALL_SITES) });
    }
    frames.reverse();
    frames
}

/// Cumulative NET_RX figures as the daemon reads them on every flush: steady traffic, short
/// waits (the detector evaluates them; it finds nothing).
pub struct NetRx {
    pub now: Vec<NetRxCpu>,
}

impl NetRx {
    pub fn new(cpus: u32) -> Self {
        Self {
            now: vec![NetRxCpu { histogram: vec![0; LATENCY_BUCKETS as usize], ..NetRxCpu::default() }; cpus as usize],
        }
    }

    pub fn next(&mut self) -> Vec<NetRxCpu> {
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
