//! Finding `libcuda.so.1` (the driver) and `libcudart.so.*` (the runtime) in a process and the
//! functions to probe in them.

use std::{collections::BTreeMap, path::PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};
use profiler_common::cuda::{cookie, kind, lookup};

use crate::collect::cuda::{Probe, Program};

/// The library's file name, as NVIDIA's driver installs it (the runtime and every framework
/// open it by this name).
pub const LIBRARY: &str = "libcuda.so";
/// The runtime library's file name (`libcudart.so.12`, the nvidia-cuda-runtime wheel's and
/// the toolkit's): its launches name their kernel by host stub.
pub const RUNTIME: &str = "libcudart.so";

/// Which of the two libraries a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Driver,
    Runtime,
}

impl Role {
    pub fn file_name(self) -> &'static str {
        match self {
            Role::Driver => LIBRARY,
            Role::Runtime => RUNTIME,
        }
    }
}

/// The libraries a process maps.
#[derive(Debug, Default)]
pub struct Found {
    pub driver: Option<Mapped>,
    pub runtime: Option<Mapped>,
}

/// A library file mapped by a process: the same file (device and inode) is probed once however
/// many processes map it, under whatever path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: String,
    pub inode: u64,
}

/// Where a process maps the library: its identity and a path the daemon can open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub id: FileId,
    /// `/proc/PID/root` + the path in the process's mount namespace (for messages).
    pub path: PathBuf,
    /// `/proc/PID/map_files/START-END`: the very file mapped, whatever its path now holds.
    pub map_files: PathBuf,
}

/// Lines of a process's maps read at most when looking for the library.
const MAPS_LINES_MAX: usize = 200_000;

/// The CUDA driver and runtime libraries process `pid` maps: its maps read a line at a time
/// (they can be megabytes), until both are found.
pub fn find_in_maps(pid: u32) -> Found {
    use std::io::BufRead;
    let mut found = Found::default();
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/maps")) else { return found };
    let mut reader = std::io::BufReader::with_capacity(64 << 10, file);
    let mut line = String::new();
    for _ in 0..MAPS_LINES_MAX {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // Cheap test first: most lines are neither library.
        if !line.contains("libcuda") {
            continue;
        }
        if found.driver.is_none() {
            found.driver = find_named(pid, &line, LIBRARY);
        }
        if found.runtime.is_none() {
            found.runtime = find_named(pid, &line, RUNTIME);
        }
        if found.driver.is_some() && found.runtime.is_some() {
            break;
        }
    }
    found
}

/// The CUDA driver library `maps` (a `/proc/PID/maps` text) shows mapped, if any.
pub fn find(pid: u32, maps: &str) -> Option<Mapped> {
    find_named(pid, maps, LIBRARY)
}

