//! The dependency rule of ../shared/STRUCTURE.md, checked on the source: each top-level module
//! of `src/` may name (`crate::<module>`) only the modules listed for it here, so arrows point down.

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
    ("coord", &["config", "storage", "clock"]),
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
    (
        "server",
        &[
            "access", "app", "clock", "cmd", "config", "context", "engine", "metrics", "protocol",
            "storage", "tls",
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

/// `top-level module -> modules it names`, from every `crate::<name>` outside comments.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let named = map.entry(module.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (at, _) in code.match_indices("crate::") {
                let rest = &code[at + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    named.insert(name);
                }
            }
        }
    }
    map
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
