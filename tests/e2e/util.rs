//! Running the real binary in a known environment: from the workspace root (so paths in
//! messages are the short relative ones users see), without any `SOUS_*` variable of the
//! developer's shell, with a fixed state directory and no colour.

use std::path::PathBuf;

use assert_cmd::Command;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// sous's cache for the tests that set none (`SOUS_CACHE_DIR`): under `target/`, never
/// the user's `~/.cache/sous`.
pub fn test_cache() -> std::path::PathBuf {
    root().join("target/e2e-cache")
}

/// `sous` with a clean environment, run from the workspace root.
pub fn sous() -> Command {
    clean(Command::cargo_bin("sous").expect("the sous binary is built"))
}

/// `cmd` (a `sous`) with the clean environment of [`sous`].
pub fn clean(mut cmd: Command) -> Command {
    for (name, _) in std::env::vars() {
        if name.starts_with("SOUS_") {
            cmd.env_remove(name);
        }
    }
    cmd.current_dir(root())
        .env("NO_COLOR", "1")
        .env("SOUS_STATE_DIR", "/state")
        .env("SOUS_CACHE_DIR", test_cache());
    cmd
}

/// The environment that makes `sous` (its native engine, its calibration) take `path`,
/// as a user pins it: `SOUS_KERNELS_ISA` and `SOUS_BF16_DOT`.
pub fn kernel_path_env(path: sous_kernels::gemm::KernelPath) -> [(&'static str, &'static str); 2] {
    [
        ("SOUS_KERNELS_ISA", path.isa.name()),
        ("SOUS_BF16_DOT", if path.bf16_dot { "on" } else { "off" }),
    ]
}

/// Every file under `dir` by relative path, with its bytes.
pub fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("a readable directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(dir).expect("under dir").display().to_string();
                out.push((name, std::fs::read(&path).expect("a readable file")));
            }
        }
    }
    out.sort();
    out
}

