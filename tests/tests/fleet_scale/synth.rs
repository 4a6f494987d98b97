//! Synthetic GPU training nodes for the fleet scale bench (issue 39, part 5): what a node's
//! daemon would have written to its store, so the real shipper ships it.
//!
//! A node runs one of a few training jobs. Its CPUs: the main Python thread (PyTorch forward and
//! backward through a model's layers, down into ATen, cuBLAS and the CUDA driver's ioctls), data
//! loader workers (decoding, collating, pinning memory, reading files), an autograd thread, and
//! the node's daemons (kubelet, containerd, node_exporter, dcgm-exporter) on the rest. Each role
//! draws from thousands of distinct stacks, deep Python + native frames with lines, a few hot
//! (Zipf). Nodes of a job share its stacks; every node has its own pods (its workload ids).
//! Some nodes carry a signature: a core saturated by kubelet in `mem_cgroup_nr_lru_pages` (the
//! zombie memcg problem), or GPUs starved by a data loader at its limit, with the findings the
//! detectors write and kernel log events. GPU tracks are written as the NVML poller writes them.

use std::{path::Path, sync::Arc};

use profiler::{
    collect::{counters::Point, kmsg::Event},
    detect::{self, Finding},
    identity::{Identity, Runtime, workloads},
    model::{Sample, Stack},
    store::{Meta, StoreWriter, counters::CountersWriter, create_and_lock, format::FORMAT_VERSION, segments_dir},
};

const SEC: u64 = 1_000_000_000;
pub const HZ: u64 = 99;
/// The NVML poller's default period (`gpu.poll_ms`).
const GPU_POLL_NS: u64 = 100_000_000;

/// SplitMix64: the same sequence on every machine.
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

    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[self.below(v.len() as u64) as usize]
    }
}

/// What a CPU of the node runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    Main,
    Loader,
    Autograd,
    System,
}

const PY_ROOT: &[&str] =
    &["_start", "__libc_start_main", "Py_BytesMain", "Py_RunMain", "pymain_run_python", "_PyRun_SimpleFileObject"];
const SITE: &str = "/opt/venv/lib/python3.11/site-packages";
const LAYERS: &[&str] = &["attention", "mlp", "rmsnorm", "rotary", "embedding", "lm_head", "moe_router", "experts"];
const ATEN: &[(&str, &[&str])] = &[
    (
        "matmul",
        &[
            "at::native::matmul",
            "at::cuda::blas::gemm<c10::BFloat16>",
            "cublasLtMatmul",
            "cublasLtMatmulAlgoGetHeuristic",
        ],
    ),
    (
        "linear",
        &[
            "at::native::linear",
            "at::native::addmm_out_cuda_impl",
            "at::cuda::blas::gemm_and_bias<c10::BFloat16>",
            "cublasLtMatmul",
        ],
    ),
    ("softmax", &["at::native::structured_softmax_cuda_out::impl", "at::native::host_softmax"]),
    ("layer_norm", &["at::native::layer_norm_cuda", "at::native::LayerNormKernelImpl"]),
    ("add", &["at::native::add_kernel", "at::native::gpu_kernel_with_scalars"]),
    ("mul", &["at::native::mul_kernel_cuda", "at::native::opmath_symmetric_gpu_kernel_with_scalars"]),
    ("copy_", &["at::native::copy_", "at::native::copy_kernel_cuda", "at::native::copy_device_to_device"]),
    ("silu", &["at::native::silu_kernel", "at::native::gpu_kernel"]),
    (
        "scaled_dot_product_attention",
        &["at::native::_fused_sdp_choice_cuda", "at::native::_flash_attention_forward", "pytorch_flash::run_mha_fwd"],
    ),
    (
        "all_reduce",
        &[
            "c10d::ProcessGroupNCCL::allreduce",
            "c10d::ProcessGroupNCCL::collective",
            "ncclAllReduce",
            "ncclEnqueueCheck",
        ],
    ),
];
const DRIVER: &[&[&str]] = &[
    &["cudaLaunchKernel", "cudart::cudaApiLaunchKernel", "libcuda.so.1+0x2a4f10", "libcuda.so.1+0x2a8c44"],
    &["cudaStreamSynchronize", "cudart::cudaApiStreamSynchronize", "libcuda.so.1+0x1c7e20", "sched_yield"],
    &["cudaMemcpyAsync", "cudart::cudaApiMemcpyAsync", "libcuda.so.1+0x3b01a8"],
    &["cudaEventQuery", "libcuda.so.1+0x1a1f00", "ioctl"],
];
const IOCTL_KERNEL: &[&str] =
    &["entry_SYSCALL_64_after_hwframe", "do_syscall_64", "__x64_sys_ioctl", "nvidia_unlocked_ioctl", "nvidia_ioctl"];
