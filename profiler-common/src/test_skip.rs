//! The suite's one rule for a test that cannot run here (no root, a tool not installed, a
//! kernel without a feature): say so loudly and skip, except under CI, where it fails.
//!
//! It lives here, behind the `test-skip` feature, because this is the one crate both test
//! suites can reach: profiler-user's unit tests cannot depend on the integration-tests crate
//! (that crate depends on profiler-user), and integration-tests' own library (the helper
//! programs build with it) should not pull in the whole daemon. Both enable the feature
//! (profiler-user as a dev-dependency only); the BPF program, built on its own, never has it.

extern crate std;

use std::eprintln;

/// True when the environment says every test must run: `CI=true` or `CI=1`, as CI systems set
/// it (GitHub Actions, GitLab and most others `true`; some `1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Says why a test cannot run here (`SKIPPED {why}` on stderr) and returns false; under CI
/// (see [`in_ci`]) panics instead: CI must run every test, never pass one that did not.
///
/// `why` names the test, or at least what is missing and what installs it (`cargo xtask
/// setup` installs everything the suite needs).
#[track_caller]
pub fn skip(why: &str) -> bool {
    if in_ci() {
        panic!("{why}, and CI is set: refusing to skip");
    }
    eprintln!("SKIPPED {why}");
    false
}
