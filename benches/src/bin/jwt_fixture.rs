//! The `jwt` variant of the harness's `api-route` scenario needs a key set and a token: this
//! writes a JSON Web Key Set with one RS256 key to the file named by its argument and prints a
//! token signed by that key, valid for a year, for the load generator to send on every request.

use std::process::ExitCode;

use gateway::filter::jwt::testing::{SigningKey, jwks, now};
use gateway_config::JwtAlgorithm;
use serde_json::json;

/// A year, in seconds: the token outlives any run.
const VALID_FOR: i64 = 365 * 24 * 3600;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: jwt_fixture JWKS_FILE (the token is printed)");
        return ExitCode::from(2);
    };
    let key = SigningKey::generate(JwtAlgorithm::Rs256, "bench");
    if let Err(e) = std::fs::write(&path, jwks(&[&key])) {
        eprintln!("cannot write {path}: {e}");
        return ExitCode::FAILURE;
    }
    let claims = json!({
        "iss": "https://id.bench.example",
        "aud": "api",
        "sub": "bench-user",
        "iat": now(),
        "exp": now() + VALID_FOR,
    });
    println!("{}", key.sign(&claims));
    ExitCode::SUCCESS
}
