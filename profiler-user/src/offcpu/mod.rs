//! Off-CPU time (issue 42): where threads wait, by stack, on the same time axis as the CPU
//! samples. The kernel side (`collect::offcpu`, `profiler-ebpf/src/offcpu.rs`) counts, per
//! thread, stack, state and second, the time threads stayed off their CPU for at least the
//! threshold; once a drain (every [`DRAIN_EVERY`]) the counts become weighted rows of their own
//! store (`SampleKind::OffCpu`, microseconds), each stack under a root frame naming the state
//! (`[off-cpu: io]`), which is what `--state` filters on. The drained counts also feed the
//! `io-stall` detector (`detect::iostall`).

mod drain;
pub mod status;
mod wait_on;

use std::{
    collections::HashMap,
    num::NonZeroUsize,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use lru::LruCache;

use crate::{
    collect::{Collector, offcpu::Settings},
    detect::Changes,
    model::{Sample, Stack},
    store::StoreWriter,
};

pub use profiler_common::offcpu::DEFAULT_THRESHOLD_NS;
pub use status::Status;
pub use wait_on::{StateFilter, WaitOn};

/// How often the counts are drained (as the CUDA counts: under a second, so that a tick a
/// millisecond early does not make it two).
pub const DRAIN_EVERY: Duration = Duration::from_millis(900);
/// How often the totals are logged, and written for `profiler status`.
const REPORT_EVERY: Duration = Duration::from_secs(60);
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// Stacks kept symbolized by hash (the kernel's map holds 256).
const STACKS_KEPT: usize = 1024;
/// Rows held while the store cannot be written (three drains of full maps).
const ROWS_HELD: usize = 3 * profiler_common::offcpu::OFFCPU_COUNTS_MAX as usize;

/// Kernel functions that only say a thread went to sleep, not on what: the wait is named by
/// the first frame under them (`pipe_read`, `futex_wait`, `ext4_file_read_iter`).
const SCHEDULING: [&str; 14] = [
    "__schedule",
    "schedule",
    "schedule_preempt_disabled",
    "schedule_timeout",
    "schedule_hrtimeout_range",
    "schedule_hrtimeout_range_clock",
    "io_schedule",
    "io_schedule_timeout",
    "__traceiter_sched_switch",
    "preempt_schedule",
    "preempt_schedule_common",
    "preempt_schedule_irq",
    "do_nanosleep",
    "bit_wait_io",
];

/// The kernel function a stack waits in: its leaf-most kernel frame that is not the scheduler.
pub fn waits_in(stack: &Stack) -> Option<Arc<str>> {
    stack
        .kernel()
        .iter()
        .rev()
        .map(|f| (f, f.trim_end_matches("_[k]")))
        .find(|(_, name)| {
            !SCHEDULING.contains(name)
                && !name.starts_with("__schedule")
                && !name.starts_with("bpf_")
                && !name.starts_with("wait_for_completion")
        })
        .map(|(f, _)| f.clone())
}

/// The file system or device a kernel stack waits on, when its functions' names say
/// (`ext4_file_read_iter` -> ext4), leaf first.
pub fn fs_of(stack: &Stack) -> Option<&'static str> {
    const NAMED: [(&str, &str); 13] = [
        ("fuse_", "fuse"),
        ("nfs", "nfs"),
        ("ext4_", "ext4"),
        ("xfs_", "xfs"),
        ("btrfs_", "btrfs"),
        ("ceph_", "ceph"),
        ("cifs_", "cifs"),
        ("ovl_", "overlayfs"),
        ("nvme_", "nvme"),
        ("blk_", "block device"),
        ("blkdev_", "block device"),
        ("scsi_", "scsi"),
        ("p9_", "9p"),
    ];
    stack.kernel().iter().rev().find_map(|f| NAMED.iter().find(|(p, _)| f.starts_with(p)).map(|(_, n)| *n))
}

