//! speedscope's file format (https://www.speedscope.app/file-format-schema.json): one evented
//! profile per thread, frames shared. Each sample holds its stack open for one period from its
//! time, on an axis that starts at the window's start, so the time-order view shows when a thread
//! ran and when it did not (a sampled profile has no time: speedscope lays its samples end to
//! end, packing an intermittent thread into the first fraction of the axis). A thread runs on
//! one CPU at a time, so its samples never overlap; a process's threads may, hence a profile per
//! thread.

use std::{collections::HashMap, io::Write};

use serde_json::json;

use super::ExportError;
use crate::query::{SampleRef, Window};

/// One thread's samples in the order given: (time, period, stack as frame indexes, root first).
type Thread = Vec<(u64, u64, Vec<usize>)>;

#[derive(Default)]
pub struct Builder {
    frames: Vec<String>,
    index: HashMap<String, usize>,
    /// (pid, tid, comm) → samples.
    threads: HashMap<(u32, u32, String), Thread>,
    window: Option<Window>,
}

impl Builder {
    /// The axis runs over `w` (else from the first sample to the last).
    pub fn for_window(mut self, w: Window) -> Self {
        self.window = Some(w);
        self
    }

    fn frame(&mut self, name: &str) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.frames.push(name.to_string());
        self.index.insert(name.to_string(), self.frames.len() - 1);
        self.frames.len() - 1
    }

    /// `period_ns`: the period of samples whose segment does not record their frequency.
    pub fn add(&mut self, s: &SampleRef<'_>, period_ns: u64) {
        let period_ns = s.frequency_hz.map_or(period_ns, |hz| 1_000_000_000 / hz.max(1));
        let stack: Vec<usize> = s
            .frames
            .iter()
            .map(|&(n, k)| if k { self.frame(&format!("{n} [k]")) } else { self.frame(&crate::untrusted::unmarked(n)) })
            .collect();
        let t = self.threads.entry((s.pid, s.tid, s.comm.to_string())).or_default();
        // A rolled-up row stands for `count` samples: they hold the stack that much longer.
        t.push((s.ts_ns, s.count.max(1) * period_ns, stack));
    }

    pub fn finish(self, name: &str, mut out: impl Write) -> Result<(), ExportError> {
        let all = || self.threads.values().flatten();
        let (from, to) = match self.window {
            Some(w) => (w.from_ns, w.to_ns),
            None => (all().map(|s| s.0).min().unwrap_or(0), all().map(|s| s.0 + s.1).max().unwrap_or(0)),
        };
        let mut threads: Vec<_> = self.threads.into_iter().collect();
        threads.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let profiles: Vec<_> = threads
            .into_iter()
            .map(|((pid, tid, comm), mut samples)| {
                samples.sort_by_key(|s| s.0);
                json!({
                    "type": "evented",
                    "name": if pid == tid { format!("{comm} (pid {pid})") } else { format!("{comm} (pid {pid}, tid {tid})") },
                    "unit": "nanoseconds",
                    "startValue": 0,
                    "endValue": to.saturating_sub(from),
                    "events": events(&samples, from, to),
                })
            })
            .collect();
        let json = json!({
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "name": name,
            "exporter": "profiler",
            "shared": { "frames": self.frames.iter().map(|f| frame_json(f)).collect::<Vec<_>>() },
            "profiles": profiles,
        });
        serde_json::to_writer(&mut out, &json).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(())
    }
}

/// Open and close events for samples sorted by time: frames a sample shares with the one before
/// it (when that one lasts until it) stay open; each close is at the end of its sample's period,
/// or the next sample's start if that is sooner. Times are ns from `from`, within `[from, to]`.
fn events(samples: &Thread, from: u64, to: u64) -> Vec<serde_json::Value> {
    let at = |t: u64| t.clamp(from, to) - from;
    let mut out = Vec::new();
    let mut open: &[usize] = &[];
    let mut open_until = 0u64;
    for (ts, period, stack) in samples {
        // What stays open: the common prefix with the previous stack, if there was no gap.
        let keep = if *ts <= open_until { open.iter().zip(stack).take_while(|(a, b)| a == b).count() } else { 0 };
        let close_at = open_until.min(*ts);
        for &f in open[keep..].iter().rev() {
            out.push(json!({"type": "C", "frame": f, "at": at(close_at)}));
        }
        for &f in &stack[keep..] {
            out.push(json!({"type": "O", "frame": f, "at": at(*ts)}));
        }
        open = stack;
        open_until = ts + period;
    }
    for &f in open.iter().rev() {
        out.push(json!({"type": "C", "frame": f, "at": at(open_until)}));
    }
    out
}

