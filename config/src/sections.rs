//! Every parse error of a file, not only the first. serde stops at the first unknown key or
//! wrong type, so when the whole file does not parse, each top-level section is parsed alone,
//! and in a section that fails, each of its entries (a list item, a named entry) alone: one
//! error per entry that has one, each located in the whole file.

use crate::error::{ConfigError, Location};
use crate::model::RawConfig;

/// The errors of the file's sections and entries parsed one by one; empty when none fails
/// alone (the error then needs the whole file, and the caller keeps it).
pub(crate) fn each_error(text: &str, file: &str) -> Vec<ConfigError> {
    // An alias may name an anchor of another section: parsed apart, it would fail for nothing.
    if has_anchor(text) {
        return Vec::new();
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut errors = Vec::new();
    for (start, end) in blocks(&lines, 0, lines.len(), 0) {
        let Err(e) = parse(&lines[start..end], file, start) else {
            continue;
        };
        let entries = entry_blocks(&lines, start + 1, end);
        if entries.is_empty() {
            errors.push(e);
            continue;
        }
        let before = errors.len();
        for (index, (from, to, item)) in entries.into_iter().enumerate() {
            let fix = item.then(|| (key_of(lines[start]), index));
            // The section's own line, then the entry: `routes:` and one of its items.
            let mut slice = vec![lines[start]];
            slice.extend_from_slice(&lines[from..to]);
            if let Err(e) = parse_entry(&slice, file, start, from, fix) {
                errors.push(e);
            }
        }
        if errors.len() == before {
            errors.push(e);
        }
    }
    errors
}

/// Whether the text defines a YAML anchor (`&name`) or uses a merge key.
fn has_anchor(text: &str) -> bool {
    text.lines().any(|line| {
        let code = line.split(" #").next().unwrap_or(line);
        code.contains("<<:")
            || code
                .split([' ', '[', '{', ','])
                .any(|word| word.len() > 1 && word.starts_with('&'))
    })
}

/// The blocks of `lines[from..to]` that start at `indent` columns: a line there that is not a
/// comment or blank starts one, which runs to the next.
fn blocks(lines: &[&str], from: usize, to: usize, indent: usize) -> Vec<(usize, usize)> {
    let starts: Vec<usize> = (from..to)
        .filter(|&i| {
            let line = lines[i];
            let trimmed = line.trim_start();
            !trimmed.is_empty()
                && !trimmed.starts_with('#')
                && line.len() - trimmed.len() == indent
                && !(indent == 0 && (trimmed.starts_with("---") || trimmed.starts_with("...")))
        })
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(k, &s)| (s, starts.get(k + 1).copied().unwrap_or(to)))
        .collect()
}

/// The entries of a section's body `lines[from..to]`: its least indented lines start them.
/// Each entry is (first line, end, whether it is a list item).
fn entry_blocks(lines: &[&str], from: usize, to: usize) -> Vec<(usize, usize, bool)> {
    let indent = (from..to)
        .filter_map(|i| {
            let trimmed = lines[i].trim_start();
            (!trimmed.is_empty() && !trimmed.starts_with('#'))
                .then_some(lines[i].len() - trimmed.len())
        })
        .min();
    let Some(indent) = indent else {
        return Vec::new();
    };
    blocks(lines, from, to, indent)
        .into_iter()
        .map(|(s, e)| (s, e, lines[s].trim_start().starts_with('-')))
        .collect()
}

/// The key of a top-level line (`routes:` → `routes`).
fn key_of(line: &str) -> &str {
    line.split(':').next().unwrap_or(line).trim()
}

/// Parses consecutive lines of the file that start at line `first` (0-based).
fn parse(lines: &[&str], file: &str, first: usize) -> Result<(), ConfigError> {
    let text = lines.join("\n");
    let Err(e) = serde_yaml::from_str::<RawConfig>(&text) else {
        return Ok(());
    };
    let line = e.location().map_or(1, |l| l.line());
    let column = e.location().map_or(1, |l| l.column());
    Err(error(e, file, first + line, column, None))
}

/// Parses a section's line followed by one of its entries, the entry starting at line `from`.
fn parse_entry(
    lines: &[&str],
    file: &str,
    section: usize,
    from: usize,
    fix: Option<(&str, usize)>,
) -> Result<(), ConfigError> {
    let text = lines.join("\n");
    let Err(e) = serde_yaml::from_str::<RawConfig>(&text) else {
        return Ok(());
    };
    let line = e.location().map_or(1, |l| l.line());
    let column = e.location().map_or(1, |l| l.column());
    // Line 1 is the section's own line; the entry's lines follow it.
    let at = if line <= 1 {
        section + 1
    } else {
        from + line - 1
    };
    Err(error(e, file, at, column, fix))
}

fn error(
    e: serde_yaml::Error,
    file: &str,
    line: usize,
    column: usize,
    fix: Option<(&str, usize)>,
) -> ConfigError {
    let mut message = e.to_string();
    // serde_yaml appends " at line L column C"; the location prefix says it already.
    if let Some(cut) = message.find(" at line ") {
        message.truncate(cut);
    }
    // A list item parsed alone is item 0 of its section.
    if let Some((section, index)) = fix {
        message = message.replacen(&format!("{section}[0]"), &format!("{section}[{index}]"), 1);
    }
    ConfigError::Parse {
        location: Location {
            file: file.to_owned(),
            line,
            column,
        },
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> Vec<String> {
        each_error(text, "g.yaml")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn one_error_per_entry_located_in_the_whole_file() {
        let text = "\
server:
  drain_timout: 1s
listeners:
  - name: a
    bind: 127.0.0.1:0
  - name: b
    bnd: 127.0.0.1:0
routes:
  # a comment
  - match: { path: / }
    respond: { body: hi }
  - match: { pth: / }
    respond: { body: hi }
  - matchh: {}
upstreams:
  app: { targets: [127.0.0.1:1], balance: fastest }
  ok: { targets: [127.0.0.1:2] }
";
        let errors = shown(text);
        assert_eq!(errors.len(), 5, "{errors:#?}");
        assert!(
            errors[0].starts_with("g.yaml:2:3: server: unknown field `drain_timout`"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("g.yaml:7:5: listeners[1]: unknown field `bnd`"),
            "{}",
            errors[1]
        );
        assert!(
            errors[2].starts_with("g.yaml:12:14: routes[1].match: unknown field `pth`"),
            "{}",
            errors[2]
        );
        assert!(
            errors[3].starts_with("g.yaml:14:5: routes[2]: unknown field `matchh`"),
            "{}",
            errors[3]
        );
        assert!(errors[4].starts_with("g.yaml:16:"), "{}", errors[4]);
        assert!(
            errors[4].contains("upstreams.app.balance: unknown variant `fastest`"),
            "{}",
            errors[4]
        );
    }

    #[test]
    fn a_file_with_anchors_is_left_whole() {
        let text = "x: &a { }\nlisteners: *a\n";
        assert!(shown(text).is_empty());
    }

    #[test]
    fn a_sound_file_has_no_errors() {
        assert!(shown("listeners:\n  - name: a\n    bind: 127.0.0.1:0\n").is_empty());
    }
}
