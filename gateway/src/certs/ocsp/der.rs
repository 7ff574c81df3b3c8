//! The few DER structures OCSP needs: encoding an `OCSPRequest` for one certificate, reading a
//! `BasicOCSPResponse` (status, validity, signature) and checking a signature with the issuer's
//! key. A strict reader over `&[u8]`: lengths in definite form only, every read bounds-checked,
//! errors as text.

use aws_lc_rs::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use x509_parser::x509::SubjectPublicKeyInfo;

/// SHA-1, the CertID hash every responder supports.
pub(super) fn sha1(data: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, data)
        .as_ref()
        .to_vec()
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

const SEQUENCE: u8 = 0x30;

/// `OCSPRequest` with one `Request` whose CertID uses SHA-1.
pub(super) fn ocsp_request(name_hash: &[u8], key_hash: &[u8], serial: &[u8]) -> Vec<u8> {
    // AlgorithmIdentifier { id-sha1 (1.3.14.3.2.26), NULL }
    let alg = tlv(
        SEQUENCE,
        &[
            &[0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a][..],
            &[0x05, 0x00],
        ]
        .concat(),
    );
    let cert_id = tlv(
        SEQUENCE,
        &[
            alg,
            tlv(0x04, name_hash),
            tlv(0x04, key_hash),
            tlv(0x02, serial),
        ]
        .concat(),
    );
    let request = tlv(SEQUENCE, &cert_id);
    let request_list = tlv(SEQUENCE, &request);
    let tbs = tlv(SEQUENCE, &request_list);
    tlv(SEQUENCE, &tbs)
}

/// A DER reader over one level of a structure.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn peek(&self) -> Option<u8> {
        self.0.first().copied()
    }

    /// The next element: its tag, content and whole encoding.
    fn next(&mut self) -> Result<(u8, &'a [u8], &'a [u8]), String> {
        let d = self.0;
        let bad = || "malformed DER".to_owned();
        let tag = *d.first().ok_or_else(bad)?;
        let first = *d.get(1).ok_or_else(bad)? as usize;
        let (len, head) = if first < 0x80 {
            (first, 2)
        } else {
            let n = first & 0x7f;
            if n == 0 || n > 4 {
                return Err(bad());
            }
            let bytes = d.get(2..2 + n).ok_or_else(bad)?;
            (
                bytes.iter().fold(0usize, |a, b| (a << 8) | *b as usize),
                2 + n,
            )
        };
        let end = head.checked_add(len).ok_or_else(bad)?;
        let content = d.get(head..end).ok_or_else(bad)?;
        let whole = &d[..end];
        self.0 = &d[end..];
        Ok((tag, content, whole))
    }

    fn expect(&mut self, tag: u8) -> Result<&'a [u8], String> {
        let (t, content, _) = self.next()?;
        if t != tag {
            return Err(format!("expected DER tag {tag:#04x}, found {t:#04x}"));
        }
        Ok(content)
    }
}

/// One `SingleResponse`.
pub(super) struct Single {
    pub(super) serial: Vec<u8>,
    pub(super) issuer_key_hash: Vec<u8>,
    pub(super) good: bool,
    pub(super) this_update: i64,
    pub(super) next_update: Option<i64>,
}

/// The parts of a `BasicOCSPResponse` that are checked.
pub(super) struct Basic<'a> {
    pub(super) tbs: &'a [u8],
    pub(super) signature_alg: String,
    pub(super) signature: Vec<u8>,
    /// The `certs` the responder included: a delegated responder certificate, often the
    /// issuer's own certificate or a chain, which by themselves prove nothing.
    pub(super) certs: Vec<Vec<u8>>,
    pub(super) responses: Vec<Single>,
}

