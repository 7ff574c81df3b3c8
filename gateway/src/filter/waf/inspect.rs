//! The inspection of one request by one policy: which parts of the request go to which
//! detectors and rule sets, in which decoded form, and what a match leads to. The head phase
//! covers everything but the body; the body phase parses the buffered body by content type.
//!
//! Inspection stops at the first match that blocks (nothing more is needed to refuse), or after
//! [`MAX_MATCHES`] reported matches in a request that is not blocked (bounding log volume).

use std::net::IpAddr;
use std::ops::ControlFlow;

use http::header::{CONTENT_LENGTH, COOKIE, REFERER, TRANSFER_ENCODING, USER_AGENT};
use http::request;

use super::body::{self, BodyKind};
use super::detect::{Hit, Kind, cache, ids, scanner};
use super::log::{Location, MatchEvent, Outcome};
use super::normalize::{DecodeFlags, normalize_path, url_decode};
use super::policy::Policy;
use super::rules::RuleSet;
use crate::ip_text::ip_text;
use crate::telemetry::Counter;

/// More request headers than this is an anomaly (browsers send 10–25).
pub const MAX_HEADERS: usize = 64;
/// More arguments (query and body fields) than this is an anomaly.
pub const MAX_ARGS: usize = 255;
/// Matches reported per request before inspection stops.
pub const MAX_MATCHES: usize = 16;

type Flow = ControlFlow<()>;
const GO: Flow = ControlFlow::Continue(());

/// The headers whose verdicts are cached (see [`Inspection::cached_header`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderSlot {
    UserAgent = 1,
    Referer = 2,
}

/// One request's inspection state.
pub struct Inspection<'a> {
    policy: &'a Policy,
    client: IpAddr,
    route: &'a str,
    request_id: &'a mut Option<String>,
    matches: usize,
    args: &'a mut usize,
    /// The rule that blocked the request, if one did.
    pub blocked: Option<u32>,
}

