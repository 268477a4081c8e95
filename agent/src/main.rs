//! The silo-agent binary: boots the agent from the library's parts.
//!
//! # Boot
//! [`main`] runs these steps in order, each a small function below:
//! `take_key_from_env` → `parse_args` → `init_logging` → `resolve_config` →
//! `build_runtime` → `note_inherited` → `become_subreaper_if_not_pid1` →
//! `install_signal_handlers` → `start_reaper` → `finish_interrupted_applies` →
//! `bind_listener` → `start_workload` → `start_commands` → `start_push` → `start_layers` →
//! `start_rewinds` → `serve_until_shutdown`.
//! Nothing slow happens before the listener is bound, but finishing a
//! layer an earlier agent was killed placing: nothing may see the tree
//! half way.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use nix::sys::signal::Signal as NixSignal;
use silo_protocol::auth::Verifier;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use silo_agent::cleanup;
use silo_agent::commands::Commands;
use silo_agent::config::{Args, Config, KEY_ENV};
use silo_agent::exec::ExecConfig;
use silo_agent::files::{Files, FilesConfig};
use silo_agent::layers::Applier;
use silo_agent::layers::journal;
use silo_agent::paths::STATE_DIR;
use silo_agent::process::{Inherited, ProcessOps, System, own_pid};
use silo_agent::push::Pusher;
use silo_agent::reaper::Reaper;
use silo_agent::rewind::Rewinder;
use silo_agent::server::listener::Listener;
use silo_agent::server::{AgentState, Rebind, Services};
use silo_agent::shutdown::Phase;
use silo_agent::snapshot::{FreezeScope, Snapshotter};
use silo_agent::suspend::Suspender;
use silo_agent::workload_handle::WorkloadHandle;
use silo_agent::{activity, random_hex, reserve, server};

/// Time the workload and execs get between SIGTERM and SIGKILL at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Time exec connections get to deliver final exits and close after shutdown.
const CONNECTION_FLUSH: Duration = Duration::from_secs(1);
/// Time blocking helper threads get to finish when the runtime is dropped.
const RUNTIME_SHUTDOWN: Duration = Duration::from_millis(100);
/// Exit status when the agent cannot start.
const EXIT_BOOT_FAILURE: u8 = 1;
/// Environment variable choosing log detail.
const LOG_ENV: &str = "SILO_AGENT_LOG";

fn main() -> ExitCode {
    let env_key = take_key_from_env();
    let args = parse_args();
    init_logging();
    if let Some(path) = &args.install_to {
        return match install_to(path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!("{err:#}");
                ExitCode::from(EXIT_BOOT_FAILURE)
            }
        };
    }
    match run(args, env_key) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::from(EXIT_BOOT_FAILURE)
        }
    }
}

/// Reads the sandbox key from the environment and removes it, so no child
/// (exec or workload) ever inherits it.
fn take_key_from_env() -> Option<OsString> {
    let key = std::env::var_os(KEY_ENV);
    // SAFETY: this is the first thing `main` does, before the runtime or any
    // other thread exists, so nothing can read the environment concurrently.
    unsafe { std::env::remove_var(KEY_ENV) };
    key
}

/// Copies this executable to `path` (mode 0755), through a temporary file
/// beside it, so a reader never sees half an agent.
fn install_to(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let own = std::env::current_exe().context("cannot find this executable")?;
    let partial = path.with_extension("partial");
    std::fs::copy(&own, &partial)
        .with_context(|| format!("cannot copy {} to {}", own.display(), partial.display()))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", partial.display()))?;
    std::fs::rename(&partial, path)
        .with_context(|| format!("cannot move the agent into place at {}", path.display()))?;
    Ok(())
}

fn parse_args() -> Args {
    Args::parse()
}

fn init_logging() {
    let level = std::env::var(LOG_ENV)
        .ok()
        .and_then(|level| level.parse().ok())
        .unwrap_or(tracing::Level::INFO);
    // Whatever reads the agent's stderr may go (a provider's session
    // relays it through processes the agent spares, but which may still
    // end): a lost line is dropped, never reported with a print that would
    // panic the request logging it.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(false)
        .with_target(false)
        .with_max_level(level)
        .init();
}

