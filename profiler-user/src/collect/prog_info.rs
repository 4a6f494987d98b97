//! `bpf_prog_info` of a loaded program, read with the bpf syscall: aya 0.14's `ProgramInfo`
//! does not expose `recursion_misses`, the count of runs the kernel skipped because another
//! BPF program was already running on that CPU (such a sample is never taken), nor the run
//! time and count the kernel keeps while `kernel.bpf_stats_enabled` is 1.

use std::os::fd::{AsRawFd, BorrowedFd};

/// `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
/// Byte offsets in `struct bpf_prog_info` (uapi/linux/bpf.h) of `run_time_ns` and `run_cnt`
/// (5.1+), and `recursion_misses` (5.12+; older kernels return a shorter struct).
const RUN_TIME_NS: usize = 192;
const RUN_CNT: usize = 200;
const RECURSION_MISSES: usize = 208;
/// `verified_insns` (5.16+): instructions the verifier processed to accept the program.
const VERIFIED_INSNS: usize = 216;

/// A program's statistics: time and runs (counted only while `kernel.bpf_stats_enabled` is 1),
/// and runs skipped because another BPF program was running on the CPU.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub recursion_misses: Option<u64>,
    /// Instructions the verifier processed (kernels older than 5.16 do not say).
    pub verified_insns: Option<u32>,
}

/// `union bpf_attr` as `BPF_OBJ_GET_INFO_BY_FD` reads it.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

pub fn recursion_misses(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    stats(fd)?.recursion_misses.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::Unsupported, "kernel older than 5.12: no recursion_misses")
    })
}

pub fn stats(fd: BorrowedFd<'_>) -> std::io::Result<Stats> {
    // Larger than any kernel's struct so far; the kernel checks the extra bytes are zero.
    let mut info = [0u64; 64];
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: attr points at a buffer of info_len bytes that outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>() as u32,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let has = |offset: usize| attr.info_len as usize >= offset + 8;
    let field = |offset: usize| if has(offset) { info[offset / 8] } else { 0 };
    Ok(Stats {
        run_time_ns: field(RUN_TIME_NS),
        run_cnt: field(RUN_CNT),
        recursion_misses: has(RECURSION_MISSES).then(|| info[RECURSION_MISSES / 8]),
        // A 4-byte field at an 8-byte boundary: the low half of its word (little-endian).
        verified_insns: (attr.info_len as usize >= VERIFIED_INSNS + 4).then(|| info[VERIFIED_INSNS / 8] as u32),
    })
}
