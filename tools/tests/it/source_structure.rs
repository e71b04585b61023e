//! The layout rules of issue 25 item 1, checked on the workspace's sources: each engine
//! subsystem holds its own handles, so no engine module but the facade (`engine/src/engine.rs`)
//! and `lib.rs` imports `engine.rs`; and functions of the server crates (engine/, bookie/,
//! proxy/ and the crates under them) and of the `quire` command (tools/src) are split along
//! their steps, so none is over 100 lines.
//! On failure the test lists every offender with its file, line and length.

use std::path::{Path, PathBuf};

/// Longest function allowed, in lines from its `fn` line to its closing brace.
const FN_LINES_MAX: usize = 100;

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read source dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The workspace root (this crate is `tools/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tools/ has a parent")
        .to_path_buf()
}

/// Every `src` directory of the server crates: engine/, bookie/ and proxy/ and the crates
/// nested in them (bookie/wire, proxy/ledger, ...), and the `quire` command's (tools/src, one
/// module per command since issue 25 item 4).
fn server_src_dirs() -> Vec<PathBuf> {
    let mut out = vec![root().join("tools").join("src")];
    for top in ["engine", "bookie", "proxy"] {
        let top = root().join(top);
        out.push(top.join("src"));
        for e in std::fs::read_dir(&top).expect("read crate dir") {
            let p = e.expect("dir entry").path().join("src");
            if p.is_dir() {
                out.push(p);
            }
        }
    }
    out
}

/// `text` with comments, string literals and char literals blanked out (newlines kept), so that
/// braces and keywords are only code's.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1).copied() == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1).copied() == Some('*') {
            while i < c.len() && !(c[i] == '*' && c.get(i + 1).copied() == Some('/')) {
                out.push(blank(c[i]));
                i += 1;
            }
            out.push_str("  ");
            i += 2;
        } else if c[i] == 'r'
            && (c.get(i + 1).copied() == Some('"') || c.get(i + 1).copied() == Some('#'))
        {
            // A raw string r"..." or r#"..."#.
            let mut hashes = 0;
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|h| c.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &c[i..j.min(c.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                let n = if c[i] == '\\' { 2 } else { 1 };
                for &ch in &c[i..(i + n).min(c.len())] {
                    out.push(blank(ch));
                }
                i += n;
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\''
            && (c.get(i + 1).copied() == Some('\\') || c.get(i + 2).copied() == Some('\''))
        {
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) has no closing quote.
            let mut j = i + 1;
            if c[j] == '\\' {
                j += 2;
            } else {
                j += 1;
            }
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            for _ in i..=j.min(c.len() - 1) {
                out.push(' ');
            }
            i = j + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The name of the function whose `fn` keyword starts `line` (after visibility and
/// qualifiers), if one does.
fn fn_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.peek() {
        let qualifier =
            matches!(*w, "pub" | "const" | "async" | "unsafe" | "extern") || w.starts_with("pub(");
        if !qualifier {
            break;
        }
        words.next();
    }
    if words.next()? != "fn" {
        return None;
    }
    let name = words.next()?;
    let end = name
        .find(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
        .unwrap_or(name.len());
    Some(&name[..end])
}

/// Every function of `text` with its first line (1-based) and length in lines, from its `fn`
/// line to the brace closing its body (declarations without a body are skipped).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let mut depth = 0i64;
        let mut opened = false;
        'scan: for (k, l) in lines[start..].iter().enumerate() {
            if !opened && depth == 0 && l.trim_end().ends_with(';') && !l.contains('{') {
                break;
            }
            for ch in l.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
                if opened && depth == 0 {
                    out.push((name.to_string(), start + 1, k + 1));
                    break 'scan;
                }
            }
        }
    }
    out
}

#[test]
fn only_the_facade_and_lib_import_the_engine_module() {
    // Goal: each subsystem holds its own handles; none reaches into the facade's state.
    let src = root().join("engine/src");
    let mut offenders = Vec::new();
    for path in rust_files(&src) {
        let rel = path.strip_prefix(&src).expect("under src").to_path_buf();
        if rel == Path::new("engine.rs") || rel == Path::new("lib.rs") {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&path).expect("read source"));
        if code.contains("crate::engine") || code.contains("super::engine") {
            offenders.push(rel.display().to_string());
        }
    }
    assert!(
        offenders.is_empty(),
        "engine modules importing engine.rs (only the facade and lib.rs may): {offenders:?}"
    );
}

#[test]
fn no_server_function_is_over_100_lines() {
    // Goal: functions are split along their steps (named helpers), none over about 100 lines.
    let root = root();
    let mut long = Vec::new();
    let mut counted = 0;
    for src in server_src_dirs() {
        for path in rust_files(&src) {
            let text = std::fs::read_to_string(&path).expect("read source");
            for (name, line, len) in functions(&text) {
                counted += 1;
                if len > FN_LINES_MAX {
                    let rel = path.strip_prefix(&root).expect("under the root");
                    long.push(format!("{}:{line} {name} ({len} lines)", rel.display()));
                }
            }
        }
    }
    assert!(counted > 1000, "the scan found only {counted} functions");
    assert!(
        long.is_empty(),
        "functions over {FN_LINES_MAX} lines: {long:?}"
    );
}

#[test]
fn the_function_scan_counts_bodies_not_strings_or_declarations() {
    // Goal: the length check measures what it claims: braces in strings, chars and comments
    // do not count, a declaration without a body is skipped, `[u8; 20]` in a signature is not
    // mistaken for the end of a declaration.
    let text = "trait T {\n    fn decl(&self);\n}\n\
                pub(crate) async fn f(k: [u8; 20]) -> u8 {\n    let s = \"}}{\";\n    \
                let c = '{';\n    // }\n    let r = r#\"}\"#;\n    0\n}\n\
                fn g<'a>(x: &'a str) -> &'a str {\n    x\n}\n";
    let fns = functions(text);
    assert_eq!(
        fns,
        vec![("f".to_string(), 4, 7), ("g".to_string(), 11, 3)],
        "{}",
        code_only(text)
    );
}
