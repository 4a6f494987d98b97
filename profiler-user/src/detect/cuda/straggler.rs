//! `gpu-straggler`: on a node whose GPUs one job holds (its processes share a workload: one pod,
//! or the systemd unit or scope a launcher such as `torchrun` runs its ranks in), one rank's GPU
//! stays busy while the other ranks' threads sit in CUDA synchronisation for at least
//! `gpu_sync_share` of `gpu_secs`: the others wait for the slow one (a data-parallel step ends
//! with a collective every rank must reach). Names the slow rank's process, its busiest thread
//! (most launches over the window) and the Python line it launches from most.
//!
//! Judged at each drain from the same per-thread windows as `gpu-sync-stall`, and the GPUs'
//! utilisation from the poller's seconds: nothing without NVML or the CUDA probes.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::json;

use super::{CudaDetect, held_gpu_util};
use crate::{
    detect::{Active, Kind, Severity, Thresholds, Top, percent},
    gpu_readings::State,
    store::format::NS_PER_SEC,
};

/// One process over the window: its threads' figures summed, as a rank of a job.
#[derive(Debug, Default)]
struct Rank {
    comm: Arc<str>,
    workload: Arc<str>,
    /// The largest share of the window any of its threads spent blocked in synchronisation.
    waited: f64,
    /// Its thread with the most launches: (tid, launches).
    busiest: (u32, u64),
    /// Launches per Python line over the window.
    lines: BTreeMap<Arc<str>, u64>,
    launches: u64,
}

/// Ranks a job needs before one of them can be a straggler.
const MIN_RANKS: usize = 2;

impl CudaDetect {
    /// The stragglers now: per job, the one rank whose GPU is busy while every other rank waited.
    pub(super) fn stragglers(&self, now_ns: u64, gpu: &State, t: &Thresholds) -> Vec<Active> {
        let window_ns = u64::from(t.gpu_secs) * NS_PER_SEC;
        let since = now_ns.saturating_sub(window_ns);
        let mut ranks: BTreeMap<u32, Rank> = BTreeMap::new();
        for (&tid, w) in &self.threads {
            let Some(first) = w.drains.front().map(|d| d.0.saturating_sub((d.1 * 1e9) as u64)) else { continue };
            // Judged over a covered window only, as a stall is.
            if now_ns.saturating_sub(first) + NS_PER_SEC / 2 < window_ns {
                continue;
            }
            let span = now_ns.saturating_sub(first).max(1) as f64;
            let blocked = w.drains.iter().map(|d| d.2.sync_ns).fold(0u64, u64::saturating_add) as f64;
            let last = &w.drains.back().expect("not empty").2;
            let r = ranks.entry(last.pid).or_insert_with(|| Rank {
                comm: last.comm.clone(),
                workload: last.workload.clone(),
                ..Default::default()
            });
            r.waited = r.waited.max((blocked / span).min(1.0));
            let launches: u64 = w.drains.iter().map(|d| d.2.launches).sum();
            r.launches += launches;
            if launches > r.busiest.1 || r.busiest.0 == 0 {
                r.busiest = (tid, launches);
            }
            for d in &w.drains {
                for (l, n) in &d.2.launch_lines {
                    *r.lines.entry(l.clone()).or_default() += n;
                }
            }
        }
        // Jobs: the ranks holding a GPU, by workload (an empty workload is no job's).
        let mut jobs: BTreeMap<Arc<str>, Vec<(u32, u32, f64)>> = BTreeMap::new();
        for (&pid, r) in ranks.iter().filter(|(_, r)| !r.workload.is_empty()) {
            if let Some((index, util)) = held_gpu_util(gpu, pid, since, now_ns) {
                jobs.entry(r.workload.clone()).or_default().push((pid, index, util));
            }
        }
        let mut out = Vec::new();
        for members in jobs.values().filter(|m| m.len() >= MIN_RANKS) {
            let waiting = |pid: u32| ranks[&pid].waited >= t.gpu_sync_share;
            let busy = |util: f64| util >= t.gpu_idle_below * 100.0;
            let slow: Vec<&(u32, u32, f64)> = members.iter().filter(|(p, _, u)| !waiting(*p) && busy(*u)).collect();
            let others = members.iter().filter(|(p, _, _)| !slow.iter().any(|s| s.0 == *p));
            // Exactly one rank ran while all the others waited: with two slow ones there is no
            // one to name, with none the job waits on something else.
            if let [&(pid, index, util)] = slow[..]
                && others.clone().all(|(p, _, _)| waiting(*p))
            {
                let waited: Vec<(u32, u32, f64)> = others.copied().collect();
                out.push(straggler(&ranks, pid, index, util, &waited, since, now_ns, gpu));
            }
        }
        out
    }
}

