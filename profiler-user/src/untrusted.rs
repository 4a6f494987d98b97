//! Rendering untrusted text. Process names (comm) and function names belong to whoever runs the
//! process: any local user can put ESC, BEL, CR or LF in them. Every human output (terminal,
//! plain-text log lines, SVG/HTML) shows such characters as visible escapes, and every text
//! format that gives characters a meaning (folded's `;`, perf script's line layout, the kernel
//! mark `_[k]`) gets one rule, here, so a name can neither forge a record nor a kernel frame.

use std::{borrow::Cow, fmt::Write};

/// True for characters a terminal or an XML parser must not receive raw: C0 and C1 controls,
/// DEL, Unicode line/paragraph separators, bidirectional overrides (which reorder what a
/// reader sees) and the two non-characters XML 1.0 forbids.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{fffe}' | '\u{ffff}')
}

/// `s` with each hidden character written as an escape: `\n`, `\r`, `\t`, `\x1b`, `\u{202e}`.
/// The result holds no control character, so it is safe on a terminal, in one log line, and
/// (after `<>&"` escaping) in XML 1.0. Text without such characters is returned as is.
pub fn visible(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if hidden(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if hidden(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Annotations flamegraph tools read at the end of a frame name (`_[k]` kernel, `_[j]` JIT,
/// `_[i]` inlined, `_[w]` wasm), and our own marks of kernel frames in pprof (` [kernel]`) and
/// speedscope (` [k]`).
const MARKS: [&str; 6] = ["_[k]", "_[j]", "_[i]", "_[w]", " [kernel]", " [k]"];

/// A user-space function name that ends like a mark gets its brackets turned into braces
/// (`x_[k]` → `x_{k}`), so only frames we mark as kernel read as kernel frames, in every
/// format. Braces, not parentheses: collapse-perf drops a trailing `(...)` as an argument list.
pub fn unmarked(name: &str) -> Cow<'_, str> {
    match MARKS.iter().find(|m| name.ends_with(*m)) {
        Some(m) => {
            let head = &name[..name.len() - m.len()];
            Cow::Owned(format!("{head}{}", m.replace('[', "{").replace(']', "}")))
        }
        None => Cow::Borrowed(name),
    }
}

/// `s` cut to at most `max` bytes (at a character boundary) and marked with an ellipsis when cut.
pub fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max.saturating_sub('…'.len_utf8());
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push('…');
    }
    s
}

/// One frame (or the comm) of a folded line (`comm;frame;frame count`), the format inferno and
/// flamegraph.pl read: hidden characters escaped, `;` (which separates frames) written `:`, and a
/// trailing ` <digits>` written `_<digits>`, since inferno reads a line ending in two numbers as a
/// differential one. `user`: a user-space frame or the comm, which must not end like a mark.
pub fn folded_frame(name: &str, user: bool) -> Cow<'_, str> {
    let mut s = visible(name);
    if user && MARKS.iter().any(|m| s.ends_with(m)) {
        s = Cow::Owned(unmarked(&s).into_owned());
    }
    if s.contains(';') {
        s = Cow::Owned(s.replace(';', ":"));
    }
    if let Some(space) = trailing_number(&s) {
        let mut o = s.into_owned();
        o.replace_range(space..space + 1, "_");
        s = Cow::Owned(o);
    }
    s
}

/// Where the space before a trailing ` <digits>` (or ` <digits>.<digits>`) is, if any.
fn trailing_number(s: &str) -> Option<usize> {
    let space = s.rfind(' ')?;
    let tail = &s[space + 1..];
    (!tail.is_empty()
        && tail.chars().any(|c| c.is_ascii_digit())
        && tail.chars().all(|c| c.is_ascii_digit() || c == '.'))
    .then_some(space)
}

/// The comm on a perf-script event line (`comm pid/tid [cpu] secs: ...`). Parsers find the pid
/// as the first all-digit word (inferno-collapse-perf, stackcollapse-perf.pl), so a comm with a
/// word of digits (`x 123 y`) has its spaces written `_`; other spaces stay, as perf prints them.
/// `;` is written `:` as in folded output, since every reader of perf script folds it.
pub fn perf_comm(comm: &str) -> Cow<'_, str> {
    let mut s = visible(comm);
    if MARKS.iter().any(|m| s.ends_with(m)) {
        s = Cow::Owned(unmarked(&s).into_owned());
    }
    if s.contains(';') {
        s = Cow::Owned(s.replace(';', ":"));
    }
    let digit_word = s.split(' ').skip(1).any(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit() || c == '/'));
    if digit_word { Cow::Owned(s.replace(' ', "_")) } else { s }
}

/// The file of a user frame on a perf-script frame line (`\t<addr> <name> (<file>)`): parsers take
/// the file as what lies between the last ` (` and the closing `)`, so parentheses in a path (a
/// deleted file's ` (deleted)`, which is dropped) are written `_`, as are `;` and control
/// characters. A file in brackets is kernel code to FlameScope and inferno-collapse-perf, so the
/// vDSO is written `linux-vdso.so.1` (as `ldd` names it) and other bracketed mappings lose theirs.
pub fn perf_file(file: &str) -> Cow<'_, str> {
    let file = file.strip_suffix(" (deleted)").unwrap_or(file);
    let file = match file {
        "[vdso]" => "linux-vdso.so.1",
        f => f.strip_prefix('[').and_then(|f| f.strip_suffix(']')).unwrap_or(f),
    };
    if file.contains(|c: char| matches!(c, '(' | ')' | ';') || c.is_control()) {
        Cow::Owned(file.chars().map(|c| if matches!(c, '(' | ')' | ';') || c.is_control() { '_' } else { c }).collect())
    } else {
        Cow::Borrowed(file)
    }
}

