//! pprof: the gzipped `perftools.profiles.Profile` protobuf that `go tool pprof` reads. One
//! pprof sample per profiler sample, with labels `cpu`, `pid`, `tid`, `comm`, `context`
//! (`task`, or the softirq it ran in: `softirq:NET_RX`) and `timestamp_ns`, values `samples/count` and `cpu/nanoseconds` (one period each).
//!
//! A user frame's location has the mapping of the file it was mapped from and, as its address,
//! its function's ELF virtual address there (the store keeps functions, not instructions, and
//! no load address: the mapping's range is 0). Mappings are numbered in the order their files
//! are first met from the root of a stack, so mapping 1, which pprof takes for the main binary,
//! is the outermost file of the first sample: its executable. They say they hold functions, so
//! pprof does not try to symbolize the addresses again.
//!
//! The messages below follow profile.proto's field numbers (github.com/google/pprof,
//! proto/profile.proto); only the fields written are declared.

use std::{collections::HashMap, io::Write};

use super::ExportError;
use crate::{exec_context::Context, query::SampleRef};

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// pprof's decoder drops a numeric label whose value is 0 unless it has a unit (`cpu=0`,
    /// pid 0); an unknown unit still matches a plain `-tagfocus=cpu=0`.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Builds a profile sample by sample.
pub struct Builder {
    pub(crate) profile: Profile,
    strings: super::interner::Interner,
    /// (name, kernel, file, address) → location id (one function per location).
    locations: HashMap<(String, bool, String, u64), u64>,
    /// File → mapping id.
    mappings: HashMap<String, u64>,
    period_ns: i64,
    /// Stored workload → its labels.
    workloads: HashMap<String, Vec<Label>>,
    first_ns: Option<u64>,
    last_ns: u64,
    /// The window asked for: the profile's time and duration.
    window: Option<crate::query::Window>,
    /// What the samples count; a CUDA kind has one value type of its own.
    kind: crate::model::SampleKind,
}

