#!/usr/bin/env python3
"""Checks the docs against themselves and against the code; prints one line per problem and
exits 1 if there is any (0 when all is well). Python 3.11 or later (tomllib), standard library
only.

  scripts/check-docs.py [--root DIR] [--leafd BINARY]

* Every relative link and #anchor in README.md and docs/**/*.md resolves (anchors as GitHub makes
  them from headings, plus <a id/name> tags).
* docs/reference/configuration.md lists exactly the keys the config structs in src/config/*.rs
  declare (walked from `Config` through the serde field names and nested sections), each with the
  default the code gives it. With --leafd, the keys and values `leafd check-config` prints for an
  empty configuration are compared too.
* Every error docs/reference/errors.md lists appears in src/: its first word and its literal text
  between placeholders (<tag>, …), allowing for a message composed of several format strings.
* Every error docs/reference/errors.md lists is produced by a test (issue 44): one of its literal
  chunks (the text between placeholders, stripped, of 6 characters or more; the whole error when
  it has none) that no other listed error has appears in a test source: tests/** (Rust, Python, shell, the client
  checks), src/**/tests.rs and the #[cfg(test)] part of the other src/ files. The few no test can
  produce are listed in ERRORS_WITHOUT_TEST with the reason; an entry that a test now covers, or
  that errors.md no longer lists, is a problem too, so the list only shrinks.
* Every metric docs/reference/metrics.md lists is exported by src/ (process_* by the
  metrics-process crate), and every metric named in src/metrics/names.rs is listed.
* Every command of src/cmd/table.rs is in docs/reference/commands.md.
* Every leafd command line in the docs' code (fenced blocks and code spans) uses flags and
  subcommands src/main.rs declares.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import unicodedata
import urllib.parse
from pathlib import Path

CONFIG_DOC = "docs/reference/configuration.md"
ERRORS_DOC = "docs/reference/errors.md"
METRICS_DOC = "docs/reference/metrics.md"
COMMANDS_DOC = "docs/reference/commands.md"

# Errors of ERRORS_DOC that no test produces, exactly as errors.md writes them. Keep it short:
# an error leaves this list as soon as a test makes it happen.
ERRORS_WITHOUT_TEST = {
    # A ZooKeeper server that stops answering for a whole snowflake.zookeeper lease_ms while a
    # node runs: the ZooKeeper tests share one private server (LEAFD_TEST_ZOOKEEPER) that must
    # stay up for the others; the lapse is tested on the coordinator, not this reply.
    "UNAVAILABLE snowflake: no ZooKeeper time report since <time>",
    # ZooKeeper coordinator only, with other live nodes reporting their clocks: needs a ZooKeeper
    # server; tests/snowflake_zookeeper.rs (a_clock_far_from_the_other_nodes_refuses_to_start)
    # makes it happen when LEAFD_TEST_ZOOKEEPER is set, matching the CoordError, not its text.
    "clock differs from the average of the other live nodes by <n> ms (limit <m> ms); refusing to start",
    # MySQL/MariaDB only, and only after another node held the migration lock for the whole
    # wait (LOCK_WAIT_SECS = 60 s in src/storage/migrate.rs): too slow for a test.
    "storage unavailable: another node held the schema migration lock (leafd_migration_lock) for <n> s",
    # A write to the state directory that fails (a full or failing disk; root, as CI runs,
    # writes through any permission): tests/reliability/full_disk.py fills an 8 MB tmpfs under
    # load in .ci/run and checks that nothing is served past a mark that was not written.
    "UNAVAILABLE segment for '<tag>' exhausted and cannot record the high-water mark in the state directory: <cause>",
}

# Where a test may produce an error (besides src/**/tests.rs and #[cfg(test)] parts).
TEST_SOURCE_SUFFIXES = {".rs", ".py", ".sh", ".js", ".mjs", ".ts", ".go", ".java"}

problems = []


def problem(where, message):
    problems.append(f"{where}: {message}")


# ---------------------------------------------------------------- Markdown


def markdown_files(root):
    files = [root / "README.md"]
    files += sorted((root / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and marker:
            fence = marker.group(1)[0] * len(marker.group(1))
            continue
        if fence is not None:
            if stripped.startswith(fence) and stripped.strip(fence[0]).strip() == "":
                fence = None
            continue
        yield number, line


def without_code_spans(line):
    return re.sub(r"(`+)(.+?)\1", lambda m: "code", line)


def github_slug(heading):
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in " -" or ch == "_" or unicodedata.category(ch)[0] in "LMN" or unicodedata.category(ch) == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors_of(path, cache={}):
    if path in cache:
        return cache[path]
    text = path.read_text(encoding="utf-8")
    seen = {}
    anchors = set()
    for _, line in prose_lines(text):
        heading = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
        for tag in re.finditer(r"<a\s+(?:id|name)=\"([^\"]+)\"", line):
            anchors.add(tag.group(1))
    cache[path] = anchors
    return anchors


def check_links(root):
    for md in markdown_files(root):
        rel = md.relative_to(root)
        text = md.read_text(encoding="utf-8")
        for number, line in prose_lines(text):
            plain = without_code_spans(line)
            targets = [m.group(1) for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", plain)]
            ref = re.match(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", plain)
            if ref:
                targets.append(ref.group(1))
            for target in targets:
                if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
                    continue  # http:, https:, mailto: …
                path_part, _, anchor = target.partition("#")
                path_part = urllib.parse.unquote(path_part)
                if path_part:
                    base = root if path_part.startswith("/") else md.parent
                    resolved = (base / path_part.lstrip("/")).resolve()
                    if not resolved.exists():
                        problem(f"{rel}:{number}", f"link to '{target}': {path_part} does not exist")
                        continue
                else:
                    resolved = md
                if anchor and resolved.is_file() and resolved.suffix == ".md":
                    if urllib.parse.unquote(anchor) not in anchors_of(resolved):
                        problem(f"{rel}:{number}", f"link to '{target}': no heading or anchor '#{anchor}' in {resolved.relative_to(root) if resolved.is_relative_to(root) else resolved}")


def table_rows(path):
    """(line number, [cells]) of every Markdown table row that is not a header separator."""
    text = path.read_text(encoding="utf-8")
    for number, line in prose_lines(text):
        if not line.lstrip().startswith("|"):
            continue
        body = line.strip().strip("|")
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
            continue
        yield number, cells


def code_spans(text):
    return [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", text)]


# ---------------------------------------------------------------- Rust source


def rust_scan(text):
    """Returns (code without comments, [string literal contents]) of a Rust file."""
    code = []
    strings = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            continue
        raw = re.match(r"b?r(#*)\"", text[i:i + 40])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = raw.group(1)
            start = i + raw.end()
            end = text.find('"' + hashes, start)
            end = n if end < 0 else end
            strings.append(text[start:end])
            code.append('"' + text[start:end] + '"')
            i = end + 1 + len(hashes)
            continue
        if c == '"':
            j, out = i + 1, []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    e = text[j + 1]
                    if e == "\n":
                        j += 2
                        while j < n and text[j] in " \t\r\n":
                            j += 1
                        continue
                    out.append({"n": "\n", "t": "\t", "r": "\r", "0": "\0"}.get(e, e))
                    j += 2
                    continue
                out.append(text[j])
                j += 1
            strings.append("".join(out))
            code.append('"' + "".join(out) + '"')
            i = j + 1
            continue
        if c == "'":
            if text.startswith("\\", i + 1):
                j = text.find("'", i + 2)
                if j > 0:
                    code.append("' '")
                    i = j + 1
                    continue
            elif i + 2 < n and text[i + 2] == "'":
                code.append("' '")
                i += 3
                continue
        code.append(c)
        i += 1
    return "".join(code), strings


class Source:
    def __init__(self, root):
        self.files = {}
        for path in sorted((root / "src").rglob("*.rs")):
            code, strings = rust_scan(path.read_text(encoding="utf-8"))
            self.files[path.relative_to(root).as_posix()] = (code, strings)
        self.strings = [s for _, strings in self.files.values() for s in strings]
        pieces = set()
        for s in self.strings:
            protected = s.replace("{{", "\x01").replace("}}", "\x02")
            for piece in re.split(r"\{[^{}]*\}", protected):
                pieces.add(piece.replace("\x01", "{").replace("\x02", "}"))
        pieces.discard("")
        self.pieces = pieces
        self.prefixes = {p[:k] for p in pieces for k in range(1, len(p) + 1)}
        self.suffixes = {p[k:] for p in pieces for k in range(len(p))}
        self.literals = set(self.strings)

    def mentions(self, text):
        """True when `text` is written in one string literal, or composed of several format
        strings: a suffix of one, whole ones, then a prefix of another (at most four parts)."""
        if any(text in p for p in self.pieces):
            return True

        def cover(rest, parts_left, first):
            if rest in self.prefixes:
                return True
            if parts_left == 1:
                return False
            for k in range(len(rest) - 1, 0, -1):
                head = rest[:k]
                if (head in self.suffixes if first else head in self.pieces) and cover(rest[k:], parts_left - 1, False):
                    return True
            return False

        return cover(text, 4, True)


# ---------------------------------------------------------------- config keys

REQUIRED = object()
UNSET = object()
UNKNOWN = object()


def rename(name, rule):
    words = name.split("_") if "_" in name or name.islower() else re.findall(r"[A-Z][a-z0-9]*", name)
    if rule == "lowercase":
        return name.lower()
    if rule == "snake_case":
        return "_".join(w.lower() for w in words) if not name.islower() else name
    if rule == "kebab-case":
        return "-".join(w.lower() for w in words)
    if rule == "UPPERCASE":
        return name.upper()
    if rule == "SCREAMING_SNAKE_CASE":
        return "_".join(w.upper() for w in words)
    if rule == "camelCase":
        return words[0].lower() + "".join(w.capitalize() for w in words[1:])
    if rule == "PascalCase":
        return "".join(w.capitalize() for w in words)
    return name


def serde_args(attrs):
    args = {}
    for attr in attrs:
        m = re.match(r"#\[serde\((.*)\)\]$", attr, re.S)
        if not m:
            continue
        for part in re.finditer(r"(\w+)(?:\s*=\s*\"([^\"]*)\")?", m.group(1)):
            args[part.group(1)] = part.group(2) if part.group(2) is not None else True
    return args


def split_top(text, sep=","):
    parts, depth, current = [], 0, []
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = text.find('"', i + 1)
            current.append(text[i:j + 1])
            i = j + 1
            continue
        if c in "([{<" and not (c == "<" and text[i - 1:i] in (" ", "=")):
            depth += 1
        elif c in ")]}>" and not (c == ">" and text[i - 1:i] in ("-", "=")):
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    if "".join(current).strip():
        parts.append("".join(current))
    return parts


class ConfigModel:
    def __init__(self, source):
        self.structs = {}
        self.enums = {}
        self.defaults = {}
        self.functions = {}
        for name, (code, _) in source.files.items():
            if not name.startswith("src/config/"):
                continue
            self._read(code)

    def _read(self, code):
        item = re.compile(r"((?:#\[[^\n]*\]\s*)*)pub\s+(struct|enum)\s+(\w+)[^{;]*\{")
        for m in item.finditer(code):
            attrs = re.findall(r"#\[[^\n]*\]", m.group(1))
            body = self._block(code, m.end() - 1)
            if m.group(2) == "struct":
                self.structs[m.group(3)] = (attrs, self._fields(body))
            else:
                rule = serde_args(attrs).get("rename_all")
                variants = {}
                for v in re.finditer(r"(?:#\[[^\n]*\]\s*)*(\w+)\s*(?:,|$)", body):
                    variants[v.group(1)] = rename(v.group(1), rule) if rule else v.group(1)
                self.enums[m.group(3)] = variants
        for m in re.finditer(r"impl\s+Default\s+for\s+(\w+)\s*\{", code):
            body = self._block(code, m.end() - 1)
            # The struct literal, not the `-> Self {` of the function's signature.
            lit = next((l for l in re.finditer(r"\b(?:Self|" + m.group(1) + r")\s*\{", body)
                        if not body[:l.start()].rstrip().endswith("->")), None)
            if not lit:
                continue
            inner = self._block(body, lit.end() - 1)
            values = {}
            for part in split_top(inner):
                field, _, expr = part.strip().partition(":")
                if field.strip() and not field.strip().startswith(".."):
                    values[field.strip()] = expr.strip() or field.strip()
            self.defaults[m.group(1)] = values
        for m in re.finditer(r"fn\s+(\w+)\s*\(\s*\)\s*->\s*[^{]+\{", code):
            self.functions[m.group(1)] = self._block(code, m.end() - 1).strip()

    @staticmethod
    def _block(text, open_index):
        depth = 0
        for i in range(open_index, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[open_index + 1:i]
        return text[open_index + 1:]

    @staticmethod
    def _fields(body):
        fields = []
        for part in split_top(re.sub(r"#\[[^\n]*\]", lambda m: m.group(0).replace(",", "\x03"), body)):
            attrs = [a.replace("\x03", ",") for a in re.findall(r"#\[[^\n]*\]", part)]
            rest = re.sub(r"#\[[^\n]*\]", "", part).strip()
            m = re.match(r"(?:pub(?:\([^)]*\))?\s+)?(?:r#)?(\w+)\s*:\s*(.+)$", rest, re.S)
            if m:
                fields.append((m.group(1), " ".join(m.group(2).split()), attrs))
        return fields

    def evaluate(self, expr, type_name):
        expr = expr.strip()
        expr = re.sub(r"\.(into|to_string|to_owned)\(\)$", "", expr)
        m = re.fullmatch(r"(?:String::from|Some)\((.*)\)", expr, re.S)
        if m:
            return self.evaluate(m.group(1), type_name)
        if re.fullmatch(r'"(?:[^"\\]|\\.)*"', expr):
            return expr[1:-1]
        if expr in ("String::new()",):
            return ""
        if expr in ("Vec::new()", "vec![]", "Vec::default()"):
            return []
        if expr == "None":
            return UNSET
        if expr in ("true", "false"):
            return expr == "true"
        if re.fullmatch(r"[0-9_ ()*+\-]+", expr) and re.search(r"\d", expr):
            return int(eval(expr.replace("_", ""), {"__builtins__": {}}))
        m = re.fullmatch(r"(\w+)::(\w+)", expr)
        if m and m.group(1) in self.enums and m.group(2) in self.enums[m.group(1)]:
            return self.enums[m.group(1)][m.group(2)]
        return UNKNOWN

    def type_default(self, type_text):
        inner = type_text.replace(" ", "")
        if inner.startswith("Option<"):
            return UNSET
        if inner.startswith("Vec<"):
            return []
        if inner == "bool":
            return False
        if inner == "String":
            return ""
        if re.fullmatch(r"[iu](8|16|32|64|128|size)|f32|f64", inner):
            return 0
        if inner in self.enums:
            return UNKNOWN
        return UNKNOWN

    def keys(self):
        """{dotted key: default} walked from `Config`."""
        out = {}
        if "Config" not in self.structs:
            problem("src/config", "no `pub struct Config` found: scripts/check-docs.py cannot read the config structs")
            return out
        self._walk("Config", "", out, set())
        return out

    def _walk(self, struct, prefix, out, seen):
        if struct in seen:
            return
        attrs, fields = self.structs[struct]
        struct_serde = serde_args(attrs)
        rule = struct_serde.get("rename_all")
        defaults = self.defaults.get(struct)
        derives_default = any("Default" in a for a in attrs if a.startswith("#[derive"))
        for name, type_text, field_attrs in fields:
            fs = serde_args(field_attrs)
            if fs.get("skip") or fs.get("skip_deserializing"):
                continue
            key_name = fs.get("rename") or (rename(name, rule) if rule else name)
            compact = type_text.replace(" ", "")
            m = re.fullmatch(r"(Option|Vec|Box)<(.+)>", compact)
            wrapper, inner = (m.group(1), m.group(2)) if m else (None, compact)
            inner_name = re.sub(r".*::", "", inner)
            key = f"{prefix}{key_name}"
            if fs.get("flatten") and inner_name in self.structs:
                self._walk(inner_name, prefix, out, seen | {struct})
                continue
            if inner_name in self.structs and wrapper != "Vec":
                self._walk(inner_name, key + ".", out, seen | {struct})
                continue
            # The default: a field's own serde default, else the struct's (its Default impl, or
            # the type's default when the struct derives Default), else required.
            if isinstance(fs.get("default"), str):
                body = self.functions.get(fs["default"].split("::")[-1])
                default = self.evaluate(body, type_text) if body else UNKNOWN
            elif fs.get("default") is True:
                default = self.type_default(type_text)
            elif struct_serde.get("default"):
                if defaults is not None and name in defaults:
                    default = self.evaluate(defaults[name], type_text)
                elif derives_default:
                    default = self.type_default(type_text)
                else:
                    default = UNKNOWN
            elif wrapper == "Option":
                default = UNSET  # serde treats a missing Option as None
            else:
                default = REQUIRED
            out[key] = default
            if wrapper == "Vec" and inner_name in self.structs:
                self._walk(inner_name, key + "[].", out, seen | {struct})


def parse_doc_default(cell):
    text = cell.strip()
    if text.lower().startswith("unset"):
        return UNSET
    if text.lower().startswith("required"):
        return REQUIRED
    spans = code_spans(text)
    if not spans:
        return UNKNOWN
    return parse_toml_value(spans[0])


def parse_toml_value(value):
    """A TOML value as Python reads it (lists, strings, numbers); text that is not one stays text."""
    value = value.strip()
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def shown(value):
    if value is UNSET:
        return "unset"
    if value is REQUIRED:
        return "required"
    if value is UNKNOWN:
        return "?"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def check_config(root, source, leafd):
    doc = root / CONFIG_DOC
    if not doc.is_file():
        problem(CONFIG_DOC, "missing: the configuration reference")
        return
    code_keys = ConfigModel(source).keys()
    documented = {}
    for number, cells in table_rows(doc):
        m = re.fullmatch(r"`([a-z0-9_]+(?:\[\])?(?:\.[a-z0-9_]+(?:\[\])?)+)`", cells[0])
        if not m:
            continue
        key = m.group(1)
        if key in documented:
            problem(f"{CONFIG_DOC}:{number}", f"key `{key}` is listed twice")
        documented[key] = (number, parse_doc_default(cells[1]) if len(cells) > 1 else UNKNOWN)
    if code_keys and not documented:
        problem(CONFIG_DOC, "no key rows found (a table row whose first cell is `section.key`)")
    for key, (number, doc_default) in documented.items():
        if code_keys and key not in code_keys:
            problem(f"{CONFIG_DOC}:{number}", f"key `{key}` is not in the code (src/config/*.rs)")
            continue
        code_default = code_keys.get(key, UNKNOWN)
        if code_default is UNKNOWN or doc_default is UNKNOWN:
            continue
        if code_default is not doc_default and code_default != doc_default:
            problem(f"{CONFIG_DOC}:{number}", f"key `{key}`: documented default {shown(doc_default)}, the code's is {shown(code_default)}")
    for key in code_keys:
        if key not in documented:
            problem(CONFIG_DOC, f"key `{key}` of the code (src/config/*.rs) is not documented")
    if leafd:
        check_config_binary(leafd, code_keys, documented)


def check_config_binary(leafd, code_keys, documented):
    try:
        import tomllib
    except ImportError:
        problem("--leafd", "needs Python 3.11 or later (tomllib)")
        return
    with tempfile.TemporaryDirectory() as work:
        empty = Path(work) / "empty.toml"
        empty.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFD_")}
        run = subprocess.run([os.path.abspath(leafd), "check-config", "--config", str(empty)], cwd=work, env=env,
                             capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        problem(leafd, f"check-config exited {run.returncode}: {run.stderr.strip()}")
        return
    lines = run.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("[")), 0)
    try:
        printed = tomllib.loads("\n".join(lines[start:]))
    except tomllib.TOMLDecodeError as e:
        problem(leafd, f"check-config printed TOML that does not parse: {e}")
        return

    def flat(table, prefix):
        for name, value in table.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", value

    for key, value in flat(printed, ""):
        if key not in code_keys:
            problem(leafd, f"check-config prints `{key}`, which scripts/check-docs.py did not find in src/config/*.rs (its parser is out of date)")
        if key not in documented:
            problem(CONFIG_DOC, f"key `{key}` (printed by check-config) is not documented")
            continue
        number, doc_default = documented[key]
        if doc_default is not UNKNOWN and doc_default != value:
            problem(f"{CONFIG_DOC}:{number}", f"key `{key}`: documented default {shown(doc_default)}, check-config prints {shown(value)}")


# ---------------------------------------------------------------- errors, metrics, commands


def check_errors(root, source):
    doc = root / ERRORS_DOC
    if not doc.is_file():
        problem(ERRORS_DOC, "missing: the errors reference")
        return
    count = 0
    for number, cells in table_rows(doc):
        if cells[0].lower() == "error":
            continue
        for token in code_spans(cells[0]):
            count += 1
            words = token.split()
            first = words[0] if words else ""
            if re.fullmatch(r"[A-Z]{2,}", first) and not source.mentions(first + " ") and first not in source.literals:
                problem(f"{ERRORS_DOC}:{number}", f"error `{token}`: its first word {first} is in no string of src/")
                continue
            chunks = [c for c in re.split(r"<[^<>]*>|…|\.\.\.", token)]
            for index, chunk in enumerate(chunks):
                text = chunk if index else chunk.lstrip()
                if len(text.strip()) < 4:
                    continue
                if not (source.mentions(text) or source.mentions(text.strip())):
                    problem(f"{ERRORS_DOC}:{number}", f"error `{token}`: '{text.strip()}' is in no string of src/")
                    break
    if count == 0:
        problem(ERRORS_DOC, "no errors found (table rows whose first cell holds `CODE message`)")


def test_text(root):
    """The text of every test source: tests/**, src/**/tests.rs (and files under a tests/
    directory of src/), and the #[cfg(test)] part of the other src/ files."""
    texts = []
    for path in sorted((root / "tests").rglob("*")):
        if path.is_file() and path.suffix in TEST_SOURCE_SUFFIXES:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    for path in sorted((root / "src").rglob("*.rs")):
        text = path.read_text(encoding="utf-8")
        if path.name == "tests.rs" or "tests" in path.relative_to(root / "src").parts[:-1]:
            texts.append(text)
        elif "#[cfg(test)]" in text:
            texts.append(text[text.index("#[cfg(test)]"):])
    return "\n".join(texts)


