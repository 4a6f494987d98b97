//! Where the daemon's and the CLI's log events go. Under systemd, with stderr connected to the
//! journal, each event is sent with the journal's native protocol: its fields become journal
//! fields (`SAMPLES_PER_S=...`) and its level the priority. Anywhere else (a terminal, a
//! container, the tests) one line per event on stderr, or one JSON object per event with
//! `--log-format json`. `RUST_LOG` filters (default `info`); libraries that log through the `log`
//! crate (aya) go the same way.

use std::{
    io::IsTerminal,
    os::{fd::AsFd, unix::fs::MetadataExt},
};

use tracing::field::{Field, Visit};
use tracing_subscriber::{
    EnvFilter,
    field::RecordFields,
    filter::LevelFilter,
    fmt::{self, FormatFields, format::Writer, time::FormatTime},
    prelude::*,
};

/// The format of log lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One human line per event: time, level, the sentence, then `key=value` fields.
    Text,
    /// One JSON object per event: `timestamp`, `level`, `fields` (with `message`).
    Json,
}

/// Installs the global subscriber. `format`: what the user asked for; `None` picks the journal
/// when stderr is the journal, text otherwise. Call once, first thing.
pub fn init(format: Option<Format>) {
    let filter = EnvFilter::builder().with_default_directive(LevelFilter::INFO.into()).from_env_lossy();
    let mut journal_error = None;
    let journal = match format {
        None if stderr_is_journal() => match tracing_journald::layer() {
            Ok(layer) => Some(layer.with_field_prefix(None).with_priority_mappings(priorities())),
            Err(e) => {
                journal_error = Some(e);
                None
            }
        },
        _ => None,
    };
    let format = format.unwrap_or(Format::Text);
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let text = (journal.is_none() && format == Format::Text).then(|| {
        fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_target(false)
            .with_timer(Rfc3339)
            .fmt_fields(VisibleFields)
    });
    let json = (journal.is_none() && format == Format::Json).then(|| {
        fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_current_span(false)
            .with_span_list(false)
            .with_timer(Rfc3339)
    });
    // `try_init` also routes the `log` crate's records here (tracing-log).
    let _ = tracing_subscriber::registry().with(filter).with(journal).with(text).with(json).try_init();
    if let Some(e) = journal_error {
        tracing::warn!(error = %e, "cannot write to the journal's socket; logging to stderr instead");
    }
}

/// The syslog convention, which `journalctl -p` follows: info is 6, debug 7.
fn priorities() -> tracing_journald::PriorityMappings {
    use tracing_journald::Priority;
    tracing_journald::PriorityMappings {
        error: Priority::Error,
        warn: Priority::Warning,
        info: Priority::Informational,
        debug: Priority::Debug,
        trace: Priority::Debug,
    }
}

/// True when systemd connected stderr to the journal: `JOURNAL_STREAM` (`DEV:INODE`) names the
/// file stderr is. A child whose stderr was redirected elsewhere inherits the variable, hence the
/// comparison.
fn stderr_is_journal() -> bool {
    let Some(var) = std::env::var_os("JOURNAL_STREAM") else { return false };
    // fstat(2) on a duplicate of the descriptor.
    let Ok(meta) = std::io::stderr().as_fd().try_clone_to_owned().and_then(|fd| std::fs::File::from(fd).metadata())
    else {
        return false;
    };
    journal_stream_is(&var.to_string_lossy(), meta.dev(), meta.ino())
}

fn journal_stream_is(var: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = var.trim().split_once(':') else { return false };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

/// The text format's fields: `message` bare, others `key=value`, as tracing's default, but with
/// control characters shown as escapes (`untrusted::visible`). Messages and fields carry comms,
/// function names and paths that a local user chose; a raw newline or CR in them would forge
/// log lines, an ESC would reach the terminal.
struct VisibleFields;

impl<'w> FormatFields<'w> for VisibleFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> std::fmt::Result {
        let mut v = VisibleVisitor { writer, first: true, result: Ok(()) };
        fields.record(&mut v);
        v.result
    }
}

struct VisibleVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl VisibleVisitor<'_> {
    fn write(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let sep = if self.first { "" } else { " " };
        self.first = false;
        let value = crate::untrusted::visible(value);
        self.result = if field.name() == "message" {
            write!(self.writer, "{sep}{value}")
        } else {
            write!(self.writer, "{sep}{}={value}", field.name().trim_start_matches("r#"))
        };
    }
}

impl Visit for VisibleVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        // As tracing's default: the message bare, other strings quoted (Debug).
        if field.name() == "message" { self.write(field, value) } else { self.write(field, &format!("{value:?}")) }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

/// RFC 3339 in UTC with milliseconds, as everywhere else in the profiler.
struct Rfc3339;

impl FormatTime for Rfc3339 {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        w.write_str(&crate::timespec::format(crate::timespec::now_ns()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text layer over a buffer, for one event.
    fn text_line(event: impl FnOnce()) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let layer = fmt::layer()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_target(false)
            .without_time()
            .fmt_fields(VisibleFields);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), event);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_name_cannot_forge_a_log_line_or_reach_the_terminal() {
        let comm = "evil\n2026-01-01T00:00:00.000Z  INFO forged\r\x1b[2J\x07";
        let out = text_line(|| tracing::warn!(comm, pid = 7, error = %comm, "process {comm} is hot"));
        assert_eq!(out.matches('\n').count(), 1, "one line: {out:?}");
        assert!(out.ends_with('\n'));
        assert!(!out.contains(['\r', '\x1b', '\x07']), "{out:?}");
        assert!(out.contains("process evil\\n2026"), "{out:?}");
        assert!(out.contains(" pid=7"), "{out:?}");
        assert!(out.contains("comm=\"evil\\n"), "{out:?}");
        assert!(out.contains("error=evil\\n"), "{out:?}");
    }

    #[test]
    fn journal_stream_names_one_file() {
        assert!(journal_stream_is("8:12345", 8, 12345));
        assert!(journal_stream_is("8:12345\n", 8, 12345));
        assert!(!journal_stream_is("8:12345", 8, 12346));
        assert!(!journal_stream_is("9:12345", 8, 12345));
        for bad in ["", "8", "8:", ":12345", "x:y", "8:12345:1"] {
            assert!(!journal_stream_is(bad, 8, 12345), "{bad}");
        }
    }
}
