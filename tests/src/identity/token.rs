//! An expired copy of a real token.
//!
//! TokenRequest refuses lifetimes under ten minutes, and a test cannot
//! wait that long. [`expired_copy`] takes a real token, moves its
//! `iat`/`nbf`/`exp` claims into the past and signs it again with the
//! cluster's own service-account key (the file the apiserver was started
//! with): the apiserver then sees a token it issued in every respect but
//! its expiry.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rcgen::{KeyPair, SigningKey};

/// `token` with its lifetime moved ten minutes into the past, signed
/// again with the service-account key `sa_key` (PEM, ECDSA P-256: ES256).
pub fn expired_copy(token: &str, sa_key: &Path) -> Result<String> {
    let [header, payload, _signature] = token.split('.').collect::<Vec<_>>()[..] else {
        bail!("not a JWT: {token}");
    };
    let head: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header)?)?;
    if head["alg"] != "ES256" {
        bail!("expected an ES256 token, got {head}");
    }
    let mut claims: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload)?)?;
    let now = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs())?;
    claims["iat"] = (now - 1200).into();
    claims["nbf"] = (now - 1200).into();
    claims["exp"] = (now - 600).into();
    let signed = format!(
        "{header}.{}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?)
    );
    let key = KeyPair::from_pem(&std::fs::read_to_string(sa_key)?)?;
    let der = key.sign(signed.as_bytes())?;
    let raw = ecdsa_der_to_raw(&der, 32)?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(raw)))
}

/// An ASN.1 `SEQUENCE { r INTEGER, s INTEGER }` ECDSA signature as JWS
/// wants it: `r || s`, each `width` bytes.
fn ecdsa_der_to_raw(der: &[u8], width: usize) -> Result<Vec<u8>> {
    fn integer(input: &[u8]) -> Result<(&[u8], &[u8])> {
        match input {
            [0x02, len, rest @ ..] if rest.len() >= usize::from(*len) => {
                Ok(rest.split_at(usize::from(*len)))
            }
            _ => bail!("not a short DER INTEGER"),
        }
    }
    let body = match der {
        [0x30, len, rest @ ..] if rest.len() == usize::from(*len) => rest,
        _ => bail!("not a short DER SEQUENCE"),
    };
    let (r, rest) = integer(body)?;
    let (s, _) = integer(rest)?;
    let mut out = Vec::with_capacity(2 * width);
    for n in [r, s] {
        let n = &n[n.iter().take_while(|b| **b == 0).count()..];
        if n.len() > width {
            bail!("integer longer than {width} bytes");
        }
        out.extend(std::iter::repeat_n(0, width - n.len()));
        out.extend_from_slice(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_signatures_become_fixed_width() {
        // SEQUENCE { INTEGER 0x00 0x80, INTEGER 0x01 }
        let der = [0x30, 0x07, 0x02, 0x02, 0x00, 0x80, 0x02, 0x01, 0x01];
        let raw = ecdsa_der_to_raw(&der, 4).expect("converts");
        assert_eq!(raw, [0, 0, 0, 0x80, 0, 0, 0, 1]);
        assert!(ecdsa_der_to_raw(&[0x31, 0x00], 4).is_err());
    }
}
