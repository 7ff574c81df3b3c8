//! Fuzz check of the forwarding fields a trusted proxy sends (`crate::forwarded`).

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::forwarded::{Resolved, TrustedProxies};

/// Input: field values, one per line, read both as `X-Forwarded-For` lines and as `Forwarded`
/// lines. Whatever they hold, the walk ends without a panic and names a canonical address
/// (never an IPv4-mapped IPv6 one); and a trusted hop appended on the right changes nothing
/// about a client already named, since the walk steps over it.
pub fn forwarded(data: &[u8]) {
    let nets = ["10.0.0.0/8", "2001:db8::/32"].map(|n| n.parse().expect("net"));
    let trusted = TrustedProxies::new(&nets).expect("not empty");
    let values: Vec<HeaderValue> = data
        .split(|&b| b == b'\n')
        .filter_map(|line| HeaderValue::from_bytes(line).ok())
        .collect();
    // Only the right end of a long chain is kept: one more hop may then drop a named client.
    let short = data.iter().filter(|&&b| b == b',' || b == b'\n').count() < 48;
    for (name, extra) in [
        ("x-forwarded-for", "10.0.0.1"),
        ("forwarded", "for=10.0.0.1"),
    ] {
        let name = HeaderName::from_static(name);
        let mut headers = HeaderMap::new();
        for v in &values {
            headers.append(name.clone(), v.clone());
        }
        let before = trusted.resolve(&headers);
        check(&before);
        headers.append(name, HeaderValue::from_static(extra));
        let after = trusted.resolve(&headers);
        check(&after);
        if short && before.client.is_some() {
            assert_eq!(after.client, before.client, "{values:?} then {extra}");
        }
    }
}

fn check(r: &Resolved) {
    if let Some(client) = r.client {
        assert_eq!(client.ip(), client.ip().to_canonical(), "{client}");
    }
}