fn run(args: Args, env_key: Option<OsString>) -> anyhow::Result<u8> {
    let config = resolve_config(args, env_key)?;
    let runtime = build_runtime()?;
    let code = runtime.block_on(boot(config));
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    code
}

fn resolve_config(args: Args, env_key: Option<OsString>) -> anyhow::Result<Config> {
    Config::resolve(args, env_key).context("invalid configuration")
}

/// One thread: PID 1 should stay light, and nothing the agent does needs more.
/// Blocking work (`/proc` walks) goes to tokio's on-demand blocking pool,
/// whose threads are kept once made (see [`reserve`]).
fn build_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(reserve::MAX_BLOCKING_THREADS)
        .thread_keep_alive(reserve::THREAD_KEEP_ALIVE)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

async fn boot(config: Config) -> anyhow::Result<u8> {
    let is_pid1 = std::process::id() == 1;
    let inherited = note_inherited(is_pid1, config.machine_agent);
    become_subreaper_if_not_pid1(is_pid1)?;
    let signals = install_signal_handlers()?;
    let reaper = start_reaper(signals.child);
    reserve::hold_threads().await;
    finish_interrupted_applies(&config).await?;
    let (listener, rebind) = bind_listener(&config).await?;
    let boot_id = random_hex::<16>()?;
    start_cleanup(&config, &boot_id);
    let ops: Arc<dyn ProcessOps> = Arc::new(System::inheriting(inherited));
    let workload = Arc::new(start_workload(&config, &reaper, &ops, &boot_id));
    let commands = start_commands(&config, reaper, Arc::clone(&ops))?;
    let (phase_tx, phase_rx) = watch::channel(Phase::Running);
    let pusher = start_push(&config, &boot_id, phase_rx.clone());
    let scope = FreezeScope::of_agent(is_pid1, config.machine_agent);
    let snapshots = Snapshotter::new(config.apply_root.clone(), scope, Arc::clone(&ops));
    let layers = start_layers(&config, &boot_id);
    let suspender = Arc::new(Suspender::new(
        scope,
        Arc::clone(&ops),
        config.key_file.clone(),
    ));
    let rewinder = start_rewinds(&config, scope, ops, &workload, &commands, &pusher);
    let state = Arc::new(AgentState::new(
        Verifier::new(config.key.clone()),
        config.protocols,
        Services {
            commands,
            pusher,
            snapshots,
            layers,
            rewinder,
            files: Files::new(FilesConfig {
                workdir: config.workdir.clone(),
                tree_limits: config.push.limits,
            }),
            suspender,
        },
        boot_id,
    ));
    tracing::info!(
        listen = %listener.describe(),
        version = env!("CARGO_PKG_VERSION"),
        protocols = %config.protocols,
        pid = std::process::id(),
        "silo-agent ready"
    );
    let server = tokio::spawn(server::run(listener, rebind, Arc::clone(&state), phase_rx));
    serve_until_shutdown(Serving {
        signals: signals.control,
        is_pid1,
        idle_timeout: config.idle_timeout,
        state,
        workload,
        phase_tx,
        server,
    })
    .await
}

/// What a machine's agent finds running below it before it starts
/// anything: the launch around it left them (a provider's session relays
/// the agent's output through them), and nothing the agent does may end
/// or stop them. An agent that is PID 1 or on the host inherits nothing.
fn note_inherited(is_pid1: bool, machine_agent: bool) -> Inherited {
    if is_pid1 || !machine_agent {
        return Inherited::default();
    }
    let me = own_pid();
    match System::default().table() {
        Ok(table) => {
            let inherited = Inherited::at_start(&table, me);
            if !inherited.is_empty() {
                tracing::info!(
                    processes = inherited.len(),
                    "spared: processes already running below the agent at its start"
                );
            }
            inherited
        }
        Err(err) => {
            tracing::warn!(%err, "cannot list /proc at start; spares nothing");
            Inherited::default()
        }
    }
}

/// Without this, orphans of commands would be re-parented past the agent
/// (to the host's init) when it does not run as PID 1, and escape its reaping.
fn become_subreaper_if_not_pid1(is_pid1: bool) -> anyhow::Result<()> {
    if !is_pid1 {
        nix::sys::prctl::set_child_subreaper(true).context("cannot become a child subreaper")?;
    }
    Ok(())
}

