//! What a waiting thread waited on (a lock, a pipe, a socket, a file...), read from the kernel
//! frames of the stack it left in, and what `--state` selects.

use super::fs_of;
use crate::model::OffState;
use crate::model::Stack;

/// What a waiting thread waited on, read from its kernel stack (the state alone says only
/// whether it could be woken): the second frame of its stacks, under the state's
/// (`[off-cpu: sleep];[wait: lock]`), and a `--state` of its own. Runnable waits have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitOn {
    /// A futex (a user-space mutex, condition variable or queue), or a kernel mutex or rwsem.
    Lock,
    /// poll, select or epoll: an event loop or a thread waiting on several descriptors.
    Poll,
    /// A pipe's read or write.
    Pipe,
    /// A socket's receive, send, accept or connect.
    Socket,
    /// nanosleep and its kin: the thread asked to sleep.
    Timer,
    /// A file system or block device: reads, writes, page faults on files, syncs.
    File,
    /// wait4/waitid: a parent waiting for a child to exit (shells, supervisors, launchers).
    Child,
    /// Anything else (a kernel stack none of the above names).
    Other,
}

impl WaitOn {
    pub const ALL: [WaitOn; 8] =
        [Self::Lock, Self::Poll, Self::Pipe, Self::Socket, Self::Timer, Self::File, Self::Child, Self::Other];

    pub fn name(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Poll => "poll",
            Self::Pipe => "pipe",
            Self::Socket => "socket",
            Self::Timer => "timer",
            Self::File => "file",
            Self::Child => "child",
            Self::Other => "other",
        }
    }

    /// Its frame, under the state's: `[wait: lock]`.
    pub fn frame(self) -> &'static str {
        match self {
            Self::Lock => "[wait: lock]",
            Self::Poll => "[wait: poll]",
            Self::Pipe => "[wait: pipe]",
            Self::Socket => "[wait: socket]",
            Self::Timer => "[wait: timer]",
            Self::File => "[wait: file]",
            Self::Child => "[wait: child]",
            Self::Other => "[wait: other]",
        }
    }

    /// One kernel function's say, if it has one (`_[k]` trimmed).
    fn of_function(f: &str) -> Option<Self> {
        const LOCK: [&str; 8] =
            ["futex_", "__futex", "mutex_lock", "__mutex_lock", "rwsem_down", "down_read", "down_write", "rt_mutex"];
        const POLL: [&str; 6] = ["do_sys_poll", "do_poll", "do_select", "core_sys_select", "ep_poll", "do_epoll_wait"];
        const PIPE: [&str; 4] = ["pipe_read", "anon_pipe_read", "pipe_write", "anon_pipe_write"];
        const SOCKET: [&str; 14] = [
            "sk_wait_data",
            "sk_stream_wait",
            "tcp_recvmsg",
            "tcp_sendmsg",
            "udp_recvmsg",
            "unix_stream_",
            "unix_dgram_recvmsg",
            "unix_accept",
            "inet_csk_accept",
            "inet_stream_connect",
            "__skb_wait_for_more_packets",
            "__skb_recv",
            "sock_recvmsg",
            "sock_sendmsg",
        ];
        const TIMER: [&str; 4] = ["hrtimer_nanosleep", "do_nanosleep", "common_nsleep", "__x64_sys_nanosleep"];
        const FILE: [&str; 8] = [
            "io_schedule",
            "folio_wait",
            "__folio_lock",
            "wait_on_page",
            "filemap_",
            "submit_bio_wait",
            "blkdev_",
            "file_write_and_wait",
        ];
        let any = |prefixes: &[&str]| prefixes.iter().any(|p| f.starts_with(p));
        if any(&LOCK) {
            Some(Self::Lock)
        } else if any(&POLL) {
            Some(Self::Poll)
        } else if any(&PIPE) {
            Some(Self::Pipe)
        } else if any(&SOCKET) {
            Some(Self::Socket)
        } else if any(&TIMER) {
            Some(Self::Timer)
        } else if any(&FILE) {
            Some(Self::File)
        } else if any(&["do_wait", "kernel_wait", "__do_sys_wait"]) {
            Some(Self::Child)
        } else {
            None
        }
    }

    /// What a stack waited on: its leaf-most kernel frame that says (a pipe read waiting for the
    /// pipe's mutex waits on a lock), else a file system or device named anywhere in it.
    pub fn of(stack: &Stack) -> Self {
        stack
            .kernel()
            .iter()
            .rev()
            .find_map(|f| Self::of_function(f.trim_end_matches("_[k]")))
            .or_else(|| fs_of(stack).map(|_| Self::File))
            .unwrap_or(Self::Other)
    }
}

