//! `sous hub serve`: the local Hub mirror.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::shutdown_signal;
use crate::failure::UserError;
use crate::shell::Shell;
use sous::hub::mirror::{self, Faults, MirrorOptions};

#[derive(Debug, Subcommand)]
pub enum HubCommand {
    /// Serve model directories (ROOT/org/name/...) over the Hub's HTTP API, read-only.
    /// Point clients at it with HF_ENDPOINT=http://HOST:PORT.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous hub serve --root target/models --port 8900\n  HF_ENDPOINT=http://127.0.0.1:8900 sous pull HuggingFaceTB/SmolLM2-135M-Instruct"
)]
pub struct ServeArgs {
    /// Directory holding one folder per repository: ROOT/org/name/.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port (0 picks a free one; the URL is printed on stdout).
    #[arg(long, default_value_t = 8090)]
    port: u16,
    /// A repository that needs the token (repeatable): anonymous requests get 401,
    /// wrong tokens 403, as the Hub answers for gated models.
    #[arg(long, value_name = "ORG/NAME")]
    gated: Vec<String>,
    /// Environment variable holding the token gated repositories accept.
    #[arg(long, value_name = "VAR", default_value = "SOUS_HUB_TOKEN")]
    token_env: String,
    /// Inject a fault, for testing clients (repeatable): drop-after=SIZE, status=CODE,
    /// corrupt, stall-after=SIZE,SECONDS, rate=SIZE, expire-after=SIZE (a signed link
    /// answers 403 once SIZE bytes went through it; needs --cdn-host); each with an
    /// optional @TIMES per file.
    #[arg(long, value_name = "SPEC")]
    fault: Vec<String>,
    /// Play the Hub's CDN: redirect LFS files to signed, expiring links on this host
    /// name (another name for this server, e.g. `localhost` when listening on
    /// 127.0.0.1, so that the link is on another origin as on huggingface.co).
    #[arg(long, value_name = "NAME")]
    cdn_host: Option<String>,
    /// How long a signed link lives, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, requires = "cdn_host")]
    link_ttl: u64,
    /// Give each LFS file's Xet hash in tree listings (`xetHash`), as the Hub does for
    /// files in Xet storage, so that `sous pull` verifies with it. Off by default:
    /// huggingface_hub 2.x with hf_xet installed takes a listed Xet hash as the cue to
    /// download through the Xet protocol, which this mirror does not speak (set
    /// HF_HUB_DISABLE_XET=1 for those clients when it is on).
    #[arg(long)]
    xet_hash: bool,
    /// Do not log requests on stderr.
    #[arg(long)]
    quiet: bool,
}

pub fn exec(cmd: HubCommand, shell: &Shell) -> anyhow::Result<ExitCode> {
    let HubCommand::Serve(args) = cmd;
    if !args.root.is_dir() {
        return Err(UserError::new(
            format!("`{}` is not a directory", args.root.display()),
            Some("give the directory that holds org/name/ model folders"),
        )
        .into());
    }
    let faults =
        Faults::new(&args.fault).map_err(|e| UserError::new(format!("invalid --fault: {e}"), None))?;
    if faults.expire_links() && args.cdn_host.is_none() {
        return Err(UserError::new(
            "--fault expire-after needs signed links",
            Some("add --cdn-host localhost (or another name that reaches this server)"),
        )
        .into());
    }
    let token = sous_engine::env::named(&args.token_env).filter(|t| !t.is_empty());
    if !args.gated.is_empty() && token.is_none() {
        return Err(UserError::new(
            format!("--gated needs the accepted token in ${}", args.token_env),
            Some("export the token in that variable, or name another with --token-env"),
        )
        .into());
    }
    let runtime = super::runtime()?;
    runtime.block_on(async {
        let listener = mirror::bind(SocketAddr::new(args.host, args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        shell.data(&format!("http://{addr}"))?;
        shell.status(
            "serving",
            &format!(
                "{} at http://{addr} (HF_ENDPOINT=http://{addr})",
                args.root.display()
            ),
        );
        let options = MirrorOptions {
            root: args.root,
            gated: args.gated,
            token,
            faults,
            access_log: !args.quiet,
            cdn_host: args.cdn_host,
            link_ttl: std::time::Duration::from_secs(args.link_ttl),
            xet_hashes: args.xet_hash,
        };
        mirror::serve(listener, options, shutdown_signal())
            .await
            .context("serving")?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