#[allow(clippy::too_many_arguments)]
fn straggler(
    ranks: &BTreeMap<u32, Rank>,
    pid: u32,
    index: u32,
    util: f64,
    waited: &[(u32, u32, f64)],
    since: u64,
    now: u64,
    gpu: &State,
) -> Active {
    let r = &ranks[&pid];
    let model = gpu.inventory.gpus.iter().find(|g| g.index == index).map_or("unknown model", |g| g.model.as_str());
    let who = Top { comm: r.comm.clone(), pid, samples: 0, workload: r.workload.clone() }.who("");
    let line = r.lines.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)));
    let line_text = line.map_or(String::new(), |(l, n)| {
        format!(", {} of its launches from {l}", percent(*n as f64 / r.launches.max(1) as f64))
    });
    let mean_wait = waited.iter().map(|(p, _, _)| ranks[p].waited).sum::<f64>() / waited.len().max(1) as f64;
    let secs = (now.saturating_sub(since) as f64 / 1e9).round();
    let gpus: Vec<String> = waited.iter().map(|(_, i, _)| i.to_string()).collect();
    Active {
        kind: Kind::GpuStraggler,
        cpu: None,
        subject: Some(format!("gpu{index}")),
        onset_ns: since,
        severity: Severity::Warning,
        summary: format!(
            "{who} is the job's slow rank: its GPU {index} ({model}) was {util:.0} % busy over {secs} s while the \
             other {} rank(s) (GPU {}) waited in synchronisation {} of the time; its busiest thread {}{line_text}; \
             look next: that rank's input or data shard, its GPU's clocks and neighbours, an uneven split of the work",
            waited.len(),
            gpus.join(", "),
            percent(mean_wait),
            r.busiest.0,
        ),
        evidence: json!({
            "gpu": index,
            "model": model,
            "pid": pid,
            "comm": &*r.comm,
            "busiest_tid": r.busiest.0,
            "gpu_utilization_percent": util,
            "python_line": line.map(|(l, _)| l.to_string()),
            "waiting_ranks": waited.iter().map(|(p, i, u)| json!({
                "pid": p, "gpu": i, "gpu_utilization_percent": u, "sync_share": ranks[p].waited,
            })).collect::<Vec<_>>(),
            "since_ns": since,
            "until_ns": now,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        detect::cuda::CudaThread,
        gpu_readings::{GpuSecond, State},
    };

    const JOB: &str = "system.slice/torchrun-train.scope";

    fn rank(pid: u32, sync_ns: u64, launches: u64, workload: &str) -> CudaThread {
        CudaThread {
            pid,
            tid: pid + 1,
            comm: "python3".into(),
            workload: workload.into(),
            launches,
            sync_ns,
            launch_lines: vec![("forward (model.py:88)".into(), launches)],
            ..Default::default()
        }
    }

    /// GPUs 0-3 held by 100, 200, 300, 400, at the given utilisation, over `secs` seconds.
    fn gpus(utils: &[f64], secs: u64) -> State {
        let mut s = State::default();
        for sec in 0..secs {
            let g = utils
                .iter()
                .enumerate()
                .map(|(i, u)| GpuSecond {
                    index: i as u32,
                    util: Some(*u),
                    polls: 10,
                    holders: vec![(i as u32 + 1) * 100],
                    ..Default::default()
                })
                .collect();
            s.seconds.push_back((sec * NS_PER_SEC, g));
        }
        s
    }

    /// 12 drains of a second each; each rank's thread blocked `sync[i]` of each second.
    fn judge(sync: &[f64], utils: &[f64], workloads: &[&str]) -> Vec<Active> {
        let mut d = CudaDetect::default();
        let state = gpus(utils, 14);
        let t = Thresholds::default();
        let mut out = Vec::new();
        for s in 1..=12u64 {
            let threads = sync
                .iter()
                .enumerate()
                .map(|(i, w)| rank((i as u32 + 1) * 100, (w * 1e9) as u64, 500, workloads[i]))
                .collect();
            d.evaluate(s * NS_PER_SEC, 1.0, threads, Some(&state), &t);
            out = d.stragglers(s * NS_PER_SEC, &state, &t);
        }
        out
    }

    #[test]
    fn one_busy_rank_while_the_others_wait_is_the_straggler() {
        let a = judge(&[0.8, 0.05, 0.85, 0.8], &[30.0, 99.0, 35.0, 30.0], &[JOB; 4]);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0].kind, Kind::GpuStraggler);
        let s = &a[0].summary;
        assert!(s.starts_with("python3 (pid 200) is the job's slow rank"), "{s}");
        assert!(
            s.contains(
                "slow rank: its GPU 1 (unknown model) was 99 % busy over 10 s while the other 3 rank(s) (GPU 0, 2, 3)"
            ),
            "{s}"
        );
        assert!(s.contains("busiest thread 201, 100 % of its launches from forward (model.py:88)"), "{s}");
        assert_eq!(a[0].evidence["waiting_ranks"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn no_straggler_when_all_run_two_are_slow_or_the_ranks_are_not_one_job() {
        assert!(judge(&[0.1, 0.05, 0.1, 0.1], &[95.0; 4], &[JOB; 4]).is_empty(), "every rank runs");
        assert!(judge(&[0.8, 0.05, 0.05, 0.8], &[30.0, 99.0, 99.0, 30.0], &[JOB; 4]).is_empty(), "two slow ranks");
        let apart = ["a.scope", "b.scope", "c.scope", "d.scope"];
        assert!(judge(&[0.8, 0.05, 0.85, 0.8], &[30.0, 99.0, 35.0, 30.0], &apart).is_empty(), "four jobs of one rank");
        assert!(
            judge(&[0.8, 0.05, 0.85, 0.8], &[30.0, 40.0, 35.0, 30.0], &[JOB; 4]).is_empty(),
            "the slow GPU idles too"
        );
    }
}
