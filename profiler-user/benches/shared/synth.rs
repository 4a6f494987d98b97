//! Synthetic samples that look like a GPU node's, for benchmarks and soak tests: N CPUs at a
//! fixed frequency, a few busy and most nearly idle, and a Zipf-like mix of distinct stacks of
//! depth 10–60 built from real-looking kernel and user frame names that share prefixes the way
//! real call trees do. Kept out of the library: the benches and the integration tests include this
//! file with `#[path]`.

use std::sync::Arc;

use profiler::model::{Sample, Stack};

/// SplitMix64: small, fast, and the same sequence on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

const KERNEL_ROOTS: &[&[&str]] = &[
    &["entry_SYSCALL_64_after_hwframe", "do_syscall_64", "x64_sys_call"],
    &["asm_sysvec_apic_timer_interrupt", "sysvec_apic_timer_interrupt", "__sysvec_apic_timer_interrupt"],
    &["asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault", "handle_mm_fault"],
    &["ret_from_fork_asm", "ret_from_fork", "kthread", "worker_thread", "process_one_work"],
    &["asm_common_interrupt", "common_interrupt", "__common_interrupt", "handle_edge_irq"],
];

const KERNEL_LEAVES: &[&str] = &[
    "__x64_sys_read",
    "ksys_read",
    "vfs_read",
    "seq_read_iter",
    "memcg_stat_show",
    "mem_cgroup_node_nr_lru_pages",
    "mem_cgroup_nr_lru_pages",
    "__x64_sys_futex",
    "do_futex",
    "futex_wait",
    "schedule",
    "__schedule",
    "finish_task_switch.isra.0",
    "__x64_sys_epoll_wait",
    "do_epoll_wait",
    "ep_poll",
    "__x64_sys_ioctl",
    "nvidia_ioctl",
    "nvidia_unlocked_ioctl",
    "os_acquire_spinlock",
    "_raw_spin_lock_irqsave",
    "net_rx_action",
    "__napi_poll",
    "ena_io_poll",
    "ena_clean_rx_irq",
    "napi_gro_receive",
    "netif_receive_skb_list_internal",
    "tcp_v4_rcv",
    "tcp_rcv_established",
    "copy_user_enhanced_fast_string",
    "__memcg_slab_free_hook",
    "clear_page_erms",
    "__alloc_pages",
    "get_page_from_freelist",
    "rmqueue",
    "filemap_read",
    "filemap_get_pages",
    "cgroup_rstat_flush_locked",
    "mem_cgroup_css_rstat_flush",
    "tick_sched_timer",
    "update_process_times",
    "scheduler_tick",
    "task_tick_fair",
    "irq_exit_rcu",
    "__do_softirq",
];

const USER_ROOTS: &[(&str, &[&str])] = &[
    ("python3", &["_start", "__libc_start_main", "Py_BytesMain", "Py_RunMain", "_PyEval_EvalFrameDefault"]),
    ("kubelet", &["runtime.goexit.abi0", "k8s.io/kubernetes/pkg/kubelet/stats.(*cadvisorStatsProvider).ListPodStats"]),
    ("containerd", &["runtime.goexit.abi0", "github.com/containerd/containerd/v2/core/runtime/v2.(*shim).State"]),
    ("nvidia-smi", &["_start", "__libc_start_main", "main", "nvmlDeviceGetUtilizationRates"]),
    ("pt_main_thread", &["start_thread", "execute_native_thread_routine", "torch::autograd::Engine::thread_main"]),
    (
        "node_exporter",
        &["runtime.goexit.abi0", "github.com/prometheus/node_exporter/collector.(*meminfoCollector).Update"],
    ),
];

const USER_WORDS: &[&str] = &[
    "at::native::",
    "at::Tensor::",
    "c10::impl::",
    "torch::autograd::",
    "cudaStreamSynchronize",
    "cuLaunchKernel",
    "ncclAllReduce",
    "PyObject_Call",
    "_PyObject_MakeTpCall",
    "method_vectorcall_FASTCALL",
    "runtime.mallocgc",
    "runtime.scanobject",
    "encoding/json.(*decodeState).",
    "syscall.Syscall",
    "std::vector<float>::",
    "memcpy",
    "__memmove_avx_unaligned_erms",
    "pthread_cond_wait",
    "__GI___poll",
    "read",
];

/// A pool of distinct stacks with Zipf-like popularity.
pub struct StackPool {
    stacks: Vec<(Arc<Stack>, usize)>,
    cdf: Vec<f64>,
    comms: Vec<Arc<str>>,
}

