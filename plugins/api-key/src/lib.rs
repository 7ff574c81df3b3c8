//! `api-key`: API key authentication. The key comes from a header (default `x-api-key`) or a
//! query parameter; a known key passes with `x-consumer: NAME` added (and the key itself
//! removed before the upstream sees it); a missing or unknown key gets 401.
//!
//! Config: `{"keys": {"k-123": "alice", "k-456": "bob"}, "header": "x-api-key",
//! "query": "api_key", "strip": true}`.

use std::collections::HashMap;
use std::rc::Rc;

use gateway_plugin_sdk::{Filter, Flow, Reply, Request};
use serde::Deserialize;

#[derive(Deserialize)]
struct Config {
    keys: HashMap<String, String>,
    #[serde(default = "default_header")]
    header: String,
    #[serde(default)]
    query: Option<String>,
    #[serde(default = "yes")]
    strip: bool,
}

fn default_header() -> String {
    "x-api-key".into()
}
fn yes() -> bool {
    true
}

struct ApiKey(Rc<Config>);

fn query_param(path: &str, name: &str) -> Option<String> {
    let (_, query) = path.split_once('?')?;
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

impl Filter for ApiKey {
    type Config = Config;

    fn create(config: &Rc<Config>) -> Self {
        Self(config.clone())
    }

    fn on_request(&mut self, req: &mut Request) -> Flow {
        let c = &self.0;
        let key = req.header(&c.header).or_else(|| {
            let name = c.query.as_deref()?;
            query_param(&req.path(), name)
        });
        let Some(consumer) = key.as_deref().and_then(|k| c.keys.get(k)) else {
            return Flow::Reply(
                Reply::new(401)
                    .header("www-authenticate", "ApiKey")
                    .header("content-type", "text/plain")
                    .body(if key.is_some() { "invalid API key\n" } else { "missing API key\n" }),
            );
        };
        if c.strip {
            req.remove_header(&c.header);
        }
        req.set_header("x-consumer", consumer);
        Flow::Continue
    }
}

gateway_plugin_sdk::export_filter!(ApiKey);