struct Signals {
    child: Signal,
    control: ControlSignals,
}

struct ControlSignals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

/// Installed before any child exists, so no SIGCHLD and no stop request is missed.
fn install_signal_handlers() -> anyhow::Result<Signals> {
    let install = |kind: SignalKind, name: &str| {
        signal(kind).with_context(|| format!("cannot install a {name} handler"))
    };
    Ok(Signals {
        child: install(SignalKind::child(), "SIGCHLD")?,
        control: ControlSignals {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            hup: install(SignalKind::hangup(), "SIGHUP")?,
        },
    })
}

fn start_reaper(sigchld: Signal) -> Reaper {
    let reaper = Reaper::default();
    tokio::spawn(reaper.clone().run(sigchld));
    reaper
}

/// Binds the listener; answers it with what binds it again after a suspend.
async fn bind_listener(config: &Config) -> anyhow::Result<(Listener, Rebind)> {
    let tls = match &config.tls {
        Some((cert, key)) => Some(server::tls::acceptor(cert, key).context("cannot set up TLS")?),
        None => None,
    };
    let rebind = Rebind {
        addr: config.listen.clone(),
        tls: tls.clone(),
    };
    let listener = Listener::bind(&config.listen, tls)
        .await
        .context("cannot bind the listener")?;
    Ok((listener, rebind))
}

/// Places the layers an earlier agent was killed placing, before anything
/// can see the tree; one that cannot be placed is logged and kept for the
/// next boot.
async fn finish_interrupted_applies(config: &Config) -> anyhow::Result<()> {
    let root = config.apply_root.clone();
    let done = tokio::task::spawn_blocking(move || journal::finish_interrupted(&root))
        .await
        .context("the task finishing interrupted layer applies failed")?;
    if done.finished > 0 {
        tracing::info!(
            layers = done.finished,
            "finished placing layers an earlier agent was killed placing"
        );
    }
    for (staging, reason) in done.failed {
        tracing::error!(
            staging = %staging.display(),
            "cannot finish an interrupted layer apply: {reason}"
        );
    }
    Ok(())
}

fn start_workload(
    config: &Config,
    reaper: &Reaper,
    ops: &Arc<dyn ProcessOps>,
    boot_id: &str,
) -> WorkloadHandle {
    WorkloadHandle::start(
        config.workload.clone(),
        config.restart,
        reaper.clone(),
        Arc::clone(ops),
        boot_id,
    )
}

/// Starts the retrier of failed removals, which first resumes those earlier
/// boots journaled (temporary files and staging directories of a `silo cp`
/// the agent was killed in, removals a reader held up).
fn start_cleanup(config: &Config, boot_id: &str) {
    let cleanup = cleanup::install(&config.apply_root.join(STATE_DIR), boot_id);
    tracing::debug!(pending = cleanup.pending(), "cleanup journal");
}

/// Makes the push service and sweeps away, in the background, what pushes
/// interrupted by an earlier agent left behind (this boot's own temporary
/// files carry its boot id, so the sweep never touches a push in progress).
/// The exec registry and the shell sessions, empty.
fn start_commands(
    config: &Config,
    reaper: Reaper,
    ops: Arc<dyn ProcessOps>,
) -> anyhow::Result<Commands> {
    let exec = ExecConfig {
        workdir: config.workdir.clone(),
        ring_bytes: config.ring_bytes,
        default_grace: config.grace,
        detach_timeout: config.detach_timeout,
        output_budget: config.output_budget,
        finished_output_budget: config.finished_output_budget,
    };
    tracing::info!(
        memory_limit = ?config.memory_limit,
        output_budget = exec.output_budget,
        finished_output_budget = exec.finished_output_budget,
        "output memory bounds"
    );
    Commands::new(exec, reaper, ops).context("cannot seed exec ids")
}

fn start_push(config: &Config, boot_id: &str, phase: watch::Receiver<Phase>) -> Arc<Pusher> {
    let pusher = Pusher::new(config.push.clone(), boot_id.to_owned(), phase);
    let sweeper = Arc::clone(&pusher);
    tokio::task::spawn_blocking(move || {
        let removed = sweeper.clean_leftovers();
        if removed > 0 {
            tracing::info!(removed, "removed leftovers of interrupted pushes");
        }
    });
    pusher
}