def error_chunks(token):
    """The literal parts of an error (between placeholders and ellipses) a test can quote."""
    chunks = [c.strip() for c in re.split(r"<[^<>]*>|…|\.\.\.", token)]
    return [c for c in chunks if len(c) >= 6] or [token]


def check_errors_tested(root):
    doc = root / ERRORS_DOC
    if not doc.is_file():
        return
    tests = test_text(root)
    listed = [(number, token) for number, cells in table_rows(doc)
              if cells[0].lower() != "error" for token in code_spans(cells[0])]
    # A part several errors share (`ERR tag '`, `UNAVAILABLE segment for '`) proves none of
    # them: an error is tested by a part only it has (all of its parts when it has none).
    shared = collections.Counter(chunk for _, token in listed for chunk in set(error_chunks(token)))
    for number, token in listed:
        chunks = error_chunks(token)
        own = [chunk for chunk in chunks if shared[chunk] == 1] or chunks
        tested = any(chunk in tests for chunk in own)
        if token in ERRORS_WITHOUT_TEST:
            if tested:
                problem(f"{ERRORS_DOC}:{number}", f"error `{token}` is produced by a test now: remove it from ERRORS_WITHOUT_TEST in scripts/check-docs.py")
        elif not tested:
            problem(f"{ERRORS_DOC}:{number}", f"error `{token}`: no test produces it (none of {own} is in tests/ or a #[cfg(test)] part of src/); write one, or add it to ERRORS_WITHOUT_TEST with the reason")
    for token in sorted(ERRORS_WITHOUT_TEST - {token for _, token in listed}):
        problem("scripts/check-docs.py", f"ERRORS_WITHOUT_TEST lists `{token}`, which {ERRORS_DOC} does not")