/// A frame; a Python one with its file and (first) line in their own fields. Kernel frames end
/// with their mark, so they never read as Python.
fn frame_json(name: &str) -> serde_json::Value {
    match crate::interpreter::python::source(name) {
        Some((function, file, line)) => json!({"name": function, "file": file, "line": line}),
        None => json!({"name": name}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// speedscope's format is JSON: names travel exactly, but a user frame cannot end like our
    /// kernel mark.
    #[test]
    fn hostile_names_round_trip_and_cannot_fake_the_kernel_mark() {
        let frames = [("evil\n;x 12\x1b", false), ("x [k]", false), ("read_zero", true)];
        let mut b = Builder::default();
        b.add(
            &SampleRef {
                ts_ns: 1,
                cpu: 0,
                pid: 1,
                tid: 1,
                comm: "a\tb;c 5",
                frames: &frames,
                locations: &[],
                count: 1,
                frequency_hz: None,
                workload: "",
            },
            10,
        );
        let mut out = Vec::new();
        b.finish("p", &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let names: Vec<&str> =
            v["shared"]["frames"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["evil\n;x 12\x1b", "x {k}", "read_zero [k]"]);
        assert_eq!(v["profiles"][0]["name"], "a\tb;c 5 (pid 1)");
    }

    fn sample<'a>(ts_ns: u64, tid: u32, frames: &'a [(&'a str, bool)]) -> SampleRef<'a> {
        SampleRef {
            ts_ns,
            cpu: 0,
            pid: 1,
            tid,
            comm: "app",
            frames,
            locations: &[],
            count: 1,
            frequency_hz: None,
            workload: "",
        }
    }

    /// Two bursts of a thread 50 periods apart read as two bursts on a window-long axis, with
    /// the frames they share kept open inside a burst.
    #[test]
    fn the_time_axis_is_the_window_and_gaps_stay_gaps() {
        let (a, b) = ([("main", false), ("work", false)], [("main", false), ("rest", false)]);
        let w = Window::new(1_000, 1_000 + 100 * 10).unwrap();
        let mut bld = Builder::default().for_window(w);
        for (ts, frames) in [(1_100, &a), (1_110, &b), (1_600, &a)] {
            bld.add(&sample(ts, 1, frames), 10);
        }
        bld.add(&sample(1_105, 2, &a), 10);
        let mut out = Vec::new();
        bld.finish("p", &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let p = &v["profiles"][0];
        assert_eq!((p["type"].as_str(), p["endValue"].as_u64()), (Some("evented"), Some(1_000)));
        let ev: Vec<(String, u64, u64)> = p["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["type"].as_str().unwrap().to_string(), e["frame"].as_u64().unwrap(), e["at"].as_u64().unwrap()))
            .collect();
        let e = |t: &str, f: u64, at: u64| (t.to_string(), f, at);
        // Frames: main 0, work 1, rest 2.
        assert_eq!(
            ev,
            [
                e("O", 0, 100),
                e("O", 1, 100),
                e("C", 1, 110),
                e("O", 2, 110),
                e("C", 2, 120),
                e("C", 0, 120),
                e("O", 0, 600),
                e("O", 1, 600),
                e("C", 1, 610),
                e("C", 0, 610)
            ]
        );
        assert_eq!(v["profiles"][1]["name"], "app (pid 1, tid 2)", "a profile per thread");
    }

    #[test]
    fn a_python_frame_has_its_file_and_line() {
        let frames = [("outer_loop (/srv/nested.py:31)", false), ("f (x.c:3)", true)];
        let mut b = Builder::default();
        let s = SampleRef {
            ts_ns: 1,
            cpu: 0,
            pid: 1,
            tid: 1,
            comm: "py",
            frames: &frames,
            locations: &[],
            count: 1,
            frequency_hz: None,
            workload: "",
        };
        b.add(&s, 10);
        let mut out = Vec::new();
        b.finish("p", &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let f = &v["shared"]["frames"];
        assert_eq!(f[0], json!({"name": "outer_loop", "file": "/srv/nested.py", "line": 31}));
        assert_eq!(f[1], json!({"name": "f (x.c:3) [k]"}));
    }
}