/// Makes the layer apply service and sweeps away, in the background, the
/// staging directories applies cut short in earlier boots left behind.
fn start_layers(config: &Config, boot_id: &str) -> Arc<Applier> {
    let layers = Arc::new(Applier::new(config.apply_root.clone(), boot_id.to_owned()));
    let sweeper = Arc::clone(&layers);
    tokio::task::spawn_blocking(move || {
        let removed = sweeper.clean_leftovers();
        if removed > 0 {
            tracing::info!(removed, "removed leftovers of interrupted layer applies");
        }
    });
    layers
}

/// Makes the in-place rewind service: it ends the processes in `scope`
/// and stops and starts the workload around each rewind.
fn start_rewinds(
    config: &Config,
    scope: Option<FreezeScope>,
    ops: Arc<dyn ProcessOps>,
    workload: &Arc<WorkloadHandle>,
    commands: &Commands,
    pusher: &Arc<Pusher>,
) -> Rewinder {
    Rewinder::new(
        config.apply_root.clone(),
        scope,
        ops,
        Arc::clone(workload),
        commands.clone(),
        Arc::clone(pusher),
    )
}

struct Serving {
    signals: ControlSignals,
    is_pid1: bool,
    idle_timeout: Option<Duration>,
    state: Arc<AgentState>,
    workload: Arc<WorkloadHandle>,
    phase_tx: watch::Sender<Phase>,
    server: tokio::task::JoinHandle<()>,
}

/// Why the agent stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// SIGTERM, or SIGINT as PID 1: exit with the workload's status.
    Signal,
    /// `--idle-timeout` elapsed: a clean exit.
    Idle,
    /// The lifetime deadline passed: a clean exit.
    Deadline,
}

/// Serves until told to stop, then: stop accepting, SIGTERM the workload and
/// every exec and session shell, SIGKILL what is left after
/// [`SHUTDOWN_GRACE`], let exec connections deliver the exits, and return
/// the exit status.
async fn serve_until_shutdown(mut s: Serving) -> anyhow::Result<u8> {
    let reason = wait_for_stop(&mut s).await;
    tracing::info!(?reason, "shutting down");
    s.phase_tx.send_replace(Phase::Draining);
    let stop_workload = s.workload.stop(SHUTDOWN_GRACE);
    let (workload_exit, ()) = tokio::join!(
        stop_workload,
        s.state.commands.terminate_all(SHUTDOWN_GRACE)
    );
    s.phase_tx.send_replace(Phase::Closing);
    if tokio::time::timeout(CONNECTION_FLUSH, &mut s.server)
        .await
        .is_err()
    {
        tracing::warn!("connections did not close in time");
        s.server.abort();
    }
    let code = match (reason, workload_exit) {
        (StopReason::Idle | StopReason::Deadline, _) | (_, None) => 0,
        (StopReason::Signal, Some(exit)) => {
            u8::try_from(exit.shell_code() & 0xff).unwrap_or(u8::MAX)
        }
    };
    tracing::info!(code, "silo-agent exiting");
    Ok(code)
}

/// SIGHUP (and SIGINT when not PID 1) are forwarded to the workload; SIGTERM
/// (and SIGINT as PID 1) stop the agent. A stray terminal Ctrl-C must not take
/// down the agent of a local sandbox, which is stopped with SIGTERM.
async fn wait_for_stop(s: &mut Serving) -> StopReason {
    let idle = async {
        match s.idle_timeout {
            Some(timeout) => {
                activity::idle_for(&s.state.activity, s.state.commands.execs(), timeout).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(idle);
    let forward = |workload: &WorkloadHandle, signal: NixSignal| workload.forward(signal);
    loop {
        tokio::select! {
            _ = s.signals.term.recv() => return StopReason::Signal,
            _ = s.signals.int.recv() => {
                if s.is_pid1 {
                    return StopReason::Signal;
                }
                forward(&s.workload, NixSignal::SIGINT);
            }
            _ = s.signals.hup.recv() => forward(&s.workload, NixSignal::SIGHUP),
            () = &mut idle => return StopReason::Idle,
            () = s.state.lifetime.reached() => return StopReason::Deadline,
        }
    }
}
