//! `bpf_prog_info` of a loaded program, read with the bpf syscall: aya 0.14's `ProgramInfo`
//! does not expose `recursion_misses`, the count of runs the kernel skipped because another
//! BPF program was already running on that CPU (such a sample is never taken).

use std::os::fd::{AsRawFd, BorrowedFd};

/// `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
/// Byte offset of `recursion_misses` in `struct bpf_prog_info` (uapi/linux/bpf.h; after
/// `run_time_ns` at 192 and `run_cnt` at 200). Kernels before 5.12 return a shorter struct.
const RECURSION_MISSES: usize = 208;

/// `union bpf_attr` as `BPF_OBJ_GET_INFO_BY_FD` reads it.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

pub fn recursion_misses(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
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
    if (attr.info_len as usize) < RECURSION_MISSES + 8 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "kernel older than 5.12: no recursion_misses",
        ));
    }
    Ok(info[RECURSION_MISSES / 8])
}
