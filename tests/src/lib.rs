//! Test harness: gateway, clients, backends, certificates.