/// The library whose file name starts with `library` that `maps` shows mapped, if any.
pub fn find_named(pid: u32, maps: &str, library: &str) -> Option<Mapped> {
    for line in maps.lines() {
        let mut f = line.split_ascii_whitespace();
        let (range, _perms, _off, dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let Some(path) = f.next() else { continue };
        // A deleted or replaced file cannot be opened by its path (a following word: "(deleted)").
        if f.next().is_some() || !path.starts_with('/') {
            continue;
        }
        let name = path.rsplit('/').next().unwrap_or("");
        if !name.starts_with(library) {
            continue;
        }
        let Ok(inode) = inode.parse() else { continue };
        if inode == 0 {
            continue;
        }
        return Some(Mapped {
            id: FileId { dev: dev.to_string(), inode },
            path: PathBuf::from(format!("/proc/{pid}/root{path}")),
            map_files: PathBuf::from(format!("/proc/{pid}/map_files/{range}")),
        });
    }
    None
}

/// The driver API functions probed, with what each counts.
pub fn functions() -> Vec<(&'static str, u64, bool)> {
    // The kernel's handle: cuLaunchKernel(f, ...), cuLaunchCooperativeKernel(f, ...),
    // cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, ...).
    let launch = cookie::make(kind::LAUNCH, 0, cookie::FUNC_ARG);
    let launch_ex = cookie::make(kind::LAUNCH, 1, cookie::FUNC_ARG);
    let graph = cookie::make(kind::LAUNCH, 0, cookie::GRAPH);
    let sync = cookie::make(kind::SYNC, 0, cookie::BYTES_NONE);
    let copy = |arg| cookie::make(kind::COPY, arg, cookie::BYTES_ARG);
    let copy_2d = cookie::make(kind::COPY, 0, cookie::BYTES_2D);
    let copy_3d = cookie::make(kind::COPY, 0, cookie::BYTES_NONE);
    let mut v = Vec::new();
    for name in ["cuLaunchKernel", "cuLaunchCooperativeKernel", "cuLaunchKernel_ptsz", "cuLaunchCooperativeKernel_ptsz"]
    {
        v.push((name, launch, false));
    }
    for name in ["cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"] {
        v.push((name, launch_ex, false));
    }
    for name in ["cuGraphLaunch", "cuGraphLaunch_ptsz"] {
        v.push((name, graph, false));
    }
    // CUDA 13 adds cuCtxSynchronize_v2(ctx) (an H200 run with CUDA 13 counted no wait at all
    // among a PyTorch job's 600 torch.cuda.synchronize() calls).
    for name in [
        "cuStreamSynchronize",
        "cuStreamSynchronize_ptsz",
        "cuEventSynchronize",
        "cuCtxSynchronize",
        "cuCtxSynchronize_v2",
    ] {
        v.push((name, sync, true));
    }
    // (dst, src, bytes[, stream]): the byte count is the third argument. The v1 names (no `_v2`)
    // take a 32-bit count whose register's upper half is undefined, and an older 2D layout:
    // left out (programs built since CUDA 3.2 call the `_v2` ones).
    for name in [
        "cuMemcpy",
        "cuMemcpy_ptds",
        "cuMemcpyAsync",
        "cuMemcpyAsync_ptsz",
        "cuMemcpyHtoD_v2",
        "cuMemcpyHtoD_v2_ptds",
        "cuMemcpyDtoH_v2",
        "cuMemcpyDtoH_v2_ptds",
        "cuMemcpyDtoD_v2",
        "cuMemcpyDtoD_v2_ptds",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyHtoDAsync_v2_ptsz",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyDtoHAsync_v2_ptsz",
        "cuMemcpyDtoDAsync_v2",
        "cuMemcpyDtoDAsync_v2_ptsz",
    ] {
        v.push((name, copy(2), false));
    }
    // (dst, dstContext, src, srcContext, bytes[, stream]).
    for name in ["cuMemcpyPeer", "cuMemcpyPeer_ptds", "cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz"] {
        v.push((name, copy(4), false));
    }
    for name in [
        "cuMemcpy2D_v2",
        "cuMemcpy2D_v2_ptds",
        "cuMemcpy2DAsync_v2",
        "cuMemcpy2DAsync_v2_ptsz",
        "cuMemcpy2DUnaligned_v2",
        "cuMemcpy2DUnaligned_v2_ptds",
    ] {
        v.push((name, copy_2d, false));
    }
    for name in ["cuMemcpy3D_v2", "cuMemcpy3D_v2_ptds", "cuMemcpy3DAsync_v2"] {
        v.push((name, copy_3d, false));
    }
    v
}

/// The driver's look-ups that name a kernel before it is launched by handle (Triton, cuBLAS),
/// probed at entry and return (`cuda_lookup`): `(&handle, ..., name or kernel)`.
pub fn lookups() -> Vec<(&'static str, u64, bool)> {
    vec![
        ("cuModuleGetFunction", cookie::make(lookup::NAMED, 2, cookie::BYTES_NONE), true),
        ("cuLibraryGetKernel", cookie::make(lookup::NAMED, 2, cookie::BYTES_NONE), true),
        ("cuKernelGetFunction", cookie::make(lookup::ALIAS, 1, cookie::BYTES_NONE), true),
    ]
}

/// The runtime's launches (their host stub or `cudaKernel_t`, passed on to the driver's launch
/// probe) and CUDA 13's `__cudaGetKernel(&kernel, stub)`.
pub fn runtime_functions() -> Vec<(&'static str, u64, bool)> {
    let launch = |arg| cookie::make(lookup::RUNTIME_LAUNCH, arg, cookie::BYTES_NONE);
    let mut v = Vec::new();
    for name in
        ["cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernel_ptsz"]
    {
        v.push((name, launch(0), false));
    }
    // cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args).
    for name in ["cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz"] {
        v.push((name, launch(1), false));
    }
    v.push(("__cudaGetKernel", cookie::make(lookup::STUB, 1, cookie::BYTES_NONE), true));
    v
}

/// Opens the file a process maps, through `map_files` (the mapped inode itself: a path
/// replaced or a link planted since cannot redirect it), and checks that it is the file the maps
/// named and one no user but root can change: a driver's library is root's, and the daemon (root)
/// must not parse and plant probes in a file a user can rewrite or truncate under it.
pub fn open(m: &Mapped) -> Result<std::fs::File, LibraryError> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(&m.map_files).map_err(|e| LibraryError::Read(m.path.clone(), e))?;
    let meta = file.metadata().map_err(|e| LibraryError::Read(m.path.clone(), e))?;
    let dev = format!("{:02x}:{:02x}", libc::major(meta.dev()), libc::minor(meta.dev()));
    if meta.ino() != m.id.inode || dev != m.id.dev {
        return Err(LibraryError::Changed(m.path.clone()));
    }
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(LibraryError::NotRoots(m.path.clone(), meta.uid(), meta.mode() & 0o7777));
    }
    Ok(file)
}