impl StackPool {
    /// `distinct` stacks of depth 10–60, popularity ∝ 1/rank^1.1.
    pub fn new(distinct: usize, rng: &mut Rng) -> Self {
        let comms: Vec<Arc<str>> = USER_ROOTS.iter().map(|(c, _)| Arc::from(*c)).collect();
        // A shared vocabulary, so stacks share frames (and prefixes) as real ones do.
        let vocab: Vec<Arc<str>> = (0..distinct.max(64) / 4 + 200)
            .map(|i| {
                let w = USER_WORDS[i % USER_WORDS.len()];
                Arc::from(format!("{w}fn_{:x}", i.wrapping_mul(0x9e37) & 0xfffff).as_str())
            })
            .collect();
        let kernel_leaves: Vec<Arc<str>> = KERNEL_LEAVES.iter().map(|k| Arc::from(*k)).collect();
        let mut stacks = Vec::with_capacity(distinct);
        let mut seen = std::collections::HashSet::new();
        while stacks.len() < distinct {
            let proc_i = rng.below(USER_ROOTS.len() as u64) as usize;
            let depth = 10 + rng.below(51) as usize;
            let kernel_depth = if rng.unit() < 0.35 { (3 + rng.below(15) as usize).min(depth - 5) } else { 0 };
            let user_depth = depth - kernel_depth;
            let mut frames: Vec<Arc<str>> = USER_ROOTS[proc_i].1.iter().map(|f| Arc::from(*f)).collect();
            // A walk whose early steps have few choices: shared prefixes (a framework's main
            // loop), diverse leaves, as in real call trees.
            let mut node = proc_i as u64 + 1;
            while frames.len() < user_depth {
                // Most calls go where they went last time; one in four branches off.
                let choice = if rng.unit() < 0.75 { 0 } else { 1 + rng.below(3) };
                node = (node ^ choice.wrapping_add(0x9e3779b97f4a7c15)).wrapping_mul(0xbf58476d1ce4e5b9);
                node ^= node >> 29;
                frames.push(vocab[(node % vocab.len() as u64) as usize].clone());
            }
            frames.truncate(user_depth);
            if kernel_depth > 0 {
                let root = KERNEL_ROOTS[rng.below(KERNEL_ROOTS.len() as u64) as usize];
                frames.extend(root.iter().take(kernel_depth).map(|f| Arc::from(*f)));
                while frames.len() < depth {
                    frames.push(kernel_leaves[rng.below(kernel_leaves.len() as u64) as usize].clone());
                }
            }
            let key = {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (proc_i, user_depth, &frames).hash(&mut h);
                h.finish()
            };
            // Distinct by content (a hash suffices to pick test data; the store never keys by one).
            if seen.insert(key) {
                stacks.push((Arc::new(Stack::new(frames, user_depth)), proc_i));
            }
        }
        let mut cdf = Vec::with_capacity(distinct);
        let mut acc = 0.0;
        for rank in 1..=distinct {
            acc += 1.0 / (rank as f64).powf(1.1);
            cdf.push(acc);
        }
        Self { stacks, cdf, comms }
    }

    /// A stack drawn by popularity, with the index of its process.
    pub fn pick(&self, rng: &mut Rng) -> (&Arc<Stack>, usize) {
        let x = rng.unit() * self.cdf.last().copied().unwrap_or(0.0);
        let i = self.cdf.partition_point(|&c| c < x).min(self.stacks.len() - 1);
        let (s, p) = &self.stacks[i];
        (s, *p)
    }
}

/// One CPU's share of busy time (shared with the replay benchmark, so both model one node).
pub fn busy_share(cpu: u32, cpus: u32) -> f64 {
    // A GPU node: a few feeder threads pin their cores, some are half busy, most idle.
    match cpu {
        c if c < cpus.div_ceil(16) => 0.95,
        c if c < cpus.div_ceil(5) => 0.4,
        _ => 0.03,
    }
}

/// What one tick of the machine produced.
pub enum Tick {
    Busy(Sample),
    Idle { ts_ns: u64, cpu: u32 },
}

/// Generates the samples of `cpus` CPUs at `hz` for one second starting at `start_ns`.
pub fn second(pool: &StackPool, rng: &mut Rng, start_ns: u64, cpus: u32, hz: u64, mut out: impl FnMut(Tick)) {
    let period = 1_000_000_000 / hz.max(1);
    for k in 0..hz {
        for cpu in 0..cpus {
            let ts_ns = start_ns + k * period + rng.below(period / 20) + u64::from(cpu) * 997;
            if rng.unit() < busy_share(cpu, cpus) {
                let (stack, p) = pool.pick(rng);
                let pid = 1000 + p as u32 * 37;
                out(Tick::Busy(Sample {
                    ts_ns,
                    cpu,
                    pid,
                    tid: pid + (cpu % 8),
                    cgroup_id: 5000 + p as u64,
                    comm: pool.comms[p].clone(),
                    stack: stack.clone(),
                    workload: Default::default(),
                }));
            } else {
                out(Tick::Idle { ts_ns, cpu });
            }
        }
    }
}

// Run by the integration tests that include this file; the benches (no test harness) compile
// the module but never run it.
#[cfg(test)]
#[allow(unused_imports)]
mod tests {
    use super::*;

    #[test]
    fn pool_is_distinct_deep_and_skewed() {
        let mut rng = Rng::new(7);
        let pool = StackPool::new(2000, &mut rng);
        assert_eq!(pool.stacks.len(), 2000);
        assert!(pool.stacks.iter().all(|(s, _)| (10..=60).contains(&s.frames.len())));
        let mut hits = vec![0u32; 2000];
        for _ in 0..100_000 {
            let (s, _) = pool.pick(&mut rng);
            hits[pool.stacks.iter().position(|(t, _)| Arc::ptr_eq(s, t)).unwrap()] += 1;
        }
        assert!(hits[0] > 50 * hits[1999].max(1), "rank 1 should dominate rank 2000: {} vs {}", hits[0], hits[1999]);
    }

    #[test]
    fn a_second_has_every_tick_of_every_cpu() {
        let mut rng = Rng::new(1);
        let pool = StackPool::new(100, &mut rng);
        let (mut busy, mut idle) = (0, 0);
        second(&pool, &mut rng, 0, 16, 99, |t| match t {
            Tick::Busy(s) => {
                assert!(s.ts_ns < 1_000_000_000);
                busy += 1
            }
            Tick::Idle { .. } => idle += 1,
        });
        assert_eq!(busy + idle, 16 * 99);
        assert!(idle > busy, "a GPU node is mostly idle");
    }
}
