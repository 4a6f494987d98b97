//! `profiler`: the daemon (`profiler run`) and the engineer's CLI over what it stored (see
//! `cli`).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
