//! SHA-256 for verifying downloads, from whichever implementation in the dependency
//! tree is fastest on this CPU.
//!
//! Two are compiled in anyway: RustCrypto's `sha2` and the one of `ring`, the crypto
//! provider of our TLS stack. Both use the SHA extensions (SHA-NI) where the CPU has
//! them, at about the same speed. Without them they differ: `sha2` falls back to
//! portable Rust, `ring` to the AVX or SSSE3 assembly it shares with OpenSSL, which
//! is the faster of the two (benchmarks/pull.md, "`sous pull` at line rate"). So
//! [`Backend::auto`] picks `sha2` on a CPU with SHA-NI and `ring` on one without, and
//! `ring` on aarch64, where it is the one of the two that uses the Arm SHA-2
//! instructions.
//!
//! `SOUS_SHA256=sha2|ring|portable` overrides the choice, for tests and benchmarks.
//! `portable` is RustCrypto's software implementation with every CPU extension
//! compiled out (`sha2` 0.9 built with `force-soft`): neither `sha2` 0.10 nor `ring`
//! can be told at run time to ignore extensions the CPU has, and this is how a
//! machine with SHA-NI measures the slowest path a machine without it could take.

use std::fmt;
use std::sync::OnceLock;

use sha2::Digest;

/// The environment variable that overrides the choice.
pub const ENV: &str = sous_engine::env::SHA256.name;

/// A SHA-256 implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// RustCrypto `sha2` 0.10: SHA-NI when present, else portable Rust.
    Sha2,
    /// `ring`: SHA-NI when present, else AVX/SSSE3 assembly.
    Ring,
    /// RustCrypto's portable Rust, no CPU extensions.
    Portable,
}

impl Backend {
    /// The backend for this process: `SOUS_SHA256` if set to a known name, else the
    /// fastest for this CPU. Decided once.
    pub fn current() -> Backend {
        static CHOSEN: OnceLock<Backend> = OnceLock::new();
        *CHOSEN.get_or_init(|| match sous_engine::env::SHA256.get() {
            Some(name) => Backend::parse(&name).unwrap_or_else(|| {
                tracing::warn!("{ENV}={name} is not sha2, ring or portable; choosing by CPU");
                Backend::auto()
            }),
            None => Backend::auto(),
        })
    }

    /// The fastest backend for this CPU. On aarch64, `ring` always: `sha2` 0.10 uses the
    /// Arm SHA-2 instructions only when built with its `asm` feature, which sous does
    /// not enable, while `ring` 0.17 (`src/digest/sha2/sha2_32.rs`) calls its
    /// `sha256-armv8` assembly wherever the CPU reports them and scalar code elsewhere.
    pub fn auto() -> Backend {
        if cfg!(target_arch = "aarch64") {
            return Backend::Ring;
        }
        if cpu_has_sha_extensions() {
            Backend::Sha2
        } else {
            Backend::Ring
        }
    }

    /// From its name.
    pub fn parse(name: &str) -> Option<Backend> {
        match name.trim().to_ascii_lowercase().as_str() {
            "sha2" => Some(Backend::Sha2),
            "ring" => Some(Backend::Ring),
            "portable" | "soft" => Some(Backend::Portable),
            _ => None,
        }
    }

    /// A fresh hasher.
    pub fn hasher(self) -> Sha256 {
        Sha256(match self {
            Backend::Sha2 => Inner::Sha2(Box::default()),
            Backend::Ring => Inner::Ring(Box::new(ring::digest::Context::new(&ring::digest::SHA256))),
            Backend::Portable => Inner::Portable(Box::default()),
        })
    }

    /// Name and the CPU path it takes here, for reports: `sha2 (SHA-NI)`.
    pub fn describe(self) -> String {
        let path = match (self, cpu_has_sha_extensions()) {
            (Backend::Portable, _) => "no CPU extensions",
            (_, true) => "SHA-NI",
            (Backend::Ring, false) => "AVX/SSSE3 assembly",
            (Backend::Sha2, false) => "portable Rust",
        };
        format!("{self} ({path})")
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sha2 => "sha2",
            Backend::Ring => "ring",
            Backend::Portable => "portable",
        })
    }
}

/// Whether the CPU has the SHA-256 instructions (x86 SHA-NI, Arm SHA2).
pub fn cpu_has_sha_extensions() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sha")
            && std::arch::is_x86_feature_detected!("sse4.1")
            && std::arch::is_x86_feature_detected!("ssse3")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("sha2")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// A running SHA-256.
pub struct Sha256(Inner);

enum Inner {
    Sha2(Box<sha2::Sha256>),
    Ring(Box<ring::digest::Context>),
    Portable(Box<sha2_portable::Sha256>),
}

impl Sha256 {
    /// Adds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            Inner::Sha2(h) => h.update(data),
            Inner::Ring(h) => h.update(data),
            Inner::Portable(h) => sha2_portable::Digest::update(h.as_mut(), data),
        }
    }

    /// The digest, as lowercase hex.
    pub fn finish_hex(self) -> String {
        match self.0 {
            Inner::Sha2(h) => hex::encode(h.finalize()),
            Inner::Ring(h) => hex::encode(h.finish().as_ref()),
            Inner::Portable(h) => hex::encode(sha2_portable::Digest::finalize(*h)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Backend; 3] = [Backend::Sha2, Backend::Ring, Backend::Portable];

    fn digest(backend: Backend, pieces: &[&[u8]]) -> String {
        let mut h = backend.hasher();
        for piece in pieces {
            h.update(piece);
        }
        h.finish_hex()
    }

    #[test]
    fn every_backend_gives_the_fips_180_digests() {
        // FIPS 180-4 examples (NIST CSRC "SHA256.pdf", "SHA2_Additional.pdf").
        let million_a = vec![b'a'; 1_000_000];
        for backend in ALL {
            assert_eq!(
                digest(backend, &[]),
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "{backend}"
            );
            assert_eq!(
                digest(backend, &[b"abc"]),
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                "{backend}"
            );
            assert_eq!(
                digest(
                    backend,
                    &[b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"]
                ),
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
                "{backend}"
            );
            assert_eq!(
                digest(backend, &[&million_a]),
                "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
                "{backend}"
            );
        }
    }

    #[test]
    fn backends_agree_on_uneven_pieces() {
        // Pieces that straddle block boundaries in every way.
        let data: Vec<u8> = (0..200_003u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let cuts = [0usize, 1, 63, 64, 65, 127, 1000, 4096, 65_537, 200_003];
        let pieces: Vec<&[u8]> = cuts.windows(2).map(|w| &data[w[0]..w[1]]).collect();
        let expected = digest(Backend::Sha2, &[&data]);
        for backend in ALL {
            assert_eq!(digest(backend, &pieces), expected, "{backend}");
        }
    }

    #[test]
    fn names_parse() {
        for backend in ALL {
            assert_eq!(Backend::parse(&backend.to_string()), Some(backend));
        }
        assert_eq!(Backend::parse(" Ring "), Some(Backend::Ring));
        assert_eq!(Backend::parse("md5"), None);
        assert!(
            Backend::auto()
                .describe()
                .starts_with(&Backend::auto().to_string())
        );
    }
}
