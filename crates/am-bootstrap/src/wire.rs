//! The PMI text wire formats (parsing and formatting only, no I/O).
//!
//! PMI-1 ("simple PMI"): one command per line, space-separated `key=value`
//! tokens, the first being `cmd=<name>`:
//! `cmd=put kvsname=kvs_1 key=k0 value=v0\n`.
//!
//! PMI-2: a 6-character decimal length (space padded), then
//! `cmd=<name>;key=value;...;` with no newline:
//! `    26cmd=kvs-put-response;rc=0;`.
//!
//! Shared with amrun's PMI-1 server in `am-launch`, so both ends speak one format; hidden from
//! the docs, as it is no API for programs (its errors are the text the server sends back).

/// Largest PMI-1 line or PMI-2 body we accept from a peer.
pub const MAX_MESSAGE: usize = 1 << 20;

/// Key length limit advertised by hydra (`keylen_max`); used by the amrun server too.
pub const KEY_MAX: usize = 64;
/// Value length limit advertised by hydra (`vallen_max`).
pub const VALUE_MAX: usize = 1024;
/// Kvsname length limit advertised by hydra (`kvsname_max`).
pub const KVSNAME_MAX: usize = 256;

/// One PMI message: the command name and its other fields, in wire order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The command (`cmd=`), e.g. `put` or `kvs-get-response`.
    pub cmd: String,
    /// The other `key=value` fields.
    pub fields: Vec<(String, String)>,
}

impl Message {
    /// The value of the first field named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `rc` is optional on the wire (hydra omits it for some replies); absent means success.
    pub fn failed(&self) -> Option<&str> {
        self.get("rc").filter(|rc| *rc != "0")
    }
}

/// Parses a PMI-1 line (without its trailing newline).
pub fn parse_v1(line: &str) -> Result<Message, String> {
    let mut tokens = line.split(' ').filter(|t| !t.is_empty());
    let first = tokens.next().ok_or("empty PMI-1 message")?;
    let cmd = first
        .strip_prefix("cmd=")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("PMI-1 message does not start with cmd=: {line:?}"))?;
    let mut fields = Vec::new();
    for token in tokens {
        // The value is everything after the first '=': values may contain '='.
        let (k, v) = token.split_once('=').unwrap_or((token, ""));
        if k.is_empty() {
            return Err(format!("PMI-1 token without a key: {token:?}"));
        }
        fields.push((k.to_owned(), v.to_owned()));
    }
    Ok(Message {
        cmd: cmd.to_owned(),
        fields,
    })
}

/// Formats a PMI-1 line, newline included. Callers validate field contents.
pub fn format_v1(cmd: &str, fields: &[(&str, &str)]) -> String {
    let mut s = format!("cmd={cmd}");
    for (k, v) in fields {
        s.push(' ');
        s.push_str(k);
        s.push('=');
        s.push_str(v);
    }
    s.push('\n');
    s
}

/// Parses the 6-character PMI-2 length header.
pub fn parse_v2_len(header: &[u8]) -> Result<usize, String> {
    let text = std::str::from_utf8(header)
        .ok()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let len = text.and_then(|t| t.parse::<usize>().ok()).ok_or_else(|| {
        format!(
            "bad PMI-2 length header {:?}",
            String::from_utf8_lossy(header)
        )
    })?;
    if len > MAX_MESSAGE {
        return Err(format!("PMI-2 message of {len} bytes is too long"));
    }
    Ok(len)
}

/// Parses a PMI-2 body (after the length header).
pub fn parse_v2(body: &str) -> Result<Message, String> {
    let mut segments = body.split(';').filter(|s| !s.is_empty());
    let first = segments.next().ok_or("empty PMI-2 message")?;
    let cmd = first
        .strip_prefix("cmd=")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("PMI-2 message does not start with cmd=: {body:?}"))?;
    let mut fields = Vec::new();
    for seg in segments {
        let (k, v) = seg.split_once('=').unwrap_or((seg, ""));
        if k.is_empty() {
            return Err(format!("PMI-2 segment without a key: {seg:?}"));
        }
        fields.push((k.to_owned(), v.to_owned()));
    }
    Ok(Message {
        cmd: cmd.to_owned(),
        fields,
    })
}

/// Formats a complete PMI-2 message, length header included.
pub fn format_v2(cmd: &str, fields: &[(&str, &str)]) -> String {
    let mut body = format!("cmd={cmd};");
    for (k, v) in fields {
        body.push_str(k);
        body.push('=');
        body.push_str(v);
        body.push(';');
    }
    format!("{:6}{body}", body.len())
}

/// Checks a key-value-store key: `[A-Za-z0-9_/-]+`, at most `max` bytes.
pub fn check_key(key: &str, max: usize) -> Result<(), String> {
    if key.is_empty() {
        return Err("keys must not be empty".into());
    }
    if key.len() > max {
        return Err(format!("keys are limited to {max} bytes"));
    }
    if let Some(c) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/')))
    {
        return Err(format!(
            "character {c:?} is not allowed in keys (use [A-Za-z0-9_/-])"
        ));
    }
    Ok(())
}

