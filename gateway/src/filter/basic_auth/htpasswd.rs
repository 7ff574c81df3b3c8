//! The htpasswd file of the `basic_auth` filter: one `user:hash` a line (an optional third
//! `:comment` field, as nginx allows, is ignored; blank lines and `#` comments are skipped).
//!
//! Only slow, salted hashes are accepted: bcrypt (`$2a$`, `$2b$`, `$2y$`) and SHA-crypt (`$5$`,
//! `$6$`, optionally with `rounds=`). MD5 (`$apr1$`, `$1$`), `{SHA}`, crypt(3) DES and plain
//! text are refused with the line they are on rather than skipped: a user missing from a file
//! that loaded "fine" is harder to notice than a file that does not load.

use std::collections::HashMap;
use std::path::Path;

use sha_crypt::{PasswordVerifier, ShaCrypt};

/// The characters of the crypt flavour of base64 both hash families write.
fn crypt64(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
}

/// One user's password hash, checked for shape when the file is read.
#[derive(Debug, Clone)]
pub(crate) enum Hash {
    Bcrypt(Box<str>),
    ShaCrypt(Box<str>),
}

impl Hash {
    /// Parses the hash field of a line.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if let Some(rest) = text
            .strip_prefix("$2a$")
            .or_else(|| text.strip_prefix("$2b$"))
            .or_else(|| text.strip_prefix("$2y$"))
        {
            return bcrypt_shape(rest).map(|()| Self::Bcrypt(text.into()));
        }
        if let Some(rest) = text.strip_prefix("$5$") {
            return sha_crypt_shape(rest, 43).map(|()| Self::ShaCrypt(text.into()));
        }
        if let Some(rest) = text.strip_prefix("$6$") {
            return sha_crypt_shape(rest, 86).map(|()| Self::ShaCrypt(text.into()));
        }
        let kind = if text.starts_with("$apr1$") || text.starts_with("$1$") {
            "an MD5 hash"
        } else if text.starts_with("{SHA}") {
            "an unsalted SHA-1 hash"
        } else if text.starts_with('$') {
            "a hash of an unsupported kind"
        } else {
            "plain text or a crypt(3) DES hash"
        };
        Err(format!(
            "{kind} is not accepted; use bcrypt (`htpasswd -B`) or SHA-crypt ($5$, $6$)"
        ))
    }

    /// Whether `password` matches. Slow on purpose: call it off the async workers.
    pub(crate) fn verify(&self, password: &[u8]) -> bool {
        match self {
            Self::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            Self::ShaCrypt(h) => ShaCrypt::default().verify_password(password, &**h).is_ok(),
        }
    }
}

/// `NN$` then 22 characters of salt and 31 of hash.
fn bcrypt_shape(rest: &str) -> Result<(), String> {
    let (cost, tail) = rest
        .split_once('$')
        .ok_or("a bcrypt hash needs a cost (`$2y$10$...`)")?;
    match cost.parse::<u32>() {
        Ok(4..=31) if cost.len() == 2 => {}
        _ => return Err(format!("bcrypt cost `{cost}` is not between 04 and 31")),
    }
    if tail.len() != 53 || !crypt64(tail) {
        return Err("a bcrypt hash has 53 characters of salt and hash after the cost".into());
    }
    Ok(())
}

/// `[rounds=N$]salt$hash`, the salt at most 16 characters, the hash `len` characters.
fn sha_crypt_shape(rest: &str, len: usize) -> Result<(), String> {
    let mut fields: Vec<&str> = rest.split('$').collect();
    if let Some(rounds) = fields.first().and_then(|f| f.strip_prefix("rounds=")) {
        match rounds.parse::<u32>() {
            Ok(1_000..=999_999_999) => {}
            _ => {
                return Err(format!(
                    "SHA-crypt rounds `{rounds}` are not between 1000 and 999999999"
                ));
            }
        }
        fields.remove(0);
    }
    let [salt, hash] = fields[..] else {
        return Err("a SHA-crypt hash is `$5$[rounds=N$]salt$hash`".into());
    };
    if salt.is_empty() || salt.len() > 16 || salt.contains(char::is_control) {
        return Err("a SHA-crypt salt has 1 to 16 characters".into());
    }
    if hash.len() != len || !crypt64(hash) {
        return Err(format!(
            "a SHA-crypt hash of this kind has {len} characters"
        ));
    }
    Ok(())
}

/// The users of one version of the file.
#[derive(Debug, Default)]
pub(crate) struct Htpasswd {
    users: HashMap<Box<str>, Hash>,
    /// What an unknown user's password is checked against, so that asking about a user who
    /// does not exist costs what asking about one who does costs: the first entry's hash (a
    /// real hash of the file's kind and cost; the answer is thrown away).
    dummy: Option<Hash>,
}