const IOCTL_LEAVES: &[&str] = &["os_acquire_spinlock", "_raw_spin_lock_irqsave", "nv_get_event", "rm_ioctl"];
const LOADER_PY: &[&str] = &[
    "_worker_loop (/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py:{})",
    "fetch (/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py:{})",
    "__getitem__ (/app/data/dataset.py:{})",
    "decode (/app/data/tokenize.py:{})",
    "collate (/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/collate.py:{})",
    "open (/opt/venv/lib/python3.11/site-packages/PIL/Image.py:{})",
    "read (/app/data/shards.py:{})",
];
const LOADER_NATIVE: &[&str] = &[
    "ImagingDecode",
    "jpeg_read_scanlines",
    "decompress_onepass",
    "tokenizers::tokenizer::TokenizerImpl::encode",
    "onig_search",
    "at::native::cat_out_cuda",
    "at::native::pin_memory",
    "cudaHostAlloc",
    "__memmove_avx_unaligned_erms",
    "PyArray_NewFromDescr",
    "zstd_decompress",
];
const LOADER_KERNEL: &[&[&str]] = &[
    &["entry_SYSCALL_64_after_hwframe", "do_syscall_64", "ksys_read", "vfs_read", "filemap_read", "copy_page_to_iter"],
    &["asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault", "handle_mm_fault", "clear_page_erms"],
    &["entry_SYSCALL_64_after_hwframe", "do_syscall_64", "__x64_sys_futex", "do_futex", "futex_wait"],
];
const DAEMONS: &[(&str, &[&str])] = &[
    (
        "kubelet",
        &[
            "runtime.goexit.abi0",
            "k8s.io/kubernetes/pkg/kubelet/stats.(*cadvisorStatsProvider).ListPodStats",
            "github.com/google/cadvisor/manager.(*containerData).housekeeping",
        ],
    ),
    (
        "containerd",
        &[
            "runtime.goexit.abi0",
            "github.com/containerd/containerd/v2/core/runtime/v2.(*shim).State",
            "google.golang.org/grpc.(*Server).handleStream",
        ],
    ),
    (
        "node_exporter",
        &[
            "runtime.goexit.abi0",
            "github.com/prometheus/node_exporter/collector.(*meminfoCollector).Update",
            "github.com/prometheus/procfs.FS.Meminfo",
        ],
    ),
    (
        "dcgm-exporter",
        &[
            "runtime.goexit.abi0",
            "github.com/NVIDIA/dcgm-exporter/pkg/dcgmexporter.(*DCGMCollector).GetMetrics",
            "dcgmGetLatestValuesForFields",
        ],
    ),
    ("nvidia-persiste", &["_start", "__libc_start_main", "main", "nvmlDeviceGetHandleByIndex"]),
];
const GO_WORDS: &[&str] = &[
    "runtime.mallocgc",
    "runtime.scanobject",
    "encoding/json.(*decodeState).object",
    "syscall.Syscall6",
    "os.(*File).Read",
    "bufio.(*Scanner).Scan",
    "strconv.ParseUint",
    "runtime.futex",
];
/// The zombie memcg signature: kubelet reading memory.stat of every cgroup, stuck in the kernel.
pub const HOT_FUNCTION: &str = "mem_cgroup_nr_lru_pages";
const MEMCG_KERNEL: &[&str] = &[
    "entry_SYSCALL_64_after_hwframe",
    "do_syscall_64",
    "ksys_read",
    "vfs_read",
    "seq_read_iter",
    "memcg_stat_show",
    "mem_cgroup_node_nr_lru_pages",
    HOT_FUNCTION,
];

