//! Kernel names for the launches (issue 41): each launch is counted with its kernel's handle or
//! host stub (`CudaKey::func`); this names it as the leaf frame of the launch's stack,
//! `[gpu] <demangled name>`, from
//! - the host stub the runtime's `cudaLaunchKernel` passed: its ELF symbol in the library that
//!   launched it is the kernel's mangled name (the symbolizer reads it, and demangles);
//! - CUDA 13's `__cudaGetKernel(&k, stub)`: `k` is `stub`'s kernel;
//! - the driver's look-ups, `cuModuleGetFunction(&f, mod, name)`, `cuLibraryGetKernel(&k, lib,
//!   name)`, `cuKernelGetFunction(&f, k)`, remembered per process.
//!
//! A handle whose look-up the daemon did not see (made before it started) is counted under
//! `[gpu] kernel in <the library that launched it>`, never under a guess; graph launches under
//! `[gpu] graph`.
//!
//! What a process can make the daemon hold is bounded: [`NAMES_BYTES_MAX`] of names and
//! [`HANDLES_MAX`] handles per process, forgotten when it exits.

use std::{collections::HashMap, sync::Arc};

use profiler_common::cuda::{Lookup, LookupKey, func, lookup};

use crate::model::{Location, Stack};

/// Bytes of kernel names remembered per process: PyTorch's eager kernels are named by stub,
/// not held here; a Triton or cuBLAS process looks up a few hundred to a few thousand kernels
/// of 100-500 bytes each.
pub const NAMES_BYTES_MAX: usize = 1 << 20;
/// Handles remembered per process (names, aliases and stubs).
pub const HANDLES_MAX: usize = 16_384;
/// Names a process's launches were given, kept between drains (a launch site is drained every
/// second it launches).
const NAMED_MAX: usize = 4096;

/// What a handle is, as a look-up said.
#[derive(Debug, Clone)]
enum Known {
    Name(Arc<str>),
    /// `cuKernelGetFunction`: the function of a kernel handle.
    Alias(u64),
    /// `__cudaGetKernel`: the kernel of a host stub.
    Stub(u64),
}

#[derive(Default)]
struct Process {
    handles: HashMap<u64, Known>,
    bytes: usize,
    /// The frame each launched `func` got, until a look-up changes what the process knows.
    named: HashMap<u64, Arc<str>>,
}

/// The kernels of each probed process.
#[derive(Default)]
pub struct Kernels {
    procs: HashMap<u32, Process>,
    /// Look-ups not kept: their process's share was full.
    pub dropped: u64,
}

/// Where a stub is and what the symbolizer calls it (`None` when nothing names it).
pub struct Symbol {
    pub name: Option<Arc<str>>,
    pub file: Arc<str>,
}

