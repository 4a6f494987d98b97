//! The unwind tables' home in the kernel: the rows array (mapped into this process, so a table
//! is written with one copy instead of a syscall per row), the per-process mapping tables, and
//! the unwinder program in the sampler's tail-call slot.

use std::os::fd::{AsFd, AsRawFd};

use aya::{
    Ebpf,
    maps::{HashMap, MapData, ProgramArray},
    programs::PerfEvent,
};
use profiler_common::{
    python::{PYTHON_PROGRAM, PyProc},
    unwind::{ProcessTable, Row, UNWIND_PROGRAM},
};

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("the BPF object has no {0}")]
    Missing(&'static str),
    #[error("the unwinder program was rejected: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("unwind map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    #[error("cannot map the unwind rows into memory: {0}")]
    Mmap(#[source] std::io::Error),
}

/// Where tables and process descriptions are written.
pub trait Tables {
    /// Room for this many rows in all.
    fn capacity(&self) -> usize;
    /// Writes `rows` from row `start` on.
    fn write_rows(&mut self, start: usize, rows: &[Row]);
    fn set_process(&mut self, pid: u32, table: &ProcessTable) -> Result<(), String>;
    fn remove_process(&mut self, pid: u32);
    /// Describes (or, with `None`, forgets) the CPython interpreter of a process.
    fn set_python(&mut self, pid: u32, python: Option<&PyProc>);
}

/// The rows array, mapped shared and writable.
struct RowsMmap {
    ptr: *mut Row,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is owned by this value and only written through `&mut self`.
unsafe impl Send for RowsMmap {}

impl Drop for RowsMmap {
    fn drop(&mut self) {
        // SAFETY: mapped in `Maps::load` with this length.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

pub struct Maps {
    rows: RowsMmap,
    // Kept so the map lives as long as its mapping.
    _rows_map: MapData,
    procs: HashMap<MapData, u32, ProcessTable>,
    python: Option<HashMap<MapData, u32, PyProc>>,
}

impl Maps {
    /// Loads the unwinder program into the sampler's tail-call slot and takes the maps.
    pub fn load(ebpf: &mut Ebpf) -> Result<Self, KernelError> {
        let program: &mut PerfEvent =
            ebpf.program_mut("unwind_user").ok_or(KernelError::Missing("program unwind_user"))?.try_into()?;
        program.load()?;
        let fd =
            program.fd()?.try_clone().map_err(|e| KernelError::Program(aya::programs::ProgramError::IOError(e)))?;
        let mut slots: ProgramArray<_> = ebpf
            .map_mut("PROGRAMS")
            .ok_or(KernelError::Missing("map PROGRAMS"))?
            .try_into()
            .map_err(|e| KernelError::Map("PROGRAMS", e))?;
        slots.set(UNWIND_PROGRAM, &fd, 0).map_err(|e| KernelError::Map("PROGRAMS", e))?;
        // Python frames are a bonus: without the program, stacks are native only.
        let python = match Self::load_python(ebpf) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "Python frames unavailable: Python code shows as interpreter frames");
                None
            }
        };
        let rows_map = match ebpf.take_map("UNWIND_ROWS") {
            Some(aya::maps::Map::Array(m)) => m,
            _ => return Err(KernelError::Missing("map UNWIND_ROWS")),
        };
        let len = rows_map.info().map_err(|e| KernelError::Map("UNWIND_ROWS", e))?.max_entries() as usize;
        let page = 4096;
        let bytes = (len * size_of::<Row>()).div_ceil(page) * page;
        // SAFETY: an mmapable array map of `len` rows; the kernel checks the length and flags.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                rows_map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(KernelError::Mmap(std::io::Error::last_os_error()));
        }
        let procs = ebpf.take_map("UNWIND_PROCS").ok_or(KernelError::Missing("map UNWIND_PROCS"))?;
        let procs = HashMap::try_from(procs).map_err(|e| KernelError::Map("UNWIND_PROCS", e))?;
        Ok(Self { rows: RowsMmap { ptr: ptr.cast(), len, bytes }, _rows_map: rows_map, procs, python })
    }

    fn load_python(ebpf: &mut Ebpf) -> Result<HashMap<MapData, u32, PyProc>, KernelError> {
        let program: &mut PerfEvent =
            ebpf.program_mut("python_frames").ok_or(KernelError::Missing("program python_frames"))?.try_into()?;
        program.load()?;
        let fd =
            program.fd()?.try_clone().map_err(|e| KernelError::Program(aya::programs::ProgramError::IOError(e)))?;
        let mut slots: ProgramArray<_> = ebpf
            .map_mut("PROGRAMS")
            .ok_or(KernelError::Missing("map PROGRAMS"))?
            .try_into()
            .map_err(|e| KernelError::Map("PROGRAMS", e))?;
        slots.set(PYTHON_PROGRAM, &fd, 0).map_err(|e| KernelError::Map("PROGRAMS", e))?;
        let map = ebpf.take_map("PY_PROCS").ok_or(KernelError::Missing("map PY_PROCS"))?;
        HashMap::try_from(map).map_err(|e| KernelError::Map("PY_PROCS", e))
    }
}

impl Tables for Maps {
    fn capacity(&self) -> usize {
        self.rows.len
    }

    fn write_rows(&mut self, start: usize, rows: &[Row]) {
        assert!(start + rows.len() <= self.rows.len, "the allocator hands out ranges inside the array");
        // SAFETY: in bounds (checked above); the sampler only reads rows a process table
        // points at, and a range is written before any table points at it.
        unsafe { std::ptr::copy_nonoverlapping(rows.as_ptr(), self.rows.ptr.add(start), rows.len()) };
    }

    fn set_process(&mut self, pid: u32, table: &ProcessTable) -> Result<(), String> {
        self.procs.insert(pid, table, 0).map_err(|e| e.to_string())
    }

    fn remove_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
        self.set_python(pid, None);
    }

    fn set_python(&mut self, pid: u32, python: Option<&PyProc>) {
        let Some(map) = self.python.as_mut() else { return };
        let _ = match python {
            Some(p) => map.insert(pid, p, 0),
            None => map.remove(&pid),
        };
    }
}