/// Checks a value: printable ASCII without space, `;` and `\`, 1 to `max` bytes.
///
/// These are the characters every PMI-1 and PMI-2 server carries unchanged.
pub fn check_value(value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err("values must not be empty (PMI cannot carry them)".into());
    }
    if value.len() > max {
        return Err(format!("values are limited to {max} bytes"));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, ';' | '\\'))
    {
        return Err(format!(
            "character {c:?} is not allowed in values (printable ASCII except space, ';' and '\\'; encode binary data, e.g. as hex)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(cmd: &str, fields: &[(&str, &str)]) -> Message {
        Message {
            cmd: cmd.into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn v1_parses_hydra_replies() {
        assert_eq!(
            parse_v1("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0").unwrap(),
            msg(
                "response_to_init",
                &[("pmi_version", "1"), ("pmi_subversion", "1"), ("rc", "0")]
            )
        );
        let m = parse_v1("cmd=get_result rc=0 msg=success value=a=b1").unwrap();
        assert_eq!(m.get("value"), Some("a=b1"));
        assert_eq!(m.failed(), None);
        let m = parse_v1("cmd=get_result rc=-1 msg=key_nokey_not_found value=unknown").unwrap();
        assert_eq!(m.failed(), Some("-1"));
        assert_eq!(
            parse_v1("cmd=barrier_out").unwrap(),
            msg("barrier_out", &[])
        );
        // Repeated spaces and bare keys are tolerated.
        assert_eq!(
            parse_v1("cmd=x  a=1 flag").unwrap(),
            msg("x", &[("a", "1"), ("flag", "")])
        );
    }

    #[test]
    fn v1_rejects_garbage() {
        assert!(parse_v1("").is_err());
        assert!(parse_v1("   ").is_err());
        assert!(parse_v1("key=value cmd=x").is_err());
        assert!(parse_v1("cmd=").is_err());
        assert!(parse_v1("cmd=x =v").is_err());
        assert!(parse_v1("mcmd=spawn").is_err());
    }

    #[test]
    fn v1_round_trip() {
        let line = format_v1(
            "put",
            &[("kvsname", "kvs_1"), ("key", "k0"), ("value", "x=y")],
        );
        assert_eq!(line, "cmd=put kvsname=kvs_1 key=k0 value=x=y\n");
        let m = parse_v1(line.trim_end_matches('\n')).unwrap();
        assert_eq!(
            m,
            msg(
                "put",
                &[("kvsname", "kvs_1"), ("key", "k0"), ("value", "x=y")]
            )
        );
        assert_eq!(format_v1("barrier_in", &[]), "cmd=barrier_in\n");
    }

    #[test]
    fn v2_frames_like_mpich() {
        // Byte-for-byte what MPICH's client sends and hydra replies.
        assert_eq!(
            format_v2("fullinit", &[("pmirank", "1"), ("threaded", "FALSE")]),
            "    38cmd=fullinit;pmirank=1;threaded=FALSE;"
        );
        let m = parse_v2("cmd=kvs-get-response;found=TRUE;value=v=0;rc=0;").unwrap();
        assert_eq!(
            m,
            msg(
                "kvs-get-response",
                &[("found", "TRUE"), ("value", "v=0"), ("rc", "0")]
            )
        );
        assert_eq!(parse_v2_len(b"   113").unwrap(), 113);
        assert_eq!(parse_v2_len(b"26    ").unwrap(), 26);
    }

    #[test]
    fn v2_rejects_garbage() {
        assert!(parse_v2_len(b"      ").is_err());
        assert!(parse_v2_len(b"  -1  ").is_err());
        assert!(parse_v2_len(b"1e5   ").is_err());
        assert!(parse_v2_len(b"12a456").is_err());
        assert!(parse_v2("").is_err());
        assert!(parse_v2("rc=0;cmd=x;").is_err());
        assert!(parse_v2("cmd=x;=y;").is_err());
    }

    #[test]
    fn v2_round_trip_through_header() {
        let framed = format_v2("kvs-put", &[("key", "k"), ("value", "a=b c")]);
        let len = parse_v2_len(&framed.as_bytes()[..6]).unwrap();
        assert_eq!(len, framed.len() - 6);
        let m = parse_v2(&framed[6..]).unwrap();
        assert_eq!(m.get("value"), Some("a=b c"));
    }

    #[test]
    fn keys_and_values_are_checked() {
        assert!(check_key("k0", KEY_MAX).is_ok());
        assert!(check_key("am/bootstrap-id_3", KEY_MAX).is_ok());
        assert!(check_key("", KEY_MAX).is_err());
        assert!(check_key("a b", KEY_MAX).is_err());
        assert!(check_key("a=b", KEY_MAX).is_err());
        assert!(check_key("a;b", KEY_MAX).is_err());
        assert!(check_key(&"k".repeat(KEY_MAX + 1), KEY_MAX).is_err());
        assert!(check_value("tcp://10.0.0.1:4000,x=y", VALUE_MAX).is_ok());
        assert!(check_value("", VALUE_MAX).is_err());
        assert!(check_value("a b", VALUE_MAX).is_err());
        assert!(check_value("a\nb", VALUE_MAX).is_err());
        assert!(check_value("a;b", VALUE_MAX).is_err());
        assert!(check_value("a\\b", VALUE_MAX).is_err());
        assert!(check_value("é", VALUE_MAX).is_err());
        assert!(check_value(&"v".repeat(VALUE_MAX + 1), VALUE_MAX).is_err());
    }
}