#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("{0} changed between reading the process's maps and opening it")]
    Changed(PathBuf),
    #[error(
        "{0} is owned by uid {1} with mode {2:o}: only a library root owns and no one else can write is probed (a user's file could be rewritten under the daemon)"
    )]
    NotRoots(PathBuf, u32, u32),
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not an ELF file this daemon reads: {1}")]
    Elf(PathBuf, String),
    #[error("{0} does not export the CUDA driver's entry points (cuInit, cuLaunchKernel): not a CUDA driver library")]
    NoFunctions(PathBuf),
    #[error(
        "{0} does not export the CUDA runtime's entry points (cudaGetDeviceCount, cudaLaunchKernel): not a CUDA runtime library"
    )]
    NoRuntimeFunctions(PathBuf),
}

/// The entry points a CUDA driver library exports, whatever its version: a file named
/// `libcuda.so*` without them (a root-owned libLLVM bind-mounted under that name in a user's
/// namespace) is refused before a probe is planted or a slot taken.
const DRIVER_EXPORTS: [&str; 2] = ["cuInit", "cuLaunchKernel"];
/// The runtime's: every `libcudart` since CUDA 7 exports both.
const RUNTIME_EXPORTS: [&str; 2] = ["cudaGetDeviceCount", "cudaLaunchKernel"];

/// The probes for the library at `path`: each function it defines, at its file offset. Names
/// it lacks are skipped; aliases of one address (a `_v2` and its plain name) are probed once.
/// Only the dynamic symbol table counts: a driver exports its API there.
pub fn probes(file: &std::fs::File, path: &std::path::Path, role: Role) -> Result<Vec<Probe>, LibraryError> {
    // Mapped, not read: a real libcuda is tens of megabytes and only its symbol tables and
    // headers are touched (page cache, not the daemon's memory). Only root can truncate it
    // under the mapping ([`open`]).
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| LibraryError::Read(path.into(), e))?;
    let elf = object::File::parse(&*map).map_err(|e| LibraryError::Elf(path.into(), e.to_string()))?;
    let (counted, looked_up, exports_wanted) = match role {
        Role::Driver => (functions(), lookups(), &DRIVER_EXPORTS),
        Role::Runtime => (Vec::new(), runtime_functions(), &RUNTIME_EXPORTS),
    };
    let wanted: BTreeMap<&str, (u64, bool, Program)> = counted
        .into_iter()
        .map(|(n, c, r)| (n, (c, r, Program::Call)))
        .chain(looked_up.into_iter().map(|(n, c, r)| (n, (c, r, Program::Lookup))))
        .collect();
    let mut found: BTreeMap<u64, Probe> = BTreeMap::new();
    let mut exports = 0;
    for sym in elf.dynamic_symbols() {
        let Ok(name) = sym.name() else { continue };
        if sym.address() == 0 || !sym.is_definition() || !sym.is_global() {
            continue;
        }
        if exports_wanted.contains(&name) {
            exports += 1;
        }
        let Some(&(cookie, returns, program)) = wanted.get(name) else { continue };
        let Some((offset, in_segment, segment)) = place(&elf, sym.address()) else { continue };
        let cookie = cookie::with_segment(cookie, in_segment, segment);
        found.entry(offset).or_insert(Probe { offset, cookie, returns, program });
    }
    if found.is_empty() || exports < exports_wanted.len() {
        return Err(match role {
            Role::Driver => LibraryError::NoFunctions(path.into()),
            Role::Runtime => LibraryError::NoRuntimeFunctions(path.into()),
        });
    }
    Ok(found.into_values().collect())
}

