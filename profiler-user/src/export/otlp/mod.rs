//! OpenTelemetry profiles (OTLP, `v1development`): an `ExportProfilesServiceRequest`, as
//! `profiler export --format otlp` writes it and the OTLP shipper (`ship::otlp`) posts it.
//!
//! One resource (`host.name`), one scope, one profile per sampling frequency (a window may span
//! a restart at another frequency, and a profile has one period): sample type `samples/count`,
//! period type `cpu/nanoseconds`, period `1e9 / Hz`, so CPU time is count x period. A sample is
//! a (stack, attributes) pair with one value and one timestamp per stored sample (its count:
//! 1, more in rolled-up data). Attributes follow the semantic conventions: `thread.id`,
//! `process.pid`, `thread.name` (the comm the kernel reports is the thread's), and
//! `cpu.logical_number`, `context` (`task`, or the softirq: `softirq:NET_RX`); the workload's as `container.id`, `container.runtime.name`,
//! `k8s.pod.uid`, `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`, and
//! `systemd.unit` (semconv has no key for a unit), on the resource when every sample shares
//! them. Frames carry `profile.frame.type` = `kernel`, `native` or `cpython` on their location
//! (as the OpenTelemetry eBPF profiler marks them), so names travel unmarked. A user frame's
//! location has the mapping of the file it was mapped from (`Mapping.filename`) and, as its
//! `address`, its function's ELF virtual address there (the store keeps functions, not
//! instructions, and no load address: `memory_start`/`memory_limit` stay 0). A Python frame's
//! file goes in `Function.filename` and the line it ran in `Line.line`: one Function per
//! function and file, whatever line its samples ran, with `start_line` 0 (unknown: the store
//! keeps the line that ran, not the function's first).

pub mod logs;
pub mod proto;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
};

use proto::{
    AnyValue, ExportProfilesServiceRequest, Function, InstrumentationScope, KeyValue, KeyValueAndUnit, Line, Link,
    Location, Mapping, Profile, ProfilesDictionary, Resource, ResourceProfiles, Sample, ScopeProfiles, Stack, Value,
    ValueType,
};

use super::ExportError;
use crate::{
    exec_context::Context,
    query::{SampleRef, Window},
};

/// Workload fields (`identity::Identity::fields`), with their attribute keys.
const WORKLOAD_KEYS: [(&str, &str); 7] = [
    ("container_id", "container.id"),
    ("runtime", "container.runtime.name"),
    ("pod_uid", "k8s.pod.uid"),
    ("namespace", "k8s.namespace.name"),
    ("pod", "k8s.pod.name"),
    ("container", "k8s.container.name"),
    ("unit", "systemd.unit"),
];

/// What a sample is, apart from its observations: stack, its own attributes, its workload.
/// (stack, its attributes: the last the kernel's name or -1, workload).
type SampleKey = (i32, [i32; 6], usize);

/// One profile: the samples of one sampling period.
#[derive(Default)]
struct Samples {
    rows: Vec<(SampleKey, Vec<i64>, Vec<u64>)>,
    index: HashMap<SampleKey, usize>,
}

/// Builds a request sample by sample.
pub struct Builder {
    window: Window,
    host: String,
    default_hz: u64,
    dict: ProfilesDictionary,
    strings: crate::export::interner::Interner,
    attributes: HashMap<(i32, Value), i32>,
    /// Location of each frame: (name, file, address) for user frames, name for kernel ones.
    user: HashMap<(String, String, u64), i32>,
    kernel: HashMap<String, i32>,
    /// Function of each (name, file).
    functions: HashMap<(i32, i32), i32>,
    /// Mapping of each file.
    mappings: HashMap<String, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    /// Workload string → its id (0: none) and attributes.
    workload_ids: HashMap<String, usize>,
    workloads: Vec<Vec<(&'static str, String)>>,
    /// By period in ns.
    profiles: BTreeMap<i64, Samples>,
    samples: u64,
    /// What the samples count (`with_kind`).
    kind: crate::model::SampleKind,
}

impl Builder {
    /// `window`: the profile's time range; `host`: `host.name`; `default_hz`: the frequency of
    /// samples whose segment does not record one (`meta.json`'s).
    pub fn new(window: Window, host: &str, default_hz: u64) -> Self {
        let mut b = Self {
            window,
            host: host.to_string(),
            default_hz: default_hz.max(1),
            // Entry 0 of every table is its zero value, which index 0 means "unset".
            dict: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                // The spec asks for full-length zero ids, for codecs that check lengths.
                link_table: vec![Link { trace_id: vec![0; 16], span_id: vec![0; 8] }],
                string_table: Vec::new(),
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: Default::default(),
            attributes: HashMap::new(),
            user: HashMap::new(),
            kernel: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            stacks: HashMap::new(),
            workload_ids: HashMap::from([(String::new(), 0)]),
            workloads: vec![Vec::new()],
            profiles: BTreeMap::new(),
            samples: 0,
            kind: crate::model::SampleKind::Cpu,
        };
        b.string("");
        b
    }

