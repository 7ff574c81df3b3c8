//! Human units used throughout the configuration: durations ("250ms", "2s", "1h") and
//! byte sizes ("64KiB", "1MiB"). Both deserialize from strings (and sizes also from plain
//! integers, meaning bytes) so the YAML reads the way people write it.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A duration written with a unit: `ns`, `us`, `ms`, `s`, `m`, `h`, `d`. Several parts may be
/// concatenated (`1m30s`). A bare `0` is allowed and means zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    /// Builds a duration from whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }
    /// Builds a duration from milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }
    /// The std duration.
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
}

impl FromStr for Duration {
    type Err = String;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        if s == "0" {
            return Ok(Self(std::time::Duration::ZERO));
        }
        if s.is_empty() {
            return Err("empty duration".into());
        }
        let mut total = std::time::Duration::ZERO;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| format!("duration `{input}` needs a unit (ms, s, m, h, d)"))?;
            if digits == 0 {
                return Err(format!("invalid duration `{input}`"));
            }
            let value: f64 = rest[..digits]
                .parse()
                .map_err(|_| format!("invalid number in duration `{input}`"))?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let nanos_per_unit: f64 = match &rest[..unit_len] {
                "ns" => 1.0,
                "us" | "µs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                "d" => 86400e9,
                other => {
                    return Err(format!(
                        "unknown duration unit `{}` in `{input}` (use ns, us, ms, s, m, h, d)",
                        other.trim()
                    ));
                }
            };
            rest = &rest[unit_len..];
            let nanos = value * nanos_per_unit;
            if !nanos.is_finite() || nanos > u64::MAX as f64 {
                return Err(format!("duration `{input}` is too large"));
            }
            total += std::time::Duration::from_nanos(nanos as u64);
        }
        Ok(Self(total))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 && !self.0.is_zero() {
            write!(f, "{}us", self.0.as_micros())
        } else if ms.is_multiple_of(3_600_000) && ms != 0 {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms.is_multiple_of(60_000) && ms != 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"250ms\", \"2s\" or \"1h\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                if v == 0 {
                    Ok(Duration::default())
                } else {
                    Err(E::custom(format!(
                        "duration {v} needs a unit, e.g. \"{v}s\" or \"{v}ms\""
                    )))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                self.visit_u64(u64::try_from(v).map_err(|_| E::custom("negative duration"))?)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl schemars::JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration: a number with a unit (ns, us, ms, s, m, h, d), parts may be concatenated (`1m30s`); `0` alone means zero.",
            "anyOf": [
                { "type": "string", "pattern": "^\\s*(0|([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h|d))+)\\s*$" },
                { "type": "integer", "const": 0 }
            ]
        })
    }
}

/// A size in bytes: a plain integer, or a number with a unit: `B`, `KB`/`MB`/`GB` (powers of
/// 1000), `KiB`/`MiB`/`GiB` (powers of 1024); `k`, `m`, `g` are accepted as binary shorthands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Kibibytes.
    pub const fn kib(n: u64) -> Self {
        Self(n * 1024)
    }
    /// Mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n * 1024 * 1024)
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
    /// The size in bytes as usize (saturating on 32-bit targets).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("invalid size `{input}` (use e.g. 64KiB or 1MiB)"))?;
        let factor: u64 = match unit.trim() {
            "" | "B" | "b" => 1,
            "KB" | "kB" => 1000,
            "MB" => 1000 * 1000,
            "GB" => 1000 * 1000 * 1000,
            "KiB" | "K" | "k" | "Ki" => 1 << 10,
            "MiB" | "M" | "m" | "Mi" => 1 << 20,
            "GiB" | "G" | "g" | "Gi" => 1 << 30,
            other => {
                return Err(format!(
                    "unknown size unit `{other}` in `{input}` (use B, KiB, MiB, GiB, KB, MB, GB)"
                ));
            }
        };
        let bytes = value * factor as f64;
        if !bytes.is_finite() || bytes > u64::MAX as f64 {
            return Err(format!("size `{input}` is too large"));
        }
        Ok(Self(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b != 0 && b.is_multiple_of(1 << 30) {
            write!(f, "{}GiB", b >> 30)
        } else if b != 0 && b.is_multiple_of(1 << 20) {
            write!(f, "{}MiB", b >> 20)
        } else if b != 0 && b.is_multiple_of(1 << 10) {
            write!(f, "{}KiB", b >> 10)
        } else {
            write!(f, "{b}B")
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64KiB\" or \"1MiB\", or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("negative size"))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A size: a number of bytes, or a number with a unit (B, KiB, MiB, GiB powers of 1024; KB, MB, GB powers of 1000).",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*(B|b|KB|kB|MB|GB|KiB|K|k|Ki|MiB|M|m|Mi|GiB|G|g|Gi)?\\s*$" }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_in_the_contract() {
        assert_eq!(
            "250ms".parse::<Duration>().unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!("2s".parse::<Duration>().unwrap(), Duration::from_secs(2));
        assert_eq!("1h".parse::<Duration>().unwrap(), Duration::from_secs(3600));
        assert_eq!(
            "1m30s".parse::<Duration>().unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(
            "1.5s".parse::<Duration>().unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!("0".parse::<Duration>().unwrap(), Duration::default());
        assert!("10".parse::<Duration>().is_err());
        assert!("5 parsecs".parse::<Duration>().is_err());
        assert!("ms".parse::<Duration>().is_err());
        assert_eq!(Duration::from_millis(250).to_string(), "250ms");
        assert_eq!(Duration::from_secs(7200).to_string(), "2h");
    }

    #[test]
    fn sizes_parse_as_in_the_contract() {
        assert_eq!("64KiB".parse::<ByteSize>().unwrap(), ByteSize(65536));
        assert_eq!("1MiB".parse::<ByteSize>().unwrap(), ByteSize(1 << 20));
        assert_eq!("1GB".parse::<ByteSize>().unwrap(), ByteSize(1_000_000_000));
        assert_eq!("512".parse::<ByteSize>().unwrap(), ByteSize(512));
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize::mib(32).to_string(), "32MiB");
    }
}
