//! A WAF policy compiled for one config generation: detectors, custom rule sets, address lists
//! and the metric handles its matches are counted in.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use gateway_config::WafPolicy;
use gateway_config::model::{WafAction, WafMode};
use ipnet::IpNet;

use super::detect::{Detectors, Enabled, ids};
use super::log::Outcome;
use super::rules::Rules;
use crate::telemetry::{Counter, Registry};

/// A compiled policy, shared by the routes of a generation that use it.
#[derive(Debug)]
pub struct Policy {
    /// Name (the `policy` label).
    pub name: String,
    /// Unique among the policies compiled by this process (a cache key context).
    pub id: u64,
    /// `block` or `detect`.
    pub mode: WafMode,
    /// Built-in detectors.
    pub detectors: Detectors,
    /// Custom rules.
    pub rules: Rules,
    /// Networks that bypass the policy.
    pub allow: Vec<IpNet>,
    /// Networks always refused.
    pub deny: Vec<IpNet>,
    /// Largest inspected body.
    pub max_body: u64,
    /// Whether bodies are buffered and inspected.
    pub inspects_body: bool,
    /// `gateway_waf_matches_total` of the built-in rules, by id.
    builtin: Vec<(u32, Counter)>,
    /// `gateway_waf_blocked_total{policy}`.
    pub blocked: Counter,
}

const MATCHES: &str = "gateway_waf_matches_total";
const MATCHES_HELP: &str = "WAF rule matches by policy, rule id and action (block, log, detect).";

impl Policy {
    /// Compiles `p`, registering its counters in `registry`.
    pub fn compile(p: &WafPolicy, registry: &Registry) -> Result<Self, String> {
        let settings = &p.settings;
        let mode = settings.mode;
        let enabled = Enabled::from_list(&settings.detect);
        let block_outcome = match mode {
            WafMode::Block => Outcome::Block,
            WafMode::Detect => Outcome::Detect,
        };
        let counter = |id: u32, outcome: Outcome| {
            registry.counter(
                MATCHES,
                MATCHES_HELP,
                &[
                    ("policy", &p.name),
                    ("rule", &id.to_string()),
                    ("action", outcome.as_str()),
                ],
            )
        };
        let rules = Rules::compile(&p.rules, |id, action| {
            counter(
                id,
                match action {
                    WafAction::Log => Outcome::Log,
                    WafAction::Block => block_outcome,
                },
            )
        })?;
        let builtin = ids::ALL
            .iter()
            .filter(|(_, detector, _)| detector.is_none_or(|d| settings.detect.contains(&d)))
            .map(|(id, detector, _)| {
                // The deny list refuses in both modes.
                let outcome = if detector.is_none() {
                    Outcome::Block
                } else {
                    block_outcome
                };
                (*id, counter(*id, outcome))
            })
            .collect();
        let inspects_body = enabled.inspects_values() || enabled.protocol || rules.inspect_body();
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ok(Self {
            name: p.name.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            mode,
            detectors: Detectors::new(enabled),
            rules,
            allow: settings.allow.clone(),
            deny: settings.deny.clone(),
            max_body: settings.max_body.bytes(),
            inspects_body,
            builtin,
            blocked: registry.counter(
                "gateway_waf_blocked_total",
                "Requests refused by a WAF policy.",
                &[("policy", &p.name)],
            ),
        })
    }

    /// Whether `ip` bypasses the policy.
    pub fn allowed(&self, ip: IpAddr) -> bool {
        contains(&self.allow, ip)
    }

    /// Whether `ip` is refused outright.
    pub fn denied(&self, ip: IpAddr) -> bool {
        contains(&self.deny, ip)
    }

    /// What a match of a built-in rule leads to.
    pub fn builtin_outcome(&self) -> Outcome {
        match self.mode {
            WafMode::Block => Outcome::Block,
            WafMode::Detect => Outcome::Detect,
        }
    }

    /// What a match of a custom rule with `action` leads to.
    pub fn rule_outcome(&self, action: WafAction) -> Outcome {
        match action {
            WafAction::Log => Outcome::Log,
            WafAction::Block => self.builtin_outcome(),
        }
    }

    /// The match counter of a built-in rule.
    pub fn builtin_counter(&self, id: u32) -> Option<&Counter> {
        self.builtin.iter().find(|(i, _)| *i == id).map(|(_, c)| c)
    }
}

fn contains(nets: &[IpNet], ip: IpAddr) -> bool {
    // An IPv4 client on a dual-stack socket shows up as `::ffff:a.b.c.d`.
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    nets.iter().any(|n| n.contains(&ip))
}
