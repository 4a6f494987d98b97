//! `/metrics` for the CPython frame reader: the processes whose Python frames are not read.

use super::exposition::write_family;

pub fn render(out: &mut String) {
    write_family(
        out,
        "profiler_python_unread_processes_total",
        "counter",
        "CPython processes whose Python frames are not read (native frames only), by reason: a version this \
         profiler does not read, a free-threaded build, a published layout that fails its checks or cannot be read. \
         The daemon's log names each interpreter once.",
        crate::interpreter::python::unread_counts()
            .into_iter()
            .map(|(reason, n)| (format!("{{reason=\"{reason}\"}}"), n as f64))
            .collect(),
    );
}