/// Reads an `OCSPResponse` down to its basic response.
pub(super) fn basic_response(der: &[u8]) -> Result<Basic<'_>, String> {
    let mut top = Reader(Reader(der).expect(SEQUENCE)?);
    let status = top.expect(0x0a)?;
    if status != [0] {
        return Err(format!(
            "the responder answered status {status:?} (not successful)"
        ));
    }
    let mut bytes = Reader(Reader(top.expect(0xa0)?).expect(SEQUENCE)?);
    let kind = bytes.expect(0x06)?;
    // id-pkix-ocsp-basic, 1.3.6.1.5.5.7.48.1.1
    if kind != [0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01, 0x01] {
        return Err("not a basic OCSP response".into());
    }
    let mut basic = Reader(Reader(bytes.expect(0x04)?).expect(SEQUENCE)?);
    let (tag, tbs_content, tbs) = basic.next()?;
    if tag != SEQUENCE {
        return Err("malformed ResponseData".into());
    }
    let signature_alg = oid_text(Reader(basic.expect(SEQUENCE)?).expect(0x06)?);
    let sig_bits = basic.expect(0x03)?;
    let signature = sig_bits.get(1..).ok_or("empty signature")?.to_vec();
    let mut certs = Vec::new();
    if basic.peek() == Some(0xa0) {
        let mut list = Reader(Reader(basic.expect(0xa0)?).expect(SEQUENCE)?);
        while !list.is_empty() {
            certs.push(list.next()?.2.to_vec());
        }
    }

    let mut data = Reader(tbs_content);
    if data.peek() == Some(0xa0) {
        data.next()?; // version
    }
    data.next()?; // responderID
    data.expect(0x18)?; // producedAt
    let mut list = Reader(data.expect(SEQUENCE)?);
    let mut responses = Vec::new();
    while !list.is_empty() {
        let mut single = Reader(list.expect(SEQUENCE)?);
        let mut cert_id = Reader(single.expect(SEQUENCE)?);
        cert_id.expect(SEQUENCE)?; // hash algorithm
        cert_id.expect(0x04)?; // issuer name hash
        let issuer_key_hash = cert_id.expect(0x04)?.to_vec();
        let serial = cert_id.expect(0x02)?.to_vec();
        let (status, _, _) = single.next()?;
        let this_update = generalized_time(single.expect(0x18)?)?;
        let next_update = if single.peek() == Some(0xa0) {
            Some(generalized_time(
                Reader(single.expect(0xa0)?).expect(0x18)?,
            )?)
        } else {
            None
        };
        responses.push(Single {
            serial,
            issuer_key_hash,
            good: status == 0x80,
            this_update,
            next_update,
        });
    }
    Ok(Basic {
        tbs,
        signature_alg,
        signature,
        certs,
        responses,
    })
}

