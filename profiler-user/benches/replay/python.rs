//! The replay bench's Python training node (`--python`): real CPython 3.11+ processes whose
//! code objects the symbolizer reads, and stacks as the sampler sends them for such a node
//! (native frames through `_PyEval_EvalFrameDefault`, then the Python frame pairs).
//!
//! Python frames cannot be made up: the symbolizer names a frame by reading its code object
//! out of the process (`process_vm_readv`). So each helper is a `python3` that compiles a
//! training program's worth of functions (`FILES` files of `FUNCTIONS` methods each, `LINES`
//! lines long), prints the address of every code object and the length of its bytecode, and
//! sleeps; the records point into those objects at real instruction offsets.

use std::{
    io::{BufRead, BufReader},
    ops::ControlFlow,
    os::unix::process::CommandExt,
    process::{Command, Stdio},
};

use crate::synth::Rng;
use blazesym::{
    SymType,
    inspect::{
        Inspector,
        source::{Elf, Source},
    },
};
use profiler_common::python::ENTRY_FRAME;

use super::workload::{Helpers, KernelText, Pool, Proc, RawStack, call_site, kernel_walk, mix, read_maps};

/// Source files per process, methods per file, lines per method: 2,000 code objects of 12
/// lines, what a training script and the library code it runs through make hot.
const FILES: usize = 40;
const FUNCTIONS: usize = 50;
const LINES: usize = 10;
/// `co_code_adaptive` of a 3.11 code object (`unwind::python::LAYOUTS`): where the sampler's
/// instruction addresses point.
const CODE_ADAPTIVE_311: u64 = 184;

const SCRIPT: &str = r#"
import sys, time
FILES, FUNCTIONS, LINES = map(int, sys.argv[1:4])
keep, out = [], []
for f in range(FILES):
    body = "".join(f"        x = x * {j} + {f}\n" for j in range(LINES))
    src = f"class Layer{f}:\n" + "".join(f"    def forward_{k}(self, x):\n{body}        return x\n" for k in range(FUNCTIONS))
    ns = {}
    exec(compile(src, f"/srv/train/models/block_{f}.py", "exec"), ns)
    cls = ns[f"Layer{f}"]
    for k in range(FUNCTIONS):
        c = getattr(cls, f"forward_{k}").__code__
        out.append(f"{id(c)} {len(c.co_code)}")
    keep.append(cls)
print(sys.version_info.minor)
print("\n".join(out), flush=True)
time.sleep(600)
"#;

/// A Python process: its pid, CPython minor version and code objects (address, code units).
pub struct PyProc {
    pub pid: u32,
    pub minor: u8,
    pub codes: Vec<(u64, u64)>,
}

/// `n` python3 helpers, each with its code objects listed; `None` without a CPython 3.11.
pub fn spawn(n: usize) -> Option<(Helpers, Vec<PyProc>)> {
    let mut children = Vec::new();
    let mut pys = Vec::new();
    for _ in 0..n {
        let mut cmd = Command::new("/usr/bin/python3");
        cmd.args(["-c", SCRIPT, &FILES.to_string(), &FUNCTIONS.to_string(), &LINES.to_string()]);
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().ok()?;
        let mut lines = BufReader::new(child.stdout.take()?).lines();
        let minor: u8 = lines.next()?.ok()?.trim().parse().ok()?;
        let codes: Vec<(u64, u64)> = lines
            .take(FILES * FUNCTIONS)
            .map_while(Result::ok)
            .filter_map(|l| {
                let (a, n) = l.split_once(' ')?;
                Some((a.parse().ok()?, n.parse::<u64>().ok()? / 2))
            })
            .collect();
        pys.push(PyProc { pid: child.id(), minor, codes });
        children.push(child);
    }
    let helpers = Helpers::from(children);
    (pys.iter().all(|p| p.minor == 11 && p.codes.len() == FILES * FUNCTIONS)).then_some((helpers, pys))
}

/// Addresses of named functions of the interpreter's executable mappings in `pid`.
fn named(pid: u32, names: &[&str]) -> Vec<(u64, u64)> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let inspector = Inspector::new();
    let src = Source::Elf(Elf { debug_syms: false, ..Elf::new(exe.clone()) });
    let mut found: Vec<(String, u64, u64)> = Vec::new();
    let _ = inspector.for_each(&src, |s| {
        if let (SymType::Function, Some(off), Some(size)) = (s.sym_type, s.file_offset, s.size)
            && names.contains(&&*s.name)
        {
            found.push((s.name.to_string(), off, size as u64));
        }
        ControlFlow::Continue(())
    });
    let maps = read_maps(pid);
    names
        .iter()
        .filter_map(|n| {
            let &(_, off, size) = found.iter().find(|f| f.0 == *n)?;
            let m = maps.iter().find(|m| *exe == *m.path && off >= m.offset && off < m.offset + (m.end - m.start))?;
            Some((m.start + off - m.offset, size))
        })
        .collect()
}

