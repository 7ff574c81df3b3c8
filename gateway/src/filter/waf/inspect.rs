//! The inspection of one request by one policy: which parts of the request go to which
//! detectors and rule sets, in which decoded form, and what a match leads to. The head phase
//! covers everything but the body; the body phase parses the buffered body by content type.
//!
//! Inspection stops at the first match that blocks (nothing more is needed to refuse), or after
//! [`MAX_MATCHES`] reported matches in a request that is not blocked (bounding log volume).

use std::net::IpAddr;
use std::ops::ControlFlow;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, COOKIE, REFERER, TRANSFER_ENCODING, USER_AGENT};
use http::{HeaderMap, HeaderValue, request};

use super::REQUEST_ID;
use super::body::{self, BodyKind};
use super::detect::{Hit, Kind, cache, feat, features, ids, scanner};
use super::log::{Location, MatchEvent, Outcome};
use super::normalize::{DecodeFlags, INLINE, normalize_path, url_decode, url_decode_in};
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

/// The parts of a request whose verdicts are remembered (see [`Inspection::remembered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    UserAgent = 1,
    Referer = 2,
    /// The method, for `method` rules.
    Method = 3,
    /// The raw path: its anomalies, detectors and `path` rules.
    Path = 4,
    /// The raw query string: `query` rules and every pair (a hit still counts the pairs).
    Query = 5,
    /// One raw `name=value` pair of the query or a form body: its anomalies, detectors and
    /// `arg:` rules (the same checks in both; only the reported location differs).
    FormPair = 6,
    /// One raw `name=value` pair of a `Cookie` header.
    CookiePair = 7,
    /// A whole `Cookie` header (a session sends the same one with every request).
    CookieHeader = 9,
    /// The client address (its bytes), for `client_ip` rules.
    ClientIp = 8,
}

/// Cookie headers kept by [`HeadScan`] (HTTP/2 clients may send one per cookie); with more, the
/// head phase looks them up again.
const SCANNED_COOKIES: usize = 4;

/// What the head phase needs from the request headers, found in one pass over them rather than
/// by a `HeaderMap` lookup for each, which hashes the name every time.
#[derive(Default)]
pub struct HeadScan<'r> {
    /// The first `Content-Length`.
    pub content_length: Option<&'r HeaderValue>,
    /// Whether there is a `Transfer-Encoding`.
    pub transfer_encoding: bool,
    /// The first `Content-Type`.
    pub content_type: Option<&'r HeaderValue>,
    /// The first `x-request-id`.
    pub request_id: Option<&'r HeaderValue>,
    user_agent: Option<&'r HeaderValue>,
    referer: Option<&'r HeaderValue>,
    /// More than one user agent or referer: `header:` rules see the others too.
    extra_user_agents: bool,
    extra_referers: bool,
    cookies: [Option<&'r HeaderValue>; SCANNED_COOKIES],
    cookie_headers: usize,
    /// Some header value starts with `() {`.
    shellshock: bool,
}

impl<'r> HeadScan<'r> {
    /// Scans `headers`.
    pub fn new(headers: &'r HeaderMap) -> Self {
        let mut scan = Self::default();
        for (name, value) in headers {
            if name == COOKIE {
                if let Some(slot) = scan.cookies.get_mut(scan.cookie_headers) {
                    *slot = Some(value);
                }
                scan.cookie_headers += 1;
            } else if name == USER_AGENT {
                scan.extra_user_agents = scan.user_agent.is_some();
                scan.user_agent.get_or_insert(value);
            } else if name == REFERER {
                scan.extra_referers = scan.referer.is_some();
                scan.referer.get_or_insert(value);
            } else if name == CONTENT_LENGTH {
                scan.content_length.get_or_insert(value);
            } else if name == CONTENT_TYPE {
                scan.content_type.get_or_insert(value);
            } else if name == TRANSFER_ENCODING {
                scan.transfer_encoding = true;
            } else if name == REQUEST_ID {
                scan.request_id.get_or_insert(value);
            }
            // Shellshock reaches CGI programs through any header.
            scan.shellshock |= is_shellshock(value.as_bytes());
        }
        scan
    }
}

