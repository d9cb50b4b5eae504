//! The dependency rule docs/development.md states ("Where things are"), checked on the source:
//! each top-level module of `src/` may name (`crate::<module>`, or `super::` up to the crate
//! root) in its production code only the modules listed for it here, so arrows point down.
//! Tests may build anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What each top-level module may import. config, protocol and clock import nothing; the
/// engines know only storage, the coordinators and the clock; the app wires it all.
const ALLOWED: &[(&str, &[&str])] = &[
    ("config", &[]),
    ("protocol", &[]),
    ("clock", &[]),
    ("access", &["config"]),
    ("auth", &["config"]),
    ("tls", &["config"]),
    ("storage", &["config"]),
    ("coord", &["config", "storage", "clock", "tls"]),
    ("engine", &["storage", "coord", "clock"]),
    ("metrics", &["engine"]),
    (
        "context",
        &["clock", "config", "coord", "engine", "metrics"],
    ),
    (
        "cmd",
        &[
            "access", "auth", "clock", "context", "engine", "metrics", "protocol",
        ],
    ),
    (
        "http",
        &[
            "access", "auth", "clock", "context", "engine", "metrics", "tls",
        ],
    ),
    // The app wires it all, the command table included (it names the per-command metrics);
    // no command imports the app (they see the context).
    (
        "app",
        &[
            "clock", "cmd", "config", "context", "coord", "engine", "metrics", "storage",
        ],
    ),
    ("run", &["access", "app", "config", "http", "server", "tls"]),
    // Connections: they run commands in the context; only their tests build an app.
    (
        "server",
        &[
            "access", "clock", "cmd", "config", "context", "metrics", "protocol", "tls",
        ],
    ),
];

/// Imports against the rule that are known and still to be removed. Each must still occur, so
/// the list only shrinks; it is empty.
const PENDING: &[(&str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `top-level module -> modules it names`, from every `crate::` path (and `super::` path that
/// climbs to the crate root) in the code outside comments and outside `#[cfg(test)]` items.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        let (module, named) = named_modules(relative, &text);
        if module != "lib" && module != "main" {
            map.entry(module).or_default().extend(named);
        }
    }
    map
}

/// The top-level module of the file at `relative` (to `src/`) and the other top-level modules
/// its production code names.
fn named_modules(relative: &Path, text: &str) -> (String, BTreeSet<String>) {
    let mut path: Vec<String> = relative
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    let module = path[0].clone();
    let code = production_code(text);
    let mut named = BTreeSet::new();
    let mut add = |name: &str| {
        if !name.is_empty() && name != module && name != "self" {
            named.insert(name.to_string());
        }
    };
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let boundary = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        if boundary && rest.starts_with("crate::") {
            at += "crate::".len();
            for name in path_heads(&code[at..]) {
                add(&name);
            }
            continue;
        }
        if boundary && rest.starts_with("super::") {
            let mut climbs = 0;
            while code[at..].starts_with("super::") {
                climbs += 1;
                at += "super::".len();
            }
            // `super` from a module `depth` deep reaches the crate root after `depth` climbs.
            if climbs >= path.len() {
                for name in path_heads(&code[at..]) {
                    add(&name);
                }
            }
            continue;
        }
        at += rest.chars().next().map_or(1, char::len_utf8);
    }
    (module, named)
}

/// The first segment of the path starting at `rest`: one name, or each of a `{a::x, b}` group's.
fn path_heads(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return vec![ident(rest)];
    };
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item_start = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(ident(&group[item_start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(ident(&group[item_start..i]));
                item_start = i + 1;
            }
            _ => {}
        }
    }
    heads
}

