//! Known vulnerability scanners and attack tools, by a token of their default `User-Agent`.
//! Cheap to evade (any client can send any user agent) but it stops the automated noise that
//! makes up most attack traffic, before it costs the upstream anything.

use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use super::{Hit, ids};

const TOKENS: &[&str] = &[
    "sqlmap",
    "nikto",
    "nmap scripting engine",
    "nmap nse",
    "masscan",
    "zgrab",
    "nuclei",
    "wpscan",
    "dirbuster",
    "gobuster",
    "feroxbuster",
    "ffuf",
    "wfuzz",
    "acunetix",
    "netsparker",
    "appscan",
    "w3af",
    "havij",
    "zmeu",
    "arachni",
    "openvas",
    "nessus",
    "skipfish",
    "jaeles",
    "commix",
    "(hydra)",
    "fimap",
    "sqlninja",
    "paros",
    "webinspect",
    "morfeus",
    "jorgee",
    "bbqsql",
    "pangolin",
    "whatweb",
    "interactsh",
    "fuzz faster u fool",
];

fn tokens() -> Option<&'static AhoCorasick> {
    static AC: OnceLock<Option<AhoCorasick>> = OnceLock::new();
    AC.get_or_init(|| {
        AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostFirst)
            .build(TOKENS)
            .ok()
    })
    .as_ref()
}

/// Looks for a scanner token in a `User-Agent` value.
pub fn detect(user_agent: &[u8]) -> Option<Hit> {
    tokens()?
        .find(user_agent)
        .map(|m| Hit::new(ids::SCANNER, m.start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_scanners_in_any_case() {
        for ua in [
            "sqlmap/1.7.2#stable (https://sqlmap.org)",
            "Mozilla/5.00 (Nikto/2.1.6)",
            "Mozilla/5.0 (compatible; Nmap Scripting Engine; https://nmap.org/book/nse.html)",
            "Fuzz Faster U Fool v2.1.0-dev",
            "Mozilla/5.0 (Hydra)",
            "WPScan v3.8.22",
            "gobuster/3.6",
        ] {
            assert!(detect(ua.as_bytes()).is_some(), "{ua}");
        }
    }

    #[test]
    fn passes_browsers_and_tools() {
        for ua in [
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
            "curl/8.5.0",
            "python-requests/2.31",
            "Go-http-client/1.1",
            "kube-probe/1.29",
        ] {
            assert!(detect(ua.as_bytes()).is_none(), "{ua}");
        }
    }
}