/// A function name on a perf-script frame line (`\t<addr> <name> (<dso>)`). The name ends at
/// the last space before `(<dso>)`, so spaces are fine; but parsers strip a trailing `+0x<hex>`
/// (an offset), drop a name starting with `(`, and split Java inlining at `->`: those are written
/// `+_0x`, `_(`, `-_>`; and `;` is written `:`, as in folded output, since every reader of perf
/// script folds it. `user`: as in [`folded_frame`].
pub fn perf_frame(name: &str, user: bool) -> Cow<'_, str> {
    let mut s = visible(name);
    if s.contains(';') {
        s = Cow::Owned(s.replace(';', ":"));
    }
    if user && MARKS.iter().any(|m| s.ends_with(m)) {
        s = Cow::Owned(unmarked(&s).into_owned());
    }
    if s.contains("->") {
        s = Cow::Owned(s.replace("->", "-_>"));
    }
    if let Some(i) = s.rfind("+0x")
        && s[i + 3..].chars().all(|c| c.is_ascii_hexdigit())
    {
        let mut o = s.into_owned();
        o.replace_range(i..i + 1, "+_");
        s = Cow::Owned(o);
    }
    // Readers trim the name before looking at its first character.
    if s.trim_start().starts_with('(') {
        s = Cow::Owned(format!("_{s}"));
    }
    if s.is_empty() {
        s = Cow::Borrowed("[unknown]");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_a_character_boundary_and_says_it_cut() {
        assert_eq!(cut("short".into(), 10), "short");
        let c = cut("ééééé".into(), 6);
        assert!(c.len() <= 6 && c.ends_with('…'), "{c}");
        assert_eq!(cut("abcdefgh".into(), 6), "abc…");
    }

    #[test]
    fn control_characters_become_visible() {
        assert_eq!(visible("plain name"), "plain name");
        assert!(matches!(visible("plain"), Cow::Borrowed(_)));
        assert_eq!(visible("a\x1b[2Jb\x07c\rd\ne\tf\x7f"), "a\\x1b[2Jb\\x07c\\rd\\ne\\tf\\x7f");
        assert_eq!(visible("\u{9b}x\u{202e}y\u{2028}"), "\\x9bx\\u{202e}y\\u{2028}");
        for s in ["\x00\x01\x1f", "\u{85}", "\u{fffe}\u{ffff}"] {
            assert!(!visible(s).chars().any(hidden), "{s:?}");
        }
        assert_eq!(visible("héllo 漢字"), "héllo 漢字");
    }

    #[test]
    fn a_user_name_cannot_fake_a_mark() {
        assert_eq!(unmarked("x_[k]"), "x_{k}");
        assert_eq!(unmarked("x [kernel]"), "x {kernel}");
        assert_eq!(unmarked("x[k]"), "x[k]");
        assert_eq!(unmarked("x [k]"), "x {k}");
        assert_eq!(folded_frame("x_[k]", true), "x_{k}");
        assert_eq!(folded_frame("ksys_read", false), "ksys_read");
        assert_eq!(perf_frame("evil;name_[k]", true), "evil:name_{k}");
    }

    #[test]
    fn folded_rules() {
        assert_eq!(folded_frame("a;b", true), "a:b");
        assert_eq!(folded_frame("spin\nmain;x 1", true), "spin\\nmain:x_1");
        assert_eq!(folded_frame("x 12.5", true), "x_12.5");
        assert_eq!(folded_frame("operator new(unsigned long)", true), "operator new(unsigned long)");
        assert_eq!(folded_frame("x 1a", true), "x 1a");
    }

    #[test]
    fn perf_rules() {
        assert_eq!(perf_comm("Web Content"), "Web Content");
        assert_eq!(perf_comm("x 123 y"), "x_123_y");
        assert_eq!(perf_comm("a\nb"), "a\\nb");
        assert_eq!(perf_frame("foo+0x1f", true), "foo+_0x1f");
        assert_eq!(perf_frame("(anonymous namespace)::f", true), "_(anonymous namespace)::f");
        assert_eq!(perf_frame("a->b", true), "a-_>b");
        assert_eq!(perf_frame(" (x)", true), "_ (x)");
        assert_eq!(perf_frame("", true), "[unknown]");
    }

    proptest::proptest! {
        /// Whatever the name, each format's rule leaves nothing a reader would take as a record,
        /// frame or count separator, or as a kernel mark.
        #[test]
        fn rules_hold_for_any_name(name in "(\\PC|[\\x00-\\x1f\\x7f\\u{80}-\\u{9f};_\\[\\]k 0-9+x()>-]){0,24}") {
            proptest::prop_assert!(!visible(&name).chars().any(hidden));
            let f = folded_frame(&name, true);
            proptest::prop_assert!(!f.chars().any(hidden) && !f.contains(';'));
            proptest::prop_assert!(!MARKS.iter().any(|m| f.ends_with(m)), "{f}");
            proptest::prop_assert!(trailing_number(&f).is_none(), "{f}");
            let p = perf_frame(&name, true);
            proptest::prop_assert!(!p.chars().any(hidden) && !p.contains(';') && !p.contains("->") && !p.trim_start().starts_with('('));
            proptest::prop_assert!(!MARKS.iter().any(|m| p.ends_with(m)), "{p}");
            let c = perf_comm(&name);
            proptest::prop_assert!(!c.chars().any(hidden) && !c.contains(';'));
        }
    }
}