/// `text` without comments, string and character literals' contents, and `#[cfg(test)]` items:
/// what the module's production code is made of.
fn production_code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut code = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && (i == 0
                || !(chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_')
                || (chars[i - 1] == 'b' && (i < 2 || !chars[i - 2].is_ascii_alphanumeric())))
        {
            // A raw string r"…" or r#"…"#: it ends at a quote followed by as many hashes.
            let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
            i += 1 + hashes + 1;
            let closing: Vec<char> = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                i += 1;
            }
            i += closing.len();
            code.push_str("\"\"");
        } else if c == '"' {
            // A string: its text is not code (a URL's `//` is no comment).
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            code.push_str("\"\"");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
        } else if c == '\'' && next == Some('\\') {
            // An escaped character literal such as '\'' or '\n'.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            code.push(c);
            i += 1;
        }
    }
    // Drop each `#[cfg(test)]` item: up to its `;`, or through its braces.
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The scanner itself: each way of naming a module is seen, comments, strings and tests are not.
#[test]
fn the_scanner_sees_every_way_of_naming_a_module() {
    let scan = |file: &str, text: &str| -> Vec<String> {
        named_modules(Path::new(file), text).1.into_iter().collect()
    };
    assert_eq!(scan("cmd/admin.rs", "use crate::app::App;"), ["app"]);
    assert_eq!(
        scan(
            "cmd/admin.rs",
            "use crate::{\n    app::App,\n    engine::{a, b},\n    cmd::x,\n};"
        ),
        ["app", "engine"]
    );
    assert_eq!(scan("cmd/admin.rs", "use super::super::app::App;"), ["app"]);
    assert_eq!(scan("cmd/mod.rs", "use super::app::App;"), ["app"]);
    assert_eq!(
        scan("cmd/admin.rs", "use super::key::Key;"),
        Vec::<String>::new()
    );
    assert_eq!(
        scan(
            "coord/zookeeper/registry.rs",
            "use super::super::super::{app, storage::X};"
        ),
        ["app", "storage"]
    );
    assert_eq!(
        scan(
            "cmd/mod.rs",
            "let a = crate::app::App::new(); let b = $crate::metrics::x();"
        ),
        ["app", "metrics"]
    );
    assert_eq!(
        scan(
            "cmd/mod.rs",
            "let u = \"http://x\"; let a = crate::app::x();"
        ),
        ["app"]
    );
    assert_eq!(
        scan(
            "cmd/mod.rs",
            "// crate::app\n/// [`crate::app`]\n/* crate::run */ let s = \"crate::server\";"
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        scan("cmd/mod.rs", "let c = '{';\nfn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::app::App;\n    fn g() { let x = 1; }\n}\nuse crate::engine::E;"),
        ["engine"]
    );
    assert_eq!(
        scan(
            "cmd/mod.rs",
            "#[cfg(test)]\nuse crate::app::App;\nuse crate::engine::E;"
        ),
        ["engine"]
    );
    assert_eq!(
        scan("cmd/mod.rs", "let mycrate::app = 1;"),
        Vec::<String>::new()
    );
    assert_eq!(
        scan(
            "cmd/mod.rs",
            "let j = r#\"{\"a\": \"crate::run\"}\"#; let k = br\"}\"; use crate::engine::E;"
        ),
        ["engine"]
    );
}

#[test]
fn arrows_point_down() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut against = Vec::new();
    let mut seen_pending = BTreeSet::new();
    for (module, named) in imports() {
        let Some(may) = allowed.get(module.as_str()) else {
            against.push(format!(
                "src/{module}: a new top-level module; add it to ALLOWED in tests/dependency_rule.rs"
            ));
            continue;
        };
        for name in named {
            if may.contains(&name.as_str()) {
                continue;
            }
            if PENDING.contains(&(module.as_str(), name.as_str())) {
                seen_pending.insert((module.clone(), name));
                continue;
            }
            against.push(format!("{module} -> {name}"));
        }
    }
    assert!(
        against.is_empty(),
        "imports against the dependency rule:\n  {}",
        against.join("\n  ")
    );
    for (module, name) in PENDING {
        assert!(
            seen_pending.contains(&(module.to_string(), name.to_string())),
            "{module} -> {name} is gone: remove it from PENDING in tests/dependency_rule.rs"
        );
    }
}