/// Where virtual address `addr` is: its file offset, its offset in the loadable segment holding
/// it, and that segment's size.
fn place(elf: &object::File<'_>, addr: u64) -> Option<(u64, u64, u64)> {
    elf.segments().find_map(|s| {
        let (start, size) = (s.address(), s.size());
        let (off, fsize) = s.file_range();
        (addr >= start && addr < start + size && addr - start < fsize)
            .then(|| (off + (addr - start), addr - start, size))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_found_by_name_with_its_file_identity() {
        let maps = "\
55d0c000-55d0d000 r-xp 00000000 08:01 1234 /usr/bin/python3.12
7f00a000-7f00b000 r-xp 00010000 08:01 98765 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f00c000-7f00d000 r-xp 00000000 08:01 4321 /usr/lib/libc.so.6
";
        let m = find(42, maps).expect("found");
        assert_eq!(m.id, FileId { dev: "08:01".into(), inode: 98765 });
        assert_eq!(m.path, PathBuf::from("/proc/42/root/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"));
        assert_eq!(m.map_files, PathBuf::from("/proc/42/map_files/7f00a000-7f00b000"));
    }

    #[test]
    fn the_runtime_is_found_beside_the_driver() {
        let maps = "\
7f00a000-7f00b000 r-xp 00010000 08:01 98765 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f00c000-7f00d000 r-xp 00000000 08:01 4321 /venv/nvidia/cuda_runtime/lib/libcudart.so.12
";
        let m = find_named(42, maps, RUNTIME).expect("found");
        assert_eq!(m.id, FileId { dev: "08:01".into(), inode: 4321 });
        assert_eq!(find(42, maps).expect("driver").id.inode, 98765);
    }

    #[test]
    fn launches_name_their_kernel_argument_and_graphs_are_graphs() {
        let f = functions();
        let c = |name: &str| f.iter().find(|(n, _, _)| *n == name).expect(name).1;
        assert_eq!((cookie::how(c("cuLaunchKernel")), cookie::arg(c("cuLaunchKernel"))), (cookie::FUNC_ARG, 0));
        assert_eq!((cookie::how(c("cuLaunchKernelEx")), cookie::arg(c("cuLaunchKernelEx"))), (cookie::FUNC_ARG, 1));
        assert_eq!(cookie::how(c("cuGraphLaunch")), cookie::GRAPH);
        let r = runtime_functions();
        assert!(r.iter().any(|(n, c, ret)| *n == "__cudaGetKernel" && *ret && cookie::kind(*c) == lookup::STUB));
        assert!(lookups().iter().all(|(_, c, ret)| *ret && cookie::kind(*c) >= lookup::NAMED));
    }

    #[test]
    fn deleted_files_and_other_libraries_are_not_probed() {
        assert_eq!(find(1, "7f00a000-7f00b000 r-xp 0 08:01 98 /tmp/libcuda.so.1 (deleted)\n"), None);
        assert_eq!(find(1, "7f00a000-7f00b000 r-xp 0 08:01 98 /usr/lib/libcudart.so.12\n"), None);
        assert_eq!(find(1, "7f00a000-7f00b000 rw-p 0 00:00 0 \n"), None);
    }

    #[test]
    fn every_launch_path_and_synchronisation_is_probed_and_only_syncs_return() {
        let f = functions();
        for name in
            ["cuLaunchKernel", "cuLaunchKernelEx_ptsz", "cuGraphLaunch", "cuMemcpyHtoDAsync_v2", "cuCtxSynchronize"]
        {
            assert!(f.iter().any(|(n, _, _)| *n == name), "{name}");
        }
        for (name, c, returns) in f {
            assert_eq!(returns, cookie::kind(c) == kind::SYNC, "{name}");
        }
    }
}
