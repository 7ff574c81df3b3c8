//! `waf-rules`: blocks requests matching configured rules. Each rule names where to look
//! (`path` (with query), `method`, `header:NAME`, `body`) and a case-insensitive substring;
//! the first match ends the request with the configured status (default 403) and an
//! `x-waf-rule` header naming the rule. Bodies are buffered (up to `max_body`) and inspected
//! at their end; a larger body gets 413.
//!
//! Config: `{"rules": [{"id": 1001, "where": "header:user-agent", "contains": "sqlmap"},
//! {"id": 1002, "where": "path", "contains": "../"}, {"id": 1003, "where": "body",
//! "contains": "<script"}], "status": 403, "max_body": 1048576}`.

use std::rc::Rc;

use gateway_plugin_sdk::{Body, Filter, Flow, Reply, Request};
use serde::Deserialize;

#[derive(Deserialize)]
struct Rule {
    id: u32,
    #[serde(rename = "where")]
    target: String,
    contains: String,
}

#[derive(Deserialize)]
struct Config {
    rules: Vec<Rule>,
    #[serde(default = "forbidden")]
    status: u16,
    #[serde(default = "mib")]
    max_body: usize,
}

fn forbidden() -> u16 {
    403
}
fn mib() -> usize {
    1 << 20
}

struct Waf(Rc<Config>);

fn matches(haystack: &[u8], needle: &str) -> bool {
    let needle = needle.as_bytes();
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

impl Waf {
    fn block(&self, rule: &Rule) -> Flow {
        gateway_plugin_sdk::log(
            gateway_plugin_sdk::Level::Warn,
            &format!("request blocked by rule {}", rule.id),
        );
        Flow::Reply(
            Reply::new(self.0.status)
                .header("x-waf-rule", &rule.id.to_string())
                .header("content-type", "text/plain")
                .body("blocked\n"),
        )
    }
}

impl Filter for Waf {
    type Config = Config;

    fn create(config: &Rc<Config>) -> Self {
        Self(config.clone())
    }

    fn on_request(&mut self, req: &mut Request) -> Flow {
        for rule in &self.0.rules {
            let value = match rule.target.as_str() {
                "path" => Some(req.path()),
                "method" => Some(req.method()),
                t => t.strip_prefix("header:").and_then(|h| req.header(h)),
            };
            if value.is_some_and(|v| matches(v.as_bytes(), &rule.contains)) {
                return self.block(rule);
            }
        }
        Flow::Continue
    }

    fn on_request_body(&mut self, body: &mut Body, end_of_stream: bool) -> Flow {
        if !self.0.rules.iter().any(|r| r.target == "body") {
            return Flow::Continue;
        }
        if body.len() > self.0.max_body {
            return Flow::Reply(Reply::new(413).body("request body too large\n"));
        }
        if !end_of_stream {
            return Flow::Pause;
        }
        let bytes = body.bytes();
        for rule in self.0.rules.iter().filter(|r| r.target == "body") {
            if matches(&bytes, &rule.contains) {
                return self.block(rule);
            }
        }
        Flow::Continue
    }
}

gateway_plugin_sdk::export_filter!(Waf);
