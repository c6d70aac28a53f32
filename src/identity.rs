//! Who a request comes from, and how that keeps users apart. Under `serve` every request has an
//! identity (a `token_file` name, or an OAuth token's `sub`); over stdio there is one user and
//! no identity. A sandbox session is found by its *key*: the session name alone for the stdio
//! user, `identity/name` under `serve`. Session names never contain `/` (`RunArgs::parse`), so
//! one identity's key can never name another's session, whatever the identity's characters.

/// The identity `serve` authenticated a request as, put in the request's extensions for the
/// MCP handler (`http::request::Parts` reach it in rmcp's request context).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity(pub String);

/// The identity of an MCP request: `None` over stdio.
pub fn of_request(extensions: &rmcp::model::Extensions) -> Option<String> {
    extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<Identity>())
        .map(|i| i.0.clone())
}

/// The default interpreter of a request made in an MCP session of Streamable HTTP (2025-11-25
/// and older, the `Mcp-Session-Id` header): that MCP session's own, so two connections of one
/// identity do not share state unless they name a session. A name, not the id itself (the id
/// stays between the client and the server): `mcp-` and 16 hex digits of its SHA-256. `None`
/// over stdio (one client) and for 2026-07-28 requests, which have no connection.
pub fn mcp_session(extensions: &rmcp::model::Extensions) -> Option<String> {
    let id = extensions
        .get::<http::request::Parts>()?
        .headers
        .get("mcp-session-id")?;
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(id.as_bytes());
    Some(format!("mcp-{}", &hex::encode(digest)[..16]))
}

/// The key of session `session` of `identity`.
pub fn session_key(identity: Option<&str>, session: &str) -> String {
    match identity {
        Some(id) => format!("{id}/{session}"),
        None => session.to_string(),
    }
}

/// `(identity, session)` of a key made by [`session_key`].
pub fn split_key(key: &str) -> (Option<&str>, &str) {
    match key.rsplit_once('/') {
        Some((id, session)) => (Some(id), session),
        None => (None, key),
    }
}

/// Whether the session of `key` belongs to `identity` (the stdio user owns the keys without one).
pub fn owns(identity: Option<&str>, key: &str) -> bool {
    split_key(key).0 == identity
}

/// A file name for `identity`'s own directories (its saved skills): the identity itself when it
/// is a plain name, else `id-` and a digest of it, so no identity can name a path outside the
/// directory or another identity's.
pub fn dir_name(identity: &str) -> String {
    let plain = !identity.is_empty()
        && identity.len() <= 64
        && !identity.starts_with('.')
        && !identity.starts_with("id-")
        && identity
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
    if plain {
        return identity.to_string();
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(identity.as_bytes());
    format!("id-{}", &hex::encode(digest)[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_identities_apart() {
        assert_eq!(session_key(None, "default"), "default");
        let k = session_key(Some("a/b"), "default");
        assert_eq!(split_key(&k), (Some("a/b"), "default"));
        assert!(owns(Some("a/b"), &k));
        assert!(!owns(Some("a"), &k));
        assert!(!owns(None, &k));
        assert!(owns(None, "default"));
        assert!(!owns(Some("x"), "default"));
    }

    #[test]
    fn an_mcp_session_has_its_own_default_interpreter() {
        let parts = |id: Option<&str>| {
            let mut b = http::Request::builder();
            if let Some(id) = id {
                b = b.header("mcp-session-id", id);
            }
            let mut e = rmcp::model::Extensions::new();
            e.insert(b.body(()).unwrap().into_parts().0);
            e
        };
        assert_eq!(mcp_session(&rmcp::model::Extensions::new()), None);
        assert_eq!(mcp_session(&parts(None)), None);
        let a = mcp_session(&parts(Some("0b7e5a52-0a8c-4c0a-9f8e-1d2c3b4a5f60"))).unwrap();
        let b = mcp_session(&parts(Some("5c1d0f9e-7a6b-4e3d-8c2b-1a0f9e8d7c6b"))).unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("mcp-") && a.len() == 20, "{a}");
        assert!(
            !a.contains("0b7e5a52"),
            "the id itself is not the name: {a}"
        );
    }

    #[test]
    fn directory_names_stay_inside() {
        assert_eq!(dir_name("alice"), "alice");
        assert_eq!(dir_name("bob@example.com"), "bob@example.com");
        for hostile in [
            "..",
            ".",
            "",
            "a/b",
            "../x",
            "id-abc",
            "auth0|123",
            &"x".repeat(65),
        ] {
            let d = dir_name(hostile);
            assert!(d.starts_with("id-") && d.len() == 35, "{hostile:?} -> {d}");
        }
        assert_ne!(dir_name("a/b"), dir_name("a_b"));
    }
}