impl Builder {
    pub fn new(frequency_hz: u64) -> Self {
        let mut b = Self {
            profile: Profile::default(),
            strings: Default::default(),
            locations: HashMap::new(),
            mappings: HashMap::new(),
            period_ns: (1_000_000_000 / frequency_hz.max(1)) as i64,
            workloads: HashMap::new(),
            first_ns: None,
            last_ns: 0,
            window: None,
            kind: crate::model::SampleKind::Cpu,
        };
        b.string(""); // index 0 must be the empty string
        let (samples, count, cpu, ns) =
            (b.string("samples"), b.string("count"), b.string("cpu"), b.string("nanoseconds"));
        b.profile.sample_type = vec![ValueType { r#type: samples, unit: count }, ValueType { r#type: cpu, unit: ns }];
        b.profile.period_type = Some(ValueType { r#type: cpu, unit: ns });
        b.profile.period = b.period_ns;
        b
    }

    /// The samples are a CUDA store's (`--samples`): one value, `cuda_launches/count`,
    /// `cuda_sync/nanoseconds` or `cuda_copies/bytes`, period 1 of it.
    pub fn for_kind(mut self, kind: crate::model::SampleKind) -> Self {
        self.kind = kind;
        if kind != crate::model::SampleKind::Cpu {
            let (t, u) = kind.sample_type();
            let vt = ValueType { r#type: self.string(t), unit: self.string(u) };
            self.profile.sample_type = vec![vt.clone()];
            self.profile.period_type = Some(vt);
            self.profile.period = 1;
        }
        self
    }

    /// The profile covers `w` (its time and duration), not only its first to last sample.
    pub fn for_window(mut self, w: crate::query::Window) -> Self {
        self.window = Some(w);
        self
    }

    fn string(&mut self, s: &str) -> i64 {
        self.strings.index(&mut self.profile.string_table, s) as i64
    }

    fn mapping(&mut self, file: &str) -> u64 {
        if let Some(&id) = self.mappings.get(file) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(file);
        self.profile.mapping.push(Mapping {
            id,
            memory_start: 0,
            memory_limit: 0,
            file_offset: 0,
            filename,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
        });
        self.mappings.insert(file.to_string(), id);
        id
    }

    /// `file` and `address`: where a user frame's function lives ("" and 0: unknown).
    fn location(&mut self, name: &str, kernel: bool, file: &str, address: u64) -> u64 {
        let (file, address) = if kernel { ("", 0) } else { (file, address) };
        let key = (name.to_string(), kernel, file.to_string(), address);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let mapping_id = if file.is_empty() { 0 } else { self.mapping(file) };
        let id = self.profile.location.len() as u64 + 1;
        // A user name cannot end like the kernel mark (`untrusted::unmarked`).
        let shown = if kernel { format!("{name} [kernel]") } else { crate::untrusted::unmarked(name).into_owned() };
        // A Python frame has its own fields for its file and the line it runs (the function's
        // first line is not kept: `start_line` stays 0, unknown).
        let (function, file, line) = match crate::interpreter::python::source(&shown).filter(|_| !kernel) {
            Some((function, file, line)) => (function.to_string(), file.to_string(), line as i64),
            None => (shown, String::new(), 0),
        };
        let (n, filename) = (self.string(&function), self.string(&file));
        // No system name: pprof demangles, and simplifies, a name equal to its system name
        // (`Scoped<T>::set` would become `Scoped::set`); ours are final.
        self.profile.function.push(Function { id, name: n, system_name: 0, filename, start_line: 0 });
        self.profile.location.push(Location { id, mapping_id, address, line: vec![Line { function_id: id, line }] });
        self.locations.insert(key, id);
        id
    }

    pub fn add(&mut self, s: &SampleRef<'_>) {
        // Files numbered from the root: the first is the executable (pprof's main binary).
        for (&(_, kernel), &(file, _)) in s.frames.iter().zip(s.locations) {
            if !kernel && !file.is_empty() {
                self.mapping(file);
            }
        }
        let mut ids: Vec<u64> = s
            .frames
            .iter()
            .enumerate()
            .rev()
            .map(|(i, &(n, k))| {
                let (file, address) = s.locations.get(i).copied().unwrap_or(("", 0));
                self.location(n, k, file, address)
            })
            .collect();
        // The comm as the root, as in folded output.
        ids.push(self.location(s.comm, false, "", 0));
        let keys = ["cpu", "pid", "tid", "timestamp_ns", "comm", "nanoseconds", "context"].map(|k| self.string(k));
        let comm = self.string(s.comm);
        let context = self.string(&Context::of_frames(s.frames.iter().copied()).to_string());
        let count = s.count as i64;
        let num = |key: i64, num: i64, num_unit: i64| Label { key, str: 0, num, num_unit };
        let mut label = vec![
            num(keys[0], i64::from(s.cpu), keys[0]),
            num(keys[1], i64::from(s.pid), keys[1]),
            num(keys[2], i64::from(s.tid), keys[2]),
            num(keys[3], s.ts_ns as i64, keys[5]),
            Label { key: keys[4], str: comm, num: 0, num_unit: 0 },
            Label { key: keys[6], str: context, num: 0, num_unit: 0 },
        ];
        label.extend(self.workload_labels(s.workload).iter().cloned());
        // A launch's kernel (its stack's `[gpu] NAME` leaf), to group or filter by (`-tagfocus`).
        if let Some(k) = super::kernel_of(self.kind, s.frames) {
            let (key, str) = (self.string("kernel"), self.string(k));
            label.push(Label { key, str, num: 0, num_unit: 0 });
        }
        let value = match self.kind {
            // Each sample weighs its own period: a window may span a restart at another frequency.
            crate::model::SampleKind::Cpu => {
                vec![count, count * s.frequency_hz.map_or(self.period_ns, |hz| (1_000_000_000 / hz.max(1)) as i64)]
            }
            kind => vec![count.saturating_mul(kind.stored_scale())],
        };
        self.profile.sample.push(Sample { location_id: ids, value, label });
        self.first_ns = Some(self.first_ns.map_or(s.ts_ns, |f| f.min(s.ts_ns)));
        self.last_ns = self.last_ns.max(s.ts_ns);
    }

    /// The pod, namespace, container and unit labels of a stored workload, made once per
    /// distinct workload.
    fn workload_labels(&mut self, workload: &str) -> &[Label] {
        if !self.workloads.contains_key(workload) {
            let fields = crate::identity::workloads::decode(workload)
                .map(|id| id.fields().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>());
            let labels = fields
                .unwrap_or_default()
                .iter()
                .map(|(k, v)| Label { key: self.string(k), str: self.string(v), num: 0, num_unit: 0 })
                .collect();
            self.workloads.insert(workload.to_string(), labels);
        }
        &self.workloads[workload]
    }

    pub fn finish(mut self, out: impl Write) -> Result<(), ExportError> {
        let (time, duration) = match self.window {
            Some(w) => (w.from_ns, (w.to_ns - w.from_ns) as i64),
            None => {
                let first = self.first_ns.unwrap_or(0);
                (first, self.last_ns.saturating_sub(first) as i64 + self.period_ns)
            }
        };
        self.profile.time_nanos = time as i64;
        self.profile.duration_nanos = duration;
        let bytes = prost::Message::encode_to_vec(&self.profile);
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&bytes)?;
        gz.finish()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use prost::Message;

    use super::*;

    /// The profile as a reader gets it: gunzipped and decoded.
    fn decoded(b: Builder) -> Profile {
        let mut gz = Vec::new();
        b.finish(&mut gz).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        Profile::decode(&raw[..]).unwrap()
    }

    /// pprof's "Main binary filename not available": mapping 1 is the stack's outermost file,
    /// and each user location has its mapping and its function's address.
    #[test]
    fn user_locations_have_mappings_and_the_first_is_the_executable() {
        let frames = [("_start", false), ("__libc_start_main", false), ("main", false), ("read_zero", true)];
        let places = [("/usr/bin/dd", 0x2040u64), ("/usr/lib/libc.so.6", 0x27200), ("/usr/bin/dd", 0x3100), ("", 0)];
        let mut b = Builder::new(99);
        b.add(&SampleRef {
            ts_ns: 1_000,
            cpu: 1,
            pid: 42,
            tid: 43,
            comm: "dd",
            frames: &frames,
            locations: &places,
            count: 1,
            frequency_hz: None,
            workload: "",
        });
        let p = decoded(b);
        let s = |i: i64| p.string_table[i as usize].as_str();
        let files: Vec<(u64, &str, bool)> = p.mapping.iter().map(|m| (m.id, s(m.filename), m.has_functions)).collect();
        assert_eq!(files, vec![(1, "/usr/bin/dd", true), (2, "/usr/lib/libc.so.6", true)]);
        let at = |name: &str| {
            let f = p.function.iter().find(|f| s(f.name) == name).unwrap();
            let l = p.location.iter().find(|l| l.line[0].function_id == f.id).unwrap();
            (l.mapping_id, l.address)
        };
        assert_eq!(at("main"), (1, 0x3100));
        assert_eq!(at("__libc_start_main"), (2, 0x27200));
        assert_eq!(at("read_zero [kernel]"), (0, 0), "kernel frames carry no address");
    }

    #[test]
    fn gzipped_profile_decodes_with_stacks_labels_and_values() {
        let frames = [("main", false), ("read_zero", true)];
        let mut b = Builder::new(99);
        for i in 0..3 {
            b.add(&SampleRef {
                ts_ns: 1_000 + i,
                cpu: 1,
                pid: 42,
                tid: 43,
                comm: "dd",
                frames: &frames,
                locations: &[],
                count: 1,
                frequency_hz: None,
                workload: "",
            });
        }
        let p = decoded(b);
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        assert_eq!(p.sample.len(), 3);
        let leaf = p.sample[0].location_id[0];
        let f = &p.function[(leaf - 1) as usize];
        assert_eq!(s(f.name), "read_zero [kernel]");
        assert_eq!(p.sample[0].location_id.len(), 3);
        assert_eq!(p.sample[0].value, vec![1, 1_000_000_000 / 99]);
        let labels: Vec<(&str, i64)> = p.sample[2].label.iter().map(|l| (s(l.key), l.num)).collect();
        assert!(labels.contains(&("cpu", 1)) && labels.contains(&("timestamp_ns", 1002)), "{labels:?}");
        assert!(p.sample[0].label.iter().all(|l| l.str != 0 || l.num_unit != 0), "every numeric label has a unit");
        assert!(p.function.iter().all(|f| f.system_name == 0), "names are not pprof's to demangle");
        assert_eq!(s(p.sample_type[0].r#type), "samples");
    }

    #[test]
    fn a_python_frame_carries_its_file_and_line_in_their_own_fields() {
        let frames = [("main", false), ("outer_loop (/srv/nested.py:31)", false), ("f (x.c:3)", true)];
        let mut b = Builder::new(99);
        b.add(&SampleRef {
            ts_ns: 1,
            cpu: 0,
            pid: 1,
            tid: 1,
            comm: "python3",
            frames: &frames,
            locations: &[],
            count: 1,
            frequency_hz: None,
            workload: "",
        });
        let p = decoded(b);
        let s = |i: i64| p.string_table[i as usize].as_str();
        let by_name = |name: &str| p.function.iter().find(|f| s(f.name) == name).unwrap_or_else(|| panic!("{name}"));
        let py = by_name("outer_loop");
        assert_eq!(s(py.filename), "/srv/nested.py");
        let loc = p.location.iter().find(|l| l.line[0].function_id == py.id).unwrap();
        assert_eq!(loc.line[0].line, 31);
        // Native and kernel frames keep their whole names and no file.
        assert_eq!(s(by_name("main").filename), "");
        assert_eq!(s(by_name("f (x.c:3) [kernel]").filename), "");
    }

    /// Issue 41, part 1: a launch's kernel is a label of its sample (`kernel`, for pprof's
    /// `-tagfocus`), beside the stack's `[gpu] NAME` leaf.
    #[test]
    fn a_launchs_kernel_is_a_label() {
        let named = [("main", false), ("train_step (train.py:93)", false), ("[gpu] ampere_sgemm_128x64_tn", false)];
        let plain = [("main", false), ("cuLaunchKernel", false)];
        let kernels = |kind: crate::model::SampleKind| {
            let mut b = Builder::new(99).for_kind(kind);
            for frames in [&named[..], &plain[..]] {
                b.add(&SampleRef {
                    ts_ns: 1_000,
                    cpu: 1,
                    pid: 42,
                    tid: 43,
                    comm: "python3",
                    frames,
                    locations: &[],
                    count: 3,
                    frequency_hz: None,
                    workload: "",
                });
            }
            let p = decoded(b);
            let s = |i: i64| p.string_table[i as usize].clone();
            p.sample.iter().map(|x| x.label.iter().find(|l| s(l.key) == "kernel").map(|l| s(l.str))).collect::<Vec<_>>()
        };
        assert_eq!(kernels(crate::model::SampleKind::CudaLaunches), [Some("ampere_sgemm_128x64_tn".into()), None]);
        assert_eq!(kernels(crate::model::SampleKind::CudaCopies), [None, None]);
    }

    #[test]
    fn a_containers_samples_carry_pod_namespace_and_container_labels() {
        let id = crate::identity::Identity {
            pod_namespace: Some("ml".into()),
            pod_name: Some("trainer-0".into()),
            container_name: Some("main".into()),
            ..Default::default()
        };
        let workload = crate::identity::workloads::encode(&id);
        let mut b = Builder::new(99);
        for w in [workload.as_str(), ""] {
            let softirq = [("main", false), ("[softirq:NET_RX]", true), ("net_rx_action", true)];
            let frames = if w.is_empty() { &softirq[..] } else { &softirq[..1] };
            b.add(&SampleRef {
                ts_ns: 1,
                cpu: 0,
                pid: 1,
                tid: 1,
                comm: "py",
                frames,
                locations: &[],
                count: 1,
                frequency_hz: None,
                workload: w,
            });
        }
        let p = decoded(b);
        let s = |i: i64| p.string_table[i as usize].as_str();
        let strs = |i: usize| -> Vec<(&str, &str)> {
            p.sample[i].label.iter().filter(|l| l.str != 0).map(|l| (s(l.key), s(l.str))).collect()
        };
        assert_eq!(
            strs(0),
            [("comm", "py"), ("context", "task"), ("namespace", "ml"), ("pod", "trainer-0"), ("container", "main")]
        );
        assert_eq!(strs(1), [("comm", "py"), ("context", "softirq:NET_RX")]);
    }

    /// pprof is structured: names travel exactly, but a user frame cannot end like our kernel mark.
    #[test]
    fn hostile_names_round_trip_and_cannot_fake_the_kernel_mark() {
        let frames = [("evil\n;x 12\x1b", false), ("x [kernel]", false), ("read_zero", true)];
        let mut b = Builder::new(99);
        b.add(&SampleRef {
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
        });
        let p = decoded(b);
        let names: Vec<&str> = p.sample[0]
            .location_id
            .iter()
            .map(|&l| p.string_table[p.function[(l - 1) as usize].name as usize].as_str())
            .collect();
        assert_eq!(names, ["read_zero [kernel]", "x {kernel}", "evil\n;x 12\x1b", "a\tb;c 5"]);
    }
}