impl Htpasswd {
    /// Parses a whole file; an error names the 1-based line.
    pub(crate) fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut file = Self::default();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let (user, rest) = line
                .split_once(':')
                .ok_or((n, "expected `user:hash`".to_owned()))?;
            if user.is_empty() || user.contains(char::is_control) {
                return Err((n, "the user name is empty or has control characters".into()));
            }
            let hash = rest.split(':').next().unwrap_or(rest);
            let hash = Hash::parse(hash).map_err(|m| (n, format!("user `{user}`: {m}")))?;
            if file.users.contains_key(user) {
                return Err((n, format!("user `{user}` is listed twice")));
            }
            file.dummy.get_or_insert_with(|| hash.clone());
            file.users.insert(user.into(), hash);
        }
        Ok(file)
    }

    /// Reads and parses `path`; the error reads `SHOWN:LINE: message`, `shown` being the path
    /// as the user wrote it.
    pub(crate) fn load(path: &Path, shown: &Path) -> Result<Self, String> {
        let shown = shown.display();
        let text = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
        let text =
            String::from_utf8(text).map_err(|_| format!("{shown}: the file is not UTF-8"))?;
        Self::parse(&text).map_err(|(line, m)| format!("{shown}:{line}: {m}"))
    }

    /// The hash to check `user`'s password against, and whether the user exists.
    pub(crate) fn lookup(&self, user: &str) -> (Option<&Hash>, bool) {
        match self.users.get(user) {
            Some(h) => (Some(h), true),
            None => (self.dummy.as_ref(), false),
        }
    }

    /// How many users the file lists.
    pub(crate) fn len(&self) -> usize {
        self.users.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha_crypt::{Algorithm, CustomizedPasswordHasher, Params};

    fn sha_crypt(alg: Algorithm, rounds: u32, password: &str) -> String {
        ShaCrypt::default()
            .hash_password_customized(
                password.as_bytes(),
                b"saltsalt",
                Some(alg.to_str()),
                None,
                Params::new(rounds).unwrap(),
            )
            .unwrap()
            .to_string()
    }

    #[test]
    fn every_accepted_kind_verifies() {
        let parts = bcrypt::hash_with_result("pw-b", 4).unwrap();
        let bcrypt_y = parts.format_for_version(bcrypt::Version::TwoY);
        let bcrypt_b = parts.format_for_version(bcrypt::Version::TwoB);
        let bcrypt_a = parts.format_for_version(bcrypt::Version::TwoA);
        let sha256 = sha_crypt(Algorithm::Sha256Crypt, 1000, "pw-5");
        let sha512 = sha_crypt(Algorithm::Sha512Crypt, 2000, "pw-6");
        // The default rounds leave the `rounds=` field out, as glibc writes it.
        let sha256_plain =
            sha_crypt(Algorithm::Sha256Crypt, 5000, "pw-5").replacen("rounds=5000$", "", 1);
        assert!(sha256.contains("rounds=1000$"), "{sha256}");
        for (hash, pw) in [
            (&bcrypt_y, "pw-b"),
            (&bcrypt_b, "pw-b"),
            (&bcrypt_a, "pw-b"),
            (&sha256, "pw-5"),
            (&sha512, "pw-6"),
            (&sha256_plain, "pw-5"),
        ] {
            let h = Hash::parse(hash).unwrap_or_else(|e| panic!("{hash}: {e}"));
            assert!(h.verify(pw.as_bytes()), "{hash}");
            assert!(!h.verify(b"wrong"), "{hash}");
            assert!(!h.verify(b""), "{hash}");
        }
    }

    #[test]
    fn weak_and_broken_hashes_are_refused() {
        for (hash, says) in [
            ("$apr1$abc$def", "MD5"),
            ("$1$abc$def", "MD5"),
            ("{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=", "SHA-1"),
            ("secret", "plain text"),
            ("$3$x", "unsupported"),
            ("$2y$10$short", "53 characters"),
            ("$2y$99$", "cost"),
            (
                "$2y$1$aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                "cost",
            ),
            ("$5$rounds=10$salt$hash", "rounds"),
            ("$5$salt", "$5$[rounds=N$]salt$hash"),
            ("$6$saltsaltsaltsaltsalt$x", "salt"),
            ("$6$salt$tooshort", "86 characters"),
        ] {
            let err = Hash::parse(hash).unwrap_err();
            assert!(err.contains(says), "{hash}: {err}");
        }
    }

    #[test]
    fn file_lines_comments_and_errors() {
        let b = bcrypt::hash("pw", 4).unwrap();
        let text = format!("# admins\n\nalice:{b}\r\nbob:{b}:the comment\n");
        let f = Htpasswd::parse(&text).unwrap();
        assert_eq!(f.len(), 2);
        assert!(f.lookup("alice").1);
        let (dummy, known) = f.lookup("mallory");
        assert!(!known && dummy.is_some());

        let bad = format!("alice:{b}\nbob:$apr1$x$y\n");
        let (line, msg) = Htpasswd::parse(&bad).unwrap_err();
        assert_eq!(line, 2);
        assert!(msg.contains("user `bob`") && msg.contains("MD5"), "{msg}");
        assert_eq!(Htpasswd::parse("no colon here").unwrap_err().0, 1);
        assert_eq!(Htpasswd::parse(&format!(":{b}")).unwrap_err().0, 1);
        let twice = format!("a:{b}\na:{b}\n");
        assert!(Htpasswd::parse(&twice).unwrap_err().1.contains("twice"));
        assert!(Htpasswd::parse("").unwrap().lookup("x").0.is_none());
    }
}
