//! Process fork and exit records from the `EVENTS` ring (see profiler-ebpf's `lifecycle`).

use profiler_common::{EVENT_HEADER_LEN, EventHeader, PROCESS_DATA_LEN, event};

use super::tracefs;

/// Where this kernel puts the fields the fork and exit programs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessFields {
    /// `task:task_newtask`: the child's pid, and the clone flags.
    pub child_pid: usize,
    pub clone_flags: usize,
    /// `sched:sched_process_exit`: `group_dead`, on kernels whose record has it.
    pub group_dead: Option<usize>,
}

impl ProcessFields {
    /// From the tracepoints' `format` files; this kernel's layout (6.x) when one is unreadable.
    pub fn read() -> Self {
        Self {
            child_pid: tracefs::field("task", "task_newtask", "pid").map_or(8, |f| f.0),
            clone_flags: tracefs::field("task", "task_newtask", "clone_flags").map_or(32, |f| f.0),
            group_dead: tracefs::field("sched", "sched_process_exit", "group_dead").map(|f| f.0),
        }
    }
}

/// A process created or ended, at `ts_ns` (boot time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEvent {
    Fork { parent: u32, child: u32, ts_ns: u64 },
    Exit { pid: u32, ts_ns: u64 },
}

/// Decodes a fork or exit record; `None` for other kinds and short records.
pub fn parse(f: ProcessFields, bytes: &[u8]) -> Option<ProcessEvent> {
    if bytes.len() < EVENT_HEADER_LEN + PROCESS_DATA_LEN {
        return None;
    }
    // SAFETY: EventHeader is plain old data and the length was checked.
    let h: EventHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let data = &bytes[EVENT_HEADER_LEN..EVENT_HEADER_LEN + PROCESS_DATA_LEN];
    match h.kind {
        event::PROCESS_FORK => {
            let child = i32::from_ne_bytes(data.get(f.child_pid..f.child_pid + 4)?.try_into().ok()?);
            let child = u32::try_from(child).ok().filter(|&c| c != 0)?;
            Some(ProcessEvent::Fork { parent: h.pid, child, ts_ns: h.ts_ns })
        }
        event::PROCESS_EXIT => Some(ProcessEvent::Exit { pid: h.pid, ts_ns: h.ts_ns }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, pid: u32, ts_ns: u64, data: &[(usize, &[u8])]) -> Vec<u8> {
        let h = EventHeader { kind, pid, tid: pid, ts_ns, ..Default::default() };
        let mut b = vec![0u8; EVENT_HEADER_LEN + PROCESS_DATA_LEN];
        // SAFETY: the buffer holds a header.
        unsafe { std::ptr::write_unaligned(b.as_mut_ptr().cast(), h) };
        for (off, bytes) in data {
            b[EVENT_HEADER_LEN + off..EVENT_HEADER_LEN + off + bytes.len()].copy_from_slice(bytes);
        }
        b
    }

    const FIELDS: ProcessFields = ProcessFields { child_pid: 8, clone_flags: 32, group_dead: Some(32) };

    #[test]
    fn fork_names_parent_and_child() {
        let r = record(event::PROCESS_FORK, 100, 5, &[(8, &4242i32.to_ne_bytes())]);
        assert_eq!(parse(FIELDS, &r), Some(ProcessEvent::Fork { parent: 100, child: 4242, ts_ns: 5 }));
        // The child's pid where this kernel puts it, not at a fixed offset.
        let moved = ProcessFields { child_pid: 12, ..FIELDS };
        let r = record(event::PROCESS_FORK, 100, 5, &[(12, &77i32.to_ne_bytes())]);
        assert_eq!(parse(moved, &r), Some(ProcessEvent::Fork { parent: 100, child: 77, ts_ns: 5 }));
    }

    #[test]
    fn exit_and_other_kinds() {
        assert_eq!(
            parse(FIELDS, &record(event::PROCESS_EXIT, 9, 7, &[])),
            Some(ProcessEvent::Exit { pid: 9, ts_ns: 7 })
        );
        assert_eq!(parse(FIELDS, &record(event::PROCESS_EXEC, 9, 7, &[])), None);
        // A fork record whose child pid reads 0 or negative is not a process.
        assert_eq!(parse(FIELDS, &record(event::PROCESS_FORK, 9, 7, &[(8, &(-1i32).to_ne_bytes())])), None);
        assert_eq!(parse(FIELDS, &record(event::PROCESS_EXIT, 9, 7, &[])[..40]), None);
        // A kernel placing the child's pid past the bytes copied: no process, no panic.
        let far = ProcessFields { child_pid: PROCESS_DATA_LEN - 2, ..FIELDS };
        assert_eq!(parse(far, &record(event::PROCESS_FORK, 9, 7, &[])), None);
    }
}