/// Runs and returns (exit code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let output = cmd.output().expect("sous runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A `sous hub serve` child process, killed on drop.
pub struct Mirror {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Mirror {
    /// Starts a mirror over `root` with extra arguments (faults, gated repos).
    pub fn start(root: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> Mirror {
        use std::io::{BufRead, BufReader};
        let bin = assert_cmd::cargo::cargo_bin("sous");
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["hub", "serve", "--port", "0", "--root"])
            .arg(root)
            .args(args)
            .envs(envs.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("mirror starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut first = String::new();
        BufReader::new(stdout)
            .read_line(&mut first)
            .expect("mirror prints its URL");
        let url = first.trim().to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "mirror URL: {url:?}");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut log) = sink.lock() {
                    log.push(line);
                }
            }
        });
        Mirror { child, url, log }
    }

    /// Requests logged so far (`GET /path 200`), in order.
    pub fn requests(&self) -> Vec<String> {
        std::thread::sleep(std::time::Duration::from_millis(100));
        self.log
            .lock()
            .map(|l| {
                l.iter()
                    .filter_map(|s| s.strip_prefix("hub: ").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Body bytes the mirror has sent so far (`GET /api/sous-mirror/stats`).
    pub fn body_bytes(&self) -> u64 {
        let stats = self.get_json("/api/sous-mirror/stats");
        stats["body_bytes"].as_u64().expect("body_bytes")
    }

    /// The JSON body of `GET path` (HTTP/1.1, one request on its own connection).
    pub fn get_json(&self, path: &str) -> serde_json::Value {
        use std::io::{Read, Write};
        let host = self.url.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(host).expect("mirror reachable");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .expect("request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("response");
        let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON from {path} ({e}): {response}"))
    }

    /// Forgets the requests logged so far.
    pub fn clear(&self) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        if let Ok(mut log) = self.log.lock() {
            log.clear();
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A deterministic multi-shard safetensors repository of about `mib` MiB at
/// `ROOT/acme/<name>/`, generated once and reused (target/test-hub/).
pub fn generated_repo(name: &str, mib: usize) -> std::path::PathBuf {
    generated_repo_in_shards(name, mib, 3)
}

/// [`generated_repo`] in `shards` shards.
pub fn generated_repo_in_shards(name: &str, mib: usize, shards: usize) -> std::path::PathBuf {
    use std::io::Write;
    // Tests on other threads ask for the same repository at once on a fresh checkout:
    // one generates it while the others wait, and it is written beside its final place
    // and renamed there whole, so a mirror never serves a file being rewritten (a
    // second writer once truncated the shards under a running pull).
    static GENERATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = GENERATING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = root().join("target/test-hub");
    let done = root.join(format!(".{name}.done"));
    if done.exists() {
        return root;
    }
    let dir = root.join("acme").join(format!(".{name}.partial"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("repo dir");
    let per_shard = mib * (1 << 20) / shards / 4; // f32 elements
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15 ^ name.len() as u64;
    let mut weight_map = serde_json::Map::new();
    for shard in 0..shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
        let tensor = format!("model.layers.{shard}.weight");
        let header = serde_json::json!({
            tensor.clone(): { "dtype": "F32", "shape": [per_shard], "data_offsets": [0, per_shard * 4] },
            "__metadata__": { "format": "pt" }
        })
        .to_string();
        let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join(&file)).expect("shard"));
        out.write_all(&(header.len() as u64).to_le_bytes())
            .expect("write");
        out.write_all(header.as_bytes()).expect("write");
        let mut buffer = Vec::with_capacity(1 << 20);
        for _ in 0..per_shard {
            // xorshift64*: fast, deterministic, incompressible enough.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let v = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            buffer.extend_from_slice(&v.to_le_bytes());
            if buffer.len() >= 1 << 20 {
                out.write_all(&buffer).expect("write");
                buffer.clear();
            }
        }
        out.write_all(&buffer).expect("write");
        weight_map.insert(tensor, serde_json::Value::String(file));
    }
    let index =
        serde_json::json!({ "metadata": { "total_size": shards * per_shard * 4 }, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama"}"#,
    )
    .expect("config");
    std::fs::create_dir_all(dir.join("original")).expect("original");
    std::fs::write(dir.join("original/consolidated.00.pth"), b"duplicate weights").expect("pth");
    std::fs::write(dir.join("pytorch_model.bin"), b"duplicate weights").expect("bin");
    let repo = root.join("acme").join(name);
    let _ = std::fs::remove_dir_all(&repo);
    std::fs::rename(&dir, &repo).expect("generated repo into place");
    std::fs::write(&done, b"").expect("done");
    root
}

/// sha256 of a file, hex.
pub fn sha256(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::open(path).expect("open");
    std::io::copy(&mut file, &mut hasher).expect("read");
    hex::encode(hasher.finalize())
}

/// The `fake-engine` test double (tests/fake-engine), built (or found up to date) on
/// first use: a stale one beside `sous` would test yesterday's behaviour.
pub fn fake_engine() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "sous-fake-engine",
                    "--bin",
                    "fake-engine",
                ])
                .current_dir(root())
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building the fake engine");
            let sous = assert_cmd::cargo::cargo_bin("sous");
            sous.with_file_name("fake-engine")
        })
        .clone()
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running `sous` whose stderr is collected line by line.
pub struct Running {
    /// The process.
    pub child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Running {
    /// Starts `sous` with `args` (and the clean environment of [`sous`]).
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Running {
        Running::start_program(
            std::process::Command::new(assert_cmd::cargo::cargo_bin("sous")),
            args,
            envs,
        )
    }

    /// [`Running::start`] with another `sous`: `cmd` is the program and the arguments
    /// that come before sous's own (an aarch64 build under qemu).
    pub fn start_program(mut cmd: std::process::Command, args: &[&str], envs: &[(&str, &str)]) -> Running {
        use std::io::{BufRead, BufReader};
        for (name, _) in std::env::vars() {
            if name.starts_with("SOUS_") {
                cmd.env_remove(name);
            }
        }
        cmd.current_dir(root())
            .env("NO_COLOR", "1")
            .env("SOUS_CACHE_DIR", test_cache())
            .args(args)
            .envs(envs.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("sous starts");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        });
        Running { child, lines }
    }

    /// Everything printed so far.
    pub fn stderr(&self) -> String {
        self.lines.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Waits until a line contains `text`.
    pub fn wait_for(&self, text: &str, within: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if self.stderr().contains(text) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }

    /// Sends a signal to sous.
    pub fn signal(&self, signal: &str) {
        let _ = std::process::Command::new("kill")
            .args(["-s", signal, &self.child.id().to_string()])
            .status();
    }

    /// Waits for sous to exit; its exit code.
    pub fn wait(&mut self, within: std::time::Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(std::time::Duration::from_millis(100));
                return status.code();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a process is alive (and not a zombie).
pub fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z')))
        .unwrap_or(false)
}

/// The SmolLM2 test model, or `None` (loudly) outside CI when it is missing.
pub fn smollm2() -> Option<PathBuf> {
    let dir = root().join("target/models/HuggingFaceTB/SmolLM2-135M-Instruct");
    if dir.join("model.safetensors").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the test model is missing in CI: scripts/test.sh must run scripts/fetch-test-model.sh"
    );
    eprintln!("SKIPPED: test model missing, run scripts/fetch-test-model.sh");
    None
}

/// The test Python (target/py, scripts/python-env.sh), or `None` (loudly) outside CI
/// when it is missing; `what` names the check that is skipped.
pub fn python(what: &str) -> Option<PathBuf> {
    let python = root().join("target/py/bin/python");
    if python.exists() {
        return Some(python);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "target/py is missing in CI: scripts/test.sh must run scripts/python-env.sh"
    );
    eprintln!("SKIPPED: {what}: run scripts/python-env.sh to create target/py");
    None
}

/// What one `/health` poll saw: the status and the answering pid, or what failed.
pub type Health = Result<(u16, Option<u64>), String>;

/// One `GET /health` on a fresh connection: the status and, from the fake engine, the
/// pid that answered (its `x-fake-pid` header).
pub fn health(port: u16) -> Health {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("read: {e}"))?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {response:?}"))?;
    let pid = response
        .lines()
        .find_map(|l| l.strip_prefix("x-fake-pid: "))
        .and_then(|p| p.trim().parse().ok());
    Ok((status, pid))
}

/// Polls `/health` every 10 ms on fresh connections until told to stop; every answer.
pub struct Poller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Health>>,
}

impl Poller {
    pub fn start(port: u16) -> Poller {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                seen.push(health(port));
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            seen
        });
        Poller { stop, thread }
    }

    pub fn finish(self) -> Vec<Health> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("poller")
    }
}