fn is_shellshock(v: &[u8]) -> bool {
    v.trim_ascii_start().starts_with(b"() {")
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
        self.detect_classified(kind, location, value, features(value))
    }

    /// [`Self::detect`] with `f` = [`features`] of `value`.
    fn detect_classified(
        &mut self,
        kind: Kind,
        location: Location<'_>,
        value: &[u8],
        f: u32,
    ) -> Flow {
        match self.policy.detectors.inspect_classified(kind, value, f) {
            Some(hit) => self.builtin(hit, location, value),
            None => GO,
        }
    }

    fn protocol(&self) -> bool {
        self.policy.detectors.enabled().protocol
    }

    /// Reports the anomalies noticed while decoding `raw` and NUL bytes in `decoded` (`f` =
    /// [`features`] of `decoded`).
    fn anomalies(
        &mut self,
        flags: DecodeFlags,
        location: Location<'_>,
        raw: &[u8],
        (decoded, f): (&[u8], u32),
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
        if f & feat::NUL != 0
            && let Some(at) = memchr::memchr(0, decoded)
        {
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
        self.count_args(1)
    }

    /// Counts `n` more arguments; reports the anomaly when the count passes [`MAX_ARGS`].
    fn count_args(&mut self, n: usize) -> Flow {
        let before = *self.args;
        *self.args += n;
        if before <= MAX_ARGS && *self.args > MAX_ARGS && self.protocol() {
            let hit = Hit {
                rule: ids::TOO_MANY_ARGS,
                at: 0,
            };
            return self.builtin(hit, Location::Request, b"");
        }
        GO
    }

    // === Head phase ===

    /// Inspects everything but the body; `scan` is [`HeadScan::new`] of `req.headers`.
    pub fn head(&mut self, req: &request::Parts, scan: &HeadScan<'_>) -> Flow {
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
            if scan.content_length.is_some() && scan.transfer_encoding {
                let hit = Hit {
                    rule: ids::CL_AND_TE,
                    at: 0,
                };
                self.builtin(hit, Location::Request, b"")?;
            }
        }
        if let Some(set) = &rules.method {
            let method = req.method.as_str().as_bytes();
            self.remembered(Part::Method, method, |insp| {
                insp.rules(Some(set), Location::Method, method)
            })?;
        }

        let raw_path = req.uri.path().as_bytes();
        self.remembered(Part::Path, raw_path, |insp| insp.path(raw_path))?;

        if let Some(query) = req.uri.query() {
            self.query(query.as_bytes())?;
        }

        self.headers(req, scan)?;
        self.cookies(req, scan)?;
        if let Some(set) = &rules.client_ip {
            let client = self.client;
            let octets = match client {
                IpAddr::V4(v4) => &v4.octets()[..],
                IpAddr::V6(v6) => &v6.octets()[..],
            };
            self.remembered(Part::ClientIp, octets, |insp| {
                let mut buf = [0u8; 48];
                let text = ip_text(client, &mut buf);
                insp.rules(Some(set), Location::ClientIp, text)
            })?;
        }
        GO
    }

    /// Runs `check` on a part of the request unless the same policy already found the same
    /// bytes (`raw`) benign at the same `part`, and remembers `raw` when `check` reported
    /// nothing. Every check here is a pure function of the policy and the raw bytes (decoding
    /// included), and a hit is an exact repetition ([`cache`]), so nothing an attacker sends
    /// can skip a check it has not passed. A session sends the same cookies, client address and
    /// user agent with every request, and `page=2` or a popular path recur across clients.
    fn remembered(
        &mut self,
        part: Part,
        raw: &[u8],
        check: impl FnOnce(&mut Self) -> Flow,
    ) -> Flow {
        let tag = cache::Tag::place(self.policy.id, part as u8);
        if cache::is_benign(tag, raw) {
            return GO;
        }
        let reported = self.matches;
        check(self)?;
        if self.matches == reported {
            cache::remember_benign(tag, raw);
        }
        GO
    }

    /// The query string: `query` rules on it decoded, and its pairs as arguments. A query
    /// seen benign as a whole costs one lookup and the count of its arguments; otherwise its
    /// pairs are still looked up one by one (`page=2` recurs with any search term).
    fn query(&mut self, query: &[u8]) -> Flow {
        let mut inspected = false;
        self.remembered(Part::Query, query, |insp| {
            inspected = true;
            if let Some(set) = &insp.policy.rules.query {
                let mut buf = [0; INLINE];
                let (decoded, _) = url_decode_in(query, true, &mut buf);
                insp.rules(Some(set), Location::Query, &decoded)?;
            }
            insp.form(query, false)
        })?;
        if inspected {
            return GO;
        }
        // Remembered: `form` did not run, but the arguments still count toward the limit.
        self.count_args(body::raw_pairs(query).count())
    }

    /// The path, normalised: anomalies, detectors and `path` rules.
    fn path(&mut self, raw: &[u8]) -> Flow {
        let (path, flags) = normalize_path(raw);
        let f = features(&path);
        self.anomalies(flags, Location::Path, raw, (&path, f))?;
        self.detect_classified(Kind::Path, Location::Path, &path, f)?;
        self.rules(self.policy.rules.path.as_ref(), Location::Path, &path)
    }

    fn headers(&mut self, req: &request::Parts, scan: &HeadScan<'_>) -> Flow {
        let policy = self.policy;
        let enabled = policy.detectors.enabled();
        for (name, set) in &policy.rules.headers {
            // The first user agent and referer go through `cached_header` below; the scan
            // says whether there are more (without hashing their names again).
            let skip = if name == USER_AGENT {
                if !scan.extra_user_agents {
                    continue;
                }
                1
            } else if name == REFERER {
                if !scan.extra_referers {
                    continue;
                }
                1
            } else {
                0
            };
            for v in req.headers.get_all(name).iter().skip(skip) {
                self.rules(Some(set), Location::Header(name.as_str()), v.as_bytes())?;
            }
        }
        if let Some(ua) = scan.user_agent {
            self.cached_header(Part::UserAgent, ua.as_bytes())?;
        }
        if let Some(referer) = scan.referer {
            self.cached_header(Part::Referer, referer.as_bytes())?;
        }
        if enabled.cmdi && scan.shellshock {
            for (name, v) in &req.headers {
                if is_shellshock(v.as_bytes()) {
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
    /// requests (a few thousand user agents make most traffic), so their verdicts are
    /// remembered.
    fn cached_header(&mut self, part: Part, raw: &[u8]) -> Flow {
        let policy = self.policy;
        let enabled = policy.detectors.enabled();
        let (name, location) = match part {
            Part::UserAgent => (&USER_AGENT, Location::Header("user-agent")),
            _ => (&REFERER, Location::Header("referer")),
        };
        let set = policy.rules.header(name);
        let scanner = enabled.scanner && part == Part::UserAgent;
        if set.is_none() && !scanner && !enabled.inspects_values() {
            return GO;
        }
        self.remembered(part, raw, |insp| {
            insp.rules(set, location, raw)?;
            if scanner && let Some(hit) = scanner::detect(raw) {
                insp.builtin(hit, location, raw)?;
            }
            if enabled.inspects_values() {
                if part == Part::UserAgent {
                    insp.detect(Kind::Header, location, raw)?;
                } else {
                    let (decoded, _) = url_decode(raw, false);
                    insp.detect(Kind::Header, location, &decoded)?;
                }
            }
            GO
        })
    }

    fn cookies(&mut self, req: &request::Parts, scan: &HeadScan<'_>) -> Flow {
        let policy = self.policy;
        if !policy.detectors.enabled().inspects_values() && policy.rules.cookies.is_empty() {
            return GO;
        }
        if scan.cookie_headers > SCANNED_COOKIES {
            for header in req.headers.get_all(COOKIE) {
                self.cookie_header(header.as_bytes())?;
            }
            return GO;
        }
        for header in scan.cookies.iter().flatten() {
            let header = header.as_bytes();
            self.remembered(Part::CookieHeader, header, |insp| {
                insp.cookie_header(header)
            })?;
        }
        GO
    }

    fn cookie_header(&mut self, header: &[u8]) -> Flow {
        for pair in header.split(|b| *b == b';') {
            let pair = pair.trim_ascii();
            if !pair.is_empty() {
                self.remembered(Part::CookiePair, pair, |insp| insp.cookie(pair))?;
            }
        }
        GO
    }

    /// One `name=value` cookie: anomalies, detectors and `cookie:` rules.
    fn cookie(&mut self, pair: &[u8]) -> Flow {
        let (name, raw) = match memchr::memchr(b'=', pair) {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (&pair[..0], pair),
        };
        // Cookie values are often percent-encoded by applications; `+` stays.
        let mut buf = [0; INLINE];
        let (value, flags) = url_decode_in(raw, false, &mut buf);
        let flags = DecodeFlags {
            invalid_percent: false,
            ..flags
        };
        let f = features(&value);
        self.anomalies(flags, Location::Cookie(name), raw, (&value, f))?;
        self.detect(Kind::Name, Location::CookieName(name), name)?;
        self.detect_classified(Kind::Value, Location::Cookie(name), &value, f)?;
        self.rules(
            self.policy.rules.cookies.get(name),
            Location::Cookie(name),
            &value,
        )
    }

    /// Inspects `a=1&b=2` pairs: the query string, or a form body.
    fn form(&mut self, input: &[u8], in_body: bool) -> Flow {
        for pair in body::raw_pairs(input) {
            self.count_arg()?;
            self.remembered(Part::FormPair, pair, |insp| insp.form_pair(pair, in_body))?;
        }
        GO
    }

    /// One raw `name=value` pair of a query or form: decoded, then its anomalies and
    /// [`Self::arg`].
    fn form_pair(&mut self, pair: &[u8], in_body: bool) -> Flow {
        let (raw_name, raw_value) = body::split_pair(pair);
        let (mut name_buf, mut value_buf) = ([0; INLINE], [0; INLINE]);
        let (name, name_flags) = url_decode_in(raw_name, true, &mut name_buf);
        let (value, value_flags) = url_decode_in(raw_value, true, &mut value_buf);
        let location = if in_body {
            Location::BodyArg(&name)
        } else {
            Location::Arg(&name)
        };
        let (name_f, value_f) = (features(&name), features(&value));
        self.anomalies(name_flags, location, raw_name, (&name, name_f))?;
        self.anomalies(value_flags, location, raw_value, (&value, value_f))?;
        self.arg((&name, name_f), (&value, value_f), in_body)
    }

    /// Inspects one decoded argument: its name and its value (each with its [`features`]), and
    /// the `arg:NAME` rules.
    fn arg(
        &mut self,
        (name, name_f): (&[u8], u32),
        (value, f): (&[u8], u32),
        in_body: bool,
    ) -> Flow {
        let (name_location, location) = if in_body {
            (Location::BodyArgName(name), Location::BodyArg(name))
        } else {
            (Location::ArgName(name), Location::Arg(name))
        };
        self.detect_classified(Kind::Name, name_location, name, name_f)?;
        self.detect_classified(Kind::Value, location, value, f)?;
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
                        let name = (part.name, features(part.name));
                        self.arg(name, (&value, features(&value)), true)
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
