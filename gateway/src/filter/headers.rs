//! The native `headers` filter: set, add and remove request and response headers. Names and
//! values are parsed into `HeaderName`/`HeaderValue` once, when the generation is built.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{request, response};

use super::{FilterFactory, Flow, HttpFilter};
use crate::body::BoxError;
use crate::context::RequestCx;
use gateway_config::model::HeadersFilterConfig;

/// Edits compiled from config.
#[derive(Debug, Default)]
struct Edits {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl Edits {
    fn compile<'a>(
        set: impl IntoIterator<Item = (&'a String, &'a String)>,
        add: impl IntoIterator<Item = (&'a String, &'a String)>,
        remove: &[String],
    ) -> Result<Self, String> {
        let pair = |(k, v): (&String, &String)| -> Result<(HeaderName, HeaderValue), String> {
            Ok((
                HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header `{k}`: {e}"))?,
                HeaderValue::from_str(v).map_err(|e| format!("header `{k}` value: {e}"))?,
            ))
        };
        Ok(Self {
            set: set.into_iter().map(pair).collect::<Result<_, _>>()?,
            add: add.into_iter().map(pair).collect::<Result<_, _>>()?,
            remove: remove
                .iter()
                .map(|k| {
                    HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header `{k}`: {e}"))
                })
                .collect::<Result<_, _>>()?,
        })
    }

    fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// Factory for the `headers` filter.
#[derive(Debug)]
pub struct HeadersFilterFactory {
    edits: std::sync::Arc<(Edits, Edits)>,
}

impl HeadersFilterFactory {
    /// Compiles the configured edits.
    pub fn new(cfg: &HeadersFilterConfig) -> Result<Self, String> {
        let request = Edits::compile(&cfg.request_set, &cfg.request_add, &cfg.request_remove)?;
        let response = Edits::compile(&cfg.response_set, &cfg.response_add, &cfg.response_remove)?;
        Ok(Self {
            edits: std::sync::Arc::new((request, response)),
        })
    }
}

impl FilterFactory for HeadersFilterFactory {
    fn name(&self) -> &'static str {
        "headers"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(HeadersFilter {
            edits: self.edits.clone(),
        })
    }

    fn after_response(&self) -> bool {
        false
    }
}

struct HeadersFilter {
    edits: std::sync::Arc<(Edits, Edits)>,
}

impl HttpFilter for HeadersFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if !self.edits.0.is_empty() {
            self.edits.0.apply(&mut req.headers);
        }
        Some(Ok(Flow::Continue))
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if !self.edits.1.is_empty() {
            self.edits.1.apply(&mut res.headers);
        }
        Some(Ok(Flow::Continue))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use indexmap::IndexMap;

    #[test]
    fn remove_then_set_then_add() {
        let mut cfg = HeadersFilterConfig::default();
        cfg.request_remove.push("cookie".into());
        cfg.request_set = IndexMap::from([("x-env".to_string(), "prod".to_string())]);
        cfg.request_add = IndexMap::from([("x-tag".to_string(), "b".to_string())]);
        let f = HeadersFilterFactory::new(&cfg).unwrap();
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_static("a=1"));
        h.insert("x-env", HeaderValue::from_static("dev"));
        h.insert("x-tag", HeaderValue::from_static("a"));
        f.edits.0.apply(&mut h);
        assert!(h.get("cookie").is_none());
        assert_eq!(h["x-env"], "prod");
        assert_eq!(h.get_all("x-tag").iter().count(), 2);
    }

    #[test]
    fn invalid_values_are_rejected_at_build() {
        let mut cfg = HeadersFilterConfig::default();
        cfg.response_set.insert("x-bad".into(), "a\nb".into());
        assert!(HeadersFilterFactory::new(&cfg).is_err());
    }
}
