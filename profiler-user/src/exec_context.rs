//! The kernel execution context of a sample: task, or which softirq it interrupted.
//!
//! The BPF sampler reports the softirq running under the tick (`profiler-ebpf/src/context.rs`
//! says how and why hardirq and NMI never show). Rather than a new sample column, the pipeline
//! puts a synthetic frame `[softirq:NET_RX]` at the root of the sample's kernel frames. The
//! store keeps it as any kernel frame (a node with the kernel bit, which no user-space name can
//! set), so segments, rollups, ClickHouse shipping and the fleet's mirror carry it unchanged, and
//! every reader derives the context from a stack once per interned stack (`Dict::context_of`): folded output and
//! flamegraphs show it, `--context` filters on it, CPU x time counts it, pprof and OTLP label it.

use std::{
    fmt,
    str::FromStr,
    sync::{Arc, LazyLock},
};

use profiler_common::SOFTIRQ_NAMES;

use crate::model::Stack;

const MARKER_PREFIX: &str = "[softirq:";

/// Where a sample ran: on behalf of its task, or in a softirq (vector number, `SOFTIRQ_NAMES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Context {
    #[default]
    Task,
    Softirq(u8),
}

/// The marker frames, one per vector, shared by every stack that carries one.
static MARKERS: LazyLock<Vec<Arc<str>>> =
    LazyLock::new(|| SOFTIRQ_NAMES.iter().map(|n| Arc::from(format!("{MARKER_PREFIX}{n}]"))).collect());

impl Context {
    /// From a ring-buffer record's flags.
    pub fn from_flags(flags: u32) -> Self {
        match profiler_common::softirq_of(flags) {
            Some(v) if (v as usize) < SOFTIRQ_NAMES.len() => Self::Softirq(v as u8),
            _ => Self::Task,
        }
    }

    /// The softirq a marker frame names (`[softirq:NET_RX]` → 3); `None` for any other name.
    pub fn of_marker(name: &str) -> Option<u8> {
        let vector = name.strip_prefix(MARKER_PREFIX)?.strip_suffix(']')?;
        SOFTIRQ_NAMES.iter().position(|n| *n == vector).map(|v| v as u8)
    }

    /// Whether `name` is a context marker (not a function: detectors skip it).
    pub fn is_marker(name: &str) -> bool {
        Self::of_marker(name).is_some()
    }

    /// The context of a stack given root first as `(name, kernel)`: its first kernel frame, if
    /// that is a marker. Only a kernel frame counts, so a user function named like a marker
    /// does not change a sample's context.
    pub fn of_frames<'a>(frames: impl IntoIterator<Item = (&'a str, bool)>) -> Self {
        match frames.into_iter().find(|&(_, kernel)| kernel) {
            Some((name, _)) => Self::of_marker(name).map_or(Self::Task, Self::Softirq),
            None => Self::Task,
        }
    }

    /// The context of a symbolized stack: its first kernel frame, if that is a marker.
    pub fn of_stack(stack: &Stack) -> Self {
        stack.frames.get(stack.user_len).and_then(|f| Self::of_marker(f)).map_or(Self::Task, Self::Softirq)
    }

    pub fn is_softirq(self) -> bool {
        matches!(self, Self::Softirq(_))
    }

    /// The marker frame of a softirq context.
    pub fn marker(self) -> Option<Arc<str>> {
        match self {
            Self::Task => None,
            Self::Softirq(v) => MARKERS.get(v as usize).cloned(),
        }
    }

    /// `stack` with this context's marker at the root of its kernel frames (unchanged for task
    /// context).
    pub fn mark(self, stack: &Stack) -> Stack {
        let mut out = stack.clone();
        if let Some(m) = self.marker() {
            out.frames.insert(stack.user_len, m);
        }
        out
    }
}

/// `task`, `softirq:NET_RX`: the label value in pprof and OTLP.
impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Task => f.write_str("task"),
            Self::Softirq(v) => write!(f, "softirq:{}", SOFTIRQ_NAMES.get(*v as usize).unwrap_or(&"?")),
        }
    }
}

/// `--context task|softirq[:NAME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextFilter {
    Task,
    /// Any softirq, or the one named.
    Softirq(Option<u8>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContextError {
    #[error("context '{0}' is not one of task, softirq, softirq:NAME")]
    Unknown(String),
    #[error("'{0}' is not a softirq: the kernel's are {names}", names = SOFTIRQ_NAMES.join(", "))]
    Vector(String),
}

impl FromStr for ContextFilter {
    type Err = ContextError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("task") {
            return Ok(Self::Task);
        }
        let Some(rest) = s.get(..7).filter(|p| p.eq_ignore_ascii_case("softirq")).map(|_| &s[7..]) else {
            return Err(ContextError::Unknown(s.to_string()));
        };
        if rest.is_empty() {
            return Ok(Self::Softirq(None));
        }
        let Some(name) = rest.strip_prefix(':') else { return Err(ContextError::Unknown(s.to_string())) };
        // `NET_RX`, `net_rx`, and the kernel's full `NET_RX_SOFTIRQ` all name vector 3.
        let upper = name.to_ascii_uppercase();
        let upper = upper.strip_suffix("_SOFTIRQ").unwrap_or(&upper);
        match SOFTIRQ_NAMES.iter().position(|n| *n == upper) {
            Some(v) => Ok(Self::Softirq(Some(v as u8))),
            None => Err(ContextError::Vector(name.to_string())),
        }
    }
}

