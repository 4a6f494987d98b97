//! What differs between the architectures the program is built for (aya-build sets
//! `bpf_target_arch` from the userspace target: `cargo build --target aarch64-...` builds this
//! for arm64): the registers a sample interrupted, and whether it interrupted user code.
//!
//! x86_64 is what runs and is tested; aarch64 (Graviton, Grace) compiles and is untested (see
//! docs/arm64.md).

/// The registers of a `perf_event` sample (`bpf_user_pt_regs_t`: `pt_regs` on x86_64,
/// `user_pt_regs` on arm64), and the prefix of the kernel's `pt_regs` that
/// `bpf_task_pt_regs` points at on both.
pub(crate) use aya_ebpf::bindings::bpf_user_pt_regs_t as Regs;

/// The registers a user-stack walk starts from.
#[derive(Clone, Copy)]
pub(crate) struct Frame {
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer: rbp, x29.
    pub fp: u64,
}

#[cfg(bpf_target_arch = "x86_64")]
mod imp {
    use super::{Frame, Regs};

    /// The low two bits of CS are the privilege level the tick interrupted: 3 is user mode.
    #[inline(always)]
    pub(crate) fn user_mode(regs: &Regs) -> bool {
        regs.cs & 3 == 3
    }

    #[inline(always)]
    pub(crate) fn frame(regs: &Regs) -> Frame {
        Frame { ip: regs.rip, sp: regs.rsp, fp: regs.rbp }
    }

    /// The return address at a function's first instruction: on top of the stack (`call`
    /// pushed it).
    #[inline(always)]
    pub(crate) fn return_address(regs: &Regs) -> Option<u64> {
        unsafe { aya_ebpf::helpers::bpf_probe_read_user(regs.rsp as *const u64) }.ok()
    }

    /// Integer argument `n` (from 0) at a function's entry (System V: rdi, rsi, rdx, rcx, r8, r9).
    #[inline(always)]
    pub(crate) fn arg(regs: &Regs, n: usize) -> u64 {
        match n {
            0 => regs.rdi,
            1 => regs.rsi,
            2 => regs.rdx,
            3 => regs.rcx,
            4 => regs.r8,
            5 => regs.r9,
            _ => 0,
        }
    }

    /// Whether the bytes before `ra` end with a call instruction, so `ra` can be a return
    /// address (the stack scan's check): `call rel32` (e8), or `call` through a register or
    /// memory (ff /2) in its 2- to 7-byte forms; a REX prefix before ff changes nothing here.
    #[inline(always)]
    pub(crate) fn after_call(ra: u64) -> bool {
        let Ok(w) = (unsafe { aya_ebpf::helpers::bpf_probe_read_user((ra - 8) as *const u64) }) else {
            return false;
        };
        let b = w.to_le_bytes();
        // ModRM of `ff /2`: reg field 2; its mod and rm fields say what follows it.
        let call = |op: u8, modrm: u8| op == 0xff && (modrm & 0x38) == 0x10;
        let parts = |m: u8| (m >> 6, m & 7);
        b[3] == 0xe8
            // ff d0+r (call *%r), ff 10+r (call *(%r), not SIB or rip-relative)
            || (call(b[6], b[7]) && (parts(b[7]).0 == 3 || (parts(b[7]).0 == 0 && parts(b[7]).1 != 4 && parts(b[7]).1 != 5)))
            // disp8, or SIB without displacement
            || (call(b[5], b[6]) && ((parts(b[6]).0 == 1 && parts(b[6]).1 != 4) || (parts(b[6]).0 == 0 && parts(b[6]).1 == 4)))
            // SIB and disp8
            || (call(b[4], b[5]) && parts(b[5]).0 == 1 && parts(b[5]).1 == 4)
            // disp32, or rip-relative (ff 15)
            || (call(b[2], b[3]) && ((parts(b[3]).0 == 2 && parts(b[3]).1 != 4) || (parts(b[3]).0 == 0 && parts(b[3]).1 == 5)))
            // SIB and disp32
            || (call(b[1], b[2]) && parts(b[2]).0 == 2 && parts(b[2]).1 == 4)
    }

    /// Offsets of rbp, rsp and rip in the `ucontext` a signal trampoline's stack pointer points
    /// at (`uc_flags`, `uc_link`, `uc_stack`, then `sigcontext` with r8..r15 first).
    pub(crate) const UC_FP: u64 = 40 + 8 * 10;
    pub(crate) const UC_SP: u64 = 40 + 8 * 15;
    pub(crate) const UC_IP: u64 = 40 + 8 * 16;
}

#[cfg(bpf_target_arch = "aarch64")]
mod imp {
    use super::{Frame, Regs};

    /// `PSR_MODE_MASK` and `PSR_MODE_EL0t` (arch/arm64/include/uapi/asm/ptrace.h): the
    /// exception level the tick interrupted, as the kernel's `user_mode(regs)` reads it.
    const PSR_MODE_MASK: u64 = 0x0000_000f;
    const PSR_MODE_EL0T: u64 = 0x0000_0000;

    #[inline(always)]
    pub(crate) fn user_mode(regs: &Regs) -> bool {
        regs.pstate & PSR_MODE_MASK == PSR_MODE_EL0T
    }

    #[inline(always)]
    pub(crate) fn frame(regs: &Regs) -> Frame {
        Frame { ip: regs.pc, sp: regs.sp, fp: regs.regs[29] }
    }

    /// The return address at a function's first instruction: the link register (x30).
    #[inline(always)]
    pub(crate) fn return_address(regs: &Regs) -> Option<u64> {
        Some(regs.regs[30])
    }

    /// Integer argument `n` (from 0) at a function's entry (AAPCS64: x0 to x7).
    #[inline(always)]
    pub(crate) fn arg(regs: &Regs, n: usize) -> u64 {
        if n < 8 { regs.regs[n] } else { 0 }
    }

    /// Whether the instruction before `ra` is a call (`bl`, `blr`), so `ra` can be a return
    /// address (the stack scan's check).
    #[inline(always)]
    pub(crate) fn after_call(ra: u64) -> bool {
        let Ok(w) = (unsafe { aya_ebpf::helpers::bpf_probe_read_user((ra - 4) as *const u32) }) else {
            return false;
        };
        (w & 0xfc00_0000) == 0x9400_0000 || (w & 0xffff_fc1f) == 0xd63f_0000
    }

    /// At `__kernel_rt_sigreturn` sp points at `struct rt_sigframe`: a 128-byte `siginfo`, then
    /// the `ucontext`, whose `uc_mcontext` (at 176: flags, link, stack, sigmask, 120 reserved
    /// bytes, aligned to 16) starts with `fault_address`, then `regs[31]`, `sp`, `pc`.
    const MCONTEXT: u64 = 128 + 176;
    pub(crate) const UC_FP: u64 = MCONTEXT + 8 + 8 * 29;
    pub(crate) const UC_SP: u64 = MCONTEXT + 8 + 8 * 31;
    pub(crate) const UC_IP: u64 = MCONTEXT + 8 + 8 * 32;
}

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!("profiler-ebpf is written for x86_64 and aarch64 (bpf_target_arch): registers and signal frames differ");

pub(crate) use imp::{UC_FP, UC_IP, UC_SP, after_call, arg, frame, return_address, user_mode};
