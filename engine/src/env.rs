//! Every environment variable sous reads, declared once: its name, the values it takes,
//! its default, what it changes and who reads it. Code asks this module ([`Var::get`])
//! instead of `std::env`, and `docs/env.md` is generated from [`ALL`] (a freshness test
//! holds it there, and another fails when code outside this module reads the
//! environment). Besides the fixed names there are two open families, also declared
//! here: recipe overrides (`SOUS_<TABLE>__<KEY>`, [`overrides`]) and the variables a
//! recipe names itself (`server.api_key_env`, an engine argument taken from the
//! environment: [`named`]).
//!
//! `sous-kernels` sits below this crate: the native engine reads the kernels' choices
//! here and passes them in (`native::tune`, `native::huge_pages`); the crate reads only
//! its two test switches itself, declared here all the same, so that the table is the
//! whole list.

use std::ffi::OsString;

/// One environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// Its name.
    pub name: &'static str,
    /// The values it takes.
    pub values: &'static str,
    /// What holds when it is unset.
    pub default: &'static str,
    /// What it changes.
    pub meaning: &'static str,
    /// Who reads it.
    pub read_by: &'static str,
}

impl Var {
    /// Its value, when set and valid Unicode.
    pub fn get(&self) -> Option<String> {
        std::env::var(self.name).ok()
    }

    /// Its value, when set and not empty.
    pub fn non_empty(&self) -> Option<String> {
        self.get().filter(|v| !v.is_empty())
    }

    /// Its value as the OS gives it, when set.
    pub fn get_os(&self) -> Option<OsString> {
        std::env::var_os(self.name)
    }

    /// Whether it is set at all (to anything, empty included).
    pub fn is_set(&self) -> bool {
        self.get_os().is_some()
    }
}