    /// Samples added (weighted by their counts).
    pub fn samples(&self) -> u64 {
        self.samples
    }

    fn string(&mut self, s: &str) -> i32 {
        self.strings.index(&mut self.dict.string_table, s) as i32
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let key = self.string(key);
        if let Some(&i) = self.attributes.get(&(key, value.clone())) {
            return i;
        }
        let i = self.dict.attribute_table.len() as i32;
        self.dict.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue { value: Some(value.clone()) }),
            unit_strindex: 0,
        });
        self.attributes.insert((key, value), i);
        i
    }

    /// A frame's location: `file` and `address` are where a user frame's function lives
    /// (`SampleRef::locations`; "" and 0 unknown).
    fn location(&mut self, name: &str, kernel: bool, file: &str, address: u64) -> i32 {
        let (file, address) = if kernel { ("", 0) } else { (file, address) };
        let key = (name.to_string(), file.to_string(), address);
        let known = if kernel { self.kernel.get(name) } else { self.user.get(&key) };
        if let Some(&i) = known {
            return i;
        }
        let python = crate::interpreter::python::source(name).filter(|_| !kernel);
        let (function, source, line, kind) = match python {
            Some((function, source, line)) => (function, source, i64::from(line), "cpython"),
            None => (name, "", 0, if kernel { "kernel" } else { "native" }),
        };
        let function_index = self.function(function, source);
        let kind = self.attribute("profile.frame.type", Value::String(kind.into()));
        let mapping_index = if file.is_empty() { 0 } else { self.mapping(file) };
        let i = self.dict.location_table.len() as i32;
        self.dict.location_table.push(Location {
            mapping_index,
            address,
            lines: vec![Line { function_index, line, column: 0 }],
            attribute_indices: vec![kind],
        });
        if kernel {
            self.kernel.insert(name.to_string(), i);
        } else {
            self.user.insert(key, i);
        }
        i
    }

    /// One Function per name and source file: a Python function sampled on several lines is one
    /// function with several locations.
    fn function(&mut self, name: &str, file: &str) -> i32 {
        let (name_strindex, filename_strindex) = (self.string(name), self.string(file));
        if let Some(&i) = self.functions.get(&(name_strindex, filename_strindex)) {
            return i;
        }
        let i = self.dict.function_table.len() as i32;
        self.dict.function_table.push(Function {
            name_strindex,
            system_name_strindex: name_strindex,
            filename_strindex,
            start_line: 0,
        });
        self.functions.insert((name_strindex, filename_strindex), i);
        i
    }

    fn mapping(&mut self, file: &str) -> i32 {
        if let Some(&i) = self.mappings.get(file) {
            return i;
        }
        let filename_strindex = self.string(file);
        let i = self.dict.mapping_table.len() as i32;
        self.dict.mapping_table.push(Mapping { memory_start: 0, memory_limit: 0, file_offset: 0, filename_strindex });
        self.mappings.insert(file.to_string(), i);
        i
    }

    fn stack(&mut self, frames: &[(&str, bool)], places: &[(&str, u64)]) -> i32 {
        // Leaf first, as OTLP (and pprof) order stacks.
        let locations: Vec<i32> = frames
            .iter()
            .enumerate()
            .rev()
            .map(|(i, &(name, kernel))| {
                let (file, address) = places.get(i).copied().unwrap_or(("", 0));
                self.location(name, kernel, file, address)
            })
            .collect();
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.dict.stack_table.len() as i32;
        self.dict.stack_table.push(Stack { location_indices: locations.clone() });
        self.stacks.insert(locations, i);
        i
    }

    fn workload(&mut self, json: &str) -> usize {
        if let Some(&id) = self.workload_ids.get(json) {
            return id;
        }
        // A workload the store holds but that does not parse carries no attributes.
        let identity = crate::identity::workloads::decode(json).unwrap_or_default();
        let fields = identity.fields();
        let attrs = WORKLOAD_KEYS
            .iter()
            .filter_map(|&(field, key)| Some((key, fields.iter().find(|(f, _)| *f == field)?.1.to_string())))
            .collect();
        let id = self.workloads.len();
        self.workloads.push(attrs);
        self.workload_ids.insert(json.to_string(), id);
        id
    }

    /// The samples are a CUDA store's (`--samples`): sample type `cuda_launches/count`,
    /// `cuda_sync/nanoseconds` or `cuda_copies/bytes`, period 1.
    pub fn with_kind(mut self, kind: crate::model::SampleKind) -> Self {
        self.kind = kind;
        self
    }

    pub fn add(&mut self, s: &SampleRef<'_>) {
        let stack = self.stack(s.frames, s.locations);
        let attrs = [
            self.attribute("thread.id", Value::Int(i64::from(s.tid))),
            self.attribute("process.pid", Value::Int(i64::from(s.pid))),
            self.attribute("thread.name", Value::String(s.comm.to_string())),
            self.attribute("cpu.logical_number", Value::Int(i64::from(s.cpu))),
            // `task` or `softirq:NET_RX` (semconv has no key for it), from the stack's marker.
            self.attribute("context", Value::String(Context::of_frames(s.frames.iter().copied()).to_string())),
            // A launch's kernel (its stack's `[gpu] NAME` leaf), to group or filter by.
            match super::kernel_of(self.kind, s.frames) {
                Some(k) => self.attribute("kernel", Value::String(k.to_string())),
                None => -1,
            },
        ];
        let workload = self.workload(s.workload);
        // A CUDA kind's samples are counts of their own, one profile with period 1.
        let cpu = self.kind == crate::model::SampleKind::Cpu;
        let period = if cpu { period_ns(s.frequency_hz.unwrap_or(self.default_hz).max(1)) } else { 1 };
        let scale = self.kind.stored_scale();
        let profile = self.profiles.entry(period).or_default();
        let key = (stack, attrs, workload);
        let row = *profile.index.entry(key).or_insert_with(|| {
            profile.rows.push((key, Vec::new(), Vec::new()));
            profile.rows.len() - 1
        });
        let (_, values, timestamps) = &mut profile.rows[row];
        values.push((s.count as i64).saturating_mul(scale));
        timestamps.push(s.ts_ns);
        self.samples += s.count;
    }

    /// The request: every profile, with the dictionary they share.
    pub fn finish(mut self) -> ExportProfilesServiceRequest {
        // A workload every sample shares describes the resource; otherwise each sample's own.
        let workloads: Vec<usize> = {
            let mut w: Vec<usize> = self.profiles.values().flat_map(|p| p.rows.iter().map(|r| r.0.2)).collect();
            w.sort_unstable();
            w.dedup();
            w
        };
        let shared = match workloads[..] {
            [only] => Some(only),
            _ => None,
        };
        let mut resource = vec![KeyValue {
            key: "host.name".into(),
            value: Some(AnyValue { value: Some(Value::String(self.host.clone())) }),
        }];
        if let Some(w) = shared {
            resource.extend(self.workloads[w].iter().map(|(key, v)| KeyValue {
                key: key.to_string(),
                value: Some(AnyValue { value: Some(Value::String(v.clone())) }),
            }));
        }
        let workload_attrs: Vec<Vec<i32>> = (0..self.workloads.len())
            .map(|w| {
                let attrs = std::mem::take(&mut self.workloads[w]);
                attrs.into_iter().map(|(key, v)| self.attribute(key, Value::String(v))).collect()
            })
            .collect();
        let (mut samples_t, mut count, mut cpu, mut ns) =
            (self.string("samples"), self.string("count"), self.string("cpu"), self.string("nanoseconds"));
        if self.kind != crate::model::SampleKind::Cpu {
            let (t, u) = self.kind.sample_type();
            (samples_t, count) = (self.string(t), self.string(u));
            (cpu, ns) = (samples_t, count);
        }
        let profiles = std::mem::take(&mut self.profiles)
            .into_iter()
            .map(|(period, p)| Profile {
                sample_type: Some(ValueType { type_strindex: samples_t, unit_strindex: count }),
                samples: p
                    .rows
                    .into_iter()
                    .map(|((stack, attrs, workload), values, timestamps)| {
                        let mut attribute_indices: Vec<i32> = attrs.into_iter().filter(|&a| a >= 0).collect();
                        if shared.is_none() {
                            attribute_indices.extend(&workload_attrs[workload]);
                        }
                        Sample {
                            stack_index: stack,
                            attribute_indices,
                            link_index: 0,
                            values,
                            timestamps_unix_nano: timestamps,
                        }
                    })
                    .collect(),
                time_unix_nano: self.window.from_ns,
                duration_nano: self.window.to_ns - self.window.from_ns,
                period_type: Some(ValueType { type_strindex: cpu, unit_strindex: ns }),
                period,
                profile_id: profile_id(&self.host, self.window, period),
                attribute_indices: Vec::new(),
            })
            .collect();
        ExportProfilesServiceRequest {
            resource_profiles: vec![ResourceProfiles {
                resource: Some(Resource { attributes: resource }),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: "profiler".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    profiles,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
            dictionary: Some(self.dict),
        }
    }

    /// The request, encoded.
    pub fn write(self, mut out: impl Write) -> Result<(), ExportError> {
        out.write_all(&prost::Message::encode_to_vec(&self.finish()))?;
        Ok(())
    }
}

fn period_ns(hz: u64) -> i64 {
    (1_000_000_000 / hz.max(1)) as i64
}

/// The same host, window and period always get the same id, so a receiver can drop a batch the
/// shipper sent twice (it resends one when it stops between a send and its cursor write).
fn profile_id(host: &str, window: Window, period: i64) -> Vec<u8> {
    // FNV-1a: stable across Rust versions, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host.bytes().chain([0]).chain(window.to_ns.to_le_bytes()).chain(period.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut id = [window.from_ns.to_be_bytes(), h.to_be_bytes()].concat();
    if id.iter().all(|&b| b == 0) {
        id[15] = 1; // all zeroes means "no id"
    }
    id
}