/// What `--state` selects: a state (the stacks' root frame) or what the wait was on (their
/// second frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    State(OffState),
    On(WaitOn),
}

impl StateFilter {
    /// The frame the stacks it selects pass through.
    pub fn frame(self) -> &'static str {
        match self {
            Self::State(s) => s.frame(),
            Self::On(w) => w.frame(),
        }
    }
}

impl std::str::FromStr for StateFilter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        OffState::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .map(Self::State)
            .or_else(|| WaitOn::ALL.into_iter().find(|w| w.name() == s).map(Self::On))
            .ok_or_else(|| {
                let names: Vec<_> =
                    OffState::ALL.iter().map(|k| k.name()).chain(WaitOn::ALL.iter().map(|w| w.name())).collect();
                format!("state '{s}' is not one of {}", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A stack of user frames `main;read` over kernel frames (root first).
    fn stack(kernel: &[&str]) -> Stack {
        let mut frames: Vec<Arc<str>> = vec![Arc::from("main"), Arc::from("read")];
        frames.extend(kernel.iter().map(|f| Arc::from(format!("{f}_[k]"))));
        Stack::new(frames, 2)
    }

    #[test]
    fn the_leaf_most_kernel_frame_that_says_names_the_wait() {
        let on = |k: &[&str]| WaitOn::of(&stack(k));
        assert_eq!(on(&["ksys_read", "vfs_read", "anon_pipe_read", "schedule"]), WaitOn::Pipe);
        assert_eq!(on(&["__x64_sys_futex", "do_futex", "futex_wait", "futex_wait_queue", "schedule"]), WaitOn::Lock);
        assert_eq!(on(&["do_epoll_wait", "ep_poll", "schedule_hrtimeout_range"]), WaitOn::Poll);
        assert_eq!(on(&["__sys_recvfrom", "sock_recvmsg", "tcp_recvmsg", "sk_wait_data"]), WaitOn::Socket);
        assert_eq!(
            on(&["__x64_sys_clock_nanosleep", "common_nsleep", "hrtimer_nanosleep", "do_nanosleep"]),
            WaitOn::Timer
        );
        assert_eq!(
            on(&["vfs_read", "nfs_file_read", "rpc_wait_bit_killable"]),
            WaitOn::File,
            "named by its file system"
        );
        assert_eq!(on(&["blkdev_read_iter", "submit_bio_wait", "io_schedule"]), WaitOn::File);
        // A pipe read waiting for the pipe's mutex waits on a lock.
        assert_eq!(on(&["vfs_read", "anon_pipe_read", "__mutex_lock", "schedule_preempt_disabled"]), WaitOn::Lock);
        assert_eq!(on(&["kernel_wait4", "do_wait", "schedule"]), WaitOn::Child);
        assert_eq!(on(&["do_signal_stop", "schedule"]), WaitOn::Other);
        assert_eq!(on(&[]), WaitOn::Other);
    }

    #[test]
    fn a_state_filter_is_a_state_or_what_was_waited_on() {
        assert_eq!("io".parse(), Ok(StateFilter::State(OffState::Io)));
        assert_eq!("lock".parse::<StateFilter>().map(StateFilter::frame), Ok("[wait: lock]"));
        assert_eq!("sleep".parse::<StateFilter>().map(StateFilter::frame), Ok("[off-cpu: sleep]"));
        let e = "busy".parse::<StateFilter>().unwrap_err();
        assert!(e.contains("runnable") && e.contains("socket"), "{e}");
        for w in WaitOn::ALL {
            assert_eq!(w.name().parse(), Ok(StateFilter::On(w)));
            assert_eq!(w.frame(), format!("[wait: {}]", w.name()));
        }
    }
}
