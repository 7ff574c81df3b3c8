//! The process's own series, under the names every Prometheus client library exports
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...), read from `/proc` at
//! scrape time, and `gateway_build_info`, so dashboards and alerts written for any service work
//! unchanged. A file that cannot be read leaves its series out rather than reporting zero.

use std::fmt::Write as _;

/// The kernel reports CPU times in `/proc` in these units on every architecture Linux runs the
/// gateway on (`USER_HZ`, fixed at 100 for the user-space ABI).
const TICKS_PER_SECOND: f64 = 100.0;

/// Appends the process series and the build info in Prometheus text.
pub(super) fn render_prometheus(out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP gateway_build_info The gateway's version, always 1.\n# TYPE gateway_build_info gauge\ngateway_build_info{{version=\"{}\"}} 1",
        crate::VERSION
    );
    if let Some(stat) = read("/proc/self/stat").as_deref().and_then(Stat::parse) {
        let cpu = (stat.utime + stat.stime) as f64 / TICKS_PER_SECOND;
        family(
            out,
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent, in seconds.",
            cpu,
        );
        family(
            out,
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            stat.vsize as f64,
        );
        family(
            out,
            "process_threads",
            "gauge",
            "Threads in the process.",
            stat.threads as f64,
        );
        if let Some(boot) = read("/proc/stat").as_deref().and_then(boot_time) {
            let start = boot as f64 + stat.start_ticks as f64 / TICKS_PER_SECOND;
            family(
                out,
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since the Unix epoch, in seconds.",
                start,
            );
        }
    }
    if let Some(rss) = read("/proc/self/status")
        .as_deref()
        .and_then(resident_bytes)
    {
        family(
            out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            rss as f64,
        );
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        // The directory handle itself is one of the entries.
        let open = fds.count().saturating_sub(1);
        family(
            out,
            "process_open_fds",
            "gauge",
            "Open file descriptors.",
            open as f64,
        );
    }
    if let Some(max) = read("/proc/self/limits")
        .as_deref()
        .and_then(max_open_files)
    {
        family(
            out,
            "process_max_fds",
            "gauge",
            "The limit of open file descriptors.",
            max as f64,
        );
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The fields of `/proc/self/stat` the series need.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    threads: u64,
    start_ticks: u64,
    vsize: u64,
}

impl Stat {
    /// Parses `/proc/[pid]/stat` (proc(5)). The command name, field 2, is in parentheses and
    /// may itself hold spaces and parentheses, so the fields are counted after its last `)`.
    fn parse(text: &str) -> Option<Self> {
        let after = &text[text.rfind(')')? + 1..];
        // Field 3 (state) is the first after the name: field n is at index n - 3.
        let fields: Vec<&str> = after.split_ascii_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Self {
            utime: field(14)?,
            stime: field(15)?,
            threads: field(20)?,
            start_ticks: field(22)?,
            vsize: field(23)?,
        })
    }
}

/// `btime` of `/proc/stat`: boot time, seconds since the epoch.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// `VmRSS` of `/proc/self/status`, in bytes.
fn resident_bytes(text: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_open_files(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 130 0 0 20 0 7 0 123456 104857600 2048 18446744073709551615";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                utime: 250,
                stime: 130,
                threads: 7,
                start_ticks: 123456,
                vsize: 104857600,
            })
        );
        assert_eq!(Stat::parse("4242 (gateway) S 1"), None);
        assert_eq!(Stat::parse("no parenthesis"), None);
    }

    #[test]
    fn status_limits_and_boot_time() {
        assert_eq!(
            resident_bytes("Name:\tgateway\nVmRSS:\t   10240 kB\nThreads: 3\n"),
            Some(10 * 1024 * 1024)
        );
        assert_eq!(resident_bytes("Name:\tgateway\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1048576              1048576              files     \n";
        assert_eq!(max_open_files(limits), Some(1_048_576));
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn this_process_reports_every_series() {
        let mut out = String::new();
        render_prometheus(&mut out);
        for name in [
            "gateway_build_info{version=",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
            "process_threads ",
        ] {
            assert!(out.contains(name), "{name} in {out}");
        }
        let rss: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1024.0 * 1024.0, "{rss}");
    }
}
