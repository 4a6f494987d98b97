//! Where a command's output goes.

use std::{io::Write, path::Path};

use profiler::outfile::OutFile;

pub fn open_output(path: Option<&Path>) -> anyhow::Result<Output> {
    Ok(match path {
        None => Output::Stdout(std::io::BufWriter::new(std::io::stdout().lock())),
        Some(p) => Output::File(OutFile::create(p)?),
    })
}

/// Where a command's output goes: stdout, or an `-o` file (0600, put in place by `finish`).
pub enum Output {
    Stdout(std::io::BufWriter<std::io::StdoutLock<'static>>),
    File(OutFile),
}

impl Output {
    pub fn finish(self) -> anyhow::Result<()> {
        match self {
            Output::Stdout(mut w) => w.flush()?,
            Output::File(f) => f.finish()?,
        }
        Ok(())
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::Stdout(w) => w.write(buf),
            Output::File(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout(w) => w.flush(),
            Output::File(f) => f.flush(),
        }
    }
}