pub struct Recorder {
    data_dir: PathBuf,
    settings: Settings,
    writer: Option<StoreWriter>,
    stacks: LruCache<u64, Sample>,
    marked: LruCache<(u64, u32), Arc<Stack>>,
    /// Whether a pid is a user process (kernel threads' waits are left out), by pid.
    user_process: HashMap<u32, bool>,
    last_drain: Instant,
    last_report: Instant,
    last_status: Instant,
    started: bool,
    own_pid: u32,
    pub status: Status,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.started {
            self.report();
            self.status.write(&self.data_dir);
        }
    }
}

impl Recorder {
    pub fn new(data_dir: &Path, settings: Settings) -> Self {
        let kept = NonZeroUsize::new(STACKS_KEPT).expect("non-zero");
        Self {
            data_dir: data_dir.to_path_buf(),
            settings,
            writer: None,
            stacks: LruCache::new(kept),
            marked: LruCache::new(kept),
            user_process: HashMap::new(),
            last_drain: Instant::now(),
            last_report: Instant::now(),
            last_status: Instant::now(),
            started: false,
            own_pid: std::process::id(),
            status: Status {
                threshold_ns: settings.threshold_ns,
                rate_limit: settings.rate_limit,
                sample_every: profiler_common::offcpu::SAMPLE_EVERY,
                walk_limit: settings.walk_limit,
                ..Default::default()
            },
        }
    }

    /// Once a stage tick: starts the program (first call), drains its counts once a
    /// [`DRAIN_EVERY`] into the store and the detector.
    pub fn tick(
        &mut self,
        collector: &mut Collector,
        pipeline: &mut crate::pipeline::Pipeline,
        now_ns: u64,
    ) -> Changes {
        if !self.started {
            self.started = true;
            if let Err(e) = collector.offcpu_start(self.settings, pipeline.offset()) {
                tracing::warn!(error = %e, "off-CPU time will not be recorded");
            }
            self.status.write(&self.data_dir);
        }
        if self.last_drain.elapsed() < DRAIN_EVERY {
            return Changes::default();
        }
        self.last_drain = Instant::now();
        if self.user_process.len() > 65_536 {
            self.user_process.clear();
        }
        let changes = self.drain(collector, pipeline, now_ns);
        if let Some(t) = collector.offcpu_totals() {
            self.status.kernel = t;
        }
        if self.last_status.elapsed() >= STATUS_EVERY {
            self.last_status = Instant::now();
            self.status.write(&self.data_dir);
        }
        if self.last_report.elapsed() >= REPORT_EVERY {
            self.last_report = Instant::now();
            self.report();
        }
        changes
    }

    /// One line with the totals so far (every [`REPORT_EVERY`], and when the daemon stops).
    fn report(&self) {
        let s = &self.status;
        tracing::info!(
            switches = s.kernel.switches,
            long_waits = s.kernel.long_waits,
            recorded_waits = s.recorded_waits,
            recorded_ms = s.recorded_us / 1_000,
            sampled_out = s.kernel.sampled_out,
            walked = s.kernel.walked,
            walks_skipped = s.kernel.walks_skipped,
            reused = s.kernel.reused,
            dropped = s.kernel.dropped,
            without_stack = s.without_stack,
            "off-CPU counts so far"
        );
    }

    fn writer(&mut self) -> Option<&mut StoreWriter> {
        if self.writer.is_none() {
            let dir = crate::model::SampleKind::OffCpu.store_dir(&self.data_dir);
            let segments = crate::store::segments_dir(&dir);
            if let Err(e) = crate::store::files::prepare_private_dir(&dir)
                .and_then(|()| crate::store::files::prepare_private_dir(&segments))
            {
                tracing::warn!(error = %e, "cannot create the off-CPU store");
                return None;
            }
            let limits = crate::store::writer::WriterLimits { max_pending: ROWS_HELD, ..Default::default() };
            self.writer = Some(StoreWriter::with_limits(&segments, limits));
        }
        self.writer.as_mut()
    }
}