fn oid_text(der: &[u8]) -> String {
    let mut parts = Vec::new();
    if let Some(first) = der.first() {
        parts.push(u64::from(first / 40));
        parts.push(u64::from(first % 40));
    }
    let mut v = 0u64;
    for b in der.iter().skip(1) {
        v = (v << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            parts.push(v);
            v = 0;
        }
    }
    parts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// `YYYYMMDDHHMMSS[.fff]Z` to Unix seconds.
fn generalized_time(t: &[u8]) -> Result<i64, String> {
    let bad = || format!("bad time {:?}", String::from_utf8_lossy(t));
    let s = std::str::from_utf8(t).map_err(|_| bad())?;
    if s.len() < 15 || !s.ends_with('Z') {
        return Err(bad());
    }
    let n =
        |r: std::ops::Range<usize>| s.get(r).and_then(|x| x.parse::<i64>().ok()).ok_or_else(bad);
    let (y, mo, d, h, mi, se) = (
        n(0..4)?,
        n(4..6)?,
        n(6..8)?,
        n(8..10)?,
        n(10..12)?,
        n(12..14)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    // Days from the civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days * 86_400 + h * 3600 + mi * 60 + se)
}

/// A public key that checks signatures.
#[derive(Debug, Clone)]
pub(super) struct PublicKey {
    /// Key algorithm OID (and the curve for EC keys).
    algorithm: String,
    curve: Option<String>,
    bits: Vec<u8>,
}

impl PublicKey {
    pub(super) fn from_spki(spki: &SubjectPublicKeyInfo<'_>) -> Option<Self> {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|o| o.to_id_string());
        Some(Self {
            algorithm: spki.algorithm.algorithm.to_id_string(),
            curve,
            bits: spki.subject_public_key.data.to_vec(),
        })
    }

    /// Verifies `signature` over `message` made with signature algorithm `alg` (OID text).
    pub(super) fn verify(&self, alg: &str, message: &[u8], signature: &[u8]) -> Result<(), String> {
        const P256: &str = "1.2.840.10045.3.1.7";
        const P384: &str = "1.3.132.0.34";
        let curve = self.curve.as_deref();
        let algorithm: &'static dyn VerificationAlgorithm = match (alg, curve) {
            ("1.2.840.10045.4.3.2", Some(P256)) => &signature::ECDSA_P256_SHA256_ASN1,
            ("1.2.840.10045.4.3.2", Some(P384)) => &signature::ECDSA_P384_SHA256_ASN1,
            ("1.2.840.10045.4.3.3", Some(P256)) => &signature::ECDSA_P256_SHA384_ASN1,
            ("1.2.840.10045.4.3.3", Some(P384)) => &signature::ECDSA_P384_SHA384_ASN1,
            ("1.2.840.113549.1.1.11", _) => &signature::RSA_PKCS1_2048_8192_SHA256,
            ("1.2.840.113549.1.1.12", _) => &signature::RSA_PKCS1_2048_8192_SHA384,
            ("1.2.840.113549.1.1.13", _) => &signature::RSA_PKCS1_2048_8192_SHA512,
            ("1.2.840.113549.1.1.5", _) => &signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            ("1.3.101.112", _) => &signature::ED25519,
            _ => {
                return Err(format!(
                    "unsupported signature algorithm {alg} for key {}",
                    self.algorithm
                ));
            }
        };
        UnparsedPublicKey::new(algorithm, &self.bits)
            .verify(message, signature)
            .map_err(|_| "bad OCSP signature".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generalized_time_is_unix_seconds() {
        assert_eq!(generalized_time(b"19700101000000Z"), Ok(0));
        assert_eq!(generalized_time(b"20240229120000Z"), Ok(1_709_208_000));
        assert_eq!(generalized_time(b"20240229120000.123Z"), Ok(1_709_208_000));
        assert!(generalized_time(b"2024").is_err());
        assert!(generalized_time(b"20241329120000Z").is_err());
    }

    #[test]
    fn request_encodes_lengths_and_reads_back() {
        let req = ocsp_request(&[1; 20], &[2; 20], &[0x01, 0x02, 0x03]);
        // OCSPRequest > TBSRequest > requestList > Request > CertID
        let mut r = Reader(&req);
        let ocsp_request = r.expect(SEQUENCE).unwrap();
        assert!(r.is_empty());
        let tbs = Reader(ocsp_request).expect(SEQUENCE).unwrap();
        let list = Reader(tbs).expect(SEQUENCE).unwrap();
        let request = Reader(list).expect(SEQUENCE).unwrap();
        let cert_id = Reader(request).expect(SEQUENCE).unwrap();
        let mut id = Reader(Reader(cert_id).expect(SEQUENCE).unwrap());
        let mut fields = Reader(cert_id);
        fields.expect(SEQUENCE).unwrap();
        assert_eq!(oid_text(id.expect(0x06).unwrap()), "1.3.14.3.2.26");
        assert_eq!(fields.expect(0x04).unwrap(), &[1; 20]);
        assert_eq!(fields.expect(0x04).unwrap(), &[2; 20]);
        assert_eq!(fields.expect(0x02).unwrap(), &[1, 2, 3]);
        // Long-form lengths.
        assert_eq!(&tlv(0x04, &[0; 200])[..3], &[0x04, 0x81, 200]);
        assert_eq!(&tlv(0x04, &[0; 300])[..4], &[0x04, 0x82, 1, 44]);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for input in [
            &b""[..],
            &[0x30],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &[0x30, 0x05, 0x0a],
        ] {
            assert!(basic_response(input).is_err());
        }
        let mut seed = 7u32;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 16) as u8
                })
                .collect();
            let _ = basic_response(&bytes);
        }
    }
}
