//! speedscope's file format (https://www.speedscope.app/file-format-schema.json): one sampled
//! profile per process, frames shared, samples in time order weighted by one period each.

use std::{collections::HashMap, io::Write};

use serde_json::json;

use super::ExportError;
use crate::query::SampleRef;

/// One process's samples: stacks (frame indexes, root first), weights, first and last time.
type Samples = (Vec<Vec<usize>>, Vec<u64>, u64, u64);

#[derive(Default)]
pub struct Builder {
    frames: Vec<String>,
    index: HashMap<String, usize>,
    profiles: HashMap<(u32, String), Samples>,
}

impl Builder {
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
            .map(|&(n, k)| if k { self.frame(&format!("{n} [k]")) } else { self.frame(&crate::text::unmarked(n)) })
            .collect();
        let p = self.profiles.entry((s.pid, s.comm.to_string())).or_insert((Vec::new(), Vec::new(), s.ts_ns, s.ts_ns));
        p.0.push(stack);
        p.1.push(s.count * period_ns);
        p.2 = p.2.min(s.ts_ns);
        p.3 = p.3.max(s.ts_ns);
    }

    pub fn finish(self, name: &str, mut out: impl Write) -> Result<(), ExportError> {
        let mut profiles: Vec<_> = self.profiles.into_iter().collect();
        profiles.sort_by(|a, b| b.1.1.len().cmp(&a.1.1.len()).then(a.0.cmp(&b.0)));
        let json = json!({
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "name": name,
            "exporter": "profiler",
            "shared": { "frames": self.frames.iter().map(|f| frame_json(f)).collect::<Vec<_>>() },
            "profiles": profiles.iter().map(|((pid, comm), (samples, weights, first, last))| json!({
                "type": "sampled",
                "name": format!("{comm} (pid {pid})"),
                "unit": "nanoseconds",
                "startValue": 0,
                "endValue": last - first + weights.last().copied().unwrap_or(0),
                "samples": samples,
                "weights": weights,
            })).collect::<Vec<_>>(),
        });
        serde_json::to_writer(&mut out, &json).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(())
    }
}

/// A frame; a Python one with its file and (first) line in their own fields. Kernel frames end
/// with their mark, so they never read as Python.
fn frame_json(name: &str) -> serde_json::Value {
    match crate::symbolize::python::source(name) {
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
