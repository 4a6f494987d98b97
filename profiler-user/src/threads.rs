//! Which of the daemon's threads yield: the HTTP server's, the unwind-table builders, the
//! shippers run at a lower priority than the sampling path (ring reader, pipeline, store).

/// Lowers the calling thread's CPU priority (nice 10): the server's threads (and the blocking
/// threads they start, which inherit it), the unwind-table builders and the shippers never
/// compete with the sampling stages. Linux applies `setpriority(PRIO_PROCESS, tid)` to one
/// thread.
pub fn lower_this_thread() {
    // SAFETY: plain syscalls on our own thread id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        if libc::setpriority(libc::PRIO_PROCESS, tid, 10) != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "could not lower a thread's priority");
        }
    }
}
