//! The replay bench's Python training node (`--python`): real CPython processes of each
//! version the reader knows (3.9 to 3.14), whose code objects the symbolizer reads, and stacks
//! as the sampler sends them for such a node (native frames through the interpreter's
//! evaluation loop, then the Python frame pairs in that version's words).
//!
//! Python frames cannot be made up: the symbolizer names a frame by reading its code object
//! out of the process (`process_vm_readv`). So each helper is an interpreter that compiles a
//! training program's worth of functions (`FILES` files of `FUNCTIONS` methods each, `LINES`
//! lines long), prints the address of every code object and the length of its bytecode, and
//! sleeps; the records point into those objects at real instruction offsets.
//!
//! The machine's `python3` is 3.11; the other versions are the Python test's interpreters, each
//! in its `debootstrap` root (`cargo xtask setup`, `xtask/src/python_roots.rs`), run through
//! `chroot` as a container's would be. Each process's layout is found as the daemon's unwind
//! stage finds it (`_PyRuntime` in the mapped interpreter, then `CPython::layout`: a table for
//! 3.9-3.12, `_Py_DebugOffsets` read from the process for 3.13+), and the records follow it:
//! - 3.9, 3.10: every Python frame is its own evaluation (a frame object per call), sent as
//!   `(code, f_lasti << 1 | ENTRY_FRAME)`, `f_lasti` a byte offset (3.9) or an instruction index
//!   (3.10); the native stack has an evaluation loop frame per Python frame;
//! - 3.11: `(code, instruction address | ENTRY_FRAME on an evaluation's first frame)`;
//! - 3.12+: `(code, instruction address)`, and a C-stack shim pair `(0, ENTRY_FRAME)` after an
//!   evaluation's first frame; 3.13 and 3.14 (Debian's) run their loop in a function split off
//!   `_PyEval_EvalFrameDefault`, so their native evaluation frames are addresses in it.

use std::{
    io::{BufRead, BufReader},
    ops::ControlFlow,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
    sync::Arc,
};

use crate::synth::Rng;
use blazesym::{
    SymType,
    inspect::{
        Inspector,
        source::{Elf, Source},
    },
};
use profiler::{
    interpreter::{
        Runtime,
        python::{CPython, Layout, LineFormat, eval_body},
    },
    unwind::table,
};
use profiler_common::python::{ENTRY_FRAME, NONE};

use super::workload::{
    CALL_SITES, EVAL_CALL_SITES, Helpers, KernelText, Pool, Proc, RawStack, anywhere, call_site, kernel_walk, mix,
    read_maps,
};

/// Source files per process, methods per file, lines per method: 2,000 code objects of 12
/// lines, what a training script and the library code it runs through make hot.
const FILES: usize = 40;
const FUNCTIONS: usize = 50;
const LINES: usize = 10;

/// The interpreters, by minor version: the root they run in (`None`: the machine's own) and
/// their path there.
pub const VERSIONS: [(u8, Option<&str>, &str); 6] = [
    (9, Some("bullseye"), "/usr/bin/python3.9"),
    (10, Some("jammy"), "/usr/bin/python3.10"),
    (11, None, "/usr/bin/python3.11"),
    (12, Some("noble"), "/usr/bin/python3.12"),
    (13, Some("sid"), "/usr/bin/python3.13"),
    (14, Some("sid"), "/usr/bin/python3.14"),
];

/// Where the Python test's roots are (`PROFILER_PYTHON_ROOTS`, as `xtask/src/python_roots.rs`).
fn roots() -> PathBuf {
    std::env::var_os("PROFILER_PYTHON_ROOTS").map_or_else(|| "/var/cache/profiler-tests/roots".into(), PathBuf::from)
}