macro_rules! vars {
    ($($(#[$doc:meta])* $id:ident = $name:literal, $values:literal, $default:literal, $meaning:literal, $read_by:literal;)+) => {
        $(
            $(#[$doc])*
            pub const $id: Var = Var {
                name: $name,
                values: $values,
                default: $default,
                meaning: $meaning,
                read_by: $read_by,
            };
        )+
        /// Every declared variable, in the order of `docs/env.md`.
        pub const ALL: &[Var] = &[$($id),+];
    };
}

vars! {
    /// Where instances, logs and resumable state live.
    STATE_DIR = "SOUS_STATE_DIR", "a directory", "$XDG_STATE_HOME/sous, else ~/.local/state/sous",
        "where `sous serve` keeps instance records and engine logs, and `eval` and `tune` their resumable state", "sous-engine (paths), deploy";
    /// Where quantized checkpoints live.
    CACHE_DIR = "SOUS_CACHE_DIR", "a directory", "$XDG_CACHE_HOME/sous, else ~/.cache/sous",
        "sous's own cache: quantized checkpoints", "sous-engine (paths), deploy";
    /// The XDG state base directory.
    XDG_STATE_HOME = "XDG_STATE_HOME", "a directory", "~/.local/state", "the base of sous's state directory", "sous-engine (paths)";
    /// The XDG cache base directory.
    XDG_CACHE_HOME = "XDG_CACHE_HOME", "a directory", "~/.cache", "the base of sous's cache and of the Hugging Face cache", "sous-engine (paths), hub";
    /// The home directory.
    HOME = "HOME", "a directory", ".", "the base of the default directories", "sous-engine (paths), hub";
    /// Log filter.
    LOG = "SOUS_LOG", "a tracing filter (`debug`, `sous=trace`)", "warn", "what sous's own diagnostics print on stderr", "the binary";
    /// No colour.
    NO_COLOR = "NO_COLOR", "any non-empty value", "colour on a terminal", "turns colour off", "the binary (shell)";
    /// Where programs are found.
    PATH = "PATH", "directories", "the system's", "where `doctor` looks for engines and `eval` for lm_eval", "doctor, eval";
    /// Whether this is CI.
    CI = "CI", "`true`", "unset", "in CI, a test that needs the test model fails instead of skipping", "bench (tests)";
    /// The Hub's address.
    HF_ENDPOINT = "HF_ENDPOINT", "a URL", "https://huggingface.co", "the Hugging Face Hub (or a mirror: `sous hub serve`)", "hub";
    /// The Hugging Face home.
    HF_HOME = "HF_HOME", "a directory", "$XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface", "the base of the Hub cache and the token file", "hub";
    /// The Hub cache.
    HF_HUB_CACHE = "HF_HUB_CACHE", "a directory", "$HF_HOME/hub", "where models are downloaded (shared with huggingface_hub)", "hub";
    /// The Hub cache, the old name.
    HUGGINGFACE_HUB_CACHE = "HUGGINGFACE_HUB_CACHE", "a directory", "unset", "the old name of HF_HUB_CACHE", "hub";
    /// The Hub token.
    HF_TOKEN = "HF_TOKEN", "a token", "the token file", "the Hub token for gated and private repositories", "hub, doctor";
    /// The Hub token, the old name.
    HUGGING_FACE_HUB_TOKEN = "HUGGING_FACE_HUB_TOKEN", "a token", "unset", "the old name of HF_TOKEN", "hub, doctor";
    /// Where the token file is.
    HF_TOKEN_PATH = "HF_TOKEN_PATH", "a file", "$HF_HOME/token", "the token file `huggingface-cli login` writes", "hub, doctor";
    /// No implicit token.
    HF_HUB_DISABLE_IMPLICIT_TOKEN = "HF_HUB_DISABLE_IMPLICIT_TOKEN", "any value", "unset", "send no token unless one is given", "hub";
    /// Offline.
    HF_HUB_OFFLINE = "HF_HUB_OFFLINE", "`1`, `true`, `yes`, `on`", "unset", "use the Hub cache only, never the network", "hub";
    /// Offline, transformers' name.
    TRANSFORMERS_OFFLINE = "TRANSFORMERS_OFFLINE", "`1`, `true`, `yes`, `on`", "unset", "the same as HF_HUB_OFFLINE", "hub";
    /// How downloads are verified.
    VERIFY = "SOUS_VERIFY", "`auto`, `sha256`", "auto", "`auto`: the Xet hash where the Hub gives one, else SHA-256", "pull";
    /// Which SHA-256 implementation hashes downloads.
    SHA256 = "SOUS_SHA256", "`sha2`, `ring`, `portable`", "chosen by CPU", "the SHA-256 implementation (for measuring one against another)", "pull";
    /// How downloads are written.
    PULL_IO = "SOUS_PULL_IO", "`auto`, `direct`, `buffered`", "auto", "`auto`: O_DIRECT for files of 1 GiB and more", "pull";
    /// The quantizer's window.
    QUANTIZE_WINDOW = "SOUS_QUANTIZE_WINDOW", "bytes", "64 MiB", "how much of a tensor the quantizer maps at a time", "quantize";
    /// OpenAI's key.
    OPENAI_API_KEY = "OPENAI_API_KEY", "a key", "unset", "the key `sous run --url` sends", "run";
    /// The GPUs a CUDA process sees.
    CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES", "GPU indices or UUIDs", "every GPU", "which GPUs the engine sees; with the recipe's own in `[env]`, sous cannot tell which it checks the memory of", "serve, plan (the GPUs' memory)";
    /// vLLM's stats interval.
    VLLM_LOG_STATS_INTERVAL = "VLLM_LOG_STATS_INTERVAL", "seconds", "10", "how often the native engine prints vLLM's stats line", "the native engine";
    /// Write generated files.
    BLESS = "SOUS_BLESS", "any value", "unset", "freshness tests rewrite the generated files (schema, man pages, this table) instead of failing", "tests";
    /// The kernels' instruction set.
    KERNELS_ISA = "SOUS_KERNELS_ISA", "`avx512`, `avx2`, `neon`, `portable`", "the best the CPU has", "which product kernels run (f32 bits are the same on each; bf16 dot products need `avx512`)", "the native engine, quantize's calibration, doctor (passed to sous-kernels)";
    /// AVX512-BF16 dot products.
    BF16_DOT = "SOUS_BF16_DOT", "`on`, `off`", "measured at load", "whether bf16 arithmetic uses AVX512-BF16's dot product", "the native engine (passed to sous-kernels)";
    /// Panels of a decode tile.
    DECODE_PANELS = "SOUS_DECODE_PANELS", "`1`, `2`, `4`", "measured at load", "weight panels a decode step's tile reads side by side", "the native engine (passed to sous-kernels)";
    /// Tiles of 9 to 16 rows.
    BATCH_TILE = "SOUS_BATCH_TILE", "`16x1`, `8x2`", "measured at load", "the tile of products of 9 to 16 rows", "the native engine (passed to sous-kernels)";
    /// The read bandwidth the decode roofline compares with.
    READ_BANDWIDTH = "SOUS_READ_BANDWIDTH", "GB/s, or `off`", "measured at load", "the CPU read bandwidth the native engine's decode roofline compares with (`off`: not measured)", "the native engine";
    /// Huge pages for the weights.
    HUGE_PAGES = "SOUS_HUGE_PAGES", "`off`, `0`, `false`", "on", "`off` leaves the native engine's weights where they were loaded", "the native engine, doctor";
    /// Test only: the f32 stride.
    TEST_F32_STRIDE = "SOUS_TEST_F32_STRIDE", "a number", "1", "tests: check every Nth f32 value against the reference (emulated CPUs)", "sous-kernels (tests)";
    /// Test only: NVRTC.
    TEST_NVRTC = "SOUS_TEST_NVRTC", "any value", "unset", "tests: the NVRTC compile test must run (not skip)", "sous-kernels (tests)";
}

/// The prefix of recipe overrides: `SOUS_<TABLE>__<KEY>=VALUE` sets `table.key`.
pub const OVERRIDE_PREFIX: &str = "SOUS_";

/// Every variable of the environment, for recipe overrides
/// (`SOUS_<TABLE>__<KEY>`, read by `sous_engine::recipe`'s `Overrides::with_env`).
pub fn overrides() -> impl Iterator<Item = (String, String)> {
    std::env::vars()
}

/// A variable a recipe or a flag names (`server.api_key_env`, `--api-key-env`, an
/// engine argument taken from the environment): its value, when set.
pub fn named(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `lookup(name)` for code that takes its variables by name (so tests can give their
/// own): the declared variable's value when set and not empty. Unknown names are a bug.
pub fn lookup(name: &str) -> Option<String> {
    debug_assert!(
        ALL.iter().any(|v| v.name == name),
        "{name} is not declared in sous_engine::env"
    );
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// [`lookup`], as the OS gives the value.
pub fn lookup_os(name: &str) -> Option<OsString> {
    debug_assert!(
        ALL.iter().any(|v| v.name == name),
        "{name} is not declared in sous_engine::env"
    );
    std::env::var_os(name)
}

/// `docs/env.md`: the table of every variable.
pub fn reference() -> String {
    let mut out = String::from(
        "# Environment variables\n\n\
         Generated from `engine/src/env.rs` (`SOUS_BLESS=1 cargo test -p sous-engine --lib env` rewrites it).\n\
         Besides these: `SOUS_<TABLE>__<KEY>=VALUE` overrides a recipe value (`SOUS_SERVING__MAX_NUM_SEQS=8`),\n\
         after the file and before `--set`; and the variables a recipe names (`server.api_key_env`) are read\n\
         by the name it gives.\n\n\
         | variable | values | default | what it changes | read by |\n|---|---|---|---|---|\n",
    );
    for v in ALL {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            v.name, v.values, v.default, v.meaning, v.read_by
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn the_reference_is_fresh() {
        let path = root().join("docs/env.md");
        let want = reference();
        if std::env::var_os("SOUS_BLESS").is_some() {
            std::fs::write(&path, &want).expect("writing docs/env.md");
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/env.md is stale: SOUS_BLESS=1 cargo test -p sous-engine --lib env"
        );
    }

    #[test]
    fn names_are_declared_once() {
        let mut names: Vec<&str> = ALL.iter().map(|v| v.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a variable is declared twice");
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Outside this module, `cli/` and `engine/` ask it; `sous-kernels` (below this
    /// crate) reads only its test switches, declared here.
    #[test]
    fn only_this_module_reads_the_environment() {
        let mut files = Vec::new();
        for dir in ["cli/src", "engine/src", "kernels/src"] {
            rust_files(&root().join(dir), &mut files);
        }
        let calls = [
            "env::var(",
            "env::var_os(",
            "env::vars(",
            "env::vars_os(",
            "EnvFilter::try_from_env(",
        ];
        let mut offenders = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file");
            let rel = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
            if rel.ends_with("engine/src/env.rs") {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                if !calls.iter().any(|c| line.contains(c)) {
                    continue;
                }
                if rel.starts_with("kernels/") {
                    // The kernels' own reads: only their test switches; their choices
                    // arrive as values (`gemm::Tuning`, arguments).
                    let own = [TEST_F32_STRIDE, TEST_NVRTC];
                    let declared = own.iter().any(|v| line.contains(&format!("\"{}\"", v.name)));
                    if !declared {
                        offenders.push(format!(
                            "{rel}:{}: reads a variable the engine reads and passes in",
                            n + 1
                        ));
                    }
                } else {
                    offenders.push(format!(
                        "{rel}:{}: reads the environment; ask sous_engine::env",
                        n + 1
                    ));
                }
            }
        }
        assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    }
}
