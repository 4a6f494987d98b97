//! Once a drain: the kernel's off-CPU counts into the store, as rows weighing microseconds under
//! each wait's stack (its state as the root frame), and into the `io-stall` detector.

use std::{collections::BTreeSet, sync::Arc, time::Instant};

use super::{Recorder, WaitOn, fs_of, waits_in};
use crate::model::OffState;
use crate::{
    collect::Collector,
    detect::{Changes, cuda::python_line, gpu::waiting::on_queue, iostall::Wait},
    model::{Sample, Stack},
    pipeline::Pipeline,
};

impl Recorder {
    pub(super) fn drain(&mut self, collector: &mut Collector, pipeline: &mut Pipeline, now_ns: u64) -> Changes {
        let cached = &self.stacks;
        let (counts, stacks) = collector.offcpu_drain(|h| cached.contains(&h), pipeline.offset());
        let now = Instant::now();
        // The stacks of threads still off CPU first: their counts come after the kernel's copy
        // is gone.
        let counted: std::collections::HashSet<u64> = counts.iter().map(|d| d.key.hash).collect();
        for (h, r) in stacks.iter().filter(|(h, _)| !counted.contains(h)) {
            if let Some(s) = pipeline.cuda_sample(record_bytes(r), now_ns, now) {
                self.stacks.put(*h, s);
            }
        }
        let mut pids = BTreeSet::new();
        let mut waits = Vec::new();
        for d in counts {
            let (pid, tid) = (d.key.pid, d.key.tid);
            if pid == 0 || pid == self.own_pid {
                continue;
            }
            let Some(state) = OffState::of(d.key.state) else { continue };
            let sample = match (d.key.hash, self.stacks.get(&d.key.hash)) {
                (0, _) => None,
                (_, Some(s)) => Some(s.clone()),
                (h, None) => stacks.get(&h).and_then(|r| {
                    let s = pipeline.cuda_sample(record_bytes(r), now_ns, now)?;
                    self.stacks.put(h, s.clone());
                    Some(s)
                }),
            };
            // Kernel threads' waits are theirs to have (a worker waiting for work): left out.
            let user = match &sample {
                Some(s) if s.stack.user_len > 0 => true,
                _ => *self.user_process.entry(pid).or_insert_with(|| is_user_process(pid)),
            };
            if !user {
                continue;
            }
            let ts_ns = d.ts_ns.min(now_ns);
            let mut sample = match sample {
                Some(s) => s,
                None => {
                    self.status.without_stack += 1;
                    let why = if d.key.hash == 0 {
                        "[stack not walked: the thread's first long wait after short ones]"
                    } else {
                        "[stack lost: more distinct waiting stacks in a drain than the kernel's map holds]"
                    };
                    bare(pid, tid, ts_ns, why)
                }
            };
            sample.ts_ns = ts_ns;
            // A stack's record is shared by the threads of its process that waited in it.
            sample.tid = tid;
            sample.stack = self.marked(d.key.hash, state, &sample.stack);
            pids.insert(pid);
            self.status.recorded_us += d.count.ns / 1_000;
            self.status.recorded_waits += d.count.waits;
            waits.push(Wait {
                pid,
                tid,
                ts_ns,
                ns: d.count.ns,
                state,
                comm: sample.comm.clone(),
                waits_in: waits_in(&sample.stack),
                fs: fs_of(&sample.stack),
                line: python_line(sample.stack.user()),
                queue: on_queue(sample.stack.user()),
            });
            let us = d.count.ns / 1_000;
            if us > 0
                && let Some(w) = self.writer()
            {
                w.push_weighted(&sample, us);
            }
        }
        // A process that waits gets its unwind tables and Python frames now: it may run too
        // little for a CPU sample to ask for them.
        for pid in pids {
            pipeline.want_tables(pid, now);
        }
        if let Some(w) = self.writer.as_mut()
            && let Err(e) = w.flush(now_ns)
        {
            tracing::warn!(error = %e, "cannot write off-CPU counts; they are held and written later");
        }
        pipeline.check_offcpu(now_ns, waits)
    }

    /// `stack` under its state's root frame, kept per stack and state.
    fn marked(&mut self, hash: u64, state: OffState, stack: &Arc<Stack>) -> Arc<Stack> {
        let key = (hash, state as u32);
        if hash != 0
            && let Some(s) = self.marked.get(&key)
        {
            return s.clone();
        }
        let mut s = (**stack).clone();
        // Under the state, what the wait was on, where a walked stack says (a runnable thread
        // waited for a CPU, nothing else).
        let mut roots = vec![Arc::from(state.frame())];
        if hash != 0 && state != OffState::Runnable {
            roots.push(Arc::from(WaitOn::of(stack).frame()));
        }
        s.user_len += roots.len();
        if !s.locations.is_empty() {
            s.locations.splice(0..0, roots.iter().map(|_| Default::default()));
        }
        s.frames.splice(0..0, roots);
        let s = Arc::new(s);
        if hash != 0 {
            self.marked.put(key, s.clone());
        }
        s
    }
}

/// A record's bytes as the ring would carry them (the parser reads only what the header counts).
fn record_bytes(r: &profiler_common::Record) -> &[u8] {
    unsafe { std::slice::from_raw_parts((r as *const profiler_common::Record).cast::<u8>(), size_of_val(r)) }
}

/// Kernel threads have no executable.
fn is_user_process(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok()
}

fn bare(pid: u32, tid: u32, ts_ns: u64, why: &str) -> Sample {
    // The thread's own name, as a walked stack carries it (the process's is its main thread's).
    let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
    Sample {
        ts_ns,
        cpu: 0,
        pid,
        tid,
        cgroup_id: 0,
        comm: Arc::from(comm.trim_end()),
        stack: Arc::new(Stack::new(vec![Arc::from(why)], 1)),
        workload: Arc::from(""),
    }
}