/// Serializes the tests that load both cores (the native engine's) with the one that
/// measures latencies to the millisecond, and with those that take gigabytes of the
/// host's memory on purpose, so that none disturbs the others.
pub fn cpu_exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The SmolLM2 test model as a folder transformers 5 saved: its weights, config and
/// tokenizer.json (byte-identical to what `save_pretrained` writes, which
/// scripts/reference/chat_template_folders.py checks), with the tokenizer_config.json
/// and chat template files of `tests/fixtures/chat-templates/<variant>/`, which
/// transformers 5.17 wrote. The weights are linked, not copied.
pub fn saved_by_transformers(model: &std::path::Path, variant: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for file in [
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
    ] {
        std::os::unix::fs::symlink(model.join(file), dir.path().join(file)).expect("link");
    }
    let saved = root().join("tests/fixtures/chat-templates").join(variant);
    for entry in walk(&saved) {
        let relative = entry.strip_prefix(&saved).expect("inside");
        let target = dir.path().join(relative);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&entry, &target).expect("copy");
    }
    assert!(
        !dir.path()
            .join("tokenizer_config.json")
            .metadata()
            .is_ok_and(|m| m.len() == 0),
        "{variant}: the fixture has a tokenizer_config.json"
    );
    dir
}

/// Every file under `dir`, recursively.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}