/// A fresh request id: 128 random bits in hex, like a trace id.
pub fn new_request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl<'a> Inspection<'a> {
    /// Starts inspecting a request of `client` on `route`; `request_id` is filled on the first
    /// match (if still empty) and `args` carries the argument count from the head phase to the
    /// body phase.
    pub fn new(
        policy: &'a Policy,
        (client, route): (IpAddr, &'a str),
        request_id: &'a mut Option<String>,
        args: &'a mut usize,
    ) -> Self {
        Self {
            policy,
            client,
            route,
            request_id,
            matches: 0,
            args,
            blocked: None,
        }
    }

    // === Reporting ===

    fn report(
        &mut self,
        rule: u32,
        outcome: Outcome,
        counter: Option<&Counter>,
        location: Location<'_>,
        value: &[u8],
        at: usize,
    ) -> Flow {
        if let Some(c) = counter {
            c.inc();
        }
        let request_id = self.request_id.get_or_insert_with(new_request_id);
        MatchEvent {
            policy: &self.policy.name,
            route: self.route,
            rule,
            outcome,
            location,
            value,
            at,
            request_id,
            client: self.client,
        }
        .emit();
        self.matches += 1;
        if outcome == Outcome::Block {
            self.blocked = Some(rule);
            return ControlFlow::Break(());
        }
        if self.matches >= MAX_MATCHES {
            return ControlFlow::Break(());
        }
        GO
    }

    /// Reports a built-in rule's match.
    pub fn builtin(&mut self, hit: Hit, location: Location<'_>, value: &[u8]) -> Flow {
        let policy = self.policy;
        let counter = policy.builtin_counter(hit.rule);
        self.report(
            hit.rule,
            policy.builtin_outcome(),
            counter,
            location,
            value,
            hit.at,
        )
    }

    fn rules(&mut self, set: Option<&RuleSet>, location: Location<'_>, value: &[u8]) -> Flow {
        let Some(set) = set else {
            return GO;
        };
        let policy = self.policy;
        set.for_each_match(value, |rule, at| {
            let outcome = policy.rule_outcome(rule.action);
            self.report(rule.id, outcome, Some(&rule.matches), location, value, at)
        })
    }

    fn detect(&mut self, kind: Kind, location: Location<'_>, value: &[u8]) -> Flow {
        match self.policy.detectors.inspect(kind, value) {
            Some(hit) => self.builtin(hit, location, value),
            None => GO,
        }
    }

    fn protocol(&self) -> bool {
        self.policy.detectors.enabled().protocol
    }

    /// Reports the anomalies noticed while decoding `raw` and NUL bytes in `decoded`.
    fn anomalies(
        &mut self,
        flags: DecodeFlags,
        location: Location<'_>,
        raw: &[u8],
        decoded: &[u8],
    ) -> Flow {
        if !self.protocol() {
            return GO;
        }
        if flags.invalid_percent {
            let at = memchr::memchr(b'%', raw).unwrap_or(0);
            self.builtin(
                Hit {
                    rule: ids::INVALID_PERCENT,
                    at,
                },
                location,
                raw,
            )?;
        }
        if flags.evasion {
            self.builtin(
                Hit {
                    rule: ids::ENCODING_EVASION,
                    at: 0,
                },
                location,
                raw,
            )?;
        }
        if let Some(at) = memchr::memchr(0, decoded) {
            self.builtin(
                Hit {
                    rule: ids::NUL_BYTE,
                    at,
                },
                location,
                decoded,
            )?;
        }
        GO
    }

    fn count_arg(&mut self) -> Flow {
        *self.args += 1;
        if *self.args == MAX_ARGS + 1 && self.protocol() {
            let hit = Hit {
                rule: ids::TOO_MANY_ARGS,
                at: 0,
            };
            return self.builtin(hit, Location::Request, b"");
        }
        GO
    }

    // === Head phase ===

    /// Inspects everything but the body.
    pub fn head(&mut self, req: &request::Parts) -> Flow {
        let policy = self.policy;
        let rules = &policy.rules;
        let enabled = policy.detectors.enabled();
        if enabled.protocol {
            if req.headers.len() > MAX_HEADERS {
                let hit = Hit {
                    rule: ids::TOO_MANY_HEADERS,
                    at: 0,
                };
                self.builtin(hit, Location::Request, b"")?;
            }
            if req.headers.contains_key(CONTENT_LENGTH)
                && req.headers.contains_key(TRANSFER_ENCODING)
            {
                let hit = Hit {
                    rule: ids::CL_AND_TE,
                    at: 0,
                };
                self.builtin(hit, Location::Request, b"")?;
            }
        }
        self.rules(
            rules.method.as_ref(),
            Location::Method,
            req.method.as_str().as_bytes(),
        )?;

        let raw_path = req.uri.path().as_bytes();
        let (path, flags) = normalize_path(raw_path);
        self.anomalies(flags, Location::Path, raw_path, &path)?;
        self.detect(Kind::Path, Location::Path, &path)?;
        self.rules(rules.path.as_ref(), Location::Path, &path)?;

        if let Some(query) = req.uri.query() {
            if let Some(set) = &rules.query {
                let (decoded, _) = url_decode(query.as_bytes(), true);
                self.rules(Some(set), Location::Query, &decoded)?;
            }
            self.form(query.as_bytes(), false)?;
        }

        self.headers(req)?;
        self.cookies(req)?;
        if let Some(set) = &rules.client_ip {
            let mut buf = [0u8; 48];
            let text = ip_text(self.client, &mut buf);
            self.rules(Some(set), Location::ClientIp, text)?;
        }
        GO
    }

    fn headers(&mut self, req: &request::Parts) -> Flow {
        let policy = self.policy;
        let enabled = policy.detectors.enabled();
        for (name, set) in &policy.rules.headers {
            // The first user agent and referer go through `cached_header` below.
            let skip = usize::from(name == USER_AGENT || name == REFERER);
            for v in req.headers.get_all(name).iter().skip(skip) {
                self.rules(Some(set), Location::Header(name.as_str()), v.as_bytes())?;
            }
        }
        if let Some(ua) = req.headers.get(USER_AGENT) {
            self.cached_header(HeaderSlot::UserAgent, ua.as_bytes())?;
        }
        if let Some(referer) = req.headers.get(REFERER) {
            self.cached_header(HeaderSlot::Referer, referer.as_bytes())?;
        }
        if enabled.cmdi {
            // Shellshock reaches CGI programs through any header.
            for (name, v) in &req.headers {
                if v.as_bytes().trim_ascii_start().starts_with(b"() {") {
                    let hit = Hit {
                        rule: ids::SHELLSHOCK,
                        at: 0,
                    };
                    self.builtin(hit, Location::Header(name.as_str()), v.as_bytes())?;
                }
            }
        }
        GO
    }

    /// The user agent or referer: its `header:` rules, the scanner list (user agent) and the
    /// value detectors (the headers applications commonly log or reflect). Both repeat across
    /// requests (a few thousand user agents make most traffic), so a value on which none of
    /// this policy's checks reported anything is remembered (keyed by policy and header) and
    /// skipped the next time, like the detectors' own benign verdicts.
    fn cached_header(&mut self, slot: HeaderSlot, raw: &[u8]) -> Flow {
        let policy = self.policy;
        let enabled = policy.detectors.enabled();
        let (name, location) = match slot {
            HeaderSlot::UserAgent => (&USER_AGENT, Location::Header("user-agent")),
            HeaderSlot::Referer => (&REFERER, Location::Header("referer")),
        };
        let set = policy.rules.header(name);
        let scanner = enabled.scanner && slot == HeaderSlot::UserAgent;
        if set.is_none() && !scanner && !enabled.inspects_values() {
            return GO;
        }
        let key = cache::tagged_key(policy.id << 8 | slot as u64, raw);
        if cache::is_benign(key) {
            return GO;
        }
        let reported = self.matches;
        self.rules(set, location, raw)?;
        if scanner && let Some(hit) = scanner::detect(raw) {
            self.builtin(hit, location, raw)?;
        }
        if enabled.inspects_values() {
            match slot {
                HeaderSlot::UserAgent => self.detect(Kind::Header, location, raw)?,
                HeaderSlot::Referer => {
                    let (decoded, _) = url_decode(raw, false);
                    self.detect(Kind::Header, location, &decoded)?;
                }
            }
        }
        if self.matches == reported {
            cache::remember_benign(key);
        }
        GO
    }

    fn cookies(&mut self, req: &request::Parts) -> Flow {
        let policy = self.policy;
        if !policy.detectors.enabled().inspects_values() && policy.rules.cookies.is_empty() {
            return GO;
        }
        for header in req.headers.get_all(COOKIE) {
            for pair in header.as_bytes().split(|b| *b == b';') {
                let pair = pair.trim_ascii();
                if pair.is_empty() {
                    continue;
                }
                let (name, raw) = match memchr::memchr(b'=', pair) {
                    Some(i) => (&pair[..i], &pair[i + 1..]),
                    None => (&pair[..0], pair),
                };
                // Cookie values are often percent-encoded by applications; `+` stays.
                let (value, flags) = url_decode(raw, false);
                let flags = DecodeFlags {
                    invalid_percent: false,
                    ..flags
                };
                self.anomalies(flags, Location::Cookie(name), raw, &value)?;
                self.detect(Kind::Name, Location::CookieName(name), name)?;
                self.detect(Kind::Value, Location::Cookie(name), &value)?;
                self.rules(
                    policy.rules.cookies.get(name),
                    Location::Cookie(name),
                    &value,
                )?;
            }
        }
        GO
    }

    /// Inspects `a=1&b=2` pairs: the query string, or a form body.
    fn form(&mut self, input: &[u8], in_body: bool) -> Flow {
        for (raw_name, raw_value) in body::pairs(input) {
            self.count_arg()?;
            let (name, name_flags) = url_decode(raw_name, true);
            let (value, value_flags) = url_decode(raw_value, true);
            let location = if in_body {
                Location::BodyArg(&name)
            } else {
                Location::Arg(&name)
            };
            self.anomalies(name_flags, location, raw_name, &name)?;
            self.anomalies(value_flags, location, raw_value, &value)?;
            self.arg(&name, &value, in_body)?;
        }
        GO
    }

    /// Inspects one decoded argument: its name, its value, and the `arg:NAME` rules.
    fn arg(&mut self, name: &[u8], value: &[u8], in_body: bool) -> Flow {
        let (name_location, location) = if in_body {
            (Location::BodyArgName(name), Location::BodyArg(name))
        } else {
            (Location::ArgName(name), Location::Arg(name))
        };
        self.detect(Kind::Name, name_location, name)?;
        self.detect(Kind::Value, location, value)?;
        self.rules(self.policy.rules.args.get(name), location, value)
    }

    // === Body phase ===

    /// Inspects a buffered body of type `content_type`.
    pub fn body(&mut self, content_type: &[u8], raw: &[u8]) -> Flow {
        let policy = self.policy;
        self.rules(policy.rules.body.as_ref(), Location::Body, raw)?;
        let enabled = policy.detectors.enabled();
        if !(enabled.inspects_values() || enabled.protocol || !policy.rules.args.is_empty()) {
            return GO;
        }
        let parsed = match BodyKind::of(content_type) {
            BodyKind::Form => Ok(self.form(raw, true)),
            BodyKind::Multipart(boundary) => body::multipart(raw, boundary, |part| {
                self.count_arg()?;
                match part.filename {
                    Some(filename) => {
                        // File contents are data; their names reach file systems.
                        let (decoded, _) = url_decode(filename, false);
                        self.detect(Kind::Filename, Location::File(part.name), &decoded)
                    }
                    None => {
                        let (value, _) = url_decode(part.content, false);
                        self.arg(part.name, &value, true)
                    }
                }
            }),
            BodyKind::Json => body::json(raw, |name, v, is_key| {
                if is_key {
                    return self.detect(Kind::Name, Location::BodyArgName(name), v);
                }
                let (value, _) = url_decode(v, false);
                self.detect(Kind::Value, Location::BodyArg(name), &value)?;
                self.rules(policy.rules.args.get(name), Location::BodyArg(name), &value)
            }),
            BodyKind::Other => Ok(GO),
        };
        match parsed {
            Ok(flow) => flow,
            Err(body::Malformed) => {
                if self.protocol() {
                    self.builtin(
                        Hit {
                            rule: ids::MALFORMED_BODY,
                            at: 0,
                        },
                        Location::Body,
                        raw,
                    )?;
                }
                // The application's parser may be more lenient than ours: inspect it whole.
                self.detect(Kind::Value, Location::Body, raw)
            }
        }
    }
}