fn py(frame: &str, line: u64) -> Arc<str> {
    Arc::from(frame.replace("{}", &line.to_string()).as_str())
}

/// Frames of one stack of `role`, drawn at random (`job` picks the model's files and lines).
fn draw(role: Role, job: u64, rng: &mut Rng) -> (Vec<Arc<str>>, usize) {
    let mut f: Vec<Arc<str>> = Vec::new();
    let mut kernel: Vec<&str> = Vec::new();
    match role {
        Role::Main | Role::Autograd => {
            if role == Role::Main {
                f.extend(PY_ROOT.iter().map(|s| Arc::from(*s)));
                f.push(py("<module> (/app/train.py:{})", 400 + job));
                f.push(py("main (/app/train.py:{})", 300 + rng.below(3)));
                f.push(py(&format!("fit ({SITE}/lightning/pytorch/trainer/trainer.py:{{}})"), 538));
                f.push(py(&format!("run ({SITE}/lightning/pytorch/loops/fit_loop.py:{{}})"), 200 + rng.below(4) * 7));
                f.push(py(
                    &format!("advance ({SITE}/lightning/pytorch/loops/training_epoch_loop.py:{{}})"),
                    230 + rng.below(3),
                ));
                f.push(py(&format!("training_step (/app/jobs/job{job}/module.py:{{}})"), 60 + rng.below(8)));
            } else {
                f.extend(
                    ["start_thread", "execute_native_thread_routine", "torch::autograd::Engine::thread_main"]
                        .map(Arc::from),
                );
                f.push(Arc::from("torch::autograd::Engine::evaluate_function"));
            }
            // Down the model: a module's forward calls its children's.
            let depth = 2 + rng.below(7);
            for d in 0..depth {
                let layer = LAYERS[rng.below(LAYERS.len() as u64) as usize];
                if role == Role::Main {
                    f.push(py(
                        &format!("_call_impl ({SITE}/torch/nn/modules/module.py:{{}})"),
                        1527 + rng.below(2) * 14,
                    ));
                    f.push(py(&format!("forward (/app/jobs/job{job}/{layer}.py:{{}})"), 20 + d * 13 + rng.below(40)));
                } else {
                    f.push(Arc::from(
                        format!("torch::autograd::generated::{layer}Backward{}::apply", rng.below(3)).as_str(),
                    ));
                }
            }
            let (op, aten) = ATEN[rng.below(ATEN.len() as u64) as usize];
            f.push(Arc::from(format!("torch::autograd::THPVariable_{op}").as_str()));
            f.push(Arc::from(format!("at::_ops::{op}::call").as_str()));
            let cut = 1 + rng.below(aten.len() as u64) as usize;
            f.extend(aten[..cut].iter().map(|s| Arc::from(*s)));
            if cut == aten.len() || rng.unit() < 0.5 {
                let drv = DRIVER[rng.below(DRIVER.len() as u64) as usize];
                f.extend(drv[..1 + rng.below(drv.len() as u64) as usize].iter().map(|s| Arc::from(*s)));
                if rng.unit() < 0.3 {
                    kernel.extend(IOCTL_KERNEL);
                    kernel.push(rng.pick(IOCTL_LEAVES));
                }
            }
        }
        Role::Loader => {
            f.extend(PY_ROOT.iter().map(|s| Arc::from(*s)));
            f.push(py("<module> (/app/train.py:{})", 400 + job));
            let n = 2 + rng.below(LOADER_PY.len() as u64 - 1) as usize;
            for (i, frame) in LOADER_PY[..n].iter().enumerate() {
                f.push(py(frame, 30 + i as u64 * 17 + rng.below(12)));
            }
            for _ in 0..1 + rng.below(4) {
                f.push(Arc::from(rng.pick(LOADER_NATIVE)));
            }
            if rng.unit() < 0.4 {
                let k = LOADER_KERNEL[rng.below(LOADER_KERNEL.len() as u64) as usize];
                kernel.extend(&k[..3 + rng.below(k.len() as u64 - 2) as usize]);
            }
        }
        Role::System => {
            let (_, root) = DAEMONS[rng.below(DAEMONS.len() as u64) as usize];
            f.extend(root.iter().map(|s| Arc::from(*s)));
            for _ in 0..2 + rng.below(10) {
                let w = rng.pick(GO_WORDS);
                f.push(Arc::from(format!("{w}.func{}", rng.below(6)).as_str()));
            }
            if rng.unit() < 0.3 {
                kernel.extend(&LOADER_KERNEL[0][..3 + rng.below(4) as usize]);
            }
        }
    }
    let user_len = f.len();
    f.extend(kernel.into_iter().map(Arc::from));
    (f, user_len)
}