impl Kernels {
    /// What the probes' look-ups said since the last drain.
    pub fn learn(&mut self, lookups: Vec<(LookupKey, Lookup)>) {
        for (key, l) in lookups {
            let known = match l.what {
                lookup::NAMED => {
                    let len = (l.len as usize).min(l.name.len());
                    let bytes = &l.name[..len];
                    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
                    if bytes.is_empty() {
                        continue;
                    }
                    // The whole buffer read without its NUL: the name was longer, cut.
                    let cut = len == l.name.len() && !l.name.ends_with(&[0]);
                    let mut name = demangle(&String::from_utf8_lossy(bytes));
                    if cut {
                        name.push('…');
                    }
                    Known::Name(Arc::from(name))
                }
                lookup::ALIAS => Known::Alias(l.target),
                lookup::STUB => Known::Stub(l.target),
                _ => continue,
            };
            let p = self.procs.entry(key.pid).or_default();
            let size = match &known {
                Known::Name(n) => n.len() + 16,
                _ => 16,
            };
            let replacing = p.handles.contains_key(&key.handle);
            if !replacing && (p.handles.len() >= HANDLES_MAX || p.bytes + size > NAMES_BYTES_MAX) {
                self.dropped += 1;
                continue;
            }
            if let Some(Known::Name(old)) = p.handles.insert(key.handle, known) {
                p.bytes = p.bytes.saturating_sub(old.len() + 16);
            } else if replacing {
                p.bytes = p.bytes.saturating_sub(16);
            }
            p.bytes += size;
            // What it knew changed: launches are named again.
            p.named.clear();
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// The leaf frame for a launch of `f` (`CudaKey::func`) by process `pid` with `stack`;
    /// `symbol` names a host stub's address in the process. `None` for a count with no kernel
    /// (not a launch).
    pub fn frame(
        &mut self,
        pid: u32,
        f: u64,
        stack: &Stack,
        symbol: impl FnOnce(u64) -> Option<Symbol>,
    ) -> Option<Arc<str>> {
        if f == 0 {
            return None;
        }
        if let Some(name) = self.procs.get(&pid).and_then(|p| p.named.get(&f)) {
            return Some(name.clone());
        }
        let addr = func::addr(f);
        let name: Arc<str> = match func::tag(f) {
            func::GRAPH => Arc::from("[gpu] graph"),
            func::STUB => {
                // CUDA 13: the runtime launched by the handle `__cudaGetKernel` gave for a stub.
                let stub = match self.known(pid, addr) {
                    Some(Known::Stub(s)) => *s,
                    _ => addr,
                };
                match symbol(stub) {
                    Some(Symbol { name: Some(n), .. }) => Arc::from(format!("[gpu] {n}")),
                    Some(Symbol { file, .. }) if !file.is_empty() => {
                        Arc::from(format!("[gpu] kernel in {}", base(&file)))
                    }
                    _ => Arc::from(format!("[gpu] kernel {stub:#x}")),
                }
            }
            _ => match self.name_of(pid, addr) {
                Some(n) => Arc::from(format!("[gpu] {n}")),
                None => match launcher(stack) {
                    Some(lib) => Arc::from(format!("[gpu] kernel in {lib}")),
                    None => Arc::from(format!("[gpu] kernel {addr:#x}")),
                },
            },
        };
        let p = self.procs.entry(pid).or_default();
        if p.named.len() >= NAMED_MAX {
            p.named.clear();
        }
        p.named.insert(f, name.clone());
        Some(name)
    }

    fn known(&self, pid: u32, handle: u64) -> Option<&Known> {
        self.procs.get(&pid)?.handles.get(&handle)
    }

    /// A driver handle's name: looked up by name, or the function of a kernel that was.
    fn name_of(&self, pid: u32, handle: u64) -> Option<Arc<str>> {
        match self.known(pid, handle)? {
            Known::Name(n) => Some(n.clone()),
            Known::Alias(k) => match self.known(pid, *k)? {
                Known::Name(n) => Some(n.clone()),
                _ => None,
            },
            Known::Stub(_) => None,
        }
    }
}

/// The library that called the driver: the first frame from the leaf outside the CUDA
/// libraries themselves (the probe's own frame is the driver's function).
fn launcher(stack: &Stack) -> Option<String> {
    let user = stack.locations.get(..stack.user_len.min(stack.locations.len()))?;
    user.iter()
        .rev()
        .map(|l: &Location| base(&l.file))
        .find(|b| !b.is_empty() && !b.starts_with("libcuda.so") && !b.starts_with("libcudart.so"))
        .map(str::to_string)
}

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A C++ mangled name demangled (`_Z6vecAddPfS_S_i` -> `vecAdd(float*, float*, float*, int)`);
/// anything else (a C name, a name cut short) as it is.
pub fn demangle(name: &str) -> String {
    if name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(name)
        && let Ok(d) = sym.demangle()
    {
        return d;
    }
    name.to_string()
}

/// `stack` with the kernel's frame as its leaf.
pub fn with_leaf(stack: &Stack, frame: Arc<str>) -> Stack {
    let mut s = stack.clone();
    let at = s.user_len;
    s.frames.insert(at, frame);
    if s.locations.len() == s.user_len {
        s.locations.push(Location::default());
    }
    s.user_len += 1;
    s
}

#[cfg(test)]
mod tests {
    use profiler_common::cuda::LOOKUP_NAME_MAX;

    use super::*;

    fn named(pid: u32, handle: u64, name: &str) -> (LookupKey, Lookup) {
        let mut l = Lookup { what: lookup::NAMED, len: name.len() as u32 + 1, target: 0, name: [0; LOOKUP_NAME_MAX] };
        l.name[..name.len()].copy_from_slice(name.as_bytes());
        (LookupKey { pid, _pad: 0, handle }, l)
    }

    fn stack_from(files: &[&str]) -> Stack {
        let frames: Vec<Arc<str>> = files.iter().map(|f| Arc::from(*f)).collect();
        let mut s = Stack::new(frames, files.len());
        s.locations = files.iter().map(|f| Location { file: Arc::from(*f), addr: 1 }).collect();
        s
    }

    #[test]
    fn a_handle_is_named_by_its_look_up_and_only_in_its_process() {
        let mut k = Kernels::default();
        k.learn(vec![named(7, 0x1000, "_Z6vecAddPfS_S_i"), named(7, 0x2000, "triton_poi_fused_add_0")]);
        let stack = stack_from(&["/usr/bin/python3", "/usr/lib/libcublasLt.so.12", "/usr/lib/libcuda.so.1"]);
        let f = |h| func::HANDLE | h;
        assert_eq!(&*k.frame(7, f(0x1000), &stack, |_| None).unwrap(), "[gpu] vecAdd(float*, float*, float*, int)");
        assert_eq!(&*k.frame(7, f(0x2000), &stack, |_| None).unwrap(), "[gpu] triton_poi_fused_add_0");
        // Another process's handle of the same value, and a handle never looked up: not named.
        assert_eq!(&*k.frame(8, f(0x1000), &stack, |_| None).unwrap(), "[gpu] kernel in libcublasLt.so.12");
        assert_eq!(&*k.frame(7, f(0x3000), &Stack::new(vec![], 0), |_| None).unwrap(), "[gpu] kernel 0x3000");
        assert_eq!(&*k.frame(7, func::GRAPH, &stack, |_| None).unwrap(), "[gpu] graph");
        assert_eq!(k.frame(7, 0, &stack, |_| None), None);
    }

    #[test]
    fn aliases_and_cuda_13_handles_lead_to_the_name() {
        let mut k = Kernels::default();
        let alias = Lookup { what: lookup::ALIAS, len: 0, target: 0x1000, name: [0; LOOKUP_NAME_MAX] };
        let stub = Lookup { what: lookup::STUB, len: 0, target: 0x5555, name: [0; LOOKUP_NAME_MAX] };
        k.learn(vec![
            named(7, 0x1000, "ampere_sgemm_128x64_tn"),
            (LookupKey { pid: 7, _pad: 0, handle: 0x9000 }, alias),
            (LookupKey { pid: 7, _pad: 0, handle: 0xabc }, stub),
        ]);
        let s = Stack::new(vec![], 0);
        assert_eq!(&*k.frame(7, func::HANDLE | 0x9000, &s, |_| None).unwrap(), "[gpu] ampere_sgemm_128x64_tn");
        let sym = |a: u64| {
            (a == 0x5555)
                .then(|| Symbol { name: Some(Arc::from("vecAdd(float*, float*, float*, int)")), file: Arc::from("") })
        };
        assert_eq!(&*k.frame(7, func::STUB | 0xabc, &s, sym).unwrap(), "[gpu] vecAdd(float*, float*, float*, int)");
        // A stub nothing names: its library.
        let lib = |_| Some(Symbol { name: None, file: Arc::from("/opt/libkernels.so") });
        assert_eq!(&*k.frame(7, func::STUB | 0x7777, &s, lib).unwrap(), "[gpu] kernel in libkernels.so");
    }

    #[test]
    fn names_are_bounded_per_process_and_cut_names_say_so() {
        let mut k = Kernels::default();
        let long = "k".repeat(LOOKUP_NAME_MAX);
        let mut l = named(1, 1, "x").1;
        l.name = [b'k'; LOOKUP_NAME_MAX];
        l.len = LOOKUP_NAME_MAX as u32;
        k.learn(vec![(LookupKey { pid: 1, _pad: 0, handle: 1 }, l)]);
        let s = Stack::new(vec![], 0);
        assert_eq!(
            &*k.frame(1, func::HANDLE | 1, &s, |_| None).unwrap(),
            format!("[gpu] {}…", &long[..LOOKUP_NAME_MAX])
        );
        let many: Vec<_> = (0..HANDLES_MAX as u64 + 10).map(|h| named(2, h + 1, "some_kernel")).collect();
        k.learn(many);
        assert_eq!(k.dropped, 10);
        assert!(k.procs[&2].bytes <= NAMES_BYTES_MAX);
        k.forget(2);
        assert!(!k.procs.contains_key(&2));
    }

    /// Long names (Triton's and cuBLAS's run to hundreds of bytes) hit the bytes' bound before
    /// the handles' one: a process that looks up more is cut at [`NAMES_BYTES_MAX`], without
    /// touching another process's share; a handle looked up again replaces its name in place.
    #[test]
    fn driver_look_ups_are_bounded_in_bytes_per_process() {
        let mut k = Kernels::default();
        let name = "k".repeat(500);
        let per = name.len() + 16;
        let flood: Vec<_> = (0..5000u64).map(|h| named(3, h + 1, &name)).collect();
        k.learn(flood);
        let kept = NAMES_BYTES_MAX / per;
        assert!(kept < HANDLES_MAX, "the bytes bind first");
        assert_eq!(k.procs[&3].handles.len(), kept);
        assert_eq!(k.procs[&3].bytes, kept * per);
        assert_eq!(k.dropped, (5000 - kept) as u64);
        // The same handles again: replaced, not added.
        k.learn((0..kept as u64).map(|h| named(3, h + 1, &name)).collect());
        assert_eq!(k.procs[&3].bytes, kept * per);
        assert_eq!(k.dropped, (5000 - kept) as u64);
        // Another process has its own share; the flooder's kept names still name its launches.
        k.learn(vec![named(4, 1, "triton_poi_fused_add_0")]);
        let s = Stack::new(vec![], 0);
        assert_eq!(&*k.frame(4, func::HANDLE | 1, &s, |_| None).unwrap(), "[gpu] triton_poi_fused_add_0");
        assert_eq!(&*k.frame(3, func::HANDLE | 1, &s, |_| None).unwrap(), format!("[gpu] {name}"));
        // A handle it could not keep is named by its library, never by another's name.
        let lib = stack_from(&["/usr/lib/libcublasLt.so.12", "/usr/lib/libcuda.so.1"]);
        assert_eq!(&*k.frame(3, func::HANDLE | 4999, &lib, |_| None).unwrap(), "[gpu] kernel in libcublasLt.so.12");
        // An exited process's share is freed.
        k.forget(3);
        k.learn(vec![named(3, 7, "after")]);
        assert_eq!(k.procs[&3].bytes, "after".len() + 16);
    }

    #[test]
    fn the_kernel_is_the_leaf() {
        let s = stack_from(&["main", "cuLaunchKernel"]);
        let named = with_leaf(&s, Arc::from("[gpu] graph"));
        assert_eq!(named.user().last().map(|f| &**f), Some("[gpu] graph"));
        assert_eq!(named.locations.len(), 3);
    }
}