impl ContextFilter {
    pub fn keeps(self, c: Context) -> bool {
        match (self, c) {
            (Self::Task, Context::Task) => true,
            (Self::Softirq(None), Context::Softirq(_)) => true,
            (Self::Softirq(Some(want)), Context::Softirq(v)) => want == v,
            _ => false,
        }
    }
}

impl fmt::Display for ContextFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Task => f.write_str("task"),
            Self::Softirq(None) => f.write_str("softirq"),
            Self::Softirq(Some(v)) => write!(f, "softirq:{}", SOFTIRQ_NAMES.get(*v as usize).unwrap_or(&"?")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_names_are_the_kernels() {
        // softirq_to_name[] in kernel/softirq.c, in vector order.
        let names: Vec<String> = (0..10u8).map(|v| Context::Softirq(v).to_string()).collect();
        assert_eq!(names[3], "softirq:NET_RX");
        assert_eq!(names[9], "softirq:RCU");
        assert_eq!(names[0], "softirq:HI");
        assert_eq!(Context::Softirq(3).marker().as_deref(), Some("[softirq:NET_RX]"));
        assert_eq!(Context::Task.to_string(), "task");
    }

    #[test]
    fn flags_decode_vector_plus_one() {
        use profiler_common::{FLAG_IDLE, FLAG_SOFTIRQ_SHIFT};
        assert_eq!(Context::from_flags(0), Context::Task);
        assert_eq!(Context::from_flags(FLAG_IDLE), Context::Task);
        assert_eq!(Context::from_flags(4 << FLAG_SOFTIRQ_SHIFT), Context::Softirq(3));
        assert_eq!(Context::from_flags(1 << FLAG_SOFTIRQ_SHIFT | 2), Context::Softirq(0));
        // A vector this build does not know (a future kernel's) is not invented.
        assert_eq!(Context::from_flags(15 << FLAG_SOFTIRQ_SHIFT), Context::Task);
    }

    #[test]
    fn marker_goes_at_the_root_of_the_kernel_frames() {
        let f = |s: &[&str]| s.iter().map(|x| Arc::from(*x)).collect::<Vec<Arc<str>>>();
        let stack = Stack::new(f(&["main", "read", "entry_SYSCALL_64", "net_rx_action"]), 2);
        let marked = Context::Softirq(3).mark(&stack);
        assert_eq!(marked.frames, f(&["main", "read", "[softirq:NET_RX]", "entry_SYSCALL_64", "net_rx_action"]));
        assert_eq!(marked.user_len, 2);
        assert_eq!((Context::of_stack(&marked), Context::of_stack(&stack)), (Context::Softirq(3), Context::Task));
        assert_eq!(Context::Task.mark(&stack), stack);
        let frames = marked.frames.iter().enumerate().map(|(i, n)| (&**n, i >= marked.user_len));
        assert_eq!(Context::of_frames(frames), Context::Softirq(3));
        // Only a kernel frame marks: a user function named like the marker does not.
        assert_eq!(Context::of_frames([("[softirq:NET_RX]", false), ("x", true)]), Context::Task);
        assert_eq!(Context::of_frames([("[softirq:NET_RX]", false)]), Context::Task);
        assert_eq!(Context::of_frames([("[softirq:BOGUS]", true)]), Context::Task);
    }

    #[test]
    fn filter_parsing() {
        assert_eq!("task".parse(), Ok(ContextFilter::Task));
        assert_eq!("softirq".parse(), Ok(ContextFilter::Softirq(None)));
        assert_eq!("softirq:NET_RX".parse(), Ok(ContextFilter::Softirq(Some(3))));
        assert_eq!("SoftIRQ:net_rx".parse(), Ok(ContextFilter::Softirq(Some(3))));
        assert_eq!("softirq:NET_RX_SOFTIRQ".parse(), Ok(ContextFilter::Softirq(Some(3))));
        assert_eq!("softirq:rcu".parse(), Ok(ContextFilter::Softirq(Some(9))));
        let e = "softirq:NETRX".parse::<ContextFilter>().unwrap_err().to_string();
        assert!(e.contains("'NETRX' is not a softirq") && e.contains("NET_RX, BLOCK"), "{e}");
        let e = "hardirq".parse::<ContextFilter>().unwrap_err().to_string();
        assert_eq!(e, "context 'hardirq' is not one of task, softirq, softirq:NAME");
        assert!("softirqs".parse::<ContextFilter>().is_err());
        assert!("".parse::<ContextFilter>().is_err());
        assert!("sof".parse::<ContextFilter>().is_err());
        let f: ContextFilter = "softirq:net_rx".parse().unwrap();
        assert_eq!(f.to_string(), "softirq:NET_RX");
        assert!(f.keeps(Context::Softirq(3)) && !f.keeps(Context::Softirq(1)) && !f.keeps(Context::Task));
        assert!(ContextFilter::Softirq(None).keeps(Context::Softirq(1)));
        assert!(ContextFilter::Task.keeps(Context::Task) && !ContextFilter::Task.keeps(Context::Softirq(3)));
    }
}