/// Distinct stacks with Zipf-like popularity (∝ 1/rank^1.1): a few hot, a long tail.
pub struct Pool {
    stacks: Vec<Arc<Stack>>,
    cdf: Vec<f64>,
}

impl Pool {
    fn new(role: Role, job: u64, distinct: usize, rng: &mut Rng) -> Self {
        let mut seen = std::collections::HashSet::new();
        let mut stacks = Vec::with_capacity(distinct);
        let mut tries = 0;
        while stacks.len() < distinct && tries < distinct * 50 {
            tries += 1;
            let (frames, user_len) = draw(role, job, rng);
            if seen.insert((frames.clone(), user_len)) {
                stacks.push(Arc::new(Stack::new(frames, user_len)));
            }
        }
        let mut acc = 0.0;
        let cdf = (1..=stacks.len())
            .map(|rank| {
                acc += 1.0 / (rank as f64).powf(1.1);
                acc
            })
            .collect();
        Self { stacks, cdf }
    }

    fn pick(&self, rng: &mut Rng) -> &Arc<Stack> {
        let x = rng.unit() * self.cdf.last().copied().unwrap_or(0.0);
        &self.stacks[self.cdf.partition_point(|&c| c < x).min(self.stacks.len() - 1)]
    }

    pub fn len(&self) -> usize {
        self.stacks.len()
    }
}

/// A job's stacks by role; the daemons' are the same on every node.
pub struct Job {
    pub main: Pool,
    pub loader: Pool,
    pub autograd: Pool,
}

pub struct Fleet {
    pub jobs: Vec<Job>,
    pub system: Pool,
    pub memcg: Arc<Stack>,
}

impl Fleet {
    /// `jobs` training jobs of (main, loader, autograd) distinct stacks each, 600 daemon stacks.
    pub fn new(jobs: u64, per_job: [usize; 3]) -> Self {
        let mut rng = Rng::new(39);
        let jobs = (0..jobs)
            .map(|j| Job {
                main: Pool::new(Role::Main, j, per_job[0], &mut rng),
                loader: Pool::new(Role::Loader, j, per_job[1], &mut rng),
                autograd: Pool::new(Role::Autograd, j, per_job[2], &mut rng),
            })
            .collect();
        let system = Pool::new(Role::System, 0, 600, &mut rng);
        let mut memcg: Vec<Arc<str>> = DAEMONS[0].1.iter().map(|s| Arc::from(*s)).collect();
        memcg.extend(["os.(*File).Read", "syscall.Syscall6"].map(Arc::from));
        let user_len = memcg.len();
        memcg.extend(MEMCG_KERNEL.iter().map(|s| Arc::from(*s)));
        Self { jobs, system, memcg: Arc::new(Stack::new(memcg, user_len)) }
    }

