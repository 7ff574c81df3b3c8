//! The `gateway` command line: `run`, `validate`, `version`, `schema`, `completions`, `manpage`.
//! Everything else lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gateway",
    version,
    about = "An HTTP, HTTP/3 and TCP/UDP gateway configured by one YAML file"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve with a config file until SIGINT or SIGTERM, then drain.
    Run {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Check a config file: prints "ok", or the located error and exits 1.
    Validate {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Print the version.
    Version,
    /// Print a completion script for a shell (load it from the shell's completion directory).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the JSON Schema (draft 2020-12) of the config file, for editors and CI checks.
    Schema,
    /// Print the manual page (roff), made from this command line's own definition.
    Manpage {
        /// Write gateway.1 and a page per subcommand (gateway-run.1, ...) into this directory
        /// instead.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// jemalloc, unless built without the `jemalloc` feature: see that feature in Cargo.toml.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("gateway {}", gateway::VERSION);
            ExitCode::SUCCESS
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "gateway",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
        Command::Schema => match serde_json::to_string_pretty(&gateway_config::json_schema()) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Manpage { dir } => match manpage(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Validate { config } => match validate(&config) {
            Ok(()) => {
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(gateway::GatewayError::Config(e)) => {
                eprintln!("error: {}", shown(&e, &config));
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => {
            let loaded = match gateway_config::load(&config).and_then(|c| {
                c.check_serves_something()?;
                Ok(c)
            }) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {}", shown(&e, &config));
                    return ExitCode::FAILURE;
                }
            };
            gateway::init_logging(loaded.server.log_format);
            // One worker means one thread: a current-thread runtime runs every task on this
            // thread, with no work-stealing queues and no cross-thread wake-ups (how a
            // process-per-core deployment runs).
            let single = loaded.server.worker_threads == 1;
            let mut rt = if single {
                tokio::runtime::Builder::new_current_thread()
            } else {
                let mut rt = tokio::runtime::Builder::new_multi_thread();
                if loaded.server.worker_threads > 0 {
                    rt.worker_threads(loaded.server.worker_threads);
                }
                rt
            };
            // The runtime lives as long as the process, so its threads may keep upstream
            // timers for reuse (`proxy::deadline`); this thread is its only one with one worker.
            use gateway::proxy::deadline::{drop_stock_on_this_thread, keep_stock_on_this_thread};
            rt.on_thread_start(keep_stock_on_this_thread)
                .on_thread_stop(drop_stock_on_this_thread);
            if single {
                keep_stock_on_this_thread();
            }
            let rt = match rt.enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let code = rt.block_on(async move {
                match gateway::Gateway::start(loaded).await {
                    Ok(gw) => {
                        gw.run_until_signal().await;
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                }
            });
            drop_stock_on_this_thread();
            code
        }
    }
}

/// A config error with the lines of the file it points at.
fn shown(e: &gateway_config::ConfigError, path: &std::path::Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(source) => e.render(&source),
        Err(_) => e.to_string(),
    }
}

/// The manual: gateway(1) on stdout, or every page (one per subcommand too) into `dir`.
fn manpage(dir: Option<PathBuf>) -> std::io::Result<()> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            clap_mangen::generate_to(Cli::command(), dir)
        }
        None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
    }
}

/// Everything `run` would build, without binding sockets or starting anything: no runtime, no
/// connection (to Redis or anything else), no task. What only the host can tell at start (a
/// port already in use) is left to `run`.
fn validate(path: &std::path::Path) -> Result<(), gateway::GatewayError> {
    let config = std::sync::Arc::new(gateway_config::load(path)?);
    config.check_serves_something()?;
    gateway::generation::Generation::check(config.clone(), &gateway::telemetry::Telemetry::new())?;
    gateway::server::tls::load_certificates(&config)?;
    gateway::telemetry::trace::check(&config.telemetry).map_err(|(key, m)| config.error(key, m))?;
    gateway::telemetry::metrics_export::check(&config.telemetry)
        .map_err(|(key, m)| config.error(key, m))?;
    Ok(())
}