def check_metrics(root, source):
    doc = root / METRICS_DOC
    if not doc.is_file():
        problem(METRICS_DOC, "missing: the metrics reference")
        return
    documented = set()
    uses_process_crate = any("metrics_process" in code for code, _ in source.files.values())
    for number, cells in table_rows(doc):
        for name in code_spans(cells[0]):
            if not re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", name):
                continue
            documented.add(name)
            if name.startswith("process_"):
                if not uses_process_crate:
                    problem(f"{METRICS_DOC}:{number}", f"metric `{name}`: src/ no longer uses the metrics-process crate")
            elif name not in source.literals:
                problem(f"{METRICS_DOC}:{number}", f"metric `{name}` is not exported by src/ (no string \"{name}\")")
    names = source.files.get("src/metrics/names.rs")
    if names is None:
        problem("src/metrics/names.rs", "missing: scripts/check-docs.py reads the metric names from it")
        return
    exported = {s for s in names[1] if re.fullmatch(r"leafd_[a-z0-9_]+", s)}
    if not exported:
        problem("src/metrics/names.rs", "no leafd_* metric names found")
    for name in sorted(exported - documented):
        problem(METRICS_DOC, f"metric `{name}` (src/metrics/names.rs) is not documented")


def check_commands(root, source):
    doc = root / COMMANDS_DOC
    table = source.files.get("src/cmd/table.rs")
    if table is None or not doc.is_file():
        problem(COMMANDS_DOC if table else "src/cmd/table.rs", "missing")
        return
    names = re.findall(r"spec\(\s*\w+,\s*\"([a-z.]+)\"", table[0])
    if not names:
        problem("src/cmd/table.rs", "no commands found: scripts/check-docs.py cannot read the command table")
    # A command is documented by a table row whose first cell has a code span starting with it.
    documented = set()
    for _, cells in table_rows(doc):
        for span in code_spans(cells[0]):
            documented.add(span.split()[0] if span.split() else "")
    for name in names:
        if name.upper() not in documented:
            problem(COMMANDS_DOC, f"command {name.upper()} (src/cmd/table.rs) has no row (a first cell starting `{name.upper()}`)")