    /// Distinct stacks in all.
    pub fn distinct(&self) -> usize {
        self.system.len() + self.jobs.iter().map(|j| j.main.len() + j.loader.len() + j.autograd.len()).sum::<usize>()
    }
}

/// What is special about a node.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Signature {
    Healthy,
    /// Its last CPU saturated by kubelet in [`HOT_FUNCTION`].
    SaturatedMemcg,
    /// Its data loaders at their limit, its GPUs mostly idle.
    GpuStarved,
}

/// One node to write.
pub struct NodePlan<'a> {
    pub name: String,
    pub index: u64,
    pub cpus: u32,
    pub gpus: u32,
    pub start_ns: u64,
    pub secs: u64,
    pub signature: Signature,
    pub fleet: &'a Fleet,
}

/// Which signature node `i` of `n` carries: 1 in 25 saturated by kubelet, 1 in 20 GPU-starved.
pub fn signature_of(i: u64) -> Signature {
    match i {
        i if i % 25 == 3 => Signature::SaturatedMemcg,
        i if i % 20 == 7 => Signature::GpuStarved,
        _ => Signature::Healthy,
    }
}

/// A CPU's role and how busy it is: the main thread on CPU 0, data loaders on up to 16 CPUs
/// (half of a small node), the autograd thread beside them, daemons on the rest; a saturated
/// node's last CPU is kubelet's whatever else it would have run (on a node of 4 CPUs or fewer,
/// a loader's or the autograd thread's: the signature was lost there).
pub fn cpu_role(cpu: u32, cpus: u32, sig: Signature) -> (Role, f64) {
    let loaders = (cpus / 2).min(16);
    match cpu {
        0 => (Role::Main, 0.97),
        c if c == cpus - 1 && sig == Signature::SaturatedMemcg => (Role::System, 0.99),
        c if c <= loaders => (Role::Loader, if sig == Signature::GpuStarved { 0.97 } else { 0.72 }),
        c if c == loaders + 1 => (Role::Autograd, if sig == Signature::GpuStarved { 0.1 } else { 0.5 }),
        _ => (Role::System, 0.1),
    }
}

/// What a node's store holds, for checking the answers.
#[derive(Default, Debug, Clone, Copy)]
pub struct Written {
    pub samples: u64,
    pub ticks: u64,
    pub counter_points: u64,
}

