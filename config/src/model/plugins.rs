//! `plugins:` (Wasm filters and their limits) and `waf:` (policies, detectors, custom rules).

use super::*;

/// One entry of `plugins:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Path of the .wasm module.
    pub wasm: PathBuf,
    /// Handed to the plugin as JSON at configure time.
    #[schemars(with = "Option<serde_json::Value>")]
    pub config: Option<serde_yaml::Value>,
    /// Handed to the plugin as VM configuration at start.
    #[schemars(with = "Option<serde_json::Value>")]
    pub vm_config: Option<serde_yaml::Value>,
    /// Per-call limits.
    #[serde(default)]
    pub limits: PluginLimits,
    /// Where the plugin's shared data and shared queues live.
    #[serde(default)]
    pub shared_data: SharedDataConfig,
}

/// `plugins.*.limits`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginLimits {
    /// Linear memory cap per VM.
    pub memory: ByteSize,
    /// CPU time per guest call.
    pub time: Duration,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            memory: ByteSize::mib(64),
            time: Duration::from_millis(100),
        }
    }
}

/// One entry of `waf:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WafPolicyConfig {
    /// `block` or `detect`.
    #[serde(default)]
    pub mode: WafMode,
    /// Built-in detectors.
    #[serde(default)]
    pub detect: Vec<WafDetector>,
    /// Largest inspected request body; larger ones get 413.
    #[serde(default = "default_waf_max_body")]
    pub max_body: ByteSize,
    /// Custom rules.
    #[serde(default)]
    pub rules: Vec<WafRuleConfig>,
    /// Client networks that bypass the policy.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<IpNet>,
    /// Client networks always refused.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub deny: Vec<IpNet>,
}

pub(super) fn default_waf_max_body() -> ByteSize {
    ByteSize::mib(1)
}

/// WAF mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WafMode {
    /// Matches are answered with 403.
    #[default]
    Block,
    /// Matches are logged and counted only.
    Detect,
}

/// A built-in WAF detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WafDetector {
    /// SQL injection.
    Sqli,
    /// Cross-site scripting.
    Xss,
    /// `../` and friends.
    PathTraversal,
    /// Known scanner user agents.
    Scanner,
    /// Protocol anomalies.
    Protocol,
    /// Shell command injection.
    CommandInjection,
}

/// A custom WAF rule.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WafRuleConfig {
    /// Rule id, reported on a match.
    pub id: u32,
    /// Where to look: method, path, query, arg:NAME, header:NAME, cookie:NAME, body, client_ip.
    #[serde(rename = "where")]
    pub location: String,
    /// Regular expression.
    #[serde(rename = "match")]
    pub pattern: String,
    /// What to do on a match.
    #[serde(default)]
    pub action: WafAction,
}

/// A WAF rule's action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WafAction {
    /// Refuse the request (in block mode).
    #[default]
    Block,
    /// Only log the match.
    Log,
}