/// The root and interpreter of 3.`minor`, when this machine has it.
pub fn interpreter(minor: u8) -> Option<(Option<PathBuf>, &'static str)> {
    let &(_, root, bin) = VERSIONS.iter().find(|v| v.0 == minor)?;
    let root = root.map(|r| roots().join(r));
    let on_host = root.as_ref().map_or_else(|| PathBuf::from(bin), |r| r.join(bin.trim_start_matches('/')));
    on_host.is_file().then_some((root, bin))
}

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

/// A Python process: its pid, its layout (as the daemon reads it) and code objects (address,
/// code units).
pub struct PyProc {
    pub pid: u32,
    pub layout: Arc<Layout>,
    /// The interpreter file's load bias (where its ELF addresses are in the process).
    pub bias: u64,
    pub codes: Vec<(u64, u64)>,
}

/// `n` helpers running CPython 3.`minor`, each with its code objects listed; `None` when this
/// machine lacks that interpreter or its layout cannot be read.
pub fn spawn(n: usize, minor: u8) -> Option<(Helpers, Vec<PyProc>)> {
    let (root, bin) = interpreter(minor)?;
    let mut children = Vec::new();
    let mut pys = Vec::new();
    for _ in 0..n {
        let mut cmd = Command::new(bin);
        cmd.args(["-c", SCRIPT, &FILES.to_string(), &FUNCTIONS.to_string(), &LINES.to_string()]);
        let root = root.as_ref().map(|r| std::ffi::CString::new(r.as_os_str().as_encoded_bytes()).expect("a path"));
        // SAFETY: prctl, chroot and chdir are async-signal-safe; `root` lives in the closure.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if let Some(r) = &root
                    && (libc::chroot(r.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0)
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().ok()?;
        let mut lines = BufReader::new(child.stdout.take()?).lines();
        let said: u8 = lines.next()?.ok()?.trim().parse().ok()?;
        let codes: Vec<(u64, u64)> = lines
            .take(FILES * FUNCTIONS)
            .map_while(Result::ok)
            .filter_map(|l| {
                let (a, n) = l.split_once(' ')?;
                Some((a.parse().ok()?, n.parse::<u64>().ok()? / 2))
            })
            .collect();
        let pid = child.id();
        children.push(child);
        let (layout, bias) = layout_of(pid)?;
        if said != minor || layout.minor != minor || codes.len() != FILES * FUNCTIONS {
            return None;
        }
        pys.push(PyProc { pid, layout: Arc::new(layout), bias, codes });
    }
    Some((Helpers::from(children), pys))
}

/// The layout of `pid`'s interpreter, found as the daemon's unwind stage finds it: the first
/// mapped file named like CPython whose `_PyRuntime` is found, placed by its load bias (also
/// returned).
fn layout_of(pid: u32) -> Option<(Layout, u64)> {
    for m in read_maps(pid) {
        let Some(version) = CPython::version_of(&m.path) else { continue };
        let data = std::fs::read(&*m.path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let Some(vaddr) = CPython::state_in(&file) else { continue };
        let bias = table::bias(0, &table::loads(&file), m.start, m.offset)?;
        let state = bias.wrapping_add(vaddr);
        let layout = CPython::layout(pid, version, state).ok()?;
        return Some((Layout { eval_body: eval_body(&file), ..layout }, bias));
    }
    None
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
    fn of(py: &PyProc) -> Self {
        let pid = py.pid;
        let root = named(pid, &["Py_BytesMain", "Py_RunMain", "_PyRun_SimpleFileObject", "PyEval_EvalCode"]);
        // A loop split off its name (Debian's 3.13, 3.14) runs the frames: its addresses.
        let eval = match py.layout.eval_body {
            Some((start, end)) => vec![(py.bias + start, end - start)],
            None => named(pid, &["_PyEval_EvalFrameDefault"]),
        };
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
        assert!(!eval.is_empty() && !call.is_empty() && !leaves.is_empty(), "the interpreter exports its functions");
        Self { root, eval: eval[0], call, leaves }
    }
}

/// The sampler's words for one Python frame at code unit `unit` of `code`, as the walker
/// writes them for `layout`'s version (`profiler_common::python`), leaf first: the frame's
/// pair, then a shim pair after an evaluation's first frame where the version has shims.
fn frame_words(layout: &Layout, code: u64, unit: u64, entry: bool, out: &mut Vec<u64>) {
    if layout.proc.every_frame_entry != 0 {
        // `f_lasti`: a byte offset (3.9) or an instruction index (3.10).
        let lasti = if layout.lines == LineFormat::Lnotab { 2 * unit } else { unit };
        out.extend_from_slice(&[code, (lasti << 1) | ENTRY_FRAME]);
        return;
    }
    let instr = code + layout.code_adaptive + 2 * unit;
    if layout.proc.owner_shim == NONE {
        out.extend_from_slice(&[code, instr | if entry { ENTRY_FRAME } else { 0 }]);
    } else {
        out.extend_from_slice(&[code, instr]);
        if entry {
            out.extend_from_slice(&[0, ENTRY_FRAME]);
        }
    }
}

/// A training node's CPU's share of busy ticks: the training process and its six DataLoader
/// workers each keep a CPU busy; the other CPUs idle.
pub fn busy_share(cpu: u32, _cpus: u32) -> f64 {
    if cpu < 7 { 0.95 } else { 0.03 }
}

/// `distinct` raw stacks of the Python processes `procs[first..]` (described by `pys`), with
/// the same popularity as the native pool: Python frames 12–40 deep over 1–4 evaluations (one
/// per frame before 3.11),
/// paths sharing their outer frames (a training loop's), one sample in five in the kernel.
pub fn pool(distinct: usize, procs: &[Proc], pys: &[PyProc], kernel: &KernelText, rng: &mut Rng) -> Pool {
    let natives: Vec<Native> = pys.iter().map(Native::of).collect();
    let mut stacks = Vec::with_capacity(distinct);
    let mut seen = std::collections::HashSet::new();
    while stacks.len() < distinct {
        let which = rng.below(pys.len() as u64) as usize;
        let (py, native) = (&pys[which], &natives[which]);
        let proc = procs.iter().position(|p| p.pid == py.pid).expect("a Python helper");
        let depth = 12 + rng.below(29) as usize;
        // Before 3.11 each Python frame is an evaluation of its own.
        let every = py.layout.proc.every_frame_entry != 0;
        let evaluations = if every { depth } else { 1 + rng.below(4) as usize };
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
        let mut starts: Vec<usize> = if every {
            (0..depth).collect()
        } else {
            (1..evaluations).map(|_| 1 + rng.below(depth as u64 - 1) as usize).collect()
        };
        starts.push(0);
        starts.sort_unstable();
        starts.dedup();
        let mut words = Vec::with_capacity(depth * 2 + 8);
        for (i, &(code, unit)) in frames.iter().enumerate().rev() {
            frame_words(&py.layout, code, unit, starts.contains(&i), &mut words);
        }
        // Native, root first: the root chain, an evaluation per start, calls between them.
        // Return addresses from each function's few call sites (`workload::CALL_SITES`).
        let mut user: Vec<u64> = native.root.iter().map(|&f| call_site(f, node, CALL_SITES)).collect();
        for k in 0..starts.len() {
            if k > 0 {
                let via = native.call[(mix(node, k as u64) % native.call.len() as u64) as usize];
                user.push(call_site(via, node ^ k as u64, CALL_SITES));
            }
            user.push(call_site(native.eval, mix(node, 100 + k as u64), EVAL_CALL_SITES));
        }
        if rng.unit() < 0.5 {
            user.push(native.leaves[rng.below(native.leaves.len() as u64) as usize].0 + 1);
        } else if let Some(leaf) = user.last_mut() {
            // The innermost evaluation is running: its frame is the sampled instruction,
            // anywhere in the loop, not a return address.
            *leaf = anywhere(native.eval, mix(node, 200 + rng.below(1 << 20)));
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