impl NodePlan<'_> {
    fn workload(&self, container: &str) -> Arc<str> {
        let job = self.index % self.fleet.jobs.len() as u64;
        let pod = format!("pretrain-job{job}-worker-{}", self.index);
        let id = Identity {
            container_id: Some(Arc::from(format!("{:064x}", self.index * 7 + container.len() as u64).as_str())),
            runtime: Runtime::Containerd,
            pod_uid: Some(Arc::from(format!("6f1c{:04x}-2b7e-4c1a-9d3e-{:012x}", job, self.index).as_str())),
            pod_namespace: Some(Arc::from("training")),
            pod_name: Some(Arc::from(pod.as_str())),
            container_name: Some(Arc::from(container)),
            unit: None,
        };
        Arc::from(workloads::encode(&id).as_str())
    }

    /// Writes the node's store into `data` (a new directory): samples, idle ticks, GPU tracks,
    /// findings and events, as its daemon would have.
    pub fn write(&self, data: &Path) -> Written {
        let _lock = create_and_lock(data).unwrap();
        let meta = Meta {
            format_version: FORMAT_VERSION,
            hostname: self.name.clone(),
            node: self.name.clone(),
            cpus: self.cpus,
            frequency_hz: HZ,
            started_ns: self.start_ns,
        };
        meta.write(data).unwrap();
        let job = &self.fleet.jobs[(self.index % self.fleet.jobs.len() as u64) as usize];
        let (trainer, host) = (self.workload("trainer"), Arc::<str>::from(""));
        let comms: [Arc<str>; 3] = [Arc::from("python3"), Arc::from("pt_data_worker"), Arc::from("pt_autograd_0")];
        let daemons: Vec<Arc<str>> = DAEMONS.iter().map(|(c, _)| Arc::from(*c)).collect();
        let roles: Vec<(Role, f64)> = (0..self.cpus).map(|c| cpu_role(c, self.cpus, self.signature)).collect();
        let mut rng = Rng::new(0x5eed ^ self.index.wrapping_mul(0x9e37_79b9));
        let mut w = StoreWriter::new(&segments_dir(data));
        let mut gpu = (self.gpus > 0)
            .then(|| (CountersWriter::stream(data, "gpu").unwrap(), CountersWriter::stream(data, "gpuslow").unwrap()));
        let mut out = Written::default();
        let base_pid = 4000 + (self.index as u32 % 50_000);
        // A daemon CPU runs one daemon for a while (~0.3 s), then another.
        let mut daemon_of: Vec<usize> = (0..self.cpus as usize).map(|c| c % DAEMONS.len()).collect();
        let period = SEC / HZ;
        for sec in 0..self.secs {
            let at = self.start_ns + sec * SEC;
            for k in 0..HZ {
                for cpu in 0..self.cpus {
                    // A tick lands a few us after its grid point (timer latency), as perf shows.
                    let ts_ns = at + k * period + u64::from(cpu) * 1_511 + rng.below(4_000);
                    let (role, busy) = roles[cpu as usize];
                    if rng.unit() >= busy {
                        w.push_idle(ts_ns, cpu);
                        out.ticks += 1;
                        continue;
                    }
                    let (pid, tid, comm, stack, workload) = match role {
                        Role::Main => (base_pid, base_pid, &comms[0], job.main.pick(&mut rng), &trainer),
                        Role::Loader => {
                            (base_pid + cpu, base_pid + cpu, &comms[1], job.loader.pick(&mut rng), &trainer)
                        }
                        Role::Autograd => (base_pid, base_pid + 1, &comms[2], job.autograd.pick(&mut rng), &trainer),
                        Role::System if busy > 0.9 => (900, 917, &daemons[0], &self.fleet.memcg, &host),
                        Role::System => {
                            if rng.below(30) == 0 {
                                daemon_of[cpu as usize] = rng.below(DAEMONS.len() as u64) as usize;
                            }
                            let d = daemon_of[cpu as usize];
                            (
                                900 + d as u32 * 100,
                                917 + d as u32 * 100 + cpu % 4,
                                &daemons[d],
                                self.fleet.system.pick(&mut rng),
                                &host,
                            )
                        }
                    };
                    w.push(&Sample {
                        ts_ns,
                        cpu,
                        pid,
                        tid,
                        cgroup_id: 5000 + u64::from(pid),
                        comm: comm.clone(),
                        stack: stack.clone(),
                        workload: workload.clone(),
                    });
                    out.samples += 1;
                    out.ticks += 1;
                }
            }
            w.flush(at + SEC).unwrap();
            if let Some((fast, slow)) = gpu.as_mut() {
                out.counter_points += self.gpu_second(at, fast, slow, &mut rng);
            }
        }
        self.notes(data);
        out
    }

    /// A second of GPU tracks: the five fast ones every poll, the slow ones once.
    fn gpu_second(&self, at: u64, fast: &mut CountersWriter, slow: &mut CountersWriter, rng: &mut Rng) -> u64 {
        let starved = self.signature == Signature::GpuStarved;
        let point = |g: u32, what: &str, unit: &str, value: f64| Point {
            name: format!("gpu.{g}.{what}"),
            cpu: None,
            unit: unit.into(),
            value,
        };
        let mut n = 0;
        for poll in 0..SEC / GPU_POLL_NS {
            let mut points = Vec::with_capacity(self.gpus as usize * 5);
            for g in 0..self.gpus {
                let util = if starved { 8.0 + rng.below(25) as f64 } else { 88.0 + rng.below(12) as f64 };
                points.push(point(g, "util", "%", util));
                points.push(point(g, "mem_util", "%", (util * 0.6).round()));
                points.push(point(g, "sm_clock_mhz", "MHz", 1980.0 - rng.below(3) as f64 * 15.0));
                points.push(point(g, "clock_events", "bits", 0.0));
                points.push(point(g, "power_w", "W", (120.0 + util * 5.5 + rng.below(20) as f64).round()));
            }
            n += points.len() as u64;
            fast.append(at + poll * GPU_POLL_NS + 3_000_000, &points).unwrap();
        }
        let mut points = Vec::new();
        for g in 0..self.gpus {
            points.push(point(g, "temp_c", "C", 55.0 + rng.below(10) as f64));
            points.push(point(g, "mem_used_mib", "MiB", 61_000.0 + rng.below(400) as f64));
            points.push(point(g, "mem_total_mib", "MiB", 81_559.0));
            points.push(point(g, "pcie_rx_mbps", "MB/s", 900.0 + rng.below(300) as f64));
            points.push(point(g, "pcie_tx_mbps", "MB/s", 300.0 + rng.below(100) as f64));
            points.push(point(g, "ecc_corrected", "errors", 0.0));
            points.push(point(g, "ecc_uncorrected", "errors", 0.0));
            points.push(point(g, "processes", "processes", 1.0));
        }
        n += points.len() as u64;
        slow.append(at + 3_000_000, &points).unwrap();
        n
    }

    /// The node's findings and events (a few): its signature's, and a NIC reset on some nodes.
    fn notes(&self, data: &Path) {
        let (start, end) = (self.start_ns, self.start_ns + self.secs * SEC);
        let finding = |id: &str, kind, cpu, start_ns, summary: String, evidence| Finding {
            id: format!("{}-{id}", self.name),
            kind,
            start_ns,
            end_ns: Some(end - 2 * SEC),
            cpu,
            severity: detect::Severity::Warning,
            summary,
            evidence,
        };
        let last = self.cpus - 1;
        let onset = start + (self.secs / 4).min(20) * SEC;
        let mut found = Vec::new();
        match self.signature {
            Signature::SaturatedMemcg => {
                let kubelet = serde_json::json!([{"comm": "kubelet", "pid": 900, "samples": 98}]);
                found.push(finding(
                    "sat",
                    detect::Kind::SaturatedCore,
                    Some(last),
                    onset,
                    format!("CPU {last} saturated (99 % busy, 97 % of it in the kernel) while the machine is 48 % busy; top: kubelet 98 %"),
                    serde_json::json!({"busy_share": 0.99, "kernel_share": 0.97, "machine_busy_share": 0.48, "mode": "kernel", "top_processes": kubelet}),
                ));
                found.push(finding(
                    "hot",
                    detect::Kind::HotKernelFunction,
                    Some(last),
                    onset,
                    format!("{HOT_FUNCTION} holds 97 % of CPU {last} over 10 s, in kubelet 97 %"),
                    serde_json::json!({"function": HOT_FUNCTION, "share": 0.97, "window_secs": 10, "watchlist": true, "processes": kubelet}),
                ));
            }
            Signature::GpuStarved => {
                for g in 0..self.gpus.min(2) {
                    found.push(finding(
                        &format!("gpu{g}"),
                        detect::Kind::GpuStarved,
                        Some(1),
                        onset,
                        format!("GPU {g} 14 % busy while its feeders keep 16 CPUs saturated: pt_data_worker"),
                        serde_json::json!({"gpu": g, "util": 14.0, "feeders": [{"comm": "pt_data_worker", "samples": 1500}]}),
                    ));
                }
            }
            Signature::Healthy => {}
        }
        for f in &found {
            detect::journal::record_finding(data, f).unwrap();
        }
        if self.index % 10 == 1 {
            let e = Event {
                id: format!("{}-ena", self.name),
                ts_ns: start + self.secs * SEC / 2,
                pattern: "ena-reset".into(),
                message: "ena 0000:00:06.0: Device reset completed successfully".into(),
            };
            detect::journal::record_event(data, &e).unwrap();
        }
    }
}