def cli_of(main_rs):
    """leafd's flags (long and short, each with whether it takes a value) and subcommands, read
    from the clap derive in src/main.rs: `struct Cli`'s #[arg(...)] fields, `enum Command`'s
    variants (kebab-case), plus clap's own --help/-h and --version/-V."""
    flags = {"--help": False, "-h": False, "--version": False, "-V": False}
    cli = re.search(r"struct Cli \{(.*?)\n\}", main_rs, re.S)
    for attrs, field in re.findall(r"#\[arg\(([^]]*?)\)\]\s*(\w+):", cli.group(1) if cli else "", re.S):
        words = [w.strip() for w in attrs.split(",")]
        takes = True  # every leafd flag takes a value
        if "long" in words:
            flags["--" + field.replace("_", "-")] = takes
        if "short" in words:
            flags["-" + field[0]] = takes
    commands = re.search(r"enum Command \{(.*?)\n\}", main_rs, re.S)
    names = re.findall(r"^\s*(\w+),", commands.group(1) if commands else "", re.M)
    subcommands = {re.sub(r"(?<!^)([A-Z])", r"-\1", n).lower() for n in names}
    return flags, subcommands


def check_cli(root, source):
    """Every leafd command line in the docs (in code: fenced blocks and `spans`) uses flags and
    subcommands that leafd has: a removed or misspelt flag (`--print-config`) fails here."""
    main_rs = source.files.get("src/main.rs")
    if main_rs is None:
        problem("src/main.rs", "missing")
        return
    flags, subcommands = cli_of(main_rs[0])
    if "--config" not in flags or not subcommands:
        problem("src/main.rs", "scripts/check-docs.py cannot read the CLI (struct Cli, enum Command)")
        return
    # leafd as the command: first on the line (after a `$ ` prompt, `sudo`, `exec`), or after
    # `&&`, `;`, `|` or `$(`; not a path given to another program (`crash.py target/debug/leafd`).
    invocation = re.compile(
        r"(?:^|&&|;|\||\$\()\s*(?:\$\s+)?(?:(?:sudo|exec|nohup)\s+)?(?:[\w./-]*/)?leafd"
        r"((?:[ \t]+[^\s`|;&#]+)+)")
    for path in markdown_files(root):
        text = path.read_text()
        code = []
        fence, shell = None, False
        for line in text.splitlines():
            marker = re.match(r"\s*(`{3,}|~{3,})\s*(\w*)", line)
            if marker:
                opening = fence is None
                fence = marker.group(1) if opening else None
                # Commands are in shell blocks; a ``` or ```text block holds output.
                shell = opening and marker.group(2) in ("sh", "bash", "shell", "console")
                continue
            if fence:
                code.extend([line] if shell else [])
            else:
                code.extend(code_spans(line))
        for snippet in code:
            for match in invocation.finditer(snippet):
                tokens = match.group(1).split()
                expects_value = False
                for token in tokens:
                    if expects_value:
                        expects_value = False
                        continue
                    if token.startswith("-"):
                        flag = token.split("=", 1)[0]
                        if flag not in flags:
                            problem(path.relative_to(root), f"`leafd {' '.join(tokens)}`: leafd has no flag {flag}")
                            break
                        expects_value = flags[flag] and "=" not in token
                        continue
                    # A subcommand ends the line or comes before flags; a word followed by more
                    # words is prose or output (`leafd is running in protected mode`).
                    rest = tokens[tokens.index(token) + 1:]
                    looks_like_command = not rest or rest[0].startswith("-")
                    if (looks_like_command and re.fullmatch(r"[a-z][a-z-]*", token)
                            and token not in subcommands):
                        problem(path.relative_to(root), f"`leafd {' '.join(tokens)}`: leafd has no subcommand {token}")
                    break


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the repository (default: this script's parent directory)")
    parser.add_argument("--leafd", help="a leafd binary: also compare `leafd check-config` with the reference")
    args = parser.parse_args()
    root = args.root.resolve()
    source = Source(root)
    check_links(root)
    check_config(root, source, args.leafd)
    check_errors(root, source)
    check_errors_tested(root)
    check_metrics(root, source)
    check_commands(root, source)
    check_cli(root, source)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