/// The interpreter's native frames, by role.
struct Native {
    /// Root first: what runs the script's first evaluation.
    root: Vec<(u64, u64)>,
    eval: (u64, u64),
    /// What one evaluation calls another through (a C extension calling back into Python).
    call: Vec<(u64, u64)>,
    /// Native work under a Python frame.
    leaves: Vec<(u64, u64)>,
}

impl Native {
    fn of(pid: u32) -> Self {
        let root = named(pid, &["Py_BytesMain", "Py_RunMain", "_PyRun_SimpleFileObject", "PyEval_EvalCode"]);
        let eval = named(pid, &["_PyEval_EvalFrameDefault"]);
        let call = named(pid, &["PyObject_Call", "_PyFunction_Vectorcall", "PyObject_Vectorcall"]);
        let leaves = named(
            pid,
            &[
                "PyNumber_Multiply",
                "PyNumber_Add",
                "PyObject_GetAttr",
                "PyDict_GetItem",
                "PyObject_Malloc",
                "PyList_Append",
            ],
        );
        assert!(
            !eval.is_empty() && !call.is_empty() && !leaves.is_empty(),
            "python3 exports its interpreter's functions"
        );
        Self { root, eval: eval[0], call, leaves }
    }
}

/// A training node's CPU's share of busy ticks: the training process and its six DataLoader
/// workers each keep a CPU busy; the other CPUs idle.
pub fn busy_share(cpu: u32, _cpus: u32) -> f64 {
    if cpu < 7 { 0.95 } else { 0.03 }
}

/// `distinct` raw stacks of the Python processes `procs[first..]` (described by `pys`), with
/// the same popularity as the native pool: Python frames 12–40 deep over 1–4 evaluations,
/// paths sharing their outer frames (a training loop's), one sample in five in the kernel.
pub fn pool(distinct: usize, procs: &[Proc], pys: &[PyProc], kernel: &KernelText, rng: &mut Rng) -> Pool {
    let natives: Vec<Native> = pys.iter().map(|p| Native::of(p.pid)).collect();
    let mut stacks = Vec::with_capacity(distinct);
    let mut seen = std::collections::HashSet::new();
    while stacks.len() < distinct {
        let which = rng.below(pys.len() as u64) as usize;
        let (py, native) = (&pys[which], &natives[which]);
        let proc = procs.iter().position(|p| p.pid == py.pid).expect("a Python helper");
        let depth = 12 + rng.below(29) as usize;
        let evaluations = 1 + rng.below(4) as usize;
        let mut node = which as u64 + 1;
        // Root first: (code, unit) per Python frame.
        let mut frames: Vec<(u64, u64)> = Vec::with_capacity(depth);
        for level in 0..depth {
            let choice = if level < 4 || rng.unit() < 0.8 { 0 } else { 1 + rng.below(3) };
            node = mix(node, choice);
            let (code, units) = py.codes[(node % py.codes.len() as u64) as usize];
            // Callers stop at a call site their path decides; the leaf anywhere in its body.
            let unit = if level + 1 == depth { rng.below(units) } else { (node >> 17) % units };
            frames.push((code, unit));
        }
        // Where each evaluation starts (root first); the first one at the root.
        let mut starts: Vec<usize> = (1..evaluations).map(|_| 1 + rng.below(depth as u64 - 1) as usize).collect();
        starts.push(0);
        starts.sort_unstable();
        starts.dedup();
        let mut words = Vec::with_capacity(depth * 2);
        for (i, &(code, unit)) in frames.iter().enumerate().rev() {
            let entry = if starts.contains(&i) { ENTRY_FRAME } else { 0 };
            words.extend_from_slice(&[code, (code + CODE_ADAPTIVE_311 + 2 * unit) | entry]);
        }
        // Native, root first: the root chain, an evaluation per start, calls between them.
        let mut user: Vec<u64> = native.root.iter().map(|&f| call_site(f, node)).collect();
        for k in 0..starts.len() {
            if k > 0 {
                let via = native.call[(mix(node, k as u64) % native.call.len() as u64) as usize];
                user.push(call_site(via, node ^ k as u64));
            }
            user.push(call_site(native.eval, mix(node, 100 + k as u64)));
        }
        if rng.unit() < 0.5 {
            user.push(native.leaves[rng.below(native.leaves.len() as u64) as usize].0 + 1);
        }
        user.reverse();
        let kernel = if rng.unit() < 0.2 {
            let chain = kernel.chains.get(rng.below(kernel.chains.len() as u64) as usize).map_or(&[][..], |c| c);
            kernel_walk(chain, &kernel.vocabulary, 3 + rng.below(6) as usize, rng)
        } else {
            Vec::new()
        };
        if seen.insert((proc, kernel.clone(), user.clone(), words.clone())) {
            stacks.push(RawStack { proc, kernel, user, python: words });
        }
    }
    Pool::zipf(stacks)
}
