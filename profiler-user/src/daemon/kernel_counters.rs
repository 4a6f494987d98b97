//! The kernel counters stage: its own thread, once a second at the top of the wall-clock
//! second, reads the counters (`collect::counters`) and appends them to the store
//! (`store::counters`). Nothing here touches the sampling path; a slow read only delays the
//! next tick. Its own CPU per read is a track too (`profiler.counters_cpu`, µs).

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    collect::counters::{Point, Sampler, thread_cpu},
    store::counters::CountersWriter,
    timespec::now_ns,
};

pub use crate::collect::counters::{LatestMemcg, LatestReclaim, LatestRunq};

pub struct KernelCounters {
    pub data_dir: PathBuf,
    pub stop: Arc<AtomicBool>,
    pub memcg: LatestMemcg,
    pub runq: LatestRunq,
    pub reclaim: LatestReclaim,
}

impl KernelCounters {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("counters".into()).spawn(move || self.run())
    }

    fn run(self) {
        let mut writer = match CountersWriter::new(&self.data_dir) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "kernel counters will not be recorded");
                return;
            }
        };
        let mut sampler =
            Sampler::new("/", Some(self.memcg.clone())).with_runq(self.runq.clone()).with_reclaim(self.reclaim.clone());
        let mut failing = false;
        while !self.stop.load(Ordering::Acquire) {
            // To the next whole second, so ticks line up with the heatmap's columns.
            let into = now_ns() % 1_000_000_000;
            std::thread::sleep(Duration::from_nanos(1_000_000_000 - into));
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            let ts_ns = now_ns();
            let cpu_before = thread_cpu();
            let mut points = sampler.tick(Instant::now());
            let cost_us = (thread_cpu() - cpu_before).as_secs_f64() * 1e6;
            points.push(Point { name: "profiler.counters_cpu".into(), cpu: None, unit: "us".into(), value: cost_us });
            match writer.append(ts_ns, &points) {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("kernel counters are written again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot write kernel counters; retrying each second");
                }
                Err(_) => {}
            }
        }
    }
}
