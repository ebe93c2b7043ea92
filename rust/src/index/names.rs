//! Naming rules: names and namespaces are data, never paths.
//!
//! CONTRACT: `validate_name` accepts a name of 1..=200 bytes and a namespace of 0..=200 bytes (UTF-8) with no
//! control character, '/', '\\', "..", or surrounding whitespace; anything else is `IndexError::InvalidName`
//! saying which rule it breaks (the value shown escaped and cut to 40 characters).

use super::IndexError;

pub const MAX_NAME_BYTES: usize = 200;


/// Check a name (`what` = "name": 1..=200 bytes) or namespace (`what` = "namespace": 0..=200 bytes).
/// Names are identifiers, never paths: no NUL/control characters, '/', '\\', "..", or surrounding whitespace.
pub fn validate_name(s: &str, what: &'static str) -> Result<(), IndexError> {
    let fail = |reason: String| {
        let shown = if s.chars().count() > 40 {
            format!("'{}…'", s.chars().take(40).collect::<String>().escape_debug())
        } else {
            format!("'{}'", s.escape_debug())
        };
        Err(IndexError::InvalidName { what, value: s.to_string(), shown, reason })
    };
    let min = if what == "namespace" { 0 } else { 1 };
    if s.len() < min {
        return fail(format!("a {what} must not be empty"));
    }
    if s.len() > MAX_NAME_BYTES {
        return fail(format!("{} bytes long; the limit is {MAX_NAME_BYTES} bytes (UTF-8)", s.len()));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return fail(format!("contains control character U+{:04X}; {what}s are printable text", c as u32));
    }
    if s.contains('/') {
        return fail(format!("{what} contains '/': {what}s are identifiers, not paths"));
    }
    if s.contains('\\') {
        return fail(format!("{what} contains '\\': {what}s are identifiers, not paths"));
    }
    if s.contains("..") {
        return fail(format!("{what} contains '..': {what}s are identifiers, not paths"));
    }
    if s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace) {
        return fail(format!("{what} has leading or trailing whitespace"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_rules() {
        for ok in ["a", "user-42", "conv:2024/x".replace('/', "_").as_str(), "日本語", "a.b", "x y"] {
            validate_name(ok, "name").unwrap();
        }
        validate_name("", "namespace").unwrap();
        let bad = [
            ("", "empty"),
            ("a/b", "'/'"),
            ("a\\b", "'\\'"),
            ("..", "'..'"),
            ("a..b", "'..'"),
            ("a\0b", "control"),
            ("a\nb", "control"),
            (" a", "whitespace"),
            ("a\t", "control"),
            ("a ", "whitespace"),
        ];
        for (s, why) in bad {
            let e = validate_name(s, "name").unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
        }
        let long = "x".repeat(10_000);
        let e = validate_name(&long, "name").unwrap_err().to_string();
        assert!(e.contains("10000 bytes") && e.len() < 300, "{e}");
        validate_name(&"x".repeat(200), "name").unwrap();
        assert!(validate_name(&"é".repeat(101), "name").is_err()); // 202 bytes
        let e = validate_name("a/b", "name").unwrap_err().to_string();
        assert_eq!(e, "invalid name 'a/b': name contains '/': names are identifiers, not paths");
    }
}
